"""Tiny tokenizers (byte-level BPE, sentencepiece BPE) and a random-logits generator for the tests."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from brisklm.constrained import (
    CompiledGrammar,
    GrammarCompiler,
    GrammarMatcher,
    allocate_token_bitmask,
    apply_token_bitmask_,
)

DATA_DIR = Path(__file__).resolve().parents[1] / "data"

TRAINING_TEXT = [
    '{"name":"Alice","age":30,"tags":["a","b"],"ok":true,"x":null,"score":-1.5e3}',
    '[{"id":1,"city":"Paris","zip":"75001"},{"id":2,"role":"admin","items":[]}]',
    "The quick brown fox jumps over the lazy dog 0123456789.",
    "def f(x):\n    return x * 2 + 1  # comment\nSELECT id FROM users WHERE age > 3;",
    "email: bob@example.com, date: 2024-01-31, id: 123e4567-e89b-12d3-a456-426614174000",
    "1. e4 e5\n2. Nf3 Nc6\n- item one\n- item two\n(a+b)*c=d\n",
    "これは日本語のテキストです。ひらがなとカタカナ。 très bien, naïve café",
] * 8
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_end|>", "<|pad|>"]


def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level alphabet: printable stand-in character -> byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    )
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class BpeTokenizer:
    """Test stand-in for brisklm.tokenizer.Tokenizer over a tokenizer.json (byte-level BPE)."""

    def __init__(self, path: Path) -> None:
        self._tok = Tokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_token_ids = (
            self._tok.token_to_id("<|endoftext|>"),
            self._tok.token_to_id("<|im_end|>"),
        )
        self.special_token_ids = frozenset(self._tok.token_to_id(t) for t in SPECIAL_TOKENS)

    def token_bytes(self) -> list[bytes]:
        decoder = _byte_decoder()
        out = []
        for i in range(self.vocab_size):
            piece = self._tok.id_to_token(i)
            out.append(
                piece.encode() if i in self.special_token_ids else bytes(decoder[c] for c in piece)
            )
        return out

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


class SentencePieceTokenizer:
    """Test stand-in for brisklm.tokenizer.Tokenizer over a sentencepiece BPE with byte fallback.

    Like Llama's, `encode` adds a dummy-prefix space at the start of the text.
    """

    def __init__(self, model_proto: bytes) -> None:
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.vocab_size = self._sp.vocab_size()
        self.eos_token_ids = (self._sp.eos_id(),)
        self.special_token_ids = frozenset(
            {self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id()}
        )

    def token_bytes(self) -> list[bytes]:
        out = []
        for i in range(self.vocab_size):
            piece = self._sp.id_to_piece(i)
            if self._sp.is_byte(i):
                out.append(bytes([int(piece[3:5], 16)]))
            elif i in self.special_token_ids:
                out.append(piece.encode())
            else:
                out.append(piece.replace("\u2581", " ").encode())
        return out

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self._sp.encode(text)
        return [self._sp.bos_id(), *ids] if add_special_tokens else ids

    def decode(self, ids: list[int]) -> str:
        return self._sp.decode(ids)


@pytest.fixture(scope="session")
def bpe_json_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT, trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="session")
def bpe_tokenizer(bpe_json_path: Path) -> BpeTokenizer:
    return BpeTokenizer(bpe_json_path)


@pytest.fixture(scope="session")
def sp_tokenizer() -> SentencePieceTokenizer:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAINING_TEXT),
        model_writer=model,
        vocab_size=500,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        character_coverage=1.0,
        minloglevel=2,
    )
    return SentencePieceTokenizer(model.getvalue())


@pytest.fixture(scope="session")
def bpe_compiler(bpe_tokenizer: BpeTokenizer) -> GrammarCompiler:
    return GrammarCompiler(bpe_tokenizer, num_threads=2)


@pytest.fixture(scope="session")
def sp_compiler(sp_tokenizer: SentencePieceTokenizer) -> GrammarCompiler:
    return GrammarCompiler(sp_tokenizer, num_threads=2)


@dataclass
class Generation:
    token_ids: list[int]
    text: bytes  # output bytes, EOS excluded
    finished: bool  # ended by an accepted EOS (False: stopped by the length cap)
    matcher: GrammarMatcher


def random_generate(
    compiled: CompiledGrammar,
    token_bytes: list[bytes],
    *,
    seed: int,
    temperature: float,
    max_tokens: int,
    model_vocab_padding: int = 7,
    eos_bias: float = 0.0,
) -> Generation:
    """A "model" with random logits over a vocabulary padded past the tokenizer's, decoded under
    the grammar: bitmask -> apply -> argmax (temperature 0) or sample; forced tokens fast-forwarded.
    `eos_bias` raises the EOS logits, as a model that wants to stop would, for open-ended grammars."""
    generator = torch.Generator().manual_seed(seed)
    matcher = compiled.matcher()
    bitmask = allocate_token_bitmask(1, compiled.vocab_size)
    model_vocab = compiled.vocab_size + model_vocab_padding
    eos = set(compiled.eos_token_ids)
    tokens: list[int] = []
    while len(tokens) < max_tokens:
        forced = matcher.compute_ff_tokens()
        if forced:
            assert matcher.accept_tokens(forced) == len(forced), "forced tokens must be accepted"
            tokens += forced
            continue
        matcher.fill_bitmask(bitmask, 0)
        logits = torch.randn(1, model_vocab, generator=generator) * 2.0  # (1, V)
        logits[0, list(eos)] += eos_bias
        apply_token_bitmask_(logits, bitmask)
        if temperature == 0:
            token = int(logits.argmax(dim=-1))
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=generator))
        assert token < compiled.vocab_size, "padded model ids must be masked out"
        assert matcher.accept_token(token), f"masked sampling produced a rejected token {token}"
        if token in eos:
            assert matcher.is_terminated()
            return Generation(tokens, b"".join(token_bytes[t] for t in tokens), True, matcher)
        tokens.append(token)
    assert not matcher.is_terminated()
    return Generation(tokens, b"".join(token_bytes[t] for t in tokens), False, matcher)


@pytest.fixture(scope="session")
def generate() -> Callable[..., Generation]:
    return random_generate
