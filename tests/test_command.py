"""brisklm.command.run_command: how the CLI and the examples end, checked in child processes
(a closed pipe and a closed stdout act on the process's own file descriptors)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROGRAM = """
import sys
from brisklm.command import run_command

def body():
    kind = sys.argv[1]
    if kind == "ok":
        print("done")
        return None
    if kind == "code":
        return 3
    if kind == "error":
        raise FileNotFoundError("no checkpoint at /x\\nsecond line")
    if kind == "bug":
        raise AttributeError("a bug keeps its traceback")
    if kind == "interrupt":
        raise KeyboardInterrupt
    if kind == "pipe":
        for _ in range(100_000):
            print("line of output")

sys.exit(run_command(body, "prog"))
"""


def run(kind: str, stdout=subprocess.PIPE, shell_pipe: bool = False):
    command = [sys.executable, "-c", PROGRAM, kind]
    if shell_pipe:
        script = " ".join(f"'{part}'" for part in command) + " | head -c 10 >/dev/null"
        script += "; echo ${PIPESTATUS[0]} >&2"
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    return subprocess.run(command, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60)


@pytest.mark.parametrize(
    ("kind", "status", "stderr"),
    [
        ("ok", 0, ""),
        ("code", 3, ""),
        ("error", 1, "prog: error: no checkpoint at /x\n"),
        ("interrupt", 130, "\n"),
    ],
)
def test_exit_statuses_and_one_line_errors(kind, status, stderr) -> None:
    done = run(kind)
    assert (done.returncode, done.stderr) == (status, stderr)


def test_a_bug_keeps_its_traceback() -> None:
    done = run("bug")
    assert done.returncode == 1 and "Traceback" in done.stderr and "AttributeError" in done.stderr


def test_a_reader_that_goes_away_ends_it_quietly() -> None:
    done = run("pipe", shell_pipe=True)
    assert done.stderr.strip() == "141"  # as for a command SIGPIPE killed, and no traceback


def test_a_closed_stdout_is_one_line() -> None:
    done = run("ok", stdout=subprocess.DEVNULL)
    assert done.returncode == 0
    closed = subprocess.run(
        ["bash", "-c", f"'{sys.executable}' -c \"$0\" ok >&-", PROGRAM],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert closed.returncode == 1
    assert closed.stderr == "prog: error: stdout is closed: prog writes its output there\n"
