"""Prefix caching: a finished request's keys and values serve a later prompt that starts alike,
and the outputs are those of an engine that computes every prompt whole."""

from __future__ import annotations

import pytest
import torch

from brisklm import LLM, SamplingParams
from brisklm.cache.prefix_cache import MIN_REUSE, PrefixCache, common_prefix_length
from brisklm.engine.llm_engine import EngineConfig
from brisklm.engine.request import RequestStatus
from brisklm.engine.scheduler import Scheduler
from brisklm.quant import QuantizeOptions, quantize_model
from tests.tiny import make_tiny_checkpoint

SHAPE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
SYSTEM = (
    "You are a helpful assistant. The quick brown fox jumps over the lazy dog in São Paulo, "
    "and the cities of the world answer in kind. "
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, logprobs=2)
SEEDED = SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=12, logprobs=1)


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([5], [1]) == 0


def test_a_request_takes_the_slot_sharing_its_longest_prefix() -> None:
    cache = PrefixCache()
    shared = list(range(100, 100 + MIN_REUSE + 4))
    cache.retain(0, [*shared, 1, 2])
    cache.retain(1, [*shared[:-2], 9])
    # Slot 0 holds more than the shared prefix: the prefix is copied to the empty slot 2.
    assert cache.choose([*shared, 7], [0, 1, 2]) == (2, len(shared), 0)
    assert cache.cached_tokens(0) == [*shared, 1, 2]
    # With no empty slot, the request takes slot 0 itself, retained longest ago.
    assert cache.choose([*shared, 7], [0, 1]) == (0, len(shared), None)
    assert cache.cached_tokens(0) == []  # taken: what it held is the new request's to overwrite
    # Where another slot was retained before it, the prefix is copied there and slot 0 stays.
    cache.retain(0, [*shared, 1, 2])
    assert cache.choose([*shared, 7], [0, 1]) == (1, len(shared), 0)
    assert cache.cached_tokens(0) == [*shared, 1, 2] and cache.cached_tokens(1) == []
    # But a prompt sharing the whole of slot 0's request's prompt (its conversation's next turn,
    # parting from the reply as the template renders it) takes the slot: a review found it
    # copying its history and evicting another conversation.
    cache.retain(1, [5, 6, 7])
    cache.retain(0, [*shared, 1, 2], prompt_length=len(shared))
    assert cache.choose([*shared, 1, 9], [0, 1]) == (0, len(shared) + 1, None)
    cache.retain(1, [*shared[:-2], 9])
    # A prompt the slot holds whole still computes its last token (its logits start the output),
    # and a slot holding just the shared prefix is taken, not copied.
    cache.retain(0, shared)
    assert cache.choose(shared, [0, 1, 2]) == (0, len(shared) - 1, None)
    cache.retain(0, shared)
    assert cache.choose([*shared, 3], [0, 1, 2]) == (0, len(shared), None)


def test_a_short_match_takes_an_empty_slot_and_a_full_cache_gives_up_its_oldest() -> None:
    cache = PrefixCache()
    cache.retain(0, [1, 2, 3, 4])
    cache.retain(1, [5, 6])
    # Three shared tokens are not worth another prompt's slot while slot 2 is empty.
    assert cache.choose([1, 2, 3, 9], [0, 1, 2]) == (2, 0, None)
    # No empty slot: any reuse beats none, and with none the slot retained longest ago goes.
    assert cache.choose([1, 2, 3, 9], [0, 1]) == (0, 3, None)
    cache.retain(0, [7, 8])
    assert cache.choose([3, 3], [0, 1]) == (1, 0, None)
    assert cache.cached_tokens(1) == [] and cache.cached_tokens(0) == [7, 8]
    # A few more shared tokens (a template's opening) do not outweigh age: the older slot goes,
    # with what it shares (it took the newer, a conversation more likely to come back).
    cache.retain(0, [1, 2, 9, 9])
    cache.retain(1, [1, 2, 3, 9])
    assert cache.choose([1, 2, 3, 5], [0, 1]) == (0, 2, None)
    with pytest.raises(ValueError, match="no free slot"):
        cache.choose([1], [])


