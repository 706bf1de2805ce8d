"""tokenizer bridge: tokenizer.json path, token_bytes/encode path, dummy-prefix tokenizers."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from brisklm.constrained import GrammarCompiler, JsonSchema, llg_tokenizer_for

TEXTS = ['{"name":"Bob","age":7}', "hello world", " leading space", "naïve café 日本語", "a\nb\tc"]


class CountingEncode:
    """Wraps a test tokenizer and counts `encode` calls."""

    def __init__(self, inner: Any, *, tokenizer_json: str | None = None) -> None:
        self._inner = inner
        self.vocab_size = inner.vocab_size
        self.eos_token_ids = inner.eos_token_ids
        self.special_token_ids = inner.special_token_ids
        self.tokenizer_json = tokenizer_json
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


def test_tokenizer_json_path_tokenizes_in_rust(bpe_tokenizer: Any, bpe_json_path: Path) -> None:
    counting = CountingEncode(bpe_tokenizer, tokenizer_json=str(bpe_json_path))
    llg = llg_tokenizer_for(counting)
    assert llg.vocab_size == bpe_tokenizer.vocab_size
    assert sorted(llg.eos_tokens) == sorted(bpe_tokenizer.eos_token_ids)
    for text in TEXTS:
        assert llg.tokenize_str(text) == bpe_tokenizer.encode(text)
    assert counting.num_encode_calls == 0  # llguidance used tokenizer.json, not the Python callback
    # The explicit argument works the same, and also takes the JSON text itself.
    plain = CountingEncode(bpe_tokenizer)
    llg = llg_tokenizer_for(plain, tokenizer_json=bpe_json_path.read_text(encoding="utf-8"))
    assert (
        llg.tokenize_str(TEXTS[0]) == bpe_tokenizer.encode(TEXTS[0]) and plain.num_encode_calls == 0
    )


def test_token_bytes_path_matches_encode(bpe_tokenizer: Any) -> None:
    counting = CountingEncode(bpe_tokenizer)  # no tokenizer.json: trie from token_bytes()
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


def test_mismatched_tokenizer_json_falls_back(
    bpe_tokenizer: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    other = Tokenizer(models.BPE())
    other.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    other.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_tokenizer.vocab_size,
        special_tokens=["<|endoftext|>", "<|im_end|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    other.train_from_iterator(["zzzz yyyy xxxx wwww"] * 50 + ["abc def ghi jkl mno"] * 50, trainer)
    path = tmp_path / "tokenizer.json"
    other.save(str(path))
    with caplog.at_level(logging.INFO, logger="brisklm.constrained.tokenizer_bridge"):
        llg = llg_tokenizer_for(CountingEncode(bpe_tokenizer, tokenizer_json=str(path)))
    assert "differently" in caplog.text
    assert llg.tokenize_str(TEXTS[0]) == bpe_tokenizer.encode(TEXTS[0])
    # A tokenizer.json llguidance cannot read at all (no decoder) also falls back.
    other.decoder = None
    other.save(str(path))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="brisklm.constrained.tokenizer_bridge"):
        llg = llg_tokenizer_for(CountingEncode(bpe_tokenizer, tokenizer_json=str(path)))
    assert "cannot read" in caplog.text
    assert llg.tokenize_str(TEXTS[0]) == bpe_tokenizer.encode(TEXTS[0])


def test_special_tokens_must_agree(
    bpe_tokenizer: Any, bpe_json_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A token the tokenizer calls special but tokenizer.json does not: use token_bytes() instead.
    plain_id = bpe_tokenizer.encode("name")[0]
    odd = CountingEncode(bpe_tokenizer, tokenizer_json=str(bpe_json_path))
    odd.special_token_ids = bpe_tokenizer.special_token_ids | {plain_id}
    with caplog.at_level(logging.INFO, logger="brisklm.constrained.tokenizer_bridge"):
        llg = llg_tokenizer_for(odd)
    assert "differently" in caplog.text
    assert llg.is_special_token(plain_id)


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
