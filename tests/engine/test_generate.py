"""generate / stream / chat through the engine on a tiny model: outputs, stopping, batching, seeds."""

from __future__ import annotations

import contextlib
import sys
import threading

import pytest
import torch

from brisklm import LLM, SamplingParams
from brisklm.engine.model_runner import ForwardBatch, ModelRunner

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPTS = ["The quick brown fox", "Hello", "Zürich and 東京 are cities; emoji 🙂", "def add(a, b):"]


def reference_greedy(llm, prompt_ids: list[int], steps: int) -> list[int]:
    """Greedy tokens straight from a fresh model runner, bypassing scheduler and sampler."""
    runner = ModelRunner(
        llm.engine.model, num_slots=1, max_seq_len=128, attention_backend="reference"
    )
    vocab = llm.engine.num_real_tokens
    tokens: list[int] = []
    logits = runner.forward(ForwardBatch([0], [0], [prompt_ids], [1]))
    for _ in range(steps):
        tokens.append(int(logits[0, :vocab].argmax()))
        start = len(prompt_ids) + len(tokens) - 1
        logits = runner.forward(ForwardBatch([0], [start], [[tokens[-1]]], [1]))
    return tokens


def test_single_prompt_output_fields(llm):
    out = llm.generate("The quick brown fox", GREEDY)
    assert out.prompt == "The quick brown fox"
    assert out.prompt_token_ids == llm.tokenizer.encode("The quick brown fox")
    assert len(out.token_ids) == 24
    assert out.finish_reason == "length"
    assert out.usage.prompt_tokens == len(out.prompt_token_ids)
    assert out.usage.completion_tokens == 24
    assert out.usage.total_tokens == out.usage.prompt_tokens + 24
    assert out.text == llm.tokenizer.decode(out.token_ids)


def test_greedy_matches_reference_and_batch_matches_alone(llm):
    alone = [llm.generate(p, GREEDY) for p in PROMPTS]
    batch = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in batch] == [o.token_ids for o in alone]
    for out in alone:
        assert out.token_ids == reference_greedy(llm, out.prompt_token_ids, 24)


def test_greedy_rows_take_the_token_the_logits_give(llm):
    """Plain greedy rows get their tokens from the native pass itself (its argmax over the real
    tokens: this model's vocabulary is padded past its tokenizer's); with logprobs the engine reads
    the logits instead. Both give the same tokens."""
    runner = llm.engine.runner
    assert llm.engine.num_real_tokens < llm.engine.model.config.vocab_size
    found_by_kernels: list[bool] = []
    forward_greedy = runner.forward_greedy

    def spy(batch, columns):
        logits, tokens = forward_greedy(batch, columns)
        found_by_kernels.append(tokens is not None)
        return logits, tokens

    runner.forward_greedy = spy
    try:
        plain = llm.generate(PROMPTS, GREEDY)
    finally:
        runner.forward_greedy = forward_greedy
    assert found_by_kernels and all(found_by_kernels) == (runner.native is not None)
    read = llm.generate(PROMPTS, GREEDY.with_changes(logprobs=0))
    assert [o.token_ids for o in plain] == [o.token_ids for o in read]


def test_rows_finish_on_their_own(llm):
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (3, 17, 1, 9)]
    outs = llm.generate(PROMPTS, params)
    assert [len(o.token_ids) for o in outs] == [3, 17, 1, 9]
    full = llm.generate(PROMPTS, GREEDY)
    for short, long in zip(outs, full):
        assert long.token_ids[: len(short.token_ids)] == short.token_ids


def test_more_prompts_than_slots_are_queued(llm):
    prompts = PROMPTS * 3  # 12 requests, 4 slots
    outs = llm.generate(prompts, GREEDY)
    alone = {p: llm.generate(p, GREEDY).token_ids for p in PROMPTS}
    assert [o.token_ids for o in outs] == [alone[p] for p in prompts]


def test_stream_concatenates_to_generate_text(llm):
    for prompt in PROMPTS:
        pieces = list(llm.stream(prompt, GREEDY))
        assert "".join(pieces) == llm.generate(prompt, GREEDY).text
        assert all(pieces)