def test_prefix_caching_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="prefix_caching must be True or False, got 'yes'"):
        EngineConfig(prefix_caching="yes")  # type: ignore[arg-type]


def _run(llm: LLM) -> list:
    prompts = [
        SYSTEM + "Tell me about the dog.",
        SYSTEM + "Tell me about the fox and the cities.",
        SYSTEM + "Tell me about the dog.",  # the same prompt again
        SYSTEM[:30] + " something else entirely",  # a short shared start
        SYSTEM + "Tell me about the dog. And then more about the lazy fox, please.",
    ]
    outputs = []
    for prompt in prompts:  # one at a time: each finds the previous ones' slots
        for params in (GREEDY, SEEDED):
            outputs.append(llm.generate(prompt, params))
    # The previous output continued: its whole sequence (prompt and output) is in a slot.
    last = outputs[-1]
    outputs.append(llm.generate(last.prompt_token_ids + last.token_ids + [5], GREEDY))
    # A batch of three admitted together, beside each other's prefixes, and a constrained one.
    outputs += llm.generate(
        [SYSTEM + "Who are you?", SYSTEM + "Where is São Paulo?", SYSTEM + "Why?"],
        [
            GREEDY,
            SEEDED,
            SamplingParams(temperature=0.0, max_tokens=30, regex="(yes|no), [a-z ]{3,12}"),
        ],
    )
    return outputs


def _same(cached: list, plain: list) -> None:
    for a, b in zip(cached, plain, strict=True):
        assert a.token_ids == b.token_ids and a.text == b.text
        assert a.finish_reason == b.finish_reason
        assert a.logprobs == b.logprobs
        assert a.usage.prompt_tokens == b.usage.prompt_tokens
        assert b.usage.cached_prompt_tokens == 0


def _with_and_without(directory, run, **options) -> dict[bool, list]:
    """``run(llm)``'s outputs on an engine with prefix caching (True) and one without (False),
    checked equal."""
    outputs = {}
    for prefix_caching in (True, False):
        with LLM.from_pretrained(
            directory, show_progress=False, prefix_caching=prefix_caching, **options
        ) as llm:
            outputs[prefix_caching] = run(llm)
    _same(outputs[True], outputs[False])
    return outputs


def _check(directory, granularity: int = 1, **options) -> None:
    def run(llm: LLM) -> list:
        if llm.engine.prefix_cache is not None:
            assert llm.engine.prefix_cache.granularity == granularity
        return _run(llm)

    outputs = _with_and_without(directory, run, max_batch_size=3, max_seq_len=256, **options)
    out = outputs[True]
    reused = [o.usage.cached_prompt_tokens for o in out]

    def cut(n: int) -> int:
        return n // granularity * granularity

    assert reused[0] == 0 and reused[2] > 20, reused  # the system prompt
    # The same prompt again: all but its last token (whose logits give the first output).
    for index in (1, 3, 4, 5, 9):
        assert reused[index] == cut(len(out[index].prompt_token_ids) - 1), (index, reused)
    # A continued sequence: its prompt and output but the last token (never fed) are reused
    # through the native pass; elsewhere the prompt's whole chunks (decode steps compute the
    # output's keys otherwise than prompt chunks).
    previous = len(out[9].prompt_token_ids)
    if granularity == 1:
        assert reused[10] == previous + len(out[9].token_ids) - 1, reused
    else:
        assert reused[10] == cut(previous), reused
    # The batch: two slots hold the system prompt, the third only the short shared start.
    assert min(reused[11:13]) > 20 and reused[13] > 0, reused


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("prefix-llama"), **SHAPE)


def test_outputs_with_prefix_caching_are_those_without(float_dir, kernels) -> None:
    # The native pass reuses any prefix (a reused prefix ends inside a chunk of 8); torch's ops
    # whole chunks.
    _check(float_dir, 1 if kernels == "native" else 8, prefill_chunk_size=8)


