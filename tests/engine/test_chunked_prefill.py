"""Chunked prefill: prompts enter the cache in chunks, in passes that also decode running requests.

The output must not change (greedy tokens equal those of whole-prompt prefill; a seeded request's
tokens do not depend on its batch), a request decoding beside a long prompt keeps getting a token
every pass, and attention never pads a decoding row to a chunk's length.
"""

from __future__ import annotations

import pytest
import torch

from brisklm import LLM, SamplingParams
from brisklm.attention import AttentionMetadata
from brisklm.attention.reference import ReferenceAttention
from brisklm.attention.sdpa import SdpaAttention
from brisklm.engine.llm_engine import EngineConfig
from brisklm.engine.model_runner import ForwardBatch
from brisklm.engine.scheduler import Scheduler
from tests.runner_spy import spy_on_passes

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def load(path, **kwargs):
    settings = dict(device="cpu", max_batch_size=4, max_seq_len=256, show_progress=False)
    return LLM.from_pretrained(path, **{**settings, **kwargs})


def prompt_ids(n: int, offset: int = 0) -> list[int]:
    """``n`` ordinary token ids (the tiny tokenizer's specials are ids 0-4)."""
    return [10 + (7 * i + offset) % 300 for i in range(n)]


def start_decoding(llm: LLM, steps: int):
    """A 30-token greedy request on a 6-token prompt, stepped ``steps`` passes by hand."""
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    request = llm.make_request(prompt_ids(6), params)
    llm.engine.add_request(request)
    for _ in range(steps):
        llm.engine.step()
    return request, params


def run_to_end(llm: LLM, requests) -> list[list[int]]:
    """Step the engine by hand (its thread never starts) until every request has finished;
    returns, per pass, how many tokens each request had emitted after it."""
    engine = llm.engine
    for request in requests:
        engine.add_request(request)
    history = []
    while engine.has_unfinished:
        for _, result in engine.step():
            assert not isinstance(result, BaseException), result
        history.append([len(r.output_token_ids) for r in requests])
    return history


# ----------------------------------------------------------------- the scheduler alone
@pytest.fixture
def make(llm):
    """Requests of ``n`` prompt tokens, made (not submitted) by the shared tiny LLM."""
    return lambda n: llm.make_request(prompt_ids(n), GREEDY)


def advance(batch) -> None:
    """What a pass does to the requests it ran: their chunk, or one decoded token, is cached."""
    for request, n in zip(batch.requests, batch.prefill_lens):
        request.num_cached += n or 1


def test_a_long_prompt_is_cut_at_multiples_of_the_chunk_size_while_others_decode(make):
    scheduler = Scheduler(num_slots=4, max_prefill_tokens=8192, prefill_chunk_size=16)
    short, long = make(5), make(40)
    scheduler.add(short)
    batch = scheduler.schedule()
    assert batch.requests == [short] and batch.prefill_lens == [5]
    advance(batch)
    scheduler.add(long)
    lens = []
    while long.is_prefilling:
        batch = scheduler.schedule()
        assert short in batch.requests  # the decoding request is in every pass
        lens.append(dict(zip(map(id, batch.requests), batch.prefill_lens)))
        advance(batch)
    assert [x[id(long)] for x in lens] == [16, 16, 8]
    assert all(x[id(short)] == 0 for x in lens)
    assert not scheduler.schedule().has_prefill


def test_chunks_start_at_multiples_whatever_is_already_cached(make):
    request = make(50)
    request.num_cached = 10  # e.g. cut elsewhere by an earlier pass
    assert request.next_prompt_chunk(16) == 6
    request.num_cached = 48
    assert request.next_prompt_chunk(16) == 2


def test_the_prompt_budget_holds_back_later_chunks_but_always_runs_one(make):
    scheduler = Scheduler(num_slots=4, max_prefill_tokens=20, prefill_chunk_size=16)
    first, second, third = make(64), make(10), make(3)
    for request in (first, second, third):
        scheduler.add(request)
    batch = scheduler.schedule()  # 16 fits, 16 + 10 does not, 16 + 3 does
    assert batch.requests == [first, third] and batch.prefill_lens == [16, 3]
    advance(batch)
    batch = scheduler.schedule()  # first's next chunk, third's first output token, second waits
    assert batch.requests == [first, third] and batch.prefill_lens == [16, 0]
    advance(batch)
    first.num_cached = 64
    batch = scheduler.schedule()
    assert batch.requests == [first, second, third] and batch.prefill_lens == [0, 10, 0]
    tight = Scheduler(num_slots=2, max_prefill_tokens=4, prefill_chunk_size=16)
    big = make(40)
    tight.add(big)
    assert tight.schedule().prefill_lens == [16]  # larger than the budget, but alone: it runs


