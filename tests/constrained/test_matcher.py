"""GrammarMatcher: accept / reject / EOS / rollback / fast-forward / bitmasks."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from brisklm.constrained import (
    Choice,
    Grammar,
    GrammarCompiler,
    GrammarMatcher,
    JsonSchema,
    Regex,
    allocate_token_bitmask,
    fill_bitmasks,
)

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def allowed_ids(matcher: GrammarMatcher) -> set[int]:
    bitmask = allocate_token_bitmask(1, matcher.compiled.vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    return {
        t for t in range(matcher.compiled.vocab_size) if (int(bitmask[0, t // 32]) >> (t % 32)) & 1
    }


def ids(compiler: GrammarCompiler, text: str) -> list[int]:
    return compiler.llg_tokenizer.tokenize_str(text)


def test_rejected_token_leaves_state_unchanged(bpe_compiler: GrammarCompiler) -> None:
    matcher = bpe_compiler.compile(JsonSchema(PERSON)).matcher()
    before = allowed_ids(matcher)
    bad = ids(bpe_compiler, "[")[0]
    assert not matcher.accept_token(bad)
    assert matcher.error is None and matcher.num_tokens == 0
    assert allowed_ids(matcher) == before
    assert not matcher.accept_token(bpe_compiler.vocab_size + 3)  # out of range: rejected, no crash
    assert not matcher.accept_token(-1)


def test_eos_only_when_complete_and_terminates(bpe_compiler: GrammarCompiler) -> None:
    eos, other_eos = bpe_compiler.eos_token_ids
    matcher = bpe_compiler.compile(Regex("ab|abcd")).matcher()
    assert not matcher.accept_token(eos)  # empty output is not a match
    assert matcher.accept_tokens(ids(bpe_compiler, "ab")) == len(ids(bpe_compiler, "ab"))
    assert matcher.is_accepting() and not matcher.is_stopped()
    assert {eos, other_eos} <= allowed_ids(matcher)  # every EOS id may end the output
    assert matcher.accept_token(torch.tensor(other_eos))  # tensor scalars work like ints
    assert matcher.is_terminated() and matcher.is_stopped()
    assert not matcher.accept_token(eos)  # nothing after EOS
    assert matcher.validate_tokens([eos]) == 0
    assert allowed_ids(matcher) <= {eos, other_eos}


@pytest.mark.parametrize("name_eos", ["<[{eos}]>", "<[{eos}]>*"])
def test_a_grammar_may_name_eos_as_a_token(bpe_compiler: GrammarCompiler, name_eos: str) -> None:
    # The EOS is content there: accepted before the grammar is complete, which llguidance's own
    # validate_tokens refuses for every EOS id.
    eos = bpe_compiler.eos_token_ids[0]
    grammar = 'start: "yes" ' + name_eos.format(eos=eos) + ' "!"'
    matcher = bpe_compiler.compile(Grammar(grammar)).matcher()
    yes, bang = ids(bpe_compiler, "yes"), ids(bpe_compiler, "!")
    assert matcher.validate_tokens([*yes, eos, *bang, eos]) == len(yes) + len(bang) + 2
    assert matcher.validate_tokens([*yes, *bang]) == len(yes + bang) - ("*" not in name_eos)
    assert matcher.accept_tokens(yes) == len(yes)
    assert eos in allowed_ids(matcher)
    assert matcher.accept_token(eos) and not matcher.is_terminated()
    assert matcher.accept_tokens(bang) == len(bang) and matcher.is_accepting()
    assert matcher.accept_token(eos) and matcher.is_terminated()
    matcher.rollback(len(yes) + len(bang) + 2)
    assert matcher.num_tokens == 0 and not matcher.accept_token(eos)
    assert matcher.error is None


def test_accept_tokens_counts_prefix(bpe_compiler: GrammarCompiler) -> None:
    matcher = bpe_compiler.compile(Choice(("yes", "no"))).matcher()
    good = ids(bpe_compiler, "yes")
    assert matcher.accept_tokens([*good, ids(bpe_compiler, "x")[0]]) == len(good)
    assert matcher.is_accepting()


def test_validate_tokens_does_not_commit(bpe_compiler: GrammarCompiler) -> None:
    compiled = bpe_compiler.compile(JsonSchema(PERSON))
    matcher = compiled.matcher()
    draft = ids(bpe_compiler, '{"name": "Al", "age": 4}') + [bpe_compiler.eos_token_ids[0]]
    assert matcher.validate_tokens(draft) == len(draft)
    assert matcher.num_tokens == 0 and allowed_ids(matcher) == allowed_ids(compiled.matcher())
    broken = ids(bpe_compiler, '{"name": "Al", "age": x')
    n = matcher.validate_tokens(broken)
    assert n < len(broken)
    assert matcher.accept_tokens(broken) == n  # validate agrees with accept
    assert matcher.validate_tokens([bpe_compiler.vocab_size + 1]) == 0
    # EOS where the output is incomplete is not valid; nothing after an EOS is.
    eos = bpe_compiler.eos_token_ids[1]
    fresh = compiled.matcher()
    assert fresh.validate_tokens(broken[:3] + [eos]) == 3
    assert fresh.validate_tokens([*draft, eos]) == len(draft)
    regex = bpe_compiler.compile(Regex("abc")).matcher()
    assert (
        regex.validate_tokens([*ids(bpe_compiler, "abc"), eos, eos])
        == len(ids(bpe_compiler, "abc")) + 1
    )
    assert regex.num_tokens == 0


def test_rollback_restores_state(bpe_compiler: GrammarCompiler) -> None:
    compiled = bpe_compiler.compile(JsonSchema(PERSON))
    matcher = compiled.matcher()
    text = ids(bpe_compiler, '{"name": "Bo", "age": 12}')
    snapshots = []
    for token in text:
        snapshots.append(allowed_ids(matcher))
        assert matcher.accept_token(token)
    assert matcher.accept_token(bpe_compiler.eos_token_ids[0])
    matcher.rollback(1)  # the EOS
    assert not matcher.is_terminated() and matcher.is_accepting()
    matcher.rollback(3)
    assert matcher.num_tokens == len(text) - 3
    assert allowed_ids(matcher) == snapshots[len(text) - 3]
    assert matcher.accept_tokens(text[-3:]) == 3
    matcher.reset()
    assert matcher.num_tokens == 0 and allowed_ids(matcher) == snapshots[0]
    with pytest.raises(ValueError, match="0..0"):
        matcher.rollback(1)


@pytest.mark.parametrize("eos_index", [0, 1])
def test_rollback_of_eos_after_exhausted_grammar(
    bpe_compiler: GrammarCompiler, eos_index: int
) -> None:
    # The grammar cannot continue after "abc": llguidance does not record the EOS then.
    eos = bpe_compiler.eos_token_ids[eos_index]
    matcher = bpe_compiler.compile(Regex("abc")).matcher()
    text = ids(bpe_compiler, "abc")
    assert matcher.accept_tokens(text) == len(text)
    assert matcher.is_stopped() and matcher.is_accepting()
    assert matcher.validate_tokens([eos]) == 1
    assert matcher.accept_token(eos)
    matcher.rollback(1)
    assert matcher.is_accepting() and not matcher.is_terminated()
    assert matcher.num_tokens == len(text)
    assert matcher.accept_token(eos)
    matcher.rollback(2)  # EOS and the last text token
    assert not matcher.is_accepting()
    assert matcher.accept_tokens(text[-1:]) == 1 and matcher.is_accepting()


def test_rollback_past_an_eos_the_grammar_names_restores_state(bpe_compiler) -> None:
    # llguidance's own rollback of an EOS it took as content left a state that refused tokens it
    # took before: with speculative decoding, the request's next token failed ("the grammar
    # rejected token ...") once a rolled-back proposal held such an EOS
    eos = bpe_compiler.eos_token_ids[0]
    grammar = f"start: /[a-z]{{1,4}}/ <[{eos}]> /[a-z]{{1,6}}/"
    matcher = bpe_compiler.compile(Grammar(grammar)).matcher()
    word = ids(bpe_compiler, "ab")
    before = allowed_ids(matcher)
    assert matcher.accept_tokens([*word, eos]) == len(word) + 1 and not matcher.is_terminated()
    after_eos = allowed_ids(matcher)
    matcher.rollback(len(word) + 1)
    assert matcher.num_tokens == 0 and allowed_ids(matcher) == before
    assert matcher.accept_tokens([*word, eos]) == len(word) + 1
    assert allowed_ids(matcher) == after_eos
    more = ids(bpe_compiler, "cd")
    assert matcher.accept_tokens(more) == len(more)
    matcher.rollback(len(more))  # tokens after the EOS only: wrong in llguidance's rollback too
    assert allowed_ids(matcher) == after_eos
    matcher.rollback(1)  # the EOS alone
    assert matcher.num_tokens == len(word) and matcher.accept_token(eos)
    end = ids(bpe_compiler, "end")
    assert matcher.accept_tokens(end) == len(end) and matcher.accept_token(eos)
    assert matcher.is_terminated()
    matcher.rollback(len(end) + 2)  # the end, "end" and the content EOS
    assert matcher.num_tokens == len(word) and matcher.accept_tokens([eos, *end]) == len(end) + 1
    assert matcher.accept_token(eos) and matcher.is_terminated()


def test_fast_forward_tokens(bpe_compiler: GrammarCompiler) -> None:
    matcher = bpe_compiler.compile(JsonSchema(PERSON)).matcher()
    forced = matcher.compute_ff_tokens()
    assert forced, "an object with fixed first key forces its opening"
    text = bpe_compiler.llg_tokenizer.decode_bytes(forced)
    assert b'{"name": '.startswith(text) and len(text) >= 2
    assert matcher.accept_tokens(forced) == len(forced)
    free = bpe_compiler.compile(Regex("[a-z]+")).matcher()
    assert free.compute_ff_tokens() == []


def test_bitmask_agrees_with_validate_for_every_token(bpe_compiler: GrammarCompiler) -> None:
    matcher = bpe_compiler.compile(JsonSchema(PERSON)).matcher()
    prefix = ids(bpe_compiler, '{"name": "A')
    assert matcher.accept_tokens(prefix) == len(prefix)
    allowed = allowed_ids(matcher)
    for token in range(bpe_compiler.vocab_size):
        assert (token in allowed) == (matcher.validate_tokens([token]) == 1), token
    assert len(allowed) > 10


def test_allocate_token_bitmask() -> None:
    bitmask = allocate_token_bitmask(3, 65)
    assert bitmask.shape == (3, 3) and bitmask.dtype == torch.int32 and bitmask.device.type == "cpu"
    assert torch.all(bitmask == -1)  # every token allowed until filled
    with pytest.raises(ValueError, match="vocab_size"):
        allocate_token_bitmask(1, 0)


def test_fill_bitmask_checks_shape(bpe_compiler: GrammarCompiler) -> None:
    matcher = bpe_compiler.compile(Regex("a")).matcher()
    width = matcher.compiled.bitmask_width
    with pytest.raises(ValueError, match="words per row"):
        matcher.fill_bitmask(torch.zeros(1, width + 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="int32"):
        matcher.fill_bitmask(torch.zeros(1, width, dtype=torch.int64))
    with pytest.raises(IndexError):
        matcher.fill_bitmask(torch.zeros(1, width, dtype=torch.int32), row=1)


def test_fill_bitmasks_matches_single_fills(bpe_compiler: GrammarCompiler) -> None:
    grammars = [JsonSchema(PERSON), Regex("[0-9]{2,4}"), Choice(("left", "right"))]
    matchers = [bpe_compiler.compile(g).matcher() for g in grammars]
    matchers[0].accept_tokens(ids(bpe_compiler, '{"name": "'))
    width = matchers[0].compiled.bitmask_width
    expected = torch.zeros(len(matchers), width, dtype=torch.int32)
    for row, matcher in enumerate(matchers):
        matcher.fill_bitmask(expected, row)
    batch = torch.full((5, width), 7, dtype=torch.int32)
    rows = [4, 0, 2]
    # Run in a worker thread, as the engine does to overlap the model forward.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(fill_bitmasks, matchers, batch, rows).result()
    for row, exp in zip(rows, expected, strict=True):
        assert torch.equal(batch[row], exp)
    assert torch.all(batch[1] == 7) and torch.all(batch[3] == 7)  # other rows untouched
    fill_bitmasks([], batch)  # nothing to do
    with pytest.raises(ValueError, match="distinct"):
        fill_bitmasks(matchers[:2], batch, [1, 1])
    with pytest.raises(ValueError, match="rows"):
        fill_bitmasks(matchers, batch, [0])


def test_fill_bitmasks_needs_one_compiler(
    bpe_compiler: GrammarCompiler, bpe_tokenizer: Any
) -> None:
    other = GrammarCompiler(bpe_tokenizer)
    matchers = [bpe_compiler.compile(Regex("a")).matcher(), other.compile(Regex("a")).matcher()]
    with pytest.raises(ValueError, match="one GrammarCompiler"):
        fill_bitmasks(matchers, allocate_token_bitmask(2, bpe_compiler.vocab_size))


def test_matchers_are_independent(bpe_compiler: GrammarCompiler) -> None:
    compiled = bpe_compiler.compile(Choice(("alpha", "beta")))
    first, second = compiled.matcher(), compiled.matcher()
    assert first.accept_tokens(ids(bpe_compiler, "alpha")) > 0
    assert second.num_tokens == 0
    assert second.accept_tokens(ids(bpe_compiler, "beta")) == len(ids(bpe_compiler, "beta"))
    assert second.is_accepting()