def test_stream_chunks_end_with_finish_and_usage(llm):
    chunks = list(llm.stream_chunks("Hello", GREEDY))
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert sum(len(c.token_ids) for c in chunks) == 24


def test_stop_token_ids_and_eos(llm):
    reference = llm.generate("Hello", GREEDY)
    target = reference.token_ids[5]
    first = reference.token_ids.index(target)
    out = llm.generate(
        "Hello", SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[target])
    )
    assert out.finish_reason == "stop"
    assert out.stop_reason == target
    assert out.token_ids == reference.token_ids[: first + 1]
    # The stop token itself is not part of the text.
    assert out.text == llm.tokenizer.decode(reference.token_ids[:first])


def test_eos_from_tokenizer_stops_generation(llm):
    eos = llm.tokenizer.eos_token_ids[0]
    # Bias eos up so the model emits it at once; min_tokens then delays it.
    out = llm.generate(
        "Hello", SamplingParams(temperature=0.0, max_tokens=10, logit_bias={eos: 100.0})
    )
    assert out.finish_reason == "stop" and out.token_ids == [eos] and out.text == ""
    out = llm.generate(
        "Hello",
        SamplingParams(temperature=0.0, max_tokens=10, logit_bias={eos: 100.0}, min_tokens=3),
    )
    assert len(out.token_ids) == 4 and out.token_ids[-1] == eos
    out = llm.generate(
        "Hello",
        SamplingParams(temperature=0.0, max_tokens=5, logit_bias={eos: 100.0}, ignore_eos=True),
    )
    assert out.finish_reason == "length" and len(out.token_ids) == 5


def test_stop_strings_span_tokens_and_never_stream(llm):
    reference = llm.generate("The quick brown fox", GREEDY).text
    assert len(reference) > 12
    stop = reference[6:11]  # a stop string cutting across token boundaries
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop])
    out = llm.generate("The quick brown fox", params)
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == reference[: reference.index(stop)]
    streamed = "".join(llm.stream("The quick brown fox", params))
    assert streamed == out.text
    included = SamplingParams(
        temperature=0.0,
        max_tokens=24,
        ignore_eos=True,
        stop=[stop],
        include_stop_str_in_output=True,
    )
    assert (
        llm.generate("The quick brown fox", included).text
        == reference[: reference.index(stop) + len(stop)]
    )


def test_min_tokens_holds_off_stop_strings(llm):
    reference = llm.generate("The quick brown fox", GREEDY)
    texts = [llm.tokenizer.decode(reference.token_ids[:n]) for n in range(25)]
    # A stop string completed by the second token: without min_tokens it ends the output there.
    stop = texts[2][len(texts[1]) - 1 :] if len(texts[1]) else texts[2]
    assert stop and texts[2].endswith(stop)
    base = dict(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop])
    early = llm.generate("The quick brown fox", SamplingParams(**base))
    assert early.finish_reason == "stop" and len(early.token_ids) <= 2
    for min_tokens in (4, 12):
        params = SamplingParams(**base, min_tokens=min_tokens)
        out = llm.generate("The quick brown fox", params)
        assert len(out.token_ids) >= min_tokens
        assert out.token_ids == reference.token_ids[: len(out.token_ids)]
        full = texts[len(out.token_ids)]
        if out.finish_reason == "stop":  # a later occurrence, completed at a counted token
            assert full.endswith(stop) and out.text == full[: -len(stop)]
            assert not texts[len(out.token_ids) - 1].endswith(stop)
            assert stop not in texts[len(out.token_ids) - 1][len(texts[min_tokens - 1]) :]
        else:
            assert out.finish_reason == "length" and out.text == texts[24]
        assert "".join(llm.stream("The quick brown fox", params)) == out.text