def test_a_request_finished_mid_prompt_leaves_its_slot(make):
    scheduler = Scheduler(num_slots=1, max_prefill_tokens=8192, prefill_chunk_size=8)
    first, second = make(30), make(4)
    scheduler.add(first)
    scheduler.add(second)
    advance(scheduler.schedule())
    scheduler.finish(first)
    batch = scheduler.schedule()
    assert batch.requests == [second] and batch.prefill_lens == [4]


# ----------------------------------------------------------------- configuration
@pytest.mark.parametrize("value", [0, -3, True, 2.5, "512"])
def test_a_bad_chunk_size_is_a_clear_error(tiny_dir, value):
    with pytest.raises(ValueError, match="prefill_chunk_size must be an int >= 1"):
        EngineConfig(prefill_chunk_size=value)
    with pytest.raises(ValueError, match="prefill_chunk_size"):
        load(tiny_dir, prefill_chunk_size=value)


def test_the_default_chunk_size_depends_on_the_device():
    config = EngineConfig()
    assert config.resolved_prefill_chunk_size(torch.device("cpu")) == 512
    assert config.resolved_prefill_chunk_size(torch.device("cuda")) == 2048
    assert EngineConfig(prefill_chunk_size=7).resolved_prefill_chunk_size(torch.device("cpu")) == 7


# ----------------------------------------------------------------- the engine
def test_chunked_prefill_gives_the_tokens_of_whole_prefill(tiny_dir, kernels):
    whole = load(tiny_dir, prefill_chunk_size=4096)
    chunked = load(tiny_dir, prefill_chunk_size=16)
    try:
        prompts = [prompt_ids(100), prompt_ids(37, 3), prompt_ids(16, 5), prompt_ids(5, 1)]
        expected = [o.token_ids for o in whole.generate(prompts, GREEDY)]
        assert [o.token_ids for o in chunked.generate(prompts, GREEDY)] == expected
        # The first logits after a chunked prompt, against the whole prompt's (float32).
        params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)
        a = whole.generate(prompts[0], params).logprobs[0]
        b = chunked.generate(prompts[0], params).logprobs[0]
        assert [t.token_id for t in a.top] == [t.token_id for t in b.top]
        assert max(abs(x.logprob - y.logprob) for x, y in zip(a.top, b.top)) < 1e-4
    finally:
        whole.close()
        chunked.close()


def test_a_decoding_request_gets_a_token_every_pass_while_a_long_prompt_is_fed(tiny_dir, kernels):
    # A token a pass while it decodes alone too (start_decoding counts passes).
    llm = load(tiny_dir, prefill_chunk_size=16, max_decode_steps=1)
    reference = load(tiny_dir, prefill_chunk_size=4096)
    try:
        decoding, params = start_decoding(llm, 3)
        arriving = llm.make_request(prompt_ids(120, 2), GREEDY)
        llm.engine.add_request(arriving)
        counts = []
        for _ in range(8):
            llm.engine.step()
            counts.append((len(decoding.output_token_ids), len(arriving.output_token_ids)))
        # 120 prompt tokens in chunks of 16: 8 passes, the last of which samples a token; the
        # decoding request gained one token in each of them.
        assert counts == [(4 + i, 0) for i in range(7)] + [(11, 1)]
        run_to_end(llm, [])
        expected = reference.generate([prompt_ids(6), prompt_ids(120, 2)], [params, GREEDY])
        assert decoding.output_token_ids == expected[0].token_ids
        assert arriving.output_token_ids == expected[1].token_ids
    finally:
        llm.close()
        reference.close()