def test_a_sliding_window_model_reuses_prefixes_longer_than_its_window(tmp_path) -> None:
    directory = make_tiny_checkpoint(tmp_path / "mistral", family="mistral", sliding_window=8)
    _check(directory)


def test_an_int4_model_and_a_draft_reuse_prefixes_with_the_same_output(float_dir, tmp_path) -> None:
    gptq = tmp_path / "gptq"
    quantize_model(
        float_dir, gptq, QuantizeOptions(method="rtn", group_size=32), show_progress=False
    )
    _check(gptq)  # through the native pass: any prefix
    # Torch's int4 kernel (bfloat16 products; off the native pass): whole chunks.
    _check(gptq, 8, prefill_chunk_size=8, int4_compute_dtype="bfloat16")
    _check(float_dir, draft=float_dir)
    _check(gptq, 16, draft="ngram", prefill_chunk_size=16, int4_compute_dtype="bfloat16")


def test_keys_a_long_forced_run_wrote_through_torchs_ops_are_not_reused(
    float_dir, monkeypatch
) -> None:
    # A grammar's forced run is fed as one row; one longer than the native pass takes runs through
    # torch's ops, which round otherwise: its keys were reused, and the next request's logprobs
    # moved (the native pass gave 512 tokens; 16 here).
    from brisklm.engine import model_runner

    monkeypatch.setattr(model_runner, "MAX_QUERY_LEN", 16)
    literal = "the quick brown fox jumps over the lazy dog " * 3
    forced = SamplingParams(temperature=0.0, max_tokens=80, regex="Yes: " + literal + "(ok|no)")

    def run(llm: LLM) -> list:
        first = llm.generate("Question: say it.", forced)
        assert len(first.token_ids) > 20
        return [first, llm.generate(first.prompt_token_ids + first.token_ids + [5], GREEDY)]

    outputs = _with_and_without(float_dir, run, max_batch_size=2, prefill_chunk_size=8)
    first = outputs[True][0]
    # Reused: the prompt and the output up to the forced run (its first token or two are sampled).
    reused = outputs[True][1].usage.cached_prompt_tokens
    assert len(first.prompt_token_ids) <= reused < len(first.prompt_token_ids) + 4


def test_a_failed_request_leaves_nothing_to_reuse(float_dir, monkeypatch) -> None:
    with LLM.from_pretrained(float_dir, max_batch_size=2, show_progress=False) as llm:
        first = llm.generate(SYSTEM + "one", GREEDY)
        engine = llm.engine
        retained = [s for s in range(2) if engine.prefix_cache.cached_tokens(s)]
        assert len(retained) == 1
        real = engine._run

        def fail(batch):
            raise RuntimeError("the pass failed")

        monkeypatch.setattr(engine, "_run", fail)
        with pytest.raises(RuntimeError, match="the pass failed"):
            llm.generate(SYSTEM + "two", GREEDY)
        monkeypatch.setattr(engine, "_run", real)
        # The failed request had the prefix copied into the other slot: that slot is cleared.
        (other,) = set(range(2)) - set(retained)
        assert engine.prefix_cache.cached_tokens(other) == []
        assert not engine.runner.kv_cache.keys[:, other].any()
        assert [s for s in range(2) if engine.prefix_cache.cached_tokens(s)] == retained
        again = llm.generate(SYSTEM + "one", GREEDY)
        assert again.token_ids == first.token_ids and again.usage.cached_prompt_tokens > 20


def test_dynamic_rope_past_the_trained_context_does_not_cache_prefixes(tmp_path) -> None:
    directory = make_tiny_checkpoint(
        tmp_path / "dynamic",
        max_position_embeddings=64,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
    )
    with LLM.from_pretrained(directory, max_seq_len=128, show_progress=False) as llm:
        assert llm.engine.prefix_cache is None
    with LLM.from_pretrained(directory, max_seq_len=64, show_progress=False) as llm:
        assert llm.engine.prefix_cache is not None


