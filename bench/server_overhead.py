"""What ``brisklm serve`` costs over the Python API, in one run: the same chat requests through a
``brisklm serve`` process and OpenAI's Python client here (HTTP, JSON, the server's request
reading, SSE, the client's parsing), and through ``LLM.chat`` / ``LLM.stream_chat`` /
``LLM.achat`` on the same model loaded here (the two engines take turns, never run together).

Greedy, a fixed number of tokens per reply (``ignore_eos``), so both sides generate the same
tokens (checked); tokens/s of each way, median over ``--rounds`` rounds that alternate them, and
their ratio (server / Python API).

    python bench/server_overhead.py                 # the bundled model
    python bench/server_overhead.py --max-tokens 64 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import openai
import torch
from langchain_overhead import PROMPTS  # (the same chat requests)

from brisklm import LLM

NAME = "brisk-chat"


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def start_server(max_batch_size: int) -> tuple[subprocess.Popen, int]:
    """``brisklm serve`` on a free port, once it answers /health."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "brisklm", "serve", "--port", str(port)]
    process = subprocess.Popen([*command, "--max-batch-size", str(max_batch_size)])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return process, port
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("brisklm serve did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    llm = LLM.from_pretrained(None, max_batch_size=8, show_progress=False)
    params = llm.default_sampling_params(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    body = {"temperature": 0, "max_tokens": args.max_tokens, "extra_body": {"ignore_eos": True}}
    server, port = start_server(max_batch_size=8)
    base = f"http://127.0.0.1:{port}/v1"
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    aclient = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0)
    tokens = args.max_tokens * len(PROMPTS)

    def python_one() -> list[str]:
        return [llm.chat(ask(p), params).content for p in PROMPTS]

    def server_one() -> list[str]:
        replies = [
            client.chat.completions.create(model=NAME, messages=ask(p), **body) for p in PROMPTS
        ]
        return [r.choices[0].message.content for r in replies]

    def python_stream() -> list[str]:
        return ["".join(llm.stream_chat(ask(p), params)) for p in PROMPTS]

    def server_stream() -> list[str]:
        texts = []
        for p in PROMPTS:
            stream = client.chat.completions.create(
                model=NAME, messages=ask(p), stream=True, **body
            )
            texts.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        return texts

    async def python_batch() -> list[str]:
        replies = await asyncio.gather(*(llm.achat(ask(p), params) for p in PROMPTS))
        return [r.content for r in replies]

    async def server_batch() -> list[str]:
        replies = await asyncio.gather(
            *(aclient.chat.completions.create(model=NAME, messages=ask(p), **body) for p in PROMPTS)
        )
        return [r.choices[0].message.content for r in replies]

    loop = asyncio.new_event_loop()
    ways = {
        "one request at a time": (python_one, server_one),
        "streamed, one at a time": (python_stream, server_stream),
        "8 at once (one batch)": (
            lambda: loop.run_until_complete(python_batch()),
            lambda: loop.run_until_complete(server_batch()),
        ),
    }
    print(
        f"machine: {platform.machine()} torch {torch.__version__} threads {torch.get_num_threads()}; "
        f"model: bundled {NAME}, {len(PROMPTS)} chat requests of {args.max_tokens} tokens, "
        f"median of {args.rounds} rounds"
    )
    print(f"{'way':26s} {'Python API':>12s} {'server':>12s} {'server/API':>11s}")
    try:
        for _ in range(20):  # (warm)
            client.models.list()
        start = time.perf_counter()
        for _ in range(200):
            client.models.list()
        floor = (time.perf_counter() - start) / 200
        print(f"an HTTP round trip through the client (GET /v1/models): {floor * 1000:.2f} ms")
        for label, (direct, served) in ways.items():
            assert direct() == served(), f"{label}: the replies differ"  # (and a warm-up)
            times: dict[str, list[float]] = {"api": [], "server": []}
            for _ in range(args.rounds):
                for key, run in (("api", direct), ("server", served)):
                    start = time.perf_counter()
                    run()
                    times[key].append(time.perf_counter() - start)
            api = tokens / statistics.median(times["api"])
            served_rate = tokens / statistics.median(times["server"])
            extra = (statistics.median(times["server"]) - statistics.median(times["api"])) / len(
                PROMPTS
            )
            print(
                f"{label:26s} {api:9.0f} t/s {served_rate:9.0f} t/s {served_rate / api:10.2f}x"
                f"  (+{extra * 1000:.1f} ms a request)"
            )
    finally:
        server.terminate()
        server.wait(timeout=30)
        loop.close()
        llm.close()


if __name__ == "__main__":
    main()