def test_a_seeded_requests_tokens_do_not_depend_on_its_batch(tiny_dir, kernels):
    llm = load(tiny_dir, prefill_chunk_size=16, max_prefill_tokens=24)
    try:
        seeded = SamplingParams(temperature=1.0, max_tokens=15, seed=11, ignore_eos=True)
        alone = llm.generate(prompt_ids(70, 1), seeded).token_ids
        # Beside other prompts, the budget of 24 prompt tokens per pass delays its chunks.
        batch = llm.generate(
            [prompt_ids(30, 4), prompt_ids(70, 1), prompt_ids(9, 2)], [GREEDY, seeded, GREEDY]
        )
        assert batch[1].token_ids == alone
    finally:
        llm.close()


def test_abort_mid_prompt_frees_the_slot_and_the_engine_goes_on(tiny_dir):
    llm = load(tiny_dir, prefill_chunk_size=8, max_batch_size=1)
    try:
        request = llm.make_request(prompt_ids(60), GREEDY)
        llm.engine.add_request(request)
        llm.engine.step()
        assert request.num_cached == 8 and request.is_prefilling
        llm.engine.abort_request(request.request_id)
        assert request.slot is None and llm.engine.scheduler.slots.num_free == 1
        out = llm.generate(prompt_ids(60), GREEDY)
        assert len(out.token_ids) == GREEDY.max_tokens
    finally:
        llm.close()


def test_constrained_and_logprob_requests_with_chunked_prompts(tiny_dir):
    llm = load(tiny_dir, prefill_chunk_size=8)
    try:
        text = "The quick brown fox jumps over the lazy dog. " * 6
        params = SamplingParams(temperature=0.0, max_tokens=20, choice=["yes", "no"], logprobs=2)
        outs = llm.generate([text, text[:40]], params)
        assert all(o.text in ("yes", "no") for o in outs)
        assert all(o.logprobs and o.logprobs[0].token_id == o.token_ids[0] for o in outs)
    finally:
        llm.close()


def test_speculative_engines_verify_in_the_passes_that_take_prompt_chunks(tiny_dir):
    plain = load(tiny_dir, prefill_chunk_size=4096)
    drafted = load(tiny_dir, draft=tiny_dir, num_speculative_tokens=3, prefill_chunk_size=16)
    try:
        decoding, params = start_decoding(drafted, 2)
        steps_before = decoding.speculative.num_steps
        arriving = drafted.make_request(prompt_ids(90, 2), GREEDY)
        drafted.engine.add_request(arriving)
        proposer = drafted.engine.speculator.proposer
        target_rows: list[list[int]] = []  # each target pass's rows (tokens fed per row)
        spy_on_passes(
            drafted.engine.runner,
            lambda batch: target_rows.append(list(map(len, batch.token_ids))),
        )
        draft_rows: list[int] = []  # the longest row of each draft pass
        spy_on_passes(
            proposer.runner, lambda batch: draft_rows.append(max(map(len, batch.token_ids)))
        )
        gained, drafted_prompt = [], []
        for _ in range(6):  # 90 prompt tokens: six chunks, each beside a verification step
            before = len(decoding.output_token_ids)
            drafted.engine.step()
            gained.append(len(decoding.output_token_ids) - before)
            drafted_prompt.append(proposer.num_cached_tokens(arriving.slot))
        assert arriving.num_cached == 90 and len(arriving.output_token_ids) == 1
        assert all(gained)  # the decoding request got tokens in every pass
        assert decoding.speculative.num_steps - steps_before == 6
        # One pass each: the verification row (1 token + up to 3 proposals), then the chunk.
        assert [rows[1] for rows in target_rows] == [16] * 5 + [10]
        assert all(2 <= rows[0] <= 4 for rows in target_rows), target_rows
        # The draft model takes the prompt in the same chunks, in the chunks' passes.
        assert drafted_prompt == [16, 32, 48, 64, 80, 90]
        assert max(draft_rows) == 16
        run_to_end(drafted, [])
        expected = plain.generate([prompt_ids(6), prompt_ids(90, 2)], [params, GREEDY])
        assert decoding.output_token_ids == expected[0].token_ids
        assert arriving.output_token_ids == expected[1].token_ids
    finally:
        plain.close()
        drafted.close()