def test_slots_keeping_prefixes_are_not_allocated_where_none_is_kept(tmp_path, caplog) -> None:
    # Dynamic NTK past the trained context keeps no prefix: its engine dropped the extra slots,
    # but the draft's cache (and the memory check) still counted them.
    directory = make_tiny_checkpoint(
        tmp_path / "dynamic",
        max_position_embeddings=64,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
    )
    options = dict(max_batch_size=1, prefix_cache_slots=3, draft=directory, show_progress=False)
    with LLM.from_pretrained(directory, max_seq_len=128, **options) as llm:
        assert llm.engine.runner.kv_cache.num_slots == 1
        assert llm.engine.speculator.proposer.runner.kv_cache.num_slots == 1
    assert "prefix_cache_slots=3 unused" in caplog.text
    with LLM.from_pretrained(directory, max_seq_len=64, **options) as llm:
        assert llm.engine.runner.kv_cache.num_slots == 4
        assert llm.engine.speculator.proposer.runner.kv_cache.num_slots == 4


def test_chunks_longer_than_the_native_pass_are_reused_whole(float_dir, monkeypatch) -> None:
    # Chunks the native pass does not take (over 512 tokens; 16 here) are reused whole: the guard
    # against keys written through torch's ops cut every prompt's retained tokens to nothing.
    from brisklm.engine import model_runner

    monkeypatch.setattr(model_runner, "MAX_QUERY_LEN", 16)

    def run(llm: LLM) -> list:
        assert llm.engine.prefix_cache.granularity == 24 if llm.engine.prefix_cache else True
        prompt = llm.tokenizer.encode(SYSTEM * 2)[:70]
        return [llm.generate(prompt + [tail], GREEDY) for tail in (5, 5, 6)]

    outputs = _with_and_without(float_dir, run, max_batch_size=2, prefill_chunk_size=24)
    assert [o.usage.cached_prompt_tokens for o in outputs[True]] == [0, 48, 48]


def _keep_draft_keys_at_release(engine, keys: dict) -> None:
    """Have ``engine`` copy each finishing request's draft keys into ``keys`` (by whether the
    engine caches prefixes) before it releases the request."""
    proposer = engine.speculator.proposer
    release = engine.release

    def keep_keys(request) -> None:
        keys[engine.prefix_cache is not None] = proposer.runner.kv_cache.keys[
            :, request.slot, :, : request.num_cached
        ].clone()
        release(request)

    engine.release = keep_keys


def test_a_draft_takes_a_reused_prefix_in_the_chunks_it_takes_without_reuse(
    float_dir, monkeypatch
) -> None:
    # The draft's cache lags the target's by the reused prefix: it took the gap as one row (past
    # the native pass's length, through torch's ops), so its keys, and a seeded request's
    # acceptances, differed from a run without prefix caching.
    from brisklm.engine import model_runner

    monkeypatch.setattr(model_runner, "MAX_QUERY_LEN", 16)
    keys = {}

    def run(llm: LLM) -> list:
        engine = llm.engine
        proposer = engine.speculator.proposer
        proposer.keeps_prefixes = False  # a draft that keeps nothing: it takes the whole gap
        prompt = llm.tokenizer.encode(SYSTEM * 2)[:60]
        first = llm.generate(prompt + [5], SEEDED)
        _keep_draft_keys_at_release(engine, keys)
        return [first, llm.generate(prompt + [6], SEEDED)]

    outputs = _with_and_without(
        float_dir, run, max_batch_size=2, prefill_chunk_size=8, draft=float_dir
    )
    assert outputs[True][1].usage.cached_prompt_tokens == 60
    assert torch.equal(keys[True], keys[False])


