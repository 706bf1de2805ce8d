"""Two ways of a grammar mask's work, in one run: ``--compare apply`` (the default), the masks
applied to the logits by the native kernels' loop against torch's ops; ``--compare worker``, the
masks filled by a worker thread while the pass runs against filled before the pass on the engine
thread (``StructuredOutputs.overlaps`` chooses between them by the CPUs free).

Greedy JSON-Schema decoding of one prompt (``--batch`` copies of it) on the bundled model (or
``--model``), the two ways taking turns request by request (this VM's speed drifts within seconds,
so two separate runs are not comparable). Prints each way's median and 10th-percentile request
time and their ratio; the tokens must be the same both ways (checked).

    python bench/grammar_mask_ab.py
    python bench/grammar_mask_ab.py --logprobs 1 --rounds 40
    python bench/grammar_mask_ab.py --compare worker --batch 4
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
    parser.add_argument("--compare", choices=("apply", "worker"), default="apply")
    parser.add_argument("--batch", type=int, default=1, help="copies of the prompt a request")
    args = parse_checked(parser)

    from brisklm import LLM, SamplingParams
    from brisklm.constrained import apply
    from brisklm.engine.structured import StructuredOutputs

    llm = LLM.from_pretrained(args.model, show_progress=False)
    params = SamplingParams(
        temperature=0.0, max_tokens=args.max_tokens, json_schema=SCHEMA, logprobs=args.logprobs
    )
    if args.compare == "apply":
        native = apply._apply_natively
        if native(torch.zeros(1, 32), torch.full((1, 1), -1, dtype=torch.int32), None) is False:
            raise SystemExit("the native kernels do not run here: nothing to compare")
        ways = {"native": native, "torch": lambda logits, bitmask, rows: False}
        module, attribute = apply, "_apply_natively"
    else:
        ways = {"worker": lambda self: True, "before": lambda self: False}
        module, attribute = StructuredOutputs, "overlaps"
    kept = getattr(module, attribute)
    times: dict[str, list[float]] = {name: [] for name in ways}
    tokens: dict[str, list[list[int]]] = {}
    try:
        for round_ in range(args.rounds):
            order = list(ways) if round_ % 2 else list(reversed(ways))
            for name in order:
                setattr(module, attribute, ways[name])
                start = time.perf_counter()
                outs = llm.generate([PROMPT] * args.batch, params)
                times[name].append(time.perf_counter() - start)
                got = [out.token_ids for out in outs]
                if tokens.setdefault(name, got) != got:
                    raise SystemExit(f"{name}: the tokens changed between requests")
    finally:
        setattr(module, attribute, kept)
        llm.close()
    first, second = ways
    if tokens[first] != tokens[second]:
        raise SystemExit("the two ways gave different tokens")
    print(
        f"machine: {platform.machine()} torch {torch.__version__} threads {torch.get_num_threads()}"
    )
    print(
        f"{len(tokens[first][0])} tokens a request of {args.batch}, logprobs={args.logprobs}, "
        f"{args.rounds} rounds"
    )
    for name, values in times.items():
        ranked = sorted(values)
        print(
            f"{name:<7} median {statistics.median(values) * 1e3:7.2f} ms   "
            f"p10 {ranked[len(ranked) // 10] * 1e3:7.2f} ms"
        )
    ratio = statistics.median(times[first]) / statistics.median(times[second])
    print(f"{first} / {second} (medians): {ratio:.3f}x the time")


if __name__ == "__main__":
    main()