@pytest.mark.parametrize("draft", ["model", "ngram"])
def test_a_seeded_speculative_request_is_unmoved_by_an_arriving_prompt(tiny_dir, draft):
    llm = load(
        tiny_dir,
        draft=tiny_dir if draft == "model" else "ngram",
        num_speculative_tokens=3,
        prefill_chunk_size=16,
    )
    try:
        for seed in range(3):
            runs = []
            for other in (False, True):
                params = SamplingParams(temperature=1.0, max_tokens=25, seed=seed, ignore_eos=True)
                request = llm.make_request(prompt_ids(8, seed), params)
                llm.engine.add_request(request)
                for _ in range(3):
                    llm.engine.step()
                arriving = [llm.make_request(prompt_ids(70, 9), GREEDY)] if other else []
                run_to_end(llm, arriving)
                runs.append((request.output_token_ids, request.speculative.num_steps))
            assert runs[0] == runs[1], f"seed {seed}"
    finally:
        llm.close()


def fail_rows_longer_than(llm: LLM, length: int):
    """Make the target's passes fail (as out of memory) when a row feeds more than ``length``
    tokens; returns a function that undoes it."""
    runner = llm.engine.runner
    forward, forward_greedy = runner.forward, runner.forward_greedy

    def out_of_memory_on_long_rows(batch, *greedy_columns):
        if any(len(tokens) > length for tokens in batch.token_ids):
            raise RuntimeError("simulated out of memory")
        return forward_greedy(batch, *greedy_columns) if greedy_columns else forward(batch)

    def restore() -> None:
        runner.forward, runner.forward_greedy = forward, forward_greedy

    runner.forward = runner.forward_greedy = out_of_memory_on_long_rows
    return restore


@pytest.mark.parametrize("draft", [None, "model"])
def test_a_pass_that_fails_on_a_chunk_fails_only_that_request(tiny_dir, draft):
    speculative = {"draft": tiny_dir, "num_speculative_tokens": 3} if draft else {}
    llm = load(tiny_dir, prefill_chunk_size=64, **speculative)
    try:
        fail_rows_longer_than(llm, 32)
        decoding, _ = start_decoding(llm, 3)
        arriving = llm.make_request(prompt_ids(100), GREEDY)
        llm.engine.add_request(arriving)
        before = len(decoding.output_token_ids)
        results = llm.engine.step()
        assert [r for r, _ in results] == [decoding, arriving]
        assert isinstance(results[1][1], RuntimeError) and arriving.finish_reason == "error"
        assert len(decoding.output_token_ids) > before and llm.engine.scheduler.slots.num_free == 3
        run_to_end(llm, [])
        assert decoding.finish_reason == "length" and len(decoding.output_token_ids) == 30
    finally:
        llm.close()


def test_a_failed_pass_leaves_a_seeded_requests_draft_draws_alone(tiny_dir, tmp_path):
    """The draft's sampled proposals of a pass that failed (on another request's prompt) had
    drawn from the seeded request's draft generator: run again, it proposed and emitted other
    tokens than alone (from the 4th token)."""
    from tests.tiny import make_tiny_checkpoint

    draft = make_tiny_checkpoint(tmp_path / "draft", seed=7, num_hidden_layers=1)
    settings = dict(draft=draft, num_speculative_tokens=3, draft_length="fixed")
    seeded = SamplingParams(temperature=1.0, seed=5, max_tokens=40, ignore_eos=True)
    llm = load(tiny_dir, prefill_chunk_size=32, **settings)
    try:
        alone = llm.generate(prompt_ids(5), seeded).token_ids
        fail_rows_longer_than(llm, 19)
        request = llm.make_request(prompt_ids(5), seeded)
        llm.engine.add_request(request)
        for _ in range(2):
            llm.engine.step()
        arriving = llm.make_request(prompt_ids(100), GREEDY)
        llm.engine.add_request(arriving)
        results = dict(llm.engine.step())
        assert isinstance(results[arriving], RuntimeError)
        assert not isinstance(results[request], BaseException)
        run_to_end(llm, [])
        assert request.output_token_ids == alone
    finally:
        llm.close()


