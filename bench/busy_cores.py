"""Threads on a machine whose cores other work keeps busy, in one run: chat calls with tools on
the bundled model (greedy and seeded, one at a time), as brisklm runs them (the native pass's team
following its barriers' sleeps, ``brisklm.kernels.team_size``, and the sampler on one thread,
``brisklm.kernels.omp``) and as before session 63 (both at torch's thread count), the two taking
turns round by round. First on an idle
machine, then beside a process that keeps one core busy (started by this script). Prints the
time per call, the share of passes that ran with fewer threads, and the ratios; the two ways must
give the same tokens (checked).

    python bench/busy_cores.py
    python bench/busy_cores.py --model DIR --rounds 6 --calls 12 --busy 2
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time

import torch
from common import parse_checked
from prefix_caching import QUESTIONS, SYSTEM, TOOLS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: bundled)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=12, help="chat calls per round and way")
    parser.add_argument("--busy", type=int, default=1, help="busy processes beside the run")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parse_checked(parser)

    import contextlib

    from brisklm import LLM, SamplingParams
    from brisklm.kernels import omp, team_size
    from brisklm.llm import default_model_path

    team = team_size.TEAM
    adaptive_size = team.size
    one_thread = omp.one_thread
    passes = {"all": 0, "fewer": 0}

    def counted(wanted: int) -> int:
        size = adaptive_size(wanted)
        passes["all"] += 1
        passes["fewer"] += size < wanted
        return size

    def fixed(wanted: int) -> int:
        passes["all"] += 1
        return wanted

    params = [
        SamplingParams(temperature=0.0, max_tokens=args.max_tokens),
        SamplingParams(temperature=0.7, top_p=0.9, seed=1, max_tokens=args.max_tokens),
    ]
    chats = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS
    ]
    results: dict[tuple[bool, str], list[float]] = {}
    fewer: dict[tuple[bool, str], list[float]] = {}
    tokens: dict[str, list[list[int]]] = {}
    directory = args.model or str(default_model_path())
    with LLM.from_pretrained(directory, show_progress=False) as llm:
        for chat in chats:  # warm-up: kernels, templates, grammars, cached prefixes
            llm.chat(chat, tools=TOOLS, params=params[0])
        for busy in (False, True):
            spinners = [
                subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(args.busy if busy else 0)
            ]
            try:
                time.sleep(0.5 if busy else 0)
                for _ in range(args.rounds):
                    for way, size in (("adaptive", counted), ("fixed", fixed)):
                        team.size = size  # type: ignore[method-assign]
                        omp.one_thread = one_thread if way == "adaptive" else contextlib.nullcontext
                        team.reset()
                        passes.update(all=0, fewer=0)
                        outputs = []
                        start = time.perf_counter()
                        for index in range(args.calls):
                            chat = chats[index % len(chats)]
                            reply = llm.chat(chat, tools=TOOLS, params=params[index % 2])
                            outputs.append(reply.output.token_ids)
                        elapsed = time.perf_counter() - start
                        results.setdefault((busy, way), []).append(elapsed / args.calls)
                        fewer.setdefault((busy, way), []).append(passes["fewer"] / passes["all"])
                        if tokens.setdefault(way, outputs) != outputs:
                            raise SystemExit(f"{way}: the tokens changed between rounds")
            finally:
                for spinner in spinners:
                    spinner.kill()
                    spinner.wait()
        team.size = adaptive_size  # type: ignore[method-assign]
        omp.one_thread = one_thread
    if tokens["adaptive"] != tokens["fixed"]:
        raise SystemExit("the team size changed the tokens")

    print(
        f"machine: {platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()}"
    )
    print(
        f"model: {directory}; {args.calls} chat calls with tools a round, {args.rounds} rounds, "
        f"the two ways alternating; busy: {args.busy} spinning process(es)"
    )
    for busy in (False, True):
        label = "busy cores" if busy else "idle"
        line = []
        for way in ("adaptive", "fixed"):
            times = results[busy, way]
            share = statistics.mean(fewer[busy, way])
            line.append(
                f"{way} {1000 * statistics.median(times):.1f} ms per call "
                f"({100 * share:.0f}% of passes with fewer threads)"
            )
        ratio = statistics.median(results[busy, "fixed"]) / statistics.median(
            results[busy, "adaptive"]
        )
        print(f"{label}: {'; '.join(line)}; fixed / adaptive {ratio:.2f}x (medians)")


if __name__ == "__main__":
    main()