def test_a_draft_model_keeps_and_reuses_prefixes_beside_the_target(float_dir) -> None:
    # The draft recomputed every reused prefix (a fifth of a chat call with tools on the bundled
    # pair); its kept keys are those it computes itself, so the output is unchanged.
    keys, first_feeds = {}, {}

    def run(llm: LLM) -> list:
        engine = llm.engine
        proposer = engine.speculator.proposer
        prefill = proposer.prefill

        def record_feed(rows) -> None:
            for row in rows:
                first_feeds.setdefault(engine.prefix_cache is not None, []).append(
                    proposer.num_cached_tokens(row.slot)
                )
            prefill(rows)

        prompt = llm.tokenizer.encode(SYSTEM * 2)[:60]
        first = llm.generate(prompt + [5], SEEDED)
        proposer.prefill = record_feed
        _keep_draft_keys_at_release(engine, keys)
        return [first, llm.generate(prompt + [6], SEEDED), llm.generate(prompt + [6], GREEDY)]

    outputs = _with_and_without(float_dir, run, max_batch_size=2, draft=float_dir)
    assert first_feeds[True][0] == 60 and first_feeds[False][0] == 0  # the draft reused 60
    assert torch.equal(keys[True], keys[False])
    assert [o.usage.cached_prompt_tokens for o in outputs[True][1:]] == [60, 60]


def test_requests_admitted_together_all_copy_a_prefix_one_of_them_claimed() -> None:
    cache = PrefixCache()
    shared = list(range(100, 100 + MIN_REUSE + 4))
    cache.retain(0, shared)
    # The first takes slot 0 in place; the next two copy the prefix from its running request
    # into the empty slots.
    assert cache.choose([*shared, 1], [0, 1, 2]) == (0, len(shared), None)
    running = [(0, shared)]
    assert cache.choose([*shared, 2], [1, 2], running) == (1, len(shared), 0)
    running.append((1, shared))
    assert cache.choose([*shared, 3], [2], running) == (2, len(shared), 0)
    # A running request's prompt computed further than the prefix it reused is copied as far.
    longer = [*shared, 1, 2, 3]
    assert cache.choose([*longer, 9], [3], [(0, shared), (1, longer)]) == (3, len(longer), 1)
    assert cache.best_reuse([*longer, 9], [4], [(0, shared), (1, longer)]) == len(longer)
    # A copy of fewer than MIN_REUSE tokens does not count; a retained slot beats a copy only
    # by reusing more.
    cache.retain(4, [7] * 20)
    assert cache.choose([*shared[:4], 4], [4, 5], running) == (5, 0, None)
    cache.retain(4, longer)
    assert cache.choose([*longer, 9], [4], [(1, longer)]) == (4, len(longer), None)


def test_n_samples_of_one_prompt_each_reuse_its_cached_prefix(float_dir) -> None:
    # Several requests admitted in one step that share a retained prefix: only the first reused it
    # (it took the slot, and the others saw only empty ones).
    def run(llm: LLM) -> list:
        first = llm.generate(SYSTEM + "one", GREEDY)
        prompt = first.prompt_token_ids + first.token_ids + [5, 6]
        seeded = [SamplingParams(temperature=1.0, seed=s, max_tokens=8) for s in (1, 2, 3)]
        return [first, *llm.generate([prompt] * 3, seeded)]

    outputs = _with_and_without(float_dir, run, max_batch_size=4)
    reused = [o.usage.cached_prompt_tokens for o in outputs[True][1:]]
    first = outputs[True][0]
    assert reused == [len(first.prompt_token_ids) + len(first.token_ids) - 1] * 3


def test_prefixes_computed_beside_other_rows_are_not_reused_off_the_native_pass(float_dir):
    # Off the native pass a row rounds by the rows beside it (torch's products and attention),
    # so keys computed in a shared pass are not those a request alone computes: reusing them
    # moved a later request's logprobs, alone (~1e-6).
    def run(llm: LLM) -> list:
        together = llm.generate([SYSTEM + "alpha beta", SYSTEM[:40] + " gamma"], [GREEDY] * 2)
        alone = llm.generate(SYSTEM + "alpha delta", GREEDY)
        return [*together, alone]

    outputs = _with_and_without(
        float_dir, run, max_batch_size=2, prefill_chunk_size=8, attention_backend="reference"
    )
    assert outputs[True][2].usage.cached_prompt_tokens == 0