@pytest.mark.parametrize("draft", [None, "model"])
@pytest.mark.parametrize("decoding_beside", [False, True])
def test_a_failed_pass_of_several_prompts_fails_only_the_prompt_that_fails(
    tiny_dir, draft, decoding_beside
):
    # The prompts' chunks of a failed pass ran again together, so a prompt too large for memory
    # failed the prompts that had arrived with it too.
    speculative = {"draft": tiny_dir, "num_speculative_tokens": 3} if draft else {}
    llm = load(tiny_dir, prefill_chunk_size=64, **speculative)
    try:
        restore = fail_rows_longer_than(llm, 32)
        decoding = [start_decoding(llm, 3)[0]] if decoding_beside else []
        short = [llm.make_request(prompt_ids(n, n), GREEDY) for n in (20, 12)]
        long = llm.make_request(prompt_ids(100), GREEDY)
        for request in (short[0], long, short[1]):
            llm.engine.add_request(request)
        results = dict(llm.engine.step())
        assert set(results) == {*decoding, *short, long}
        assert isinstance(results[long], RuntimeError) and long.finish_reason == "error"
        assert not any(isinstance(results[r], BaseException) for r in (*decoding, *short))
        run_to_end(llm, [])
        restore()
        for request in short:  # the same tokens as the prompt alone
            alone = llm.generate(request.prompt_token_ids, GREEDY).token_ids
            assert request.finish_reason == "length" and request.output_token_ids == alone
    finally:
        llm.close()


@pytest.mark.parametrize("draft", [None, "model"])
def test_a_failed_pass_waits_for_its_grammar_masks_before_running_its_parts(
    tiny_dir, draft, monkeypatch
):
    # A pass's grammar masks are filled in a worker thread while the model runs (where a CPU is
    # free for it: made so here). When the pass fails, its decoding rows run again at once: the
    # engine thread must not touch a matcher (llguidance allows one caller at a time) until that
    # worker is done with them.
    import threading
    import time

    import brisklm.engine.structured as structured
    from brisklm.constrained.matcher import GrammarMatcher

    monkeypatch.setattr(structured.StructuredOutputs, "overlaps", lambda self: True)

    speculative = {"draft": tiny_dir, "num_speculative_tokens": 4} if draft else {}
    constrained = SamplingParams(temperature=0.0, max_tokens=30, regex=r"(ab|cd|[a-z]{2,5} )+\.")
    prompts = [prompt_ids(6, k) for k in range(3)]
    plain = load(tiny_dir)
    llm = load(tiny_dir, prefill_chunk_size=64, **speculative)
    try:
        expected = [o.token_ids for o in plain.generate(prompts, constrained)]
        slow, filling = threading.Event(), threading.Event()
        overlaps: list[str] = []  # matcher calls on the engine thread while the worker fills

        def in_worker() -> bool:
            return threading.current_thread().name.startswith("brisklm-grammar")

        def slowed(fill):
            def slow_fill(*args, **kwargs):
                if slow.is_set() and in_worker():
                    filling.set()
                    time.sleep(0.05)  # as a large vocabulary's masks take
                    try:
                        return fill(*args, **kwargs)
                    finally:
                        filling.clear()
                return fill(*args, **kwargs)

            return slow_fill

        def watched(name):
            method = getattr(GrammarMatcher, name)

            def call(self, *args, **kwargs):
                if filling.is_set() and not in_worker():
                    overlaps.append(name)
                return method(self, *args, **kwargs)

            return call

        for name in ("accept_token", "accept_tokens", "validate_tokens", "rollback"):
            monkeypatch.setattr(GrammarMatcher, name, watched(name))
        monkeypatch.setattr(GrammarMatcher, "compute_ff_tokens", watched("compute_ff_tokens"))
        monkeypatch.setattr(GrammarMatcher, "fill_bitmask", slowed(GrammarMatcher.fill_bitmask))
        monkeypatch.setattr(structured, "fill_bitmasks", slowed(structured.fill_bitmasks))
        forward = llm.engine.runner.forward

        def out_of_memory_on_long_rows(batch):
            if any(len(tokens) > 32 for tokens in batch.token_ids):
                if len(batch.token_ids) > 1:  # the mixed pass: its masks are being filled
                    assert filling.wait(10)
                raise RuntimeError("simulated out of memory")
            return forward(batch)

        llm.engine.runner.forward = out_of_memory_on_long_rows
        requests = [llm.make_request(p, constrained) for p in prompts]
        for request in requests:
            llm.engine.add_request(request)
        llm.engine.step()
        slow.set()
        arriving = llm.make_request(prompt_ids(100), GREEDY)
        llm.engine.add_request(arriving)
        failed = [r for r, result in llm.engine.step() if isinstance(result, BaseException)]
        slow.clear()
        assert failed == [arriving] and not overlaps, overlaps
        run_to_end(llm, [])
        assert [r.output_token_ids for r in requests] == expected
    finally:
        plain.close()
        llm.close()


