"""tokenizer bridge: tokenizer.json path, token_bytes/encode path, dummy-prefix tokenizers."""

from __future__ import annotations

from typing import Any

import pytest

from brisklm.constrained import Choice, GrammarCompiler, JsonSchema, Regex, llg_tokenizer_for

TEXTS = ['{"name":"Bob","age":7}', "hello world", " leading space", "naïve café 日本語", "a\nb\tc"]


class CountingEncode:
    """Wraps a test tokenizer and counts `encode` calls."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.vocab_size = inner.vocab_size
        self.eos_token_ids = inner.eos_token_ids
        self.special_token_ids = inner.special_token_ids
        self.num_encode_calls = 0

    def token_bytes(self) -> list[bytes]:
        return self._inner.token_bytes()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.num_encode_calls += 1
        return self._inner.encode(text, add_special_tokens=add_special_tokens)


class BrokenEncode(CountingEncode):
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.num_encode_calls += 1
        if text != "\n":
            raise RuntimeError("encode is broken")
        return self._inner.encode(text, add_special_tokens=add_special_tokens)


def _bytes(tokenizer: Any, ids: list[int]) -> bytes:
    token_bytes = tokenizer.token_bytes()
    return b"".join(token_bytes[i] for i in ids)


def test_tokenizes_as_encode_does(bpe_tokenizer: Any) -> None:
    counting = CountingEncode(bpe_tokenizer)
    llg = llg_tokenizer_for(counting)
    for text in TEXTS:
        assert llg.tokenize_str(text) == bpe_tokenizer.encode(text)
    assert counting.num_encode_calls > 0
    for i in range(bpe_tokenizer.vocab_size):
        if i not in bpe_tokenizer.special_token_ids and not bpe_tokenizer.token_bytes()[
            i
        ].startswith(b"\xff"):
            assert llg.decode_bytes([i]) == bpe_tokenizer.token_bytes()[i]
    assert all(llg.is_special_token(i) for i in bpe_tokenizer.special_token_ids)


def test_the_tokenizers_special_tokens_are_special(bpe_tokenizer: Any) -> None:
    # A token the tokenizer calls special (here an ordinary word's id) can never be text.
    plain_id = bpe_tokenizer.encode("name")[0]
    odd = CountingEncode(bpe_tokenizer)
    odd.special_token_ids = bpe_tokenizer.special_token_ids | {plain_id}
    llg = llg_tokenizer_for(odd)
    assert llg.is_special_token(plain_id)
    assert plain_id not in llg.tokenize_str("name")


def test_dummy_prefix_is_not_injected(sp_tokenizer: Any) -> None:
    # sentencepiece adds a leading space in encode(); mid-sequence text must not get one.
    assert _bytes(sp_tokenizer, sp_tokenizer.encode("abc")) == b" abc"
    llg = llg_tokenizer_for(sp_tokenizer)
    for text in TEXTS:
        assert _bytes(sp_tokenizer, llg.tokenize_str(text)) == text.encode()


def test_sentencepiece_fast_forward_tokens_are_accepted(
    sp_compiler: GrammarCompiler, sp_tokenizer: Any
) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    matcher = sp_compiler.compile(JsonSchema(schema)).matcher()
    forced = matcher.compute_ff_tokens()
    assert _bytes(sp_tokenizer, forced).startswith(b'{"')
    assert matcher.accept_tokens(forced) == len(forced)


def test_failing_encode_falls_back_to_greedy(bpe_tokenizer: Any) -> None:
    broken = BrokenEncode(bpe_tokenizer)
    llg = llg_tokenizer_for(broken)
    for text in TEXTS:
        assert _bytes(bpe_tokenizer, llg.tokenize_str(text)) == text.encode()
    assert broken.num_encode_calls > 1


def test_needs_an_eos(bpe_tokenizer: Any) -> None:
    no_eos = CountingEncode(bpe_tokenizer)
    no_eos.eos_token_ids = ()
    with pytest.raises(ValueError, match="EOS"):
        llg_tokenizer_for(no_eos)


@pytest.mark.parametrize(
    "constraint", [Regex(r"a<\|im_end\|>b"), Choice(("a<|im_end|>b",))], ids=["regex", "choice"]
)
def test_forced_text_that_spells_a_special_token_is_plain_text(
    bpe_tokenizer: Any, constraint: Any
) -> None:
    # encode() (and llguidance reading tokenizer.json) reads "<|im_end|>" in text as the special
    # token, which llguidance refuses for text: the request failed at its first step ("token ...
    # doesn't satisfy the grammar").
    assert bpe_tokenizer.encode("a<|im_end|>b")[1] in bpe_tokenizer.special_token_ids
    matcher = GrammarCompiler(bpe_tokenizer).compile(constraint).matcher()
    forced = matcher.compute_ff_tokens()
    assert not set(forced) & bpe_tokenizer.special_token_ids
    assert _bytes(bpe_tokenizer, forced) == b"a<|im_end|>b"
    assert matcher.accept_tokens(forced) == len(forced)
    assert matcher.is_accepting()
