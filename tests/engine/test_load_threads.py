"""A load beside other busy processes takes the CPUs left (brisklm.kernels.omp.BusyCpus)."""

from __future__ import annotations

import os

import pytest
import torch

import brisklm.llm
from brisklm import LLM, SamplingParams
from brisklm.kernels import omp


def stat_lines(busy_ticks: int, idle_ticks: int) -> str:
    """/proc/stat with the first CPU this process may run on at ``busy_ticks`` of user time and
    ``idle_ticks`` idle, the others all idle (``idle_ticks + busy_ticks``)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    for i, cpu in enumerate(cpus):
        user, idle = (busy_ticks, idle_ticks) if i == 0 else (0, idle_ticks + busy_ticks)
        # user nice system idle iowait irq softirq steal guest guest_nice
        lines.append(f"cpu{cpu} {user} 0 0 {idle} 0 0 0 0 0 0")
    lines.append("intr 12345")
    return "\n".join(lines) + "\n"


def test_busy_cpus_counts_the_cpus_other_work_takes(monkeypatch):
    samples = iter([stat_lines(1000, 500), stat_lines(1100, 500)])  # one CPU busy throughout
    monkeypatch.setattr(omp, "available_cpus", lambda: len(os.sched_getaffinity(0)))
    busy = omp.BusyCpus(window_s=0.05, read=lambda: next(samples)).measure()
    # (less this process's own CPU time in the window, asleep: a little)
    assert busy is not None and 0.8 < busy <= 1.0
    idle = iter([stat_lines(1000, 500), stat_lines(1000, 600)])
    assert omp.BusyCpus(window_s=0.0, read=lambda: next(idle)).measure() == 0.0


def test_busy_cpus_is_none_without_proc_stat():
    def unreadable() -> str:
        raise OSError("no /proc here")

    assert omp.BusyCpus(window_s=0.0, read=unreadable).measure() is None


@pytest.mark.parametrize(
    ("busy", "wanted", "threads"),
    [(None, 2, 2), (0.0, 2, 2), (0.4, 2, 2), (0.6, 2, 1), (1.0, 2, 1), (2.0, 2, 1), (0.0, 1, 1)],
)
def test_threads_beside_busy_cpus(monkeypatch, busy, wanted, threads):
    monkeypatch.setattr(omp, "available_cpus", lambda: 2)
    assert omp.threads_beside(busy, wanted) == threads


def test_a_load_beside_busy_cpus_runs_on_the_cpus_left(tiny_dir, monkeypatch):
    """The load's torch ops run on one thread where all but one CPU are busy; the engine's
    threads, and the process's count, stay torch's."""
    if not omp.one_thread_works() or torch.get_num_threads() < 2:
        pytest.skip("needs torch's OpenMP runtime and two threads")
    monkeypatch.setattr(omp.BusyCpus, "measure", lambda self: omp.available_cpus() - 1.0)
    seen = []
    load_model = brisklm.llm.load_model

    def spying(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return load_model(*args, **kwargs)

    monkeypatch.setattr(brisklm.llm, "load_model", spying)
    before = torch.get_num_threads()
    with LLM.from_pretrained(tiny_dir, show_progress=False) as llm:
        step = llm.engine.step

        def engine_step():  # (on the engine thread)
            seen.append(torch.get_num_threads())
            return step()

        llm.engine.step = engine_step
        out = llm.generate("Hi", SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
        assert len(out.token_ids) == 3
    assert seen[0] == 1 and set(seen[1:]) == {before} and torch.get_num_threads() == before


def test_busy_cpus_reads_odd_proc_stat_files(monkeypatch):
    """A file that does not parse reads as unknown (it failed the load); a CPU in one sample only
    counts in neither; a container's view numbering its CPUs from 0 counts them all."""
    monkeypatch.setattr(omp, "available_cpus", lambda: 2)
    broken = iter(["cpu0 1 0 0 5 0 0 0 0\n\nintr 1\n", "cpu0 x 0 0 5\n"])
    assert omp.BusyCpus(window_s=0.05, read=lambda: next(broken)).measure() is None
    # cpu1 comes online between the samples with its whole uptime's ticks: left out.
    hotplug = iter(["cpu0 100 0 0 100 0 0 0 0\n", "cpu0 200 0 0 100 0 0 0 0\ncpu1 0 0 0 9999\n"])
    busy = omp.BusyCpus(window_s=0.05, read=lambda: next(hotplug)).measure()
    assert busy is not None and 0.8 < busy <= 1.0
    # The affinity mask names CPUs 40 and 41; the container's /proc/stat numbers them 0 and 1.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {40, 41}, raising=False)
    renumbered = iter(
        [
            stat_lines_of({"cpu0": (0, 100), "cpu1": (0, 100)}),
            stat_lines_of({"cpu0": (100, 100), "cpu1": (0, 200)}),
        ]
    )
    busy = omp.BusyCpus(window_s=0.05, read=lambda: next(renumbered)).measure()
    assert busy is not None and 0.8 < busy <= 1.0


def stat_lines_of(cpus: dict[str, tuple[int, int]]) -> str:
    """/proc/stat lines for named CPUs of (user, idle) ticks."""
    lines = [f"{name} {user} 0 0 {idle} 0 0 0 0 0 0" for name, (user, idle) in cpus.items()]
    return "\n".join(["cpu  0 0 0 0 0 0 0 0 0 0", *lines]) + "\n"
