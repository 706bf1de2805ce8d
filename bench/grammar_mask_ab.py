"""Grammar masks applied to the logits by the native kernels' loop against torch's ops, in one run.

Greedy JSON-Schema decoding of one prompt on the bundled model (or ``--model``), the two ways of
applying the mask taking turns request by request (this VM's speed drifts within seconds, so two
separate runs are not comparable). Prints each way's median and 10th-percentile request time and
their ratio; the tokens must be the same both ways (checked).

    python bench/grammar_mask_ab.py
    python bench/grammar_mask_ab.py --logprobs 1 --rounds 40
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from common import parse_checked

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "city": {"type": "string"},
        "age": {"type": "integer"},
    },
    "required": ["name", "city", "age"],
}
PROMPT = "Extract as JSON: Ada Lovelace, 36, lives in London."


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--logprobs", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=60)
    args = parse_checked(parser)

    from brisklm import LLM, SamplingParams
    from brisklm.constrained import apply

    llm = LLM.from_pretrained(args.model, show_progress=False)
    params = SamplingParams(
        temperature=0.0, max_tokens=args.max_tokens, json_schema=SCHEMA, logprobs=args.logprobs
    )
    ways = {"native": apply._apply_natively, "torch": lambda logits, bitmask, rows: False}
    if ways["native"](torch.zeros(1, 32), torch.full((1, 1), -1, dtype=torch.int32), None) is False:
        raise SystemExit("the native kernels do not run here: nothing to compare")
    times: dict[str, list[float]] = {name: [] for name in ways}
    tokens: dict[str, list[int]] = {}
    try:
        for round_ in range(args.rounds):
            order = list(ways) if round_ % 2 else list(reversed(ways))
            for name in order:
                apply._apply_natively = ways[name]
                start = time.perf_counter()
                out = llm.generate(PROMPT, params)
                times[name].append(time.perf_counter() - start)
                if tokens.setdefault(name, out.token_ids) != out.token_ids:
                    raise SystemExit(f"{name}: the tokens changed between requests")
    finally:
        apply._apply_natively = ways["native"]
        llm.close()
    if tokens["native"] != tokens["torch"]:
        raise SystemExit("the two ways gave different tokens")
    print(
        f"machine: {platform.machine()} torch {torch.__version__} threads {torch.get_num_threads()}"
    )
    print(
        f"{len(tokens['native'])} tokens a request, logprobs={args.logprobs}, {args.rounds} rounds"
    )
    for name, values in times.items():
        ranked = sorted(values)
        print(
            f"{name:<7} median {statistics.median(values) * 1e3:7.2f} ms   "
            f"p10 {ranked[len(ranked) // 10] * 1e3:7.2f} ms"
        )
    ratio = statistics.median(times["native"]) / statistics.median(times["torch"])
    print(f"native / torch (medians): {ratio:.3f}x the time")


if __name__ == "__main__":
    main()
