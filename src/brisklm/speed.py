"""How fast a loaded model prefills a prompt and decodes at given batch sizes on this machine
(``brisklm bench``): the engine's own speed, end to end through ``LLM.generate``."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# What the prompts are made of: ordinary text, tiled to the length asked for.
_TEXT = (
    "The lighthouse keeper counted the ships that passed each night and wrote their names in a "
    "green notebook, with the hour, the weather and the colour of their lights. "
)
# Decode runs after prompts of at most this many tokens.
DECODE_PROMPT_TOKENS = 32


@dataclass(frozen=True)
class DecodeSpeed:
    batch_size: int
    tokens_per_second: float  # all rows' new tokens
    seconds_per_step: float  # one token for every row


@dataclass(frozen=True)
class SpeedReport:
    prompt_tokens: int
    prefill_seconds: float
    prefill_tokens_per_second: float
    new_tokens: int
    decode: list[DecodeSpeed] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_speed_options(
    prompt_tokens: int, new_tokens: int, batch_sizes: Sequence[int], repeats: int
) -> None:
    """ValueError naming the option that is out of range."""
    from brisklm.checks import check_int

    check_int("prompt_tokens", prompt_tokens, 1)
    check_int("new_tokens", new_tokens, 1)
    check_int("repeats", repeats, 1)
    if not batch_sizes or any(
        isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in batch_sizes
    ):
        raise ValueError(f"batch_sizes must be ints >= 1, got {list(batch_sizes)!r}")


def prompt_ids(llm: Any, num_tokens: int, row: int = 0) -> list[int]:
    """``num_tokens`` ids of ordinary text, each row's starting elsewhere in it (no two rows of
    a batch alike)."""
    text = llm.tokenizer.encode(_TEXT, add_special_tokens=False)
    start = (row * 7) % len(text)
    tiled = text[start:] + text * (num_tokens // len(text) + 2)
    return tiled[:num_tokens]


def measure_speed(
    llm: Any,
    prompt_tokens: int = 512,
    new_tokens: int = 64,
    batch_sizes: Sequence[int] = (1, 8),
    repeats: int = 3,
) -> SpeedReport:
    """Prefill of one ``prompt_tokens`` prompt, and decoding of ``new_tokens`` greedy tokens a
    row (eos ignored) after prompts of ``DECODE_PROMPT_TOKENS`` at each batch size: the best of
    ``repeats`` runs. A decode step is timed as a run of ``new_tokens + 1`` tokens less a run of
    1 (its prefill and first token), over ``new_tokens``. Prefix caching must be off (a repeat
    would reuse the prompt)."""

    check_speed_options(prompt_tokens, new_tokens, batch_sizes, repeats)
    if llm.engine.prefix_cache is not None:
        raise ValueError("measure_speed needs an LLM made with prefix_caching=False")
    decode_prompt = min(DECODE_PROMPT_TOKENS, prompt_tokens)
    longest = max(prompt_tokens + 1, decode_prompt + new_tokens + 1)
    if longest > llm.max_seq_len:
        raise ValueError(
            f"prompt_tokens={prompt_tokens} and new_tokens={new_tokens} need a context of "
            f"{longest} tokens; the model's is {llm.max_seq_len}"
        )
    if max(batch_sizes) > llm.engine.config.max_batch_size:
        raise ValueError(
            f"batch size {max(batch_sizes)} is past the engine's max_batch_size="
            f"{llm.engine.config.max_batch_size}"
        )

    def run(prompts: list[list[int]], num_new: int) -> float:
        return time_generate(llm, prompts, num_new)

    # Each shape runs once untimed first: a run's first time pays for its KV cache slots' pages
    # (on huge pages a slot's whole memory at its first token) and its buffers. Without it the
    # first run of 1 token at batch 8 took twice as long as the runs of 33 tokens after it.
    prompt = [prompt_ids(llm, prompt_tokens)]
    run(prompt, 1)
    prefill = min(run(prompt, 1) for _ in range(repeats))
    decode = []
    for batch_size in batch_sizes:
        prompts = [prompt_ids(llm, decode_prompt, row) for row in range(batch_size)]
        run(prompts, new_tokens + 1)
        step = measure(run, prompts, new_tokens + 1, repeats)[1]
        decode.append(DecodeSpeed(batch_size, batch_size / step, step))
    return SpeedReport(prompt_tokens, prefill, prompt_tokens / prefill, new_tokens, decode)


def time_generate(llm: Any, prompts: list[list[int]], num_new: int) -> float:
    """Seconds ``llm.generate`` takes for ``num_new`` greedy tokens a prompt (eos ignored)."""
    from brisklm.sampling import SamplingParams

    params = SamplingParams(max_tokens=num_new, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == num_new for o in outputs)
    return elapsed


def measure(
    run: Callable[[list[list[int]], int], float],
    prompts: list[list[int]],
    num_new: int,
    repeats: int,
) -> tuple[float, float]:
    """(seconds of a run of 1 token, seconds a decode step): the best of ``repeats`` runs of 1
    and of ``num_new`` tokens (``run(prompts, num_new)`` times one), a step their difference over
    ``num_new - 1``. ValueError when the longer run took no longer: too few steps to time (a
    step was reported as a nanosecond: a billion tokens/s)."""
    first = min(run(prompts, 1) for _ in range(repeats))
    full = min(run(prompts, num_new) for _ in range(repeats))
    return first, step_seconds(first, full, num_new)


def step_seconds(first: float, full: float, num_new: int) -> float:
    """Seconds a decode step, from a run of 1 token (``first`` seconds) and one of ``num_new``
    (``full``); ValueError when the longer run took no longer (a step was once reported as a
    nanosecond: a billion tokens/s)."""
    if full <= first:
        raise ValueError(
            f"a run of {num_new} tokens took no longer than a run of 1 ({1e3 * full:.2f} ms "
            f"against {1e3 * first:.2f} ms): too few decode steps ({num_new - 1}) to time "
            "against the noise; decode more new tokens"
        )
    return (full - first) / (num_new - 1)