def test_a_draft_with_dynamic_rope_past_its_context_keeps_no_prefixes(float_dir, tmp_path):
    # Its keys rotate by the longest position of the pass that computed them: kept ones were not
    # those a later request computes, and every seeded output moved.
    draft = make_tiny_checkpoint(
        tmp_path / "dynamic-draft",
        max_position_embeddings=64,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
    )

    def run(llm: LLM) -> list:
        if llm.engine.prefix_cache is not None:
            assert llm.engine.speculator.proposer.keeps_prefixes is False
        ids = llm.tokenizer.encode(SYSTEM * 3)
        outputs = [llm.generate(ids[:100] + [5], GREEDY)]
        return outputs + [llm.generate(ids[:90] + [6, 7], SEEDED) for _ in range(2)]

    outputs = _with_and_without(float_dir, run, max_batch_size=1, max_seq_len=256, draft=draft)
    assert outputs[True][1].usage.cached_prompt_tokens == 90


# ----------------------------------------------------------------- requests arriving together
def _scheduler(num_slots: int, claims: list, chunk_size: int = 16) -> Scheduler:
    """A scheduler over a prefix cache of granularity 1 whose running requests' prompts are
    copyable as far as computed; ``claims`` records each admission's (slot, reuse, source)."""
    return Scheduler(
        num_slots,
        max_prefill_tokens=8192,
        prefill_chunk_size=chunk_size,
        prefix_cache=PrefixCache(),
        claim_slot=lambda slot, length, source, prompt: claims.append((slot, length, source)),
        copyable=lambda r: min(r.num_cached, r.num_prompt_tokens),
    )


def _advance(batch) -> None:
    for request, n in zip(batch.requests, batch.prefill_lens):
        request.num_cached += n or 1


def test_a_request_waits_for_a_running_one_computing_the_prefix_it_shares(llm) -> None:
    claims: list = []
    scheduler = _scheduler(3, claims)
    shared = list(range(10, 50))  # 40 tokens: three chunks of 16
    leader = llm.make_request([*shared, 60, 61], GREEDY)
    follower = llm.make_request([*shared, 70], GREEDY)
    other = llm.make_request(list(range(100, 120)), GREEDY)
    for request in (leader, follower, other):
        scheduler.add(request)
    batch = scheduler.schedule()
    # The follower waits; the request behind it takes the slot left beside its kept one.
    assert batch.requests == [leader, other] and list(scheduler.waiting) == [follower]
    _advance(batch)
    _advance(scheduler.schedule())  # the leader's second chunk: 32 of the 40 computed
    assert list(scheduler.waiting) == [follower]
    _advance(scheduler.schedule())
    assert leader.num_cached == 42
    batch = scheduler.schedule()  # now it copies the 40 tokens and computes its last one
    assert follower in batch.requests and claims[-1] == (follower.slot, 40, leader.slot)
    assert follower.num_cached == follower.num_cached_prompt_tokens == 40
    assert batch.prefill_lens[batch.requests.index(follower)] == 1


def test_a_waiting_request_keeps_its_place_and_stops_waiting_for_a_request_gone(llm) -> None:
    claims: list = []
    scheduler = _scheduler(2, claims)
    shared = list(range(10, 50))
    leader, follower = (llm.make_request([*shared, t], GREEDY) for t in (60, 70))
    later = llm.make_request(list(range(100, 120)), GREEDY)
    for request in (leader, follower, later):
        scheduler.add(request)
    # Two slots: the leader's, and the one the follower keeps; the later request waits behind.
    assert scheduler.schedule().requests == [leader]
    assert list(scheduler.waiting) == [follower, later]
    scheduler.finish(leader)  # aborted before computing the prefix: nothing to wait for
    leader.status = RequestStatus.FINISHED
    assert scheduler.schedule().requests == [follower, later]
    assert claims[-2] == (follower.slot, 0, None)


