"""Speculative decoding speed-up at batch 1, in one run: the target alone and with its draft model
for k = 2..6 on two prompt sets, and with n-gram prompt lookup on an extraction task, each with the
fixed and the adaptive draft length schedule (k is then the longest proposal). Prints tokens/s,
speed-up against a run of the target alone made right before each configuration (this VM's memory
bandwidth drifts within seconds, so a baseline measured once at the start skews every ratio), and
acceptance. Greedy by default, so every configuration produces the same tokens (checked);
``--temperature`` samples instead (seeded, so each configuration's runs repeat; speculative
sampling keeps the target's distribution, not its tokens, so the texts and their lengths differ
between configurations and only tokens/s compares).

Prompt sets: "chat", open-ended requests (story, explanation, note) that the bundled 11M model was
never trained for and answers with nonsense; "tasks", the requests it was trained for (a tool call,
a JSON-Schema extraction, JSON with given keys, an answer from a tool result, a short question).

    python bench/speculative.py                      # bundled brisk-chat with brisk-draft
    python bench/speculative.py --model DIR --draft DIR
    python bench/speculative.py --ks 5 --temperature 0.7 --top-p 0.9   # sampled
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

CHAT_PROMPTS = [
    "Tell me a short story about a fox who learns to swim.",
    "Explain why the sky is blue in a few sentences.",
    "Write a short note inviting a friend to dinner on Friday.",
]
EXTRACTION = (
    "Copy the record exactly, then list its fields.\n"
    "Record: name=Ada Lovelace; born=1815-12-10; city=London; field=mathematics; known_for=the first "
    "published computer program; notes=worked with Charles Babbage on the Analytical Engine."
)

TIDE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_tide_table",
        "description": "Get the tide table.",
        "parameters": {
            "type": "object",
            "properties": {"harbor": {"type": "string"}, "day": {"type": "integer"}},
            "required": ["harbor", "day"],
        },
    },
}
PERSON_SCHEMA = (
    '{"type": "object", "properties": {"name": {"type": "string"}, "employer": {"type": "string"}, '
    '"city": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "employer", '
    '"city", "age"]}'
)
TASK_CHATS: list[tuple[list[dict], list[dict] | None]] = [
    (
        [{"role": "user", "content": 'Get the tide table for harbor "Port Isaac" and day 14.'}],
        [TIDE_TOOL],
    ),
    (
        [
            {
                "role": "user",
                "content": f"Extract JSON matching this schema: {PERSON_SCHEMA}\nText: Maren Okafor "
                "works at Globex, lives in Tromsø and is 42 years old.",
            }
        ],
        None,
    ),
    (
        [
            {
                "role": "user",
                "content": 'What is 17 plus 25? Reply in JSON with keys "question" and "answer".',
            }
        ],
        None,
    ),
    (
        [
            {"role": "user", "content": "Get the tide table for harbor Mevagissey and day 3."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {
                            "name": "get_tide_table",
                            "arguments": {"harbor": "Mevagissey", "day": 3},
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "content": '{"high_tide": "06:42", "low_tide": "12:55", "height_m": 4.8}',
            },
        ],
        [TIDE_TOOL],
    ),
    ([{"role": "user", "content": "What is the capital of Norway?"}], None),
]


def run(
    llm, prompts: list, max_tokens: int, repeats: int = 1, sampling: dict | None = None
) -> tuple[float, list[list[int]], float, float]:
    """(tokens/s, token ids, acceptance rate, mean accepted per step) over the prompts, one at a
    time; each prompt's time is the best of ``repeats`` runs (greedy, or ``sampling`` with a seed:
    every run is the same)."""
    from brisklm import SamplingParams

    sampling = sampling or {"temperature": 0.0}
    params = SamplingParams(max_tokens=max_tokens, **sampling)
    llm.generate(prompts[0], SamplingParams(max_tokens=8, **sampling))  # warm-up
    tokens, seconds, outputs = 0, 0.0, []
    proposed = accepted = steps = 0
    for prompt in prompts:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            out = llm.generate(prompt, params)
            best = min(best, time.perf_counter() - start)
        seconds += best
        tokens += len(out.token_ids)
        outputs.append(out.token_ids)
        if out.speculative is not None:
            proposed += out.speculative.num_proposed
            accepted += out.speculative.num_accepted
            steps += out.speculative.num_steps
    rate = accepted / proposed if proposed else float("nan")
    per_step = accepted / steps if steps else float("nan")
    return tokens / seconds, outputs, rate, per_step


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="target (default: bundled brisk-chat)")
    parser.add_argument(
        "--draft", default="default", help="draft model (default: bundled brisk-draft)"
    )
    parser.add_argument("--ks", default="2,3,4,5,6")
    parser.add_argument(
        "--draft-lengths", default="fixed,adaptive", help="draft length schedules to compare"
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1, help="best of N per prompt")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="sample at this temperature (0: greedy)"
    )
    parser.add_argument("--top-p", type=float, default=1.0, help="with --temperature")
    args = parser.parse_args()
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise SystemExit("--temperature must be >= 0 and --top-p in (0, 1]")
    sampling = {"temperature": args.temperature}
    if args.temperature > 0:
        sampling.update(top_p=args.top_p, seed=0)

    from brisklm import LLM

    def load(**kwargs):
        return LLM.from_pretrained(
            args.model,
            max_batch_size=1,
            max_seq_len=1024,
            show_progress=False,
            prefix_caching=False,  # repeated prompts: time their compute
            **kwargs,
        )

    def chat_ids(llm) -> list[list[int]]:
        return [llm.chat_prompt_ids([{"role": "user", "content": p}]) for p in CHAT_PROMPTS]

    def task_ids(llm) -> list[list[int]]:
        return [llm.chat_prompt_ids(m, t) for m, t in TASK_CHATS]

    def extraction_ids(llm) -> list[list[int]]:
        return [llm.chat_prompt_ids([{"role": "user", "content": EXTRACTION}])]

    schedules = args.draft_lengths.split(",")
    id_sets = {"chat": chat_ids, "tasks": task_ids, "extraction": extraction_ids}

    def alone(name: str) -> tuple[float, list[list[int]]]:
        """The target alone on a prompt set, measured now: each configuration is compared with a
        run right before it, since this VM's memory bandwidth drifts within seconds."""
        target = load()
        rate, out, _, _ = run(
            target, id_sets[name](target), args.max_tokens, args.repeats, sampling
        )
        target.close()
        return rate, out

    configs = [
        (
            name,
            f"draft k={k} {schedule}",
            dict(draft=args.draft, num_speculative_tokens=k, draft_length=schedule),
        )
        for name in ("chat", "tasks")
        for schedule in schedules
        for k in [int(k) for k in args.ks.split(",")]
    ] + [
        (
            "extraction",
            f"n-gram k={k} {schedule}",
            dict(draft="ngram", num_speculative_tokens=k, draft_length=schedule),
        )
        for schedule in schedules
        for k in (3, 5)
    ]
    rows, alone_rates = [], {name: [] for name in id_sets}
    for name, config, kwargs in configs:
        base_rate, base_out = alone(name)
        alone_rates[name].append(base_rate)
        llm = load(**kwargs)
        rate, out, acceptance, per_step = run(
            llm, id_sets[name](llm), args.max_tokens, args.repeats, sampling
        )
        llm.close()
        if args.temperature == 0:
            assert out == base_out, "speculative output differs from the target's own"
        rows.append((config, name, rate, rate / base_rate, acceptance, per_step))
    for name, rates in alone_rates.items():
        if rates:
            median = statistics.median(rates)
            rows.append(("target alone (median)", name, median, 1.0, float("nan"), float("nan")))

    print(
        f"machine: {platform.machine()} torch {torch.__version__} threads {torch.get_num_threads()}"
        f"; sampling: {sampling}"
    )
    print(f"{'config':<26}{'task':<12}{'tok/s':>8}{'speed-up':>10}{'accept':>9}{'acc/step':>10}")
    for name, task, rate, speedup, acceptance, per_step in rows:
        print(
            f"{name:<26}{task:<12}{rate:>8.1f}{speedup:>9.2f}x{acceptance:>9.2f}{per_step:>10.2f}"
        )


if __name__ == "__main__":
    main()
