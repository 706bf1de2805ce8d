"""How a command-line program on brisklm ends (``brisklm``'s and the examples'): an error as one
line naming what was wrong, no traceback; Ctrl-C, SIGTERM and a reader that went away quietly,
with the exit statuses a shell reports for them."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 128 + 15  # what a shell reports for a command SIGTERM ended (signal 15)
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a command killed by SIGPIPE (signal 13)
# The errors a program reports as a line: bad input and what the library refuses (a missing
# checkpoint is an OSError, a prompt too long a ValueError), not bugs (AttributeError, ...).
REPORTED_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    TypeError,
    OSError,
    RuntimeError,
    MemoryError,
)


class CommandParser(argparse.ArgumentParser):
    """argparse with the same way of ending for a usage error: one line on stderr, "PROG: error:
    MESSAGE (see: PROG --help)", and exit status 1 (argparse's own prints the whole usage and
    exits 2). A subcommand's parser names the program (its first word)."""

    def error(self, message: str) -> NoReturn:
        program = self.prog.split()[0]
        advice = self.hint(message)
        print(f"{program}: error: {message}{advice} (see: {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_ERROR)

    def hint(self, message: str) -> str:
        """Advice to add to an error's ``message`` (none here)."""
        return ""


class Terminated(Exception):
    """SIGTERM reached the program (``brisklm serve`` raises it once its server has stopped): it
    exits 143 once its engine and sockets are closed, where the signal's default action would
    skip that."""


def run_command(
    body: Callable[[], int | None],
    prog: str,
    describe: Callable[[BaseException], str] = str,
    errors: tuple[type[Exception], ...] = REPORTED_ERRORS,
) -> int:
    """Run a program's ``body`` and return its exit status: the body's (None: 0), or for one of
    ``errors`` 1, printing "PROG: error: " and the first line of ``describe(error)``; Ctrl-C
    130, ``Terminated`` 143 and a closed pipe 141, with no traceback."""
    if sys.stdout is None:  # `PROG >&-`
        print(f"{prog}: error: stdout is closed: {prog} writes its output there", file=sys.stderr)
        return EXIT_ERROR
    try:
        code = body()
        # What is still buffered (the last newline: a pipe's stdout is not line-buffered) goes
        # now, so that a closed pipe raises here and not in the interpreter's flush at exit.
        sys.stdout.flush()
        return code or 0
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        return EXIT_TERMINATED
    except BrokenPipeError:
        # The reader went away (`... | head -c 100`): stop quietly, as a command killed by
        # SIGPIPE does. Python ignores SIGPIPE, so the write raised instead; pointing stdout at
        # /dev/null keeps the interpreter's final flush from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except errors as error:
        message = describe(error) or type(error).__name__
        print(f"{prog}: error: {message.splitlines()[0]}", file=sys.stderr)
        return EXIT_ERROR