def test_a_request_arriving_after_the_leaders_first_chunk_still_waits(llm) -> None:
    # The leader has computed 8 of the 20 shared tokens, too few to copy: the follower waits for
    # all 20 (it was admitted, copied nothing and computed them beside the leader).
    claims: list = []
    scheduler = _scheduler(2, claims, chunk_size=8)
    shared = list(range(10, 30))
    leader, follower = (llm.make_request([*shared, t, t], GREEDY) for t in (60, 70))
    scheduler.add(leader)
    _advance(scheduler.schedule())
    scheduler.add(follower)
    while leader.num_cached < len(shared):
        batch = scheduler.schedule()
        assert batch.requests == [leader]
        _advance(batch)
    assert follower in scheduler.schedule().requests
    assert claims[-1] == (follower.slot, len(shared), leader.slot)


def test_a_short_or_already_reusable_prefix_is_not_waited_for(llm) -> None:
    claims: list = []
    scheduler = _scheduler(3, claims)
    leader = llm.make_request(list(range(10, 50)), GREEDY)
    short = llm.make_request([*range(10, 10 + MIN_REUSE - 1), 99, 98], GREEDY)
    scheduler.add(leader)
    scheduler.add(short)
    assert scheduler.schedule().requests == [leader, short]  # 15 shared tokens: computed beside
    # A prefix retained in a free slot is as good as the running request's: no waiting.
    claims.clear()
    scheduler = _scheduler(3, claims)
    scheduler.prefix_cache.retain(2, list(range(10, 50)))
    first, second = (llm.make_request([*range(10, 50), t], GREEDY) for t in (1, 2))
    scheduler.add(first)
    scheduler.add(second)
    assert scheduler.schedule().requests == [second, first]  # in slot order
    assert claims == [(2, 40, None), (0, 40, 2)]


def test_requests_arriving_together_compute_a_shared_prefix_once(float_dir, kernels) -> None:
    def run(llm: LLM) -> list:
        prompts = [SYSTEM * 2 + q for q in ("Who?", "Where is São Paulo?", "Why not?", "Who?")]
        return llm.generate(prompts, [GREEDY, SEEDED, SEEDED, GREEDY])

    outputs = _with_and_without(float_dir, run, max_batch_size=4, prefill_chunk_size=8)
    out = outputs[True]
    reused = [o.usage.cached_prompt_tokens for o in out]
    if kernels == "torch":  # each row rounds by its pass's other rows: nothing is shared
        assert reused == [0, 0, 0, 0]
        return
    first = out[0].prompt_token_ids
    shared = [common_prefix_length(first, o.prompt_token_ids) for o in out[1:3]]
    assert min(shared) > 40
    assert reused == [0, *shared, len(first) - 1]


def test_a_draft_and_n_samples_of_a_prompt_share_its_prefix(float_dir) -> None:
    draft_reuse: list[int] = []

    def run(llm: LLM) -> list:
        proposer = llm.engine.speculator.proposer
        claim = getattr(proposer, "claim", None)

        def record(slot, *args) -> None:
            claim(slot, *args)
            draft_reuse.append(proposer.num_cached_tokens(slot))

        if claim is not None and llm.engine.prefix_cache is not None:
            proposer.claim = record
        seeded = [SamplingParams(temperature=1.0, seed=s, max_tokens=8) for s in (1, 2, 3)]
        return llm.generate([SYSTEM + "one"] * 3, seeded)

    for draft in (float_dir, "ngram"):
        outputs = _with_and_without(float_dir, run, max_batch_size=3, draft=draft)
        length = len(outputs[True][0].prompt_token_ids)
        assert [o.usage.cached_prompt_tokens for o in outputs[True]] == [0, *[length - 1] * 2]
    # The draft model copied the prompt's keys from the leader's slot too.
    assert draft_reuse == [0, length - 1, length - 1]


def _conversations(llm: LLM, num_conversations: int, num_turns: int) -> list:
    """Conversations taking turns, one request at a time: each turn's prompt is the previous
    turn's prompt and output and one more token; then the first turns of all, as one batch."""
    start = llm.tokenizer.encode(SYSTEM)[:40]
    prompts = [[10 + i, *start] for i in range(num_conversations)]
    outputs = []
    for turn in range(num_turns):
        for i, prompt in enumerate(prompts):
            out = llm.generate(prompt, GREEDY if i % 2 else SEEDED)
            outputs.append(out)
            prompts[i] = prompt + out.token_ids + [5 + turn]
    outputs += llm.generate([[10 + i, *start] for i in range(num_conversations)], GREEDY)
    return outputs