def test_min_tokens_with_every_token_a_stop_is_refused(llm):
    vocab = llm.engine.num_real_tokens
    bad = SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=list(range(vocab)))
    with pytest.raises(ValueError, match="min_tokens"):
        llm.generate("Hello", bad)
    eos = set(llm.tokenizer.eos_token_ids)
    others = [t for t in range(vocab) if t not in eos]
    with pytest.raises(ValueError, match="eos"):
        llm.generate("Hello", SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=others))
    # With ignore_eos the eos tokens are ordinary ones, so one is left to sample.
    ok = SamplingParams(
        temperature=0.0, max_tokens=3, min_tokens=2, stop_token_ids=others, ignore_eos=True
    )
    out = llm.generate("Hello", ok)
    assert len(out.token_ids) >= 2 and set(out.token_ids[:2]) <= eos
    assert len(llm.generate("Hello", GREEDY).token_ids) == 24


def test_context_limit_ends_with_length(llm):
    prompt = list(range(5, 5 + 120))
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
    assert out.finish_reason == "length"
    assert len(prompt) + len(out.token_ids) == llm.max_seq_len


def test_seeded_sampling_is_reproducible_in_any_batch(llm):
    seeded = SamplingParams(temperature=1.0, max_tokens=16, seed=1234, ignore_eos=True)
    alone = llm.generate("Hello", seeded).token_ids
    assert llm.generate("Hello", seeded).token_ids == alone
    other = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=20, ignore_eos=True)
    mixed = llm.generate(["The quick", "Hello", "def"], [other, seeded, other])
    assert mixed[1].token_ids == alone
    different = llm.generate(
        "Hello", SamplingParams(temperature=1.0, max_tokens=16, seed=99, ignore_eos=True)
    )
    assert different.token_ids != alone


def test_logprobs_match_model_distribution(llm):
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=3, ignore_eos=True)
    out = llm.generate("Hello", params)
    assert out.logprobs is not None and len(out.logprobs) == 6
    runner = ModelRunner(llm.engine.model, num_slots=1, max_seq_len=128, attention_backend="sdpa")
    ids = out.prompt_token_ids + out.token_ids
    logits = runner.forward(ForwardBatch([0], [0], [ids], [len(out.token_ids) + 1])).clone()
    logits[:, llm.engine.num_real_tokens :] = float("-inf")
    expected = torch.log_softmax(logits, dim=-1)
    for step, entry in enumerate(out.logprobs):
        assert entry.token_id == out.token_ids[step]
        assert entry.logprob == pytest.approx(expected[step, entry.token_id].item(), abs=1e-4)
        assert entry.rank == 1  # greedy picks the most likely token
        assert [t.token_id for t in entry.top] == expected[step].topk(3).indices.tolist()
        assert entry.token_bytes == llm.tokenizer.token_bytes()[entry.token_id]
        assert entry.token == entry.token_bytes.decode("utf-8", "replace")
        for alternative in entry.top:
            assert alternative.token_bytes == llm.tokenizer.token_bytes()[alternative.token_id]
    # The entries' bytes are the text (the vocabulary strings were "Ġword" pieces, not text).
    special = llm.tokenizer.special_token_ids
    text = b"".join(e.token_bytes for e in out.logprobs if e.token_id not in special)
    assert text.decode("utf-8", "replace") == out.text


def test_concurrent_callers_share_the_engine(llm):
    expected = {p: llm.generate(p, GREEDY).token_ids for p in PROMPTS}
    results: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def worker(prompt: str) -> None:
        try:
            results[prompt] = llm.generate(prompt, GREEDY).token_ids
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert results == expected


def test_chat_uses_template(llm):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    ids = llm.chat_prompt_ids(messages)
    rendered = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")
    assert ids == llm.tokenizer.encode(rendered, add_special_tokens=False)
    reply = llm.chat(messages, GREEDY)
    assert reply.output.prompt_token_ids == ids
    assert reply.content == reply.output.text
    assert reply.tool_calls == []
    assert "".join(llm.stream_chat(messages, GREEDY)) == reply.content


