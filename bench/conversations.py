"""More conversations taking turns than requests run at once, in one run: each turn sends the
conversation's whole history (its earlier prompts and replies) and one more question, one call at
a time, round robin over the conversations (what a chat server sees from its users).

Timed on brisklm with ``prefix_cache_slots`` (every conversation keeps its history's keys),
without them (at most ``max_batch_size`` conversations keep theirs, so each turn finds its slot
taken by another conversation and computes its history again) and on transformers' ``generate``
(no reuse across calls). Greedy; the two brisklm runs must give the same tokens (checked). Prints
the mean time per turn after the first round, the prompt tokens reused, and the ratios.

    python bench/conversations.py                        # the bundled brisk-chat
    python bench/conversations.py --preset 125m          # a random 125M Llama, float32
    python bench/conversations.py --conversations 8 --max-batch-size 2 --turns 4
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time

import torch
from common import add_model_or_preset_arguments, model_directory

OPENING = (
    "You are the support assistant of a bicycle shop. Customers ask about repairs, parts, "
    "opening hours and deliveries. Answer in a sentence or two, politely, and ask for the order "
    "number when a question is about an order. The shop opens at nine and closes at six, from "
    "Monday to Saturday; repairs take two days, deliveries three to five. "
)
QUESTIONS = [
    "My front brake squeaks. Can you fix it this week?",
    "Do you sell tubes for 28 inch wheels?",
    "Where is my order 4471? It was due on Monday.",
    "Can I bring my bike on Sunday?",
    "How much is a new chain fitted?",
    "Do you deliver to the next town?",
    "What lights do you recommend for winter?",
    "Is the cargo bike in stock again?",
]
FOLLOW_UPS = ["Thanks. And how long would that take?", "OK, what else do I need?", "Great, bye!"]


def run_brisk(llm, histories: list[list[int]], turns: int, follow_ups, params):
    """Each turn of each conversation, one call at a time: (seconds, reused, tokens) per call."""
    histories = [list(h) for h in histories]
    calls = []
    for turn in range(turns):
        for index, history in enumerate(histories):
            start = time.perf_counter()
            out = llm.generate(history, params)
            calls.append((time.perf_counter() - start, out.usage.cached_prompt_tokens, out))
            histories[index] = history + out.token_ids + follow_ups[turn % len(follow_ups)]
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_or_preset_arguments(parser)
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--max-batch-size", type=int, default=2)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-transformers", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.conversations <= args.max_batch_size or args.turns < 2:
        parser.error("--conversations must exceed --max-batch-size, and --turns be at least 2")

    from brisklm import LLM, SamplingParams
    from brisklm.tokenizer import Tokenizer

    scratch = tempfile.TemporaryDirectory()
    directory = model_directory(args, scratch.name)
    tokenizer = Tokenizer.from_pretrained(directory)
    histories = [
        tokenizer.encode(f"Customer {i}. {OPENING}{QUESTIONS[i % len(QUESTIONS)]}")
        for i in range(args.conversations)
    ]
    follow_ups = [tokenizer.encode(" " + text) for text in FOLLOW_UPS]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)

    runs = {}
    kept_slots = args.conversations - args.max_batch_size  # a slot for every conversation
    for extra in (0, kept_slots):
        with LLM.from_pretrained(
            directory,
            show_progress=False,
            max_batch_size=args.max_batch_size,
            prefix_cache_slots=extra,
        ) as llm:
            llm.generate(histories[0][:32], params)  # warm-up (kernels)
            runs[extra] = run_brisk(llm, histories, args.turns, follow_ups, params)
    if [c[2].token_ids for c in runs[0]] != [c[2].token_ids for c in runs[kept_slots]]:
        raise SystemExit("the prefix cache slots changed the output")

    later = slice(args.conversations, None)  # turns after the first round
    hf_times: list[float] = []
    if not args.no_transformers:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        with torch.inference_mode():
            for index, (_, _, out) in enumerate(runs[kept_slots]):
                start = time.perf_counter()
                model.generate(
                    torch.tensor([out.prompt_token_ids]),
                    max_new_tokens=len(out.token_ids),
                    min_new_tokens=len(out.token_ids),
                    do_sample=False,
                    pad_token_id=0,
                )
                if index >= args.conversations:
                    hf_times.append(time.perf_counter() - start)

    print(
        f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    )
    print(
        f"model: {args.preset or directory}; {args.conversations} conversations, {args.turns} "
        f"turns each, max_batch_size {args.max_batch_size}, greedy, {args.max_tokens} tokens a "
        "reply"
    )
    prompt = statistics.mean(len(c[2].prompt_token_ids) for c in runs[kept_slots][later])
    print(f"prompt tokens a turn after the first round: {prompt:.0f}")
    rows = [
        (f"brisklm, prefix_cache_slots={kept_slots}", runs[kept_slots]),
        ("brisklm, prefix_cache_slots=0", runs[0]),
    ]
    for name, calls in rows:
        seconds = [c[0] for c in calls[later]]
        reused = statistics.mean(c[1] for c in calls[later])
        print(
            f"  {name:<32} {1000 * statistics.mean(seconds):8.1f} ms a turn "
            f"(median {1000 * statistics.median(seconds):.1f}), {reused:.0f} tokens reused"
        )
    if hf_times:
        print(
            f"  {'transformers generate':<32} {1000 * statistics.mean(hf_times):8.1f} ms a turn "
            f"(median {1000 * statistics.median(hf_times):.1f})"
        )
    kept = statistics.mean(c[0] for c in runs[kept_slots][later])
    line = f"slots vs none: {statistics.mean(c[0] for c in runs[0][later]) / kept:.2f}x"
    if hf_times:
        line += f"; vs transformers: {statistics.mean(hf_times) / kept:.2f}x"
    print(line)
    scratch.cleanup()


if __name__ == "__main__":
    main()
