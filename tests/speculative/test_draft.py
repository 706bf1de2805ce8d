"""DraftModelProposer: proposals, the q it reports, cache sync across rollback, limits, vocabulary
checks, seeds and grammar masks."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
from tokenizers import Tokenizer as HfTokenizer
from tokenizers import decoders, pre_tokenizers, trainers
from tokenizers import models as bpe_models

from brisklm.constrained import GrammarCompiler, Regex, allocate_token_bitmask
from brisklm.engine.model_runner import ForwardBatch, ModelRunner
from brisklm.sampling import SamplingMetadata, SamplingParams, make_generator, processed_probs
from brisklm.speculative import (
    DraftModelProposer,
    DraftRow,
    Proposer,
    check_compatible,
    make_draft_generator,
)
from brisklm.tokenizer import Tokenizer
from tests.runner_spy import spy_on_passes
from tests.speculative.loop import plain_generate
from tests.tiny import CORPUS, SPECIAL_TOKENS

MAX_SEQ = 128
SAMPLED = SamplingParams(
    temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.3, presence_penalty=0.7, seed=5
)


def _proposer(model, target_model, tokenizer, k=4, num_slots=4, max_seq_len=MAX_SEQ):
    return DraftModelProposer(
        model, num_slots, max_seq_len, k, target_config=target_model.config, tokenizer=tokenizer
    )


def _row(slot, context, num_prompt, k, params=None, seed_generator=False):
    params = params or SamplingParams.greedy()
    generator = make_draft_generator(params, "cpu") if seed_generator else None
    return DraftRow(slot, context[:num_prompt], context[num_prompt:], k, params, generator)


def test_implements_the_proposer_interface(target_model, tokenizer):
    assert isinstance(_proposer(target_model, target_model, tokenizer), Proposer)


def test_target_as_own_draft_proposes_the_greedy_continuation(target_model, tokenizer, prompts):
    num_real = min(tokenizer.vocab_size, target_model.config.vocab_size)
    greedy = SamplingParams.greedy(ignore_eos=True)
    expected = plain_generate(target_model, prompts, [greedy] * 3, 6, num_real)
    proposer = _proposer(target_model, target_model, tokenizer, k=6)
    rows = [DraftRow(i, p, [], 6, greedy) for i, p in enumerate(prompts)]
    proposals = proposer.propose(rows)
    assert [p.token_ids for p in proposals] == expected
    # Greedy on the raw logits: the kernels' argmax, a function of the context (no q, as n-gram).
    assert all(proposal.probs is None for proposal in proposals)
    # Greedy over processed logits (a penalty) draws from its one-hot q.
    penalised = SamplingParams.greedy(ignore_eos=True, repetition_penalty=1.3)
    expected = plain_generate(target_model, prompts, [penalised] * 3, 6, num_real)
    proposer = _proposer(target_model, target_model, tokenizer, k=6)
    rows = [DraftRow(i, p, [], 6, penalised) for i, p in enumerate(prompts)]
    proposals = proposer.propose(rows)
    assert [p.token_ids for p in proposals] == expected
    for proposal in proposals:
        assert proposal.probs.shape == (6, target_model.config.vocab_size)
        assert torch.equal(proposal.probs.argmax(dim=-1), torch.tensor(proposal.token_ids))
        assert torch.all(proposal.probs.max(dim=-1).values == 1.0)  # greedy: one-hot q


@pytest.mark.parametrize("num_accepted", [0, 2, 4])
@pytest.mark.parametrize("explicit_rollback", [True, False])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_cache_stays_in_sync_across_rollback(
    draft_model, target_model, tokenizer, prompts, num_accepted, explicit_rollback, sampled
):
    """After a verification step the proposer re-feeds only what it must and then proposes
    exactly what a fresh proposer given the whole new context proposes."""
    k = 4
    params = SAMPLED if sampled else SamplingParams.greedy()
    prompt = prompts[1]
    proposer = _proposer(draft_model, target_model, tokenizer, k=k)
    first = proposer.propose([_row(2, prompt, len(prompt), k, params, sampled)])[0]
    assert proposer.num_cached_tokens(2) == len(prompt) + k - 1
    # The target accepted num_accepted proposals, then emitted a token of its own.
    own_token = (first.token_ids[num_accepted] + 1) % 300 if num_accepted < k else 7
    context = prompt + first.token_ids[:num_accepted] + [own_token]
    if explicit_rollback:
        proposer.rollback(2, k - num_accepted)
        assert proposer.num_cached_tokens(2) == len(prompt) + min(num_accepted, k - 1)
    second = proposer.propose([_row(2, context, len(prompt), k, params, sampled)])[0]
    fresh = _proposer(draft_model, target_model, tokenizer, k=k)
    expected = fresh.propose([_row(2, context, len(prompt), k, params, sampled)])[0]
    assert second.token_ids == expected.token_ids
    torch.testing.assert_close(second.probs, expected.probs, atol=1e-5, rtol=1e-4)


def test_context_that_diverges_before_its_last_token_is_refed(
    draft_model, target_model, tokenizer, prompts
):
    """Tokens that did not come from the proposals (forced grammar tokens, a step taken without
    speculation) are compared with what the cache holds, not trusted."""
    prompt = prompts[1]
    proposer = _proposer(draft_model, target_model, tokenizer, k=4)
    first = proposer.propose([_row(0, prompt, len(prompt), 4)])[0]
    forced = [(first.token_ids[0] + 1) % 300, first.token_ids[1], 9]
    context = prompt + forced
    second = proposer.propose([_row(0, context, len(prompt), 4)])[0]
    fresh = _proposer(draft_model, target_model, tokenizer, k=4)
    expected = fresh.propose([_row(0, context, len(prompt), 4)])[0]
    assert second.token_ids == expected.token_ids
    torch.testing.assert_close(second.probs, expected.probs, atol=1e-5, rtol=1e-4)


def test_same_context_twice_gives_the_same_proposal(draft_model, target_model, tokenizer, prompts):
    proposer = _proposer(draft_model, target_model, tokenizer)
    row = _row(0, prompts[0], len(prompts[0]), 4)
    first = proposer.propose([row])[0]
    again = proposer.propose([row])[0]
    assert first.token_ids == again.token_ids
    torch.testing.assert_close(first.probs, again.probs)


def test_release_then_a_new_request_in_the_slot(draft_model, target_model, tokenizer, prompts):
    proposer = _proposer(draft_model, target_model, tokenizer)
    proposer.propose([_row(1, prompts[0], len(prompts[0]), 4)])
    proposer.release(1)
    assert proposer.num_cached_tokens(1) == 0
    got = proposer.propose([_row(1, prompts[2], len(prompts[2]), 4)])[0]
    fresh = _proposer(draft_model, target_model, tokenizer)
    assert got.token_ids == fresh.propose([_row(1, prompts[2], len(prompts[2]), 4)])[0].token_ids


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_a_prompt_prefilled_in_chunks_proposes_as_one_fed_whole(
    draft_model, target_model, tokenizer, prompts, sampled
):
    """The engine feeds the draft each prompt chunk the target takes; the first proposal then
    feeds only the target's token after the prompt, and proposes what a proposer fed the whole
    prompt at once proposes."""
    params = SAMPLED if sampled else SamplingParams.greedy()
    prompt = (prompts[1] * 45)[:45]
    context = prompt + [33]  # the target's token after the prompt
    proposer = _proposer(draft_model, target_model, tokenizer)
    for end in (16, 32, 45):  # chunks of 16 tokens
        proposer.prefill([DraftRow(1, prompt[:end], [], 0, params)])
        assert proposer.num_cached_tokens(1) == end
    proposer.prefill([DraftRow(1, prompt, [], 0, params)])  # nothing new: nothing runs
    fed: list[list[int]] = []
    spy_on_passes(proposer.runner, lambda batch: fed.append(list(map(len, batch.token_ids))))
    got = proposer.propose([_row(1, context, len(prompt), 4, params, sampled)])[0]
    assert fed[0] == [1]  # only the target's token after the prompt
    fresh = _proposer(draft_model, target_model, tokenizer)
    expected = fresh.propose([_row(1, context, len(prompt), 4, params, sampled)])[0]
    assert got.token_ids == expected.token_ids
    if sampled:
        torch.testing.assert_close(got.probs, expected.probs, atol=1e-5, rtol=1e-4)
    else:  # greedy drafts carry no q
        assert got.probs is None and expected.probs is None


def test_prefill_of_several_rows_and_its_bad_input(draft_model, target_model, tokenizer, prompts):
    proposer = _proposer(draft_model, target_model, tokenizer)
    rows = [DraftRow(slot, prompts[slot], [], 0) for slot in range(3)]
    proposer.prefill(rows)
    assert [proposer.num_cached_tokens(slot) for slot in range(3)] == [len(p) for p in prompts]
    with pytest.raises(ValueError, match="once per prefill call"):
        proposer.prefill([rows[0], rows[0]])
    with pytest.raises(ValueError, match="does not fit the draft cache"):
        proposer.prefill([DraftRow(3, [5] * (MAX_SEQ + 1), [], 0)])
    with pytest.raises(ValueError, match="out of range"):
        proposer.prefill([DraftRow(9, [5], [], 0)])
    forward = proposer.runner.forward

    def fail(batch):
        raise RuntimeError("simulated out of memory")

    proposer.runner.forward = fail
    with pytest.raises(RuntimeError, match="simulated"):
        proposer.prefill([DraftRow(0, prompts[0] * 2, [], 0)])
    proposer.runner.forward = forward
    assert proposer.num_cached_tokens(0) == len(prompts[0])  # a failed pass records nothing
    got = proposer.propose([_row(0, prompts[0] + [7], len(prompts[0]), 4)])[0]
    fresh = _proposer(draft_model, target_model, tokenizer)
    assert (
        got.token_ids == fresh.propose([_row(0, prompts[0] + [7], len(prompts[0]), 4)])[0].token_ids
    )


@torch.inference_mode()
def test_q_is_the_processed_draft_distribution_with_proposals_as_output(
    draft_model, target_model, tokenizer, prompts
):
    """Each step's q equals processed_probs of the draft's logits for context + proposals so far,
    with those proposals counted as output (penalties) and padding ids masked."""
    prompt, output = prompts[2], [17, 17, 40]
    proposer = _proposer(draft_model, target_model, tokenizer, k=4)
    row = DraftRow(0, prompt, output, 4, SAMPLED, make_draft_generator(SAMPLED, "cpu"))
    proposal = proposer.propose([row])[0]
    runner = ModelRunner(draft_model, 1, MAX_SEQ)
    num_real = min(tokenizer.vocab_size, target_model.config.vocab_size)
    for j in range(len(proposal)):
        drafted = proposal.token_ids[:j]
        context = prompt + output + drafted
        logits = runner.forward(ForwardBatch([0], [0], [context], [1]))
        logits[:, num_real:] = float("-inf")
        md = SamplingMetadata.build(
            [SAMPLED],
            [prompt],
            [output + drafted],
            [None],
            logits.shape[1],
            "cpu",
            tokenizer.eos_token_ids,
        )
        torch.testing.assert_close(
            proposal.probs[j], processed_probs(logits, md)[0], atol=1e-5, rtol=1e-4
        )
        assert proposal.probs[j, proposal.token_ids[j]] > 0


def test_seeded_draws_do_not_depend_on_the_batch(draft_model, target_model, tokenizer, prompts):
    def run(rows):
        return _proposer(draft_model, target_model, tokenizer, k=5).propose(rows)

    seeded = lambda slot, prompt: _row(slot, prompt, len(prompt), 5, SAMPLED, True)  # noqa: E731
    alone = run([seeded(3, prompts[0])])[0]
    noisy = SamplingParams(temperature=1.0)
    batch = run(
        [
            _row(0, prompts[1], len(prompts[1]), 2, noisy),
            seeded(3, prompts[0]),
            _row(1, prompts[2], len(prompts[2]), 5),
        ]
    )
    assert batch[1].token_ids == alone.token_ids
    # Different seeds explore: the seed is really used.
    other = SamplingParams(**{**dataclasses.asdict(SAMPLED), "seed": 6})
    different = {
        tuple(
            run(
                [_row(0, prompts[0], len(prompts[0]), 5, dataclasses.replace(other, seed=s), True)]
            )[0].token_ids
        )
        for s in range(6)
    }
    assert len(different) > 1


def test_draft_generator_is_separate_from_the_request_generator():
    assert make_draft_generator(SamplingParams.greedy(seed=3), "cpu") is None
    assert make_draft_generator(SamplingParams(temperature=1.0), "cpu") is None
    params = SamplingParams(temperature=1.0, seed=3)
    target, draft = make_generator(params, "cpu"), make_draft_generator(params, "cpu")
    assert not torch.equal(torch.rand(8, generator=target), torch.rand(8, generator=draft))
    again = make_draft_generator(params, "cpu")
    assert torch.equal(
        torch.rand(8, generator=again), torch.rand(8, generator=make_draft_generator(params, "cpu"))
    )
    extreme = make_draft_generator(SamplingParams(temperature=1.0, seed=2**64 - 1), "cpu")
    assert extreme is not None


def test_limits_k_zero_and_cache_end(draft_model, target_model, tokenizer, prompts):
    proposer = _proposer(draft_model, target_model, tokenizer, k=4, max_seq_len=16)
    prompt = prompts[0]  # 6 tokens
    assert len(prompt) == 6
    long_context = list(prompt) + [5] * 8  # 14 tokens: room for 16 - 14 + 1 = 3 proposals
    out = proposer.propose(
        [
            _row(0, prompt, len(prompt), 0),
            _row(1, long_context, len(prompt), 10),
            _row(2, prompt, len(prompt), 2),
        ]
    )
    assert [len(p) for p in out] == [0, 3, 2]
    assert out[0].probs.shape == (0, target_model.config.vocab_size)
    with pytest.raises(ValueError, match="does not fit"):
        proposer.propose([_row(3, list(prompt) * 3, len(prompt), 2)])
    with pytest.raises(ValueError, match="only once"):
        proposer.propose([_row(0, prompt, 6, 1), _row(0, prompt, 6, 1)])
    with pytest.raises(ValueError, match="slot"):
        proposer.propose([_row(9, prompt, 6, 1)])
    with pytest.raises(ValueError, match="roll back"):
        proposer.rollback(2, 100)


def test_a_draft_trained_on_a_shorter_context_is_named(
    draft_model, target_model, tokenizer, caplog
):
    """It loaded without a word: past its positions its proposals are extrapolated, which costs
    acceptance, not the target's output."""
    trained = draft_model.config.max_position_embeddings
    with caplog.at_level("WARNING", logger="brisklm.speculative.draft"):
        _proposer(draft_model, target_model, tokenizer, max_seq_len=trained)
        assert not caplog.records
        _proposer(draft_model, target_model, tokenizer, max_seq_len=trained + 1)
    (record,) = caplog.records
    assert f"trained on {trained} positions and the engine's context is {trained + 1}" in (
        record.getMessage()
    )


