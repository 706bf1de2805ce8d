"""The examples run end to end, offline, on the bundled default model (skipped while it is absent)."""

from __future__ import annotations

import json
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


def run_example_failing(name: str, *args: str) -> subprocess.CompletedProcess:
    paths = [str(ROOT / "src"), str(ROOT / "integrations" / "langchain")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, str(ROOT / "examples" / name), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    ("name", "args", "status", "words"),
    [
        # (argparse's usage and exit status 2 before session 75: now as brisklm's CLI)
        ("streaming.py", ["--max-tokens", "0"], 1, "--max-tokens: must be at least 1, got 0"),
        ("streaming.py", ["--device", "gpu"], 1, "invalid choice: 'gpu'"),
        ("streaming.py", ["--model", "/nonexistent"], 1, "model directory '/nonexistent' does"),
        ("streaming.py", ["word " * 3000], 1, "but the context holds"),
        ("agent_tools.py", ["--model", "/nonexistent", "Hi"], 1, "no model checkpoint at"),
        ("structured_extraction.py", ["--model", "/nonexistent"], 1, "no model checkpoint at"),
    ],
)
def test_bad_input_is_one_line_naming_it(name, args, status, words) -> None:
    """They printed a traceback for each (a missing checkpoint, a prompt too long, a bad flag
    value), where brisklm's CLI prints one line (brisklm.command.run_command, which they use)."""
    done = run_example_failing(name, *args)
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr and words in done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(f"{name}: error: ")


def load_example(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        name.removesuffix(".py"), ROOT / "examples" / name
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def test_an_agent_that_never_answers_says_so(monkeypatch, capsys) -> None:
    """After MAX_ROUNDS replies that call tools the last message is a tool result: it was
    printed as the assistant's answer."""
    from langchain_core.messages import AIMessage

    example = load_example("agent_tools.py")

    class AlwaysCalls:
        def bind_tools(self, tools):
            return self

        def invoke(self, messages):
            call = {"name": "get_weather", "args": {"city": "Oslo"}, "id": f"c{len(messages)}"}
            return AIMessage("", tool_calls=[call])

    monkeypatch.setattr(example, "ChatBrisk", lambda **kwargs: AlwaysCalls())
    monkeypatch.setattr(sys, "argv", ["agent_tools.py", "Weather in Oslo?"])
    example.main()
    out = capsys.readouterr().out
    assert out.count("tool call: get_weather") == example.MAX_ROUNDS
    assert out.endswith(f"assistant: (no answer after {example.MAX_ROUNDS} rounds of tool calls)\n")
    # The tool's result is JSON, which has no Infinity (it gave {"fahrenheit": Infinity}).
    result = example.celsius_to_fahrenheit.invoke({"celsius": 1e308})
    assert "error" in json.loads(result, parse_constant=lambda name: pytest.fail(name))