def test_an_aborted_stream_ends_with_the_text_it_held_back(tiny_dir):
    # The end of the text so far could start a stop string, so a stream holds it back; abort
    # dropped it from the stream while the request's output kept it. An LLM of its own, whose
    # engine is stepped here: no engine thread may step it too; a token a step, so that the
    # stream stops where it is counted.
    llm = LLM.from_pretrained(tiny_dir, show_progress=False, max_seq_len=128, max_decode_steps=1)
    engine = llm.engine

    def run(params: SamplingParams, num_tokens: int):
        request = llm.make_request("Hello", params)
        engine.add_request(request)
        streamed = ""
        while len(request.output_token_ids) < num_tokens:
            for _, chunk in engine.step():
                streamed += chunk.text
        return request, streamed

    plain, _ = run(SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), 8)
    held = plain.text[-2:]
    assert held.strip(), plain.text  # the test needs visible text at the end
    stop = [held + "\x00"]
    request, streamed = run(
        SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, stop=stop), 8
    )
    assert streamed == plain.text[:-2]  # the last two characters are held back
    _, last = engine.abort_request(request.request_id)
    assert last.finish_reason == "abort"
    assert streamed + last.text == request.to_output().text == plain.text
    llm.close()


def test_rope_tables_span_the_engines_context_not_the_trained_one(tmp_path):
    # The cos/sin tables were as long as max_position_embeddings: 1 GiB for a 1M-token config
    # whose engine holds 4,096 tokens (2.3 GB at the first request's peak).
    from tests.tiny import make_tiny_checkpoint

    long = make_tiny_checkpoint(tmp_path / "long", max_position_embeddings=1_000_000)
    short = make_tiny_checkpoint(tmp_path / "short", max_position_embeddings=512)
    prompt = list(range(5, 45))
    outputs = []
    for path in (long, short):
        with LLM.from_pretrained(path, max_seq_len=96, show_progress=False) as llm:
            outputs.append(llm.generate(prompt, GREEDY).token_ids)
            cos, sin = llm.engine.model.rotary.tables(torch.device("cpu"), torch.float32, 10)
            assert cos.shape[0] == sin.shape[0] == 96
    assert outputs[0] == outputs[1]


def test_the_public_methods_type_hints_resolve_at_run_time():
    # The prompt aliases were strings ("str | TokenIds"): typing.get_type_hints, which pydantic's
    # validate_call and documentation tools use, raised TypeError on stream, make_request, ...
    import typing

    methods = [
        getattr(LLM, name)
        for name in ("stream", "stream_chunks", "astream", "astream_chunks", "make_request")
    ]
    if sys.version_info >= (3, 11):  # typing.get_overloads
        methods += [*typing.get_overloads(LLM.generate), *typing.get_overloads(LLM.agenerate)]
        one = typing.get_type_hints(typing.get_overloads(LLM.generate)[0])
        assert set(typing.get_args(one["prompts"])) == {str, list[int], tuple[int, ...]}
    for method in methods:
        hints = typing.get_type_hints(method)
        assert "prompt" in hints or "prompts" in hints
    assert {str, torch.Tensor} <= set(typing.get_args(typing.get_type_hints(LLM.stream)["prompt"]))


def test_sampling_metadata_is_kept_while_nothing_in_it_depends_on_the_outputs(llm, monkeypatch):
    """Building a batch's sampling tensors took ~50 us a step: a batch whose metadata reads no
    outputs (no penalties; min_tokens reached) builds it once, and samples the same tokens."""
    from brisklm.sampling import metadata as metadata_module

    builds = []
    build = metadata_module.SamplingMetadata.build.__func__

    def counting(cls, *args, **kwargs):
        builds.append(len(args[0]))
        return build(cls, *args, **kwargs)

    plain = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=12, ignore_eos=True)
    cases = [
        (plain, 1),
        (plain.with_changes(min_tokens=5, ignore_eos=False), 6),  # 5 masking steps, then one
        # Penalties count the outputs each call (the kernels count them within a call of steps).
        (plain.with_changes(repetition_penalty=1.3), range(2, 12)),
        (plain.with_changes(presence_penalty=0.5), range(2, 12)),
    ]
    if llm.engine.runner.native is None:  # a step a call: built each step
        cases[2:] = [(params, 12) for params, _ in cases[2:]]
    for params, expected_builds in cases:
        alone = llm.generate("Hello", params)  # (built before counting: the reference)
        monkeypatch.setattr(metadata_module.SamplingMetadata, "build", classmethod(counting))
        builds.clear()
        again = llm.generate("Hello", params)
        monkeypatch.undo()
        assert again.token_ids == alone.token_ids
        if isinstance(expected_builds, range):
            assert len(builds) in expected_builds, params
        else:
            assert len(builds) == expected_builds, params
    # Two requests together, then one of them alone (a new batch): built again.
    builds.clear()
    monkeypatch.setattr(metadata_module.SamplingMetadata, "build", classmethod(counting))
    short = plain.with_changes(max_tokens=4)
    outs = llm.generate(["Hello", "The quick"], [short, plain])
    assert builds == [2, 1]
    assert outs[1].token_ids == llm.generate("The quick", plain).token_ids