def test_dynamic_ntk_past_the_trained_context_feeds_prompts_whole(tmp_path):
    # Dynamic NTK rotates a pass's keys by its longest position, so chunks would change them.
    from tests.tiny import make_tiny_checkpoint

    rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    path = make_tiny_checkpoint(
        tmp_path / "dynamic", max_position_embeddings=64, rope_parameters=rope
    )
    past = load(path, max_seq_len=256, prefill_chunk_size=16)
    within = load(path, max_seq_len=64, prefill_chunk_size=16)
    whole = load(path, max_seq_len=256, prefill_chunk_size=4096)
    try:
        assert past.engine.prefill_chunk_size == 256
        assert within.engine.prefill_chunk_size == 16  # the scaling never starts there
        prompt = prompt_ids(150)
        assert past.generate(prompt, GREEDY).token_ids == whole.generate(prompt, GREEDY).token_ids
    finally:
        for llm in (past, within, whole):
            llm.close()


def test_dynamic_ntk_past_the_trained_context_takes_forced_tokens_one_a_step(tmp_path):
    """Tokens a grammar forces were fed with the sampled one as one row: past the trained context
    dynamic NTK rotated that row by its last position, and the output differed (from 19 tokens in)
    from the same request with logprobs, which takes forced tokens one a step as transformers'
    decoding does."""
    from tests.tiny import make_tiny_checkpoint

    rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    path = make_tiny_checkpoint(
        tmp_path / "dynamic",
        max_position_embeddings=64,
        rope_parameters=rope,
        initializer_range=0.5,
    )
    llm = load(path, max_seq_len=300)
    try:
        prompt = prompt_ids(90)
        regex = r"[a-z]{3} the quick brown fox jumps over the lazy dog and then [a-z ]{40}"
        outputs = [
            llm.generate(
                prompt, SamplingParams(temperature=0, max_tokens=120, regex=regex, logprobs=n)
            )
            for n in (None, 1)
        ]
        assert outputs[0].token_ids == outputs[1].token_ids
        assert outputs[0].finish_reason == "stop"
    finally:
        llm.close()


def test_native_calls_take_rows_longest_first(tiny_dir, kernels):
    if kernels != "native":
        pytest.skip("the native pass's call limit")
    llm = load(tiny_dir, max_seq_len=512, max_batch_size=4)
    try:
        runner = llm.engine.runner
        calls = []
        forward = runner.native.forward

        def recording(token_ids, *args):
            calls.append([len(t) for t in token_ids])
            return forward(token_ids, *args)

        runner.native.forward = recording
        rows = [[11], prompt_ids(512), [12], prompt_ids(300)]
        logits = runner.forward(ForwardBatch([0, 1, 2, 3], [5, 0, 7, 0], rows, [1, 1, 1, 1]))
        # 512 fills a call; 300 and both one-token rows share the next (rows in batch order).
        assert calls == [[512], [1, 1, 300]]
        assert logits.shape[0] == 4
        alone = runner.forward(ForwardBatch([2], [7], [[12]], [1]))
        assert torch.equal(logits[2], alone[0])
    finally:
        llm.close()


# ----------------------------------------------------------------- attention over a mixed batch
def mixed_batch(row_invariant: bool):
    torch.manual_seed(0)
    heads, kv_heads, dim, slots, positions = 4, 2, 16, 4, 64
    # Rows: a decoding row, a 9-token chunk at 16, another decoding row, a 5-token chunk at 0.
    meta = AttentionMetadata.build(
        [0, 1, 2, 3], [20, 16, 33, 0], [1, 9, 1, 5], "cpu", row_invariant
    )
    n = meta.num_tokens
    q = torch.randn(n, heads, dim)
    k, v = torch.randn(n, kv_heads, dim), torch.randn(n, kv_heads, dim)
    cache = torch.randn(2, slots, kv_heads, positions, dim)
    return meta, q, k, v, cache


