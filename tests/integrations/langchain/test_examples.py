"""The examples run end to end, offline, on the bundled default model (skipped while it is absent)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integrations.langchain.bundled import model_under_test

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.bundled_model


def run_example(name: str, *args: str) -> str:
    model = model_under_test()
    command = [sys.executable, str(ROOT / "examples" / name), *args]
    if model is not None:
        command += ["--model", model]
    paths = [str(ROOT / "src"), str(ROOT / "integrations" / "langchain")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_structured_extraction() -> None:
    out = run_example("structured_extraction.py")
    assert "5 people extracted" in out


def test_agent_tools() -> None:
    out = run_example("agent_tools.py", "Please get the weather for Paris.")
    assert "tool call: get_weather(" in out
    assert "tool result:" in out
    assert "assistant:" in out


def test_streaming() -> None:
    out = run_example("streaming.py", "--max-tokens", "64")
    assert "tokens/s]" in out