@pytest.mark.parametrize("draft", [False, True])
def test_prefix_cache_slots_keep_more_conversations_than_run_at_once(
    float_dir, kernels, draft
) -> None:
    # With one request running at a time, one slot kept one conversation's keys: four taking
    # turns recomputed their whole history at every turn. Three more slots keep all four.
    options = dict(max_seq_len=256, prefill_chunk_size=8, show_progress=False, max_batch_size=1)
    if draft:
        options["draft"] = float_dir
    with LLM.from_pretrained(float_dir, prefix_caching=False, **options) as llm:
        plain = _conversations(llm, 4, 3)
    with LLM.from_pretrained(float_dir, **options) as llm:
        one_slot = _conversations(llm, 4, 3)
    with LLM.from_pretrained(float_dir, prefix_cache_slots=3, **options) as llm:
        engine = llm.engine
        assert engine.runner.kv_cache.num_slots == 4 and engine.scheduler.max_running == 1
        if draft:
            assert engine.speculator.proposer.num_slots == 4
        most_running = []
        schedule = engine.scheduler.schedule

        def record():
            batch = schedule()
            most_running.append(len(engine.scheduler.running))
            return batch

        engine.scheduler.schedule = record
        kept = _conversations(llm, 4, 3)
    _same(kept, plain)
    _same(one_slot, plain)
    assert max(most_running) == 1  # the batch of four ran one at a time
    granularity = 1 if kernels == "native" else 8
    for index in range(4, 12):  # turns 2 and 3: the conversation's previous sequence
        previous = kept[index - 4]
        length = len(previous.prompt_token_ids)
        if granularity == 1:
            length += len(previous.token_ids) - 1  # but the last token, never fed
        assert kept[index].usage.cached_prompt_tokens == length // granularity * granularity
        assert one_slot[index].usage.cached_prompt_tokens == 0  # another conversation's slot
    # The first turns again: each finds its own conversation's slot.
    assert all(o.usage.cached_prompt_tokens >= 40 // granularity * granularity for o in kept[12:])


def test_prefix_cache_slots_need_prefix_caching() -> None:
    with pytest.raises(ValueError, match="prefix_cache_slots must be an int >= 0, got -1"):
        EngineConfig(prefix_cache_slots=-1)
    with pytest.raises(ValueError, match="prefix_cache_slots=2 needs prefix_caching=True"):
        EngineConfig(prefix_caching=False, prefix_cache_slots=2)


def test_a_new_conversation_sharing_a_prefix_leaves_the_longer_one_its_slot(float_dir) -> None:
    """With no empty slot, a request sharing part of a retained conversation copies the part to
    the slot retained longest ago: it took that conversation's slot, and its next turn
    recomputed its history."""

    def run(llm: LLM) -> list:
        first = llm.generate("Completely unrelated words about nothing in particular.", GREEDY)
        asked = llm.generate(SYSTEM + "Tell me about the dog.", GREEDY)  # retained after first
        other = llm.generate(SYSTEM + "Tell me about the fox.", GREEDY)  # shares SYSTEM with it
        turn = asked.prompt_token_ids + asked.token_ids + [5, 6, 7]
        return [first, asked, other, llm.generate(turn, GREEDY)]

    options = dict(max_batch_size=1, max_seq_len=256, show_progress=False)
    with LLM.from_pretrained(float_dir, prefix_caching=False, **options) as llm:
        plain = run(llm)
    with LLM.from_pretrained(float_dir, prefix_cache_slots=1, **options) as llm:
        with_cache = run(llm)
    _same(with_cache, plain)
    asked = with_cache[1]
    assert with_cache[2].usage.cached_prompt_tokens > 20  # the system prompt, copied
    # The next turn of the longer conversation reuses all of it (but its last token, never fed).
    whole = len(asked.prompt_token_ids) + len(asked.token_ids) - 1
    assert with_cache[3].usage.cached_prompt_tokens == whole