def test_stops_drafting_after_eos(draft_model, target_model, tokenizer, prompts):
    eos = tokenizer.eos_token_ids[0]
    forced = SamplingParams.greedy(logit_bias={eos: 100.0})
    proposer = _proposer(draft_model, target_model, tokenizer, k=4)
    assert proposer.propose([_row(0, prompts[0], 6, 4, forced)])[0].token_ids == [eos]
    ignoring = SamplingParams.greedy(logit_bias={eos: 100.0}, ignore_eos=True)
    assert proposer.propose([_row(1, prompts[0], 6, 4, ignoring)])[0].token_ids == [eos] * 4


def test_vocabulary_must_match(target_model, draft_model, tokenizer, target_dir):
    target_config = target_model.config
    smaller = dataclasses.replace(draft_model.config, vocab_size=300)
    with pytest.raises(ValueError, match=r"draft model vocabulary size 300 .* target model's 416"):
        check_compatible(target_config, smaller, tokenizer)
    padded = dataclasses.replace(draft_model.config, vocab_size=448)
    with pytest.raises(ValueError, match="448"):
        check_compatible(target_config, padded, tokenizer)
    # With the draft's tokenizer, different padding is fine; too small a vocabulary is not.
    check_compatible(target_config, padded, tokenizer, Tokenizer.from_pretrained(target_dir))
    with pytest.raises(ValueError, match=r"300 is smaller than the target's 400 tokens"):
        check_compatible(target_config, smaller, tokenizer, tokenizer)
    with pytest.raises(ValueError, match="draft model vocabulary size 300"):
        DraftModelProposer(
            _with_config(draft_model, smaller),
            2,
            32,
            3,
            target_config=target_config,
            tokenizer=tokenizer,
        )


