"""Prefix caching on a chat workload, in one run: calls one at a time that share a system prompt
and tool definitions (what a LangChain agent sends), timed on brisklm with prefix caching, without
it, and on transformers' ``generate`` (no prefix reuse across calls). Prints the mean latency per
call, the prompt tokens reused, and the ratios; greedy, and the two brisklm runs must give the
same tokens (checked).

    python bench/prefix_caching.py                 # the bundled brisk-chat
    python bench/prefix_caching.py --model DIR --calls 24 --max-tokens 32
    python bench/prefix_caching.py --draft default     # with the bundled draft model
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

SYSTEM = (
    "You are a careful assistant for a travel desk. Use the tools when a request needs live data; "
    "answer briefly otherwise. Never invent values: copy names and numbers from the request."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": kind} for arg, kind in args},
                "required": [arg for arg, _ in args],
            },
        },
    }
    for name, description, args in [
        ("get_weather", "Current weather for a city.", [("city", "string")]),
        ("get_tide_table", "Tide table of a harbor.", [("harbor", "string"), ("day", "integer")]),
        ("convert_currency", "Convert money.", [("amount", "number"), ("to", "string")]),
    ]
]
QUESTIONS = [
    "What is the weather in Paris?",
    "Get the tide table for harbor Port Isaac and day 14.",
    "Convert 120 euros to yen.",
    "Hello!",
    "Is it raining in Tokyo?",
    "How is the weather in Oslo?",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: bundled)")
    parser.add_argument("--calls", type=int, default=18)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--draft",
        default=None,
        help="speculative decoding: a draft directory, default (the bundled draft) or ngram",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from brisklm import LLM, SamplingParams
    from brisklm.llm import default_model_path

    directory = args.model or str(default_model_path())
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    chats = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        for q in (QUESTIONS * args.calls)[: args.calls]
    ]

    results = {}
    for caching in (False, True):
        with LLM.from_pretrained(
            directory, show_progress=False, prefix_caching=caching, draft=args.draft
        ) as llm:
            times, tokens, reused, prompt = [], [], [], []
            llm.chat(chats[0], tools=TOOLS, params=params)  # warm-up (kernels, template)
            for chat in chats:
                start = time.perf_counter()
                reply = llm.chat(chat, tools=TOOLS, params=params)
                times.append(time.perf_counter() - start)
                tokens.append(reply.output.token_ids)
                reused.append(reply.usage.cached_prompt_tokens)
                prompt.append(reply.usage.prompt_tokens)
            results[caching] = (times, tokens, reused, prompt)
    if results[True][1] != results[False][1]:
        raise SystemExit("prefix caching changed the output")

    from transformers import AutoModelForCausalLM

    from brisklm.tokenizer import Tokenizer

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    tokenizer = Tokenizer.from_pretrained(directory)
    hf_times = []
    with torch.inference_mode():
        for index, chat in enumerate(chats):
            text = tokenizer.apply_chat_template(chat, tools=TOOLS)
            ids = tokenizer.encode(text, add_special_tokens=False)
            start = time.perf_counter()
            model.generate(
                torch.tensor([ids]),
                max_new_tokens=len(results[True][1][index]),
                min_new_tokens=len(results[True][1][index]),
                do_sample=False,
                pad_token_id=0,
            )
            if index:  # the first call warms transformers up
                hf_times.append(time.perf_counter() - start)

    off, on = results[False][0][1:], results[True][0][1:]  # the first call as transformers'
    print(
        f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    )
    print(
        f"model: {directory}; {args.calls} chat calls with {len(TOOLS)} tools, greedy; "
        f"draft: {args.draft}"
    )
    print(
        f"prompt tokens per call: {statistics.mean(results[True][3]):.0f}, reused with caching: "
        f"{statistics.mean(results[True][2][1:]):.0f}"
    )
    for name, values in (
        ("brisklm, prefix caching", on),
        ("brisklm, no caching", off),
        ("transformers generate", hf_times),
    ):
        print(
            f"  {name:<24} {1000 * statistics.mean(values):7.1f} ms per call "
            f"(median {1000 * statistics.median(values):.1f})"
        )
    print(
        f"caching vs none: {statistics.mean(off) / statistics.mean(on):.2f}x; "
        f"vs transformers: {statistics.mean(hf_times) / statistics.mean(on):.2f}x"
    )


if __name__ == "__main__":
    main()
