"""A batch of requests that share a long prefix and arrive together, in one run: structured
extraction over several texts with one instruction and JSON Schema (what LangChain's
``with_structured_output(...).batch(texts)`` sends), and n samples of one prompt.

Timed on brisklm computing the shared prefix once (the default: requests wait for the running
one computing it and copy its keys), on brisklm computing it in every request (as before session
63; the two alternate batch by batch, and must give the same tokens), and on transformers'
``generate`` over the padded batch. Nothing is cached before a batch: each starts from an empty
prefix cache. Prints the mean time per batch, the prompt tokens computed, and the ratios.

    python bench/shared_prefix_batch.py                      # the bundled brisk-chat
    python bench/shared_prefix_batch.py --preset 125m        # a random 125M Llama, float32
    python bench/shared_prefix_batch.py --model DIR --batch 8 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time

import torch
from common import add_model_or_preset_arguments, model_directory

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "the person's full name"},
        "age": {"type": "integer", "description": "age in years"},
        "city": {"type": "string", "description": "the city the person lives in"},
        "occupation": {"type": "string", "description": "what the person does for a living"},
        "email": {"type": "string", "description": "an e-mail address, if the text gives one"},
        "member": {"type": "boolean", "description": "whether the person is a club member"},
    },
    "required": ["name", "age", "city", "occupation", "email", "member"],
}
INSTRUCTIONS = (
    "You extract facts from short texts about people for a membership database. Read the text "
    "and reply with one JSON object that follows this JSON Schema exactly, with every required "
    "field. Copy names, cities and addresses as the text writes them; write numbers as digits; "
    "use false where the text does not say the person is a member. Reply with the JSON object "
    "only, with no other text before or after it.\n\nJSON Schema: "
)
TEXTS = [
    "Maria Lopez, 34, is a nurse in São Paulo and a club member (maria@example.com).",
    "Tom Berg is a 51-year-old carpenter from Oslo. Reach him at tom.berg@example.org.",
    "Aiko Tanaka (28) teaches piano in Kyoto; she joined the club last spring. aiko@example.jp",
    "The baker Pierre Martin, aged 45, lives in Lyon. Email: pierre@example.fr. Not a member.",
    "Olu Adeyemi, a 39-year-old engineer in Lagos, writes from olu@example.ng; club member.",
    "Hanna Schmidt is 62 and a retired pilot in Hamburg (hanna.s@example.de).",
    "Li Wei, 23, studies law in Chengdu and is a member; contact li.wei@example.cn.",
    "Sven Olsen (47), fisherman in Bergen, sven@example.no, joined the club in May.",
]


def prompts_of(batch: int) -> list[str]:
    head = INSTRUCTIONS + json.dumps(SCHEMA) + "\n\nText: "
    return [head + TEXTS[i % len(TEXTS)] + "\nJSON:" for i in range(batch)]


def forget_prefixes(llm) -> None:
    """Drop what the prefix cache holds, so that the next batch computes its prefix anew."""
    engine = llm.engine
    for slot in range(engine.scheduler.slots.num_slots):
        engine.prefix_cache.forget(slot)


def sharing(llm, on: bool) -> None:
    """Turn computing a shared prefix once on (the engine's own) or off (every request computes
    it: no waiting for a running request, nothing copied from one)."""
    scheduler = llm.engine.scheduler
    for name in ("_awaits_prefix", "_copy_sources"):
        scheduler.__dict__.pop(name, None)
    if not on:
        scheduler._awaits_prefix = lambda request: False
        scheduler._copy_sources = lambda: []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_or_preset_arguments(parser)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4, help="n of the n-samples workload")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-transformers", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from brisklm import LLM, SamplingParams

    scratch = tempfile.TemporaryDirectory()
    directory = model_directory(args, scratch.name)

    extraction = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, json_schema=SCHEMA)
    seeded = [
        SamplingParams(temperature=0.8, seed=s, max_tokens=args.max_tokens)
        for s in range(args.samples)
    ]
    workloads = {
        f"extraction, {args.batch} texts": (prompts_of(args.batch), extraction),
        f"{args.samples} samples of one prompt": (prompts_of(1) * args.samples, seeded),
    }
    times: dict[tuple[str, bool], list[float]] = {}
    computed: dict[tuple[str, bool], int] = {}
    tokens: dict[tuple[str, bool], list[list[int]]] = {}
    with LLM.from_pretrained(
        directory, show_progress=False, max_batch_size=max(args.batch, args.samples, 2)
    ) as llm:
        for prompts, params in workloads.values():  # warm-up
            llm.generate(prompts[:2], params if isinstance(params, SamplingParams) else params[:2])
        for _ in range(args.rounds):
            for name, (prompts, params) in workloads.items():
                for on in (True, False):
                    forget_prefixes(llm)
                    sharing(llm, on)
                    start = time.perf_counter()
                    outputs = llm.generate(prompts, params)
                    times.setdefault((name, on), []).append(time.perf_counter() - start)
                    computed[name, on] = sum(
                        o.usage.prompt_tokens - o.usage.cached_prompt_tokens for o in outputs
                    )
                    tokens[name, on] = [o.token_ids for o in outputs]
        sharing(llm, True)
    for name in workloads:
        if tokens[name, True] != tokens[name, False]:
            raise SystemExit(f"{name}: sharing the prefix changed the output")

    hf: dict[str, list[float]] = {}
    if not args.no_transformers:
        from transformers import AutoModelForCausalLM

        from brisklm.tokenizer import Tokenizer

        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        tokenizer = Tokenizer.from_pretrained(directory)
        with torch.inference_mode():
            for name, (prompts, _) in workloads.items():
                ids = [tokenizer.encode(p) for p in prompts]
                width = max(map(len, ids))
                batch = torch.tensor([[0] * (width - len(i)) + i for i in ids])
                mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
                new = max(map(len, tokens[name, True]))
                for round_ in range(args.rounds + 1):
                    start = time.perf_counter()
                    model.generate(
                        batch,
                        attention_mask=mask,
                        max_new_tokens=new,
                        min_new_tokens=new,
                        do_sample=False,
                        pad_token_id=0,
                    )
                    if round_:  # the first warms transformers up
                        hf.setdefault(name, []).append(time.perf_counter() - start)

    print(
        f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    )
    print(f"model: {args.preset or directory}; {args.rounds} rounds, alternating")
    for name in workloads:
        on, off = times[name, True], times[name, False]
        total = sum(len(t) for t in tokens[name, True])
        print(
            f"{name}: prompt tokens computed {computed[name, True]} shared vs "
            f"{computed[name, False]} each; {total} tokens generated"
        )
        rows = [("brisklm, prefix computed once", on), ("brisklm, computed by each", off)]
        if name in hf:
            rows.append(("transformers generate", hf[name]))
        for label, values in rows:
            print(
                f"  {label:<30} {1000 * statistics.mean(values):8.1f} ms per batch "
                f"(median {1000 * statistics.median(values):.1f})"
            )
        ratio = statistics.median(off) / statistics.median(on)
        line = f"  once vs each: {ratio:.2f}x (medians)"
        if name in hf:
            line += f"; vs transformers: {statistics.median(hf[name]) / statistics.median(on):.2f}x"
        print(line)
    scratch.cleanup()


if __name__ == "__main__":
    main()