def test_different_draft_tokenizer_is_refused(target_model, tokenizer, target_dir, tmp_path):
    # Same size, other merges: a BPE trained on the reversed corpus, in a copy of the checkpoint.
    other_dir = tmp_path / "other"
    shutil.copytree(target_dir, other_dir)
    hf = HfTokenizer(bpe_models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator([text[::-1] for text in CORPUS] * 20, trainer)
    hf.save(str(other_dir / "tokenizer.json"))
    other = Tokenizer.from_pretrained(other_dir)
    assert other.vocab_size == tokenizer.vocab_size
    with pytest.raises(ValueError, match="differs from the target tokenizer .* at token id"):
        check_compatible(target_model.config, target_model.config, tokenizer, other)


def _with_config(model, config):
    """A shallow stand-in model whose config says ``config`` (only the check reads it)."""

    class Stub(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = config
            self.inner = model

    return Stub()


def test_grammar_mask_keeps_proposals_valid_and_matcher_unchanged(
    draft_model, target_model, tokenizer, prompts
):
    compiler = GrammarCompiler(tokenizer)
    compiled = compiler.compile(Regex("(ab|cd)+e"))
    params = SamplingParams(temperature=1.0, seed=3)
    for attempt in range(5):
        matcher = compiled.matcher()
        if attempt % 2:
            matcher.accept_tokens(tokenizer.encode("ab", add_special_tokens=False))
        before = matcher.num_tokens
        proposer = _proposer(draft_model, target_model, tokenizer, k=5)
        row = DraftRow(0, prompts[0], [], 5, params, make_draft_generator(params, "cpu"), matcher)
        proposal = proposer.propose([row])[0]
        assert matcher.num_tokens == before
        assert len(proposal) >= 1
        assert matcher.validate_tokens(proposal.token_ids) == len(proposal.token_ids)
        # q has no mass on tokens the grammar forbids at the first position.
        bitmask = allocate_token_bitmask(1, compiled.vocab_size)
        matcher.fill_bitmask(bitmask, 0)
        allowed = torch.zeros(proposal.probs.shape[1], dtype=torch.bool)
        for token in range(compiled.vocab_size):
            allowed[token] = bool((int(bitmask[0, token // 32]) >> (token % 32)) & 1)
        assert float(proposal.probs[0][~allowed].sum()) == 0.0


def test_rows_of_very_different_feed_lengths_in_one_call(
    draft_model, target_model, tokenizer, prompts
):
    """A new long prompt goes in its own extend pass; results come back in row order."""
    proposer = _proposer(draft_model, target_model, tokenizer, k=3)
    first = proposer.propose([_row(0, prompts[0], 6, 3)])[0]
    continuing = prompts[0] + first.token_ids[:1] + [11]
    long_prompt = (prompts[1] + prompts[2]) * 6
    rows = [
        _row(1, long_prompt, len(long_prompt), 3),
        _row(0, continuing, 6, 3),
        _row(2, prompts[2], len(prompts[2]), 3),
    ]
    got = proposer.propose(rows)
    for row, proposal in zip(rows, got):
        fresh = _proposer(draft_model, target_model, tokenizer, k=3).propose([row])[0]
        assert proposal.token_ids == fresh.token_ids
        torch.testing.assert_close(proposal.probs, fresh.probs, atol=1e-5, rtol=1e-4)


def test_greedy_drafts_come_from_one_call_of_greedy_steps(
    draft_model, target_model, tokenizer, prompts, monkeypatch
):
    """Rows drafting greedily on the raw logits take the tokens after their first from one call
    of greedy steps: the proposals of a pass a step, each row with its own length and its own
    stop token ending it early."""

    def propose(rows, steps_run: bool) -> tuple[list[list[int]], list[int]]:
        proposer = _proposer(draft_model, target_model, tokenizer, k=6)
        calls: list[int] = []
        original = proposer.runner.run_steps

        def spy(batch, columns, steps):
            calls.append(steps)
            return original(batch, columns, steps) if steps_run else None

        monkeypatch.setattr(proposer.runner, "run_steps", spy)
        return [p.token_ids for p in proposer.propose(rows)], calls

    greedy = SamplingParams.greedy(ignore_eos=True)
    rows = [_row(i, p, len(p), k, greedy) for i, (p, k) in enumerate(zip(prompts, (6, 3, 5)))]
    want, _ = propose(rows, steps_run=False)
    got, calls = propose(rows, steps_run=True)
    assert got == want and [len(p) for p in got] == [6, 3, 5]
    assert calls == [5]  # the longest row's 5 tokens after its first, in one call
    stopping = SamplingParams.greedy(ignore_eos=True, stop_token_ids=[want[0][2]])
    rows[0] = _row(0, prompts[0], len(prompts[0]), 6, stopping)
    got, _ = propose(rows, steps_run=True)
    assert got[0] == want[0][: want[0].index(want[0][2]) + 1] and got[1:] == want[1:]


def test_greedy_drafts_near_the_cache_end_fit_their_call(
    draft_model, target_model, tokenizer, prompts
):
    """A row near its slot's end beside one with room: the call runs what every row has room
    for, and the longer proposal goes on a pass a step (one call of the longest's steps failed the
    whole step once, a review found)."""
    greedy = SamplingParams.greedy(ignore_eos=True)
    context = (prompts[0] * 3)[:14]
    rows = [_row(0, context, 14, 4, greedy), _row(1, prompts[1][:6], 6, 4, greedy)]
    got = _proposer(draft_model, target_model, tokenizer, k=4, max_seq_len=16).propose(rows)
    proposer = _proposer(draft_model, target_model, tokenizer, k=4, max_seq_len=16)
    proposer.runner.run_steps = lambda batch, columns, steps, sampling=None: None  # a pass a step
    want = proposer.propose(rows)
    assert [p.token_ids for p in got] == [p.token_ids for p in want]
    assert [len(p) for p in got] == [3, 4]
