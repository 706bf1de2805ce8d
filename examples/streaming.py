"""Stream a chat reply straight from brisklm (no LangChain): text as it is generated, then usage.

python examples/streaming.py [--model CHECKPOINT_DIR] [--device cpu|cuda] [--max-tokens N] [PROMPT]
"""

from __future__ import annotations

import argparse
import sys
import time

from brisklm import LLM, SamplingParams
from brisklm.command import CommandParser, run_command


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main() -> None:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", default="Tell me a short story about a blue cat.")
    parser.add_argument("--model", default=None, help="checkpoint directory (default: bundled)")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], help="where to run (default: cuda if available)"
    )
    parser.add_argument(
        "--max-tokens", type=positive_int, default=200, help="most tokens in the reply (200)"
    )
    args = parser.parse_args()

    llm = LLM.from_pretrained(args.model, device=args.device, show_progress=False)
    messages = [{"role": "user", "content": args.prompt}]
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=0, max_tokens=args.max_tokens)
    prompt_ids = llm.chat_prompt_ids(messages)

    start = time.perf_counter()
    first_token_at = None
    usage = None
    for chunk in llm.stream_chunks(prompt_ids, params):
        if chunk.text:
            first_token_at = first_token_at or time.perf_counter()
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        if chunk.finished:
            usage = chunk.usage
            finish_reason = chunk.finish_reason
    elapsed = time.perf_counter() - start
    print()
    assert usage is not None
    rate = usage.completion_tokens / elapsed if elapsed > 0 else float("inf")
    ttft = (first_token_at or time.perf_counter()) - start
    print(
        f"[{usage.prompt_tokens} prompt + {usage.completion_tokens} generated tokens, "
        f"finish: {finish_reason}, first text after {ttft * 1000:.0f} ms, {rate:.1f} tokens/s]"
    )
    llm.close()


if __name__ == "__main__":
    # Errors as one line (a missing checkpoint, a prompt too long), Ctrl-C and `| head` quietly.
    sys.exit(run_command(main, "streaming.py"))
