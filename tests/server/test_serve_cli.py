"""``brisklm serve`` from the command line: the socket it listens on, and its one-line errors."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from brisklm.cli import main

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")


def test_a_port_in_use_is_one_line_before_the_model_loads(capsys) -> None:
    # uvicorn printed the "serving" line, logged the bind error and exited 3.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--port", str(port), "--model", "/nonexistent"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"brisklm: error: cannot listen on 127.0.0.1:{port} (--host, --port): ")
    assert len(err.strip().splitlines()) == 1 and "serving" not in err
    assert "/nonexistent" not in err  # the socket is tried first


def test_port_0_serves_on_the_port_it_names_and_ctrl_c_stops_it() -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "brisklm", "serve", "--port", "0", "--max-batch-size", "2"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        found = re.fullmatch(
            r"brisklm: serving brisk-chat at (http://127\.0\.0\.1:(\d+))/v1 \(Ctrl-C stops\)\n",
            line,
        )
        assert found and int(found.group(2)) != 0, line
        base = found.group(1)
        assert httpx.get(f"{base}/health", timeout=30).status_code == 200
        models = httpx.get(f"{base}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["brisk-chat"]
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 130  # the CLI's code for an interrupt, as in generate
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def _serve(*flags: str) -> tuple[subprocess.Popen, str]:
    """``brisklm serve`` on a free port, and its base URL once it serves."""
    server = subprocess.Popen(
        [sys.executable, "-m", "brisklm", "serve", "--port", "0", *flags],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stderr is not None
    line = server.stderr.readline()
    while line.startswith("brisklm: warning: "):  # (--max-seq-len past the bundled model's)
        line = server.stderr.readline()
    found = re.search(r"serving brisk-chat at (http://\S+)/v1", line)
    assert found, line
    return server, found.group(1)


def test_ctrl_c_lets_replies_end_and_a_second_ends_them_without_a_traceback() -> None:
    """The first Ctrl-C waited, saying nothing, for every reply in flight (minutes for a long
    one); a second made uvicorn cancel them, which printed a traceback of ~100 lines."""
    # A reply of 16,000 tokens: seconds at the bundled model's speed, so the second Ctrl-C comes
    # while it runs however loaded the machine.
    server, base = _serve("--max-seq-len", "16384", "--max-batch-size", "1")
    try:
        body = {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 16000,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as reply:
            lines = reply.iter_lines()
            assert next(lines).startswith("data: ")  # the reply is under way
            server.send_signal(signal.SIGINT)
            assert server.stderr is not None
            assert server.stderr.readline() == (
                "brisklm: stopping once the replies in flight end (Ctrl-C again ends them now)\n"
            )
            server.send_signal(signal.SIGINT)
            rest = [line for line in lines if line]
        assert '"finish_reason": "abort"' in rest[-2] and rest[-1] == "data: [DONE]"
        assert server.wait(timeout=60) == 130
        err = server.stderr.read()
        assert err.startswith("brisklm: ending the replies in flight\n")
        assert "Traceback" not in err
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_sigterm_stops_the_server_through_its_cleanup() -> None:
    # uvicorn raised SIGTERM again under its default action: the process died by the signal,
    # without closing its engine and sockets.
    server, base = _serve("--max-batch-size", "1")
    try:
        assert httpx.get(f"{base}/health", timeout=30).status_code == 200
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 128 + signal.SIGTERM
        assert server.stderr is not None and "Traceback" not in server.stderr.read()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_every_address_of_the_host_is_listened_on_at_one_port() -> None:
    from brisklm.cli import CliError, _listen

    # "" is every interface (IPv4 and, where the machine has it, IPv6), as uvicorn binds it.
    sockets = _listen("", 0)
    try:
        assert {s.getsockname()[1] for s in sockets} == {sockets[0].getsockname()[1]}
        assert "0.0.0.0" in {s.getsockname()[0] for s in sockets}
        # Listening already: a second bind of the port fails here, not once the model loads.
        with pytest.raises(CliError, match="Address already in use"):
            _listen("0.0.0.0", sockets[0].getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    with pytest.raises(CliError, match=r"--port must be in \[0, 65535\], got 70000"):
        _listen("127.0.0.1", 70000)  # (getaddrinfo took it as port 4464)


def test_a_sigterm_as_the_server_starts_stops_it_before_it_raises() -> None:
    """A SIGTERM landing before uvicorn's own handlers were in (as the server started) raised
    inside ``asyncio.run`` before the server's coroutine began: a "coroutine 'Server.serve' was
    never awaited" RuntimeWarning (1 run in 15 of an audit). Now it asks the server to exit, and
    ``Terminated`` is raised once it has."""
    from brisklm.cli import _serve_until_terminated
    from brisklm.command import Terminated

    class Starting:
        should_exit = False
        ran_to_its_end = False

        def run(self, sockets):
            os.kill(os.getpid(), signal.SIGTERM)  # before any handler of its own
            assert self.should_exit  # (the handler ran, and raised nothing here)
            self.ran_to_its_end = True

    server = Starting()
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        _serve_until_terminated(server, [])
    assert server.ran_to_its_end and signal.getsignal(signal.SIGTERM) is before


def test_a_sigint_the_process_ignored_still_says_it_stopped_the_server() -> None:
    """In the background of a non-interactive shell SIGINT is ignored; uvicorn stops on it all
    the same, and raised again under "ignore" it left the command exiting 0."""
    from brisklm.cli import _serve_until_terminated

    class Serving:
        should_exit = False

        def run(self, sockets):
            os.kill(os.getpid(), signal.SIGINT)
            assert self.should_exit

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt):
            _serve_until_terminated(Serving(), [])
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_uvicorn_hands_its_signal_back_to_be_raised(signum) -> None:
    """Through a real uvicorn server: it stops on the signal and raises it again under the
    handler it found, which raises ``Terminated`` (SIGTERM), or ``KeyboardInterrupt`` (a SIGINT
    the process ignored); the handlers before it are back."""
    import threading
    import time

    uvicorn = pytest.importorskip("uvicorn")
    from brisklm.cli import _listen, _serve_until_terminated
    from brisklm.command import Terminated

    async def app(scope, receive, send):  # (an app that answers nothing: none is asked)
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                pass
            return

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    sockets = _listen("127.0.0.1", 0)

    def signal_once_started() -> None:
        for _ in range(500):
            if server.started:
                break
            time.sleep(0.01)
        os.kill(os.getpid(), signum)

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if signum == signal.SIGINT else None
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    threading.Thread(target=signal_once_started, daemon=True).start()
    try:
        with pytest.raises(Terminated if signum == signal.SIGTERM else KeyboardInterrupt):
            _serve_until_terminated(server, sockets)
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    finally:
        for listening in sockets:
            listening.close()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
