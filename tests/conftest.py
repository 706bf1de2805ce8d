"""Shared pytest fixtures and markers."""

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def without_native_kernels(monkeypatch):
    """Load and run models through torch's ops only, as where the native CPU kernels cannot build."""
    from brisklm.kernels import native

    monkeypatch.setenv(native.ENV_SWITCH, "0")
    native.library.cache_clear()
    yield
    monkeypatch.undo()
    native.library.cache_clear()


@pytest.fixture(autouse=True)
def _speculation_schedules_on_counts(request, monkeypatch):
    """Adaptive draft length schedules decide on accepted tokens alone, as for a seeded sampled
    request: the timed rule (brisklm.speculative.draft_length) follows how fast the engine's
    steps ran, which on a shared machine is noise, and tests count proposals and steps. Tests
    marked ``timed_speculation`` keep it, and pin the costs they want."""
    if request.node.get_closest_marker("timed_speculation"):
        return
    from brisklm.engine.speculation import Speculator

    monkeypatch.setattr(Speculator, "_cost", lambda self, request, size, seconds: None)


@pytest.fixture(autouse=True)
def _native_team_from_scratch():
    """Each test starts with the native pass's team uncapped: a cap one test's busy passes set
    (brisklm.kernels.team_size) would otherwise cut the threads the next one asks for."""
    from brisklm.kernels.team_size import TEAM

    TEAM.reset()
    yield