def test_a_mixed_batch_splits_into_decoding_rows_and_chunks():
    meta, *_ = mixed_batch(False)
    single, longer = meta.split_single_token_rows()
    assert single[0].query_lens == [1, 1] and single[0].slot_list == [0, 2]
    assert longer[0].query_lens == [9, 5] and longer[0].start_positions == [16, 0]
    assert single[1].tolist() == [0, 10]  # not contiguous: an index
    assert longer[1].tolist() == list(range(1, 10)) + list(range(11, 16))
    contiguous = AttentionMetadata.build([0, 1, 2], [5, 6, 0], [1, 1, 4], "cpu")
    assert [index for _, index in contiguous.split_single_token_rows()] == [
        slice(0, 2),
        slice(2, 6),
    ]
    for uniform in ([1, 1], [3, 5]):
        assert (
            AttentionMetadata.build([0, 1], [4, 0], uniform, "cpu").split_single_token_rows()
            is None
        )


class RecordingSdpa(SdpaAttention):
    def __init__(self) -> None:
        self.calls: list[AttentionMetadata] = []

    def forward(self, q, k, v, k_cache, v_cache, meta, sliding_window):
        self.calls.append(meta)
        return super().forward(q, k, v, k_cache, v_cache, meta, sliding_window)


@pytest.mark.parametrize("row_invariant", [False, True])
def test_attention_over_a_mixed_batch_matches_the_reference(row_invariant):
    meta, q, k, v, cache = mixed_batch(row_invariant)
    expected_cache = cache.clone()
    expected = ReferenceAttention().forward(
        q, k, v, expected_cache[0], expected_cache[1], meta, None
    )
    backend = RecordingSdpa()
    got = backend.attend(q, k, v, cache[0], cache[1], meta, None)
    assert torch.allclose(got, expected, atol=1e-5)
    # Two calls, one per group: no decoding row padded to a chunk's length.
    assert [m.query_lens for m in backend.calls] == [[1, 1], [9, 5]]
    assert torch.equal(cache, expected_cache)  # every row's keys and values written
    windowed = ReferenceAttention().forward(q, k, v, cache[0], cache[1], meta, 6)
    assert torch.allclose(
        SdpaAttention().attend(q, k, v, cache[0], cache[1], meta, 6), windowed, atol=1e-5
    )


def test_a_runner_pass_of_a_decoding_row_and_a_chunk_equals_each_row_alone(tiny_dir, kernels):
    llm = load(tiny_dir)
    try:
        runner = llm.engine.runner
        first, second = prompt_ids(40), prompt_ids(30, 5)
        runner.forward(ForwardBatch([0], [0], [first[:39]], [0]))
        runner.forward(ForwardBatch([1], [0], [second[:16]], [0]))
        mixed = runner.forward(ForwardBatch([0, 1], [39, 16], [first[39:], second[16:]], [1, 1]))
        runner.forward(ForwardBatch([2], [0], [first], [0]))
        alone = runner.forward(ForwardBatch([2], [39], [first[39:]], [1]))
        runner.forward(ForwardBatch([3], [0], [second[:16]], [0]))
        chunk_alone = runner.forward(ForwardBatch([3], [16], [second[16:]], [1]))
        assert torch.allclose(mixed[0], alone[0], atol=1e-5)
        assert torch.allclose(mixed[1], chunk_alone[0], atol=1e-5)
    finally:
        llm.close()


def test_streams_of_chunked_prompts_give_the_generated_text(tiny_dir):
    import asyncio

    llm = load(tiny_dir, prefill_chunk_size=8)
    try:
        text = "Zürich and 東京 are cities; the quick brown fox jumps over the lazy dog. " * 3
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        expected = llm.generate(text, params).text

        async def astream() -> str:
            return "".join([delta async for delta in llm.astream(text, params)])

        assert "".join(llm.stream(text, params)) == expected
        assert asyncio.run(astream()) == expected
    finally:
        llm.close()


def test_a_scheduler_runs_at_most_max_running_requests(make) -> None:
    # Slots past max_running only keep prefixes (EngineConfig.prefix_cache_slots).
    scheduler = Scheduler(num_slots=3, max_prefill_tokens=64, prefill_chunk_size=8, max_running=1)
    requests = [make(3) for _ in range(3)]
    for request in requests:
        scheduler.add(request)
    batch = scheduler.schedule()
    assert batch is not None and batch.requests == [requests[0]]
    assert list(scheduler.waiting) == requests[1:] and scheduler.slots.num_free == 2
    with pytest.raises(ValueError, match=r"max_running must be in \[1, 3\], got 4"):
        Scheduler(num_slots=3, max_prefill_tokens=64, prefill_chunk_size=8, max_running=4)