def test_stream_requests_adds_up_per_request_and_aborts_the_rest_when_closed(llm, monkeypatch):
    """``stream_requests``: the chunks of requests submitted together, each tagged with its
    request's index, add up to each output alone; closing the stream early aborts the others."""
    requests = [llm.make_request(p, GREEDY) for p in PROMPTS]
    texts = [""] * len(PROMPTS)
    with contextlib.closing(llm.stream_requests(requests)) as chunks:
        for index, chunk in chunks:
            texts[index] += chunk.text
    assert texts == [o.text for o in llm.generate(PROMPTS, GREEDY)]
    aborted: list[str] = []
    abort = llm._loop.abort
    monkeypatch.setattr(llm._loop, "abort", lambda rid: (aborted.append(rid), abort(rid)))
    long = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    requests = [llm.make_request(p, long) for p in PROMPTS[:2]]
    chunks = llm.stream_requests(requests)
    index, first = next(chunks)
    chunks.close()
    # (the other request had not finished: a chunk of 100 tokens' request cannot be its last)
    assert not first.finished and requests[1 - index].request_id in aborted
    assert len(llm.generate("Hello", GREEDY).token_ids) == 24  # the engine goes on


async def test_astream_requests_adds_up_per_request(llm):
    requests = [llm.make_request(p, GREEDY) for p in PROMPTS]
    texts = [""] * len(PROMPTS)
    async with contextlib.aclosing(llm.astream_requests(requests)) as chunks:
        async for index, chunk in chunks:
            texts[index] += chunk.text
    assert texts == [o.text for o in llm.generate(PROMPTS, GREEDY)]


def test_a_progress_bar_counts_the_prompts_finished(llm, capsys):
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    quiet = llm.generate(PROMPTS, params)
    assert capsys.readouterr().err == ""  # off by default
    shown = llm.generate(PROMPTS, params, show_progress=True)
    err = capsys.readouterr().err
    assert f"{len(PROMPTS)}/{len(PROMPTS)}" in err and "output tokens/s" in err
    assert [o.token_ids for o in shown] == [o.token_ids for o in quiet]
    import asyncio

    again = asyncio.run(llm.agenerate(PROMPTS, params, show_progress=True))
    assert f"{len(PROMPTS)}/{len(PROMPTS)}" in capsys.readouterr().err
    assert [o.token_ids for o in again] == [o.token_ids for o in quiet]


def test_engine_stats_count_finished_requests(llm):
    stats = llm.engine.stats
    before = dict(stats.finished), stats.prompt_tokens, stats.generation_tokens
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    assert stats.finished["length"] - before[0]["length"] == len(PROMPTS)
    assert stats.prompt_tokens - before[1] == sum(len(o.prompt_token_ids) for o in outs)
    assert stats.generation_tokens - before[2] == 5 * len(PROMPTS)
    # The prompt tokens a request reused from the prefix cache are counted apart.
    cached = stats.cached_prompt_tokens
    again = llm.generate(outs[0].prompt_token_ids + outs[0].token_ids + [5], params)
    assert again.usage.cached_prompt_tokens > 0
    assert stats.cached_prompt_tokens - cached == again.usage.cached_prompt_tokens
    # An abort counts as one (it reaches the engine before the request sent after it).
    stream = llm.stream_chunks(PROMPTS[0], SamplingParams(max_tokens=50, ignore_eos=True))
    next(stream)
    stream.close()
    llm.generate(PROMPTS[1], params)
    assert stats.finished["abort"] - before[0]["abort"] == 1
