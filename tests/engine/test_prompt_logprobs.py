"""Prompt logprobs (``SamplingParams.prompt_logprobs``): each prompt token's logprob given the
tokens before it, against transformers, through prompt chunks, beside other requests, with a
draft model, and with a prefix cache that such a request does not reuse."""

from __future__ import annotations

import pytest
import torch

from brisklm import LLM, SamplingParams
from brisklm.outputs import TokenLogprob

PROMPT = "Hello there, how are you doing on this fine day in Zürich, my friend? 🙂"
OTHERS = ["The quick brown fox", "def add(a, b):", "Hello"]
WANTED = SamplingParams(temperature=0.0, max_tokens=5, prompt_logprobs=3, ignore_eos=True)
PLAIN = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


def load(path, **kwargs) -> LLM:
    settings = dict(device="cpu", max_batch_size=4, max_seq_len=128, show_progress=False)
    return LLM.from_pretrained(path, **{**settings, **kwargs})


def reference(tiny_dir, prompt_ids: list[int], num_real_tokens: int) -> torch.Tensor:
    """transformers' logprobs at each prompt position (row i: the token after position i)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids])).logits[0].float()
    logits[:, num_real_tokens:] = float("-inf")  # the padded vocabulary's ids are no tokens
    return torch.log_softmax(logits, dim=-1)


def values(entries: list[TokenLogprob | None] | None) -> list[float]:
    assert entries is not None and entries[0] is None
    return [e.logprob for e in entries[1:]]  # type: ignore[union-attr]


@pytest.mark.parametrize("chunk", [None, 8])
def test_prompt_logprobs_match_transformers(tiny_dir, kernels, chunk) -> None:
    """Every entry (whole prompt, or in chunks of 8 tokens) against transformers' log-softmax:
    the token, its logprob, its rank and the top alternatives; the output is the one without."""
    with load(tiny_dir, prefill_chunk_size=chunk) as llm:
        out = llm.generate(PROMPT, WANTED)
        plain = llm.generate(PROMPT, PLAIN)
        real = llm.engine.num_real_tokens
    ids = out.prompt_token_ids
    assert (
        len(ids) > 16 and out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(ids)
    )
    assert out.token_ids == plain.token_ids and plain.prompt_logprobs is None
    expected = reference(tiny_dir, ids, real)
    table = llm.tokenizer.token_bytes()
    for position in range(1, len(ids)):
        entry = out.prompt_logprobs[position]
        assert entry is not None
        row = expected[position - 1]
        assert entry.token_id == ids[position]
        assert entry.token_bytes == table[ids[position]]
        assert entry.logprob == pytest.approx(row[ids[position]].item(), abs=1e-4)
        assert entry.rank == int((row > row[ids[position]] + 1e-5).sum()) + 1
        top = row.topk(3)
        assert [t.token_id for t in entry.top] == top.indices.tolist()
        assert [t.logprob for t in entry.top] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_other_requests_are_unchanged_beside_one(llm) -> None:
    """A prompt with prompt logprobs in a batch with others: their outputs are theirs alone, its
    logprobs are those it has alone."""
    alone = llm.generate(PROMPT, WANTED)
    expected = {p: llm.generate(p, PLAIN).token_ids for p in OTHERS}
    outs = llm.generate([OTHERS[0], PROMPT, *OTHERS[1:]], [PLAIN, WANTED, PLAIN, PLAIN])
    assert [o.token_ids for o in outs] == [expected[OTHERS[0]], alone.token_ids] + [
        expected[p] for p in OTHERS[1:]
    ]
    assert values(outs[1].prompt_logprobs) == pytest.approx(values(alone.prompt_logprobs), abs=1e-5)
    assert all(o.prompt_logprobs is None for i, o in enumerate(outs) if i != 1)


def test_a_request_with_prompt_logprobs_reuses_no_prefix(llm) -> None:
    """A cached prefix has no logits: the request computes its whole prompt, and the prefix
    stays for the requests after it."""
    first = llm.generate(PROMPT, PLAIN)
    wanted = llm.generate(PROMPT, WANTED)
    assert wanted.usage.cached_prompt_tokens == 0
    assert len(wanted.prompt_logprobs) == len(first.prompt_token_ids)
    assert wanted.token_ids == first.token_ids
    again = llm.generate(PROMPT, PLAIN)
    assert again.usage.cached_prompt_tokens > 0 and again.token_ids == first.token_ids


def test_the_first_stream_chunk_carries_them(llm) -> None:
    whole = llm.generate(PROMPT, WANTED)
    chunks = list(llm.stream_chunks(PROMPT, WANTED))
    assert values(chunks[0].prompt_logprobs) == pytest.approx(values(whole.prompt_logprobs))
    assert all(c.prompt_logprobs is None for c in chunks[1:])
    assert [t for c in chunks for t in c.token_ids] == whole.token_ids


def test_a_sampled_request_draws_the_same_tokens(llm) -> None:
    """Reading the prompt's logits changes no draw: a seed gives the same output either way."""
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=12)
    plain = llm.generate(PROMPT, seeded)
    wanted = llm.generate(PROMPT, seeded.with_changes(prompt_logprobs=0))
    assert wanted.token_ids == plain.token_ids
    assert all(e.top == () for e in wanted.prompt_logprobs[1:])


def test_a_drafted_engine_gives_the_same(tiny_dir, llm) -> None:
    """With a draft model (the prompt's chunks go through the speculator's pass) the logprobs
    and output are the plain engine's."""
    expected = llm.generate(PROMPT, WANTED)
    with load(tiny_dir, draft=tiny_dir, num_speculative_tokens=3, prefill_chunk_size=8) as drafted:
        outs = drafted.generate([PROMPT, OTHERS[0]], [WANTED, PLAIN])
    assert outs[0].token_ids == expected.token_ids
    assert values(outs[0].prompt_logprobs) == pytest.approx(
        values(expected.prompt_logprobs), abs=1e-4
    )
    assert outs[1].prompt_logprobs is None
