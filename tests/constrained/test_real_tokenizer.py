"""The grammar machinery on brisklm's own Tokenizer (byte-level BPE and sentencepiece), not stand-ins:
llguidance reads the tokenizer's JSON pipeline, forced text decodes exactly, outputs validate."""

from __future__ import annotations

import json

import jsonschema
import pytest

from brisklm import Tokenizer
from brisklm.constrained import GrammarCompiler, JsonSchema, Regex
from tests.constraint_cases import SCHEMAS
from tests.tiny import make_tiny_checkpoint
from tests.tokenizer_fixtures import build_sentencepiece


@pytest.fixture(scope="module", params=["byte-level-bpe", "sentencepiece"])
def tokenizer(request, tmp_path_factory) -> Tokenizer:
    directory = tmp_path_factory.mktemp(request.param)
    if request.param == "sentencepiece":
        build_sentencepiece(directory)
    else:
        make_tiny_checkpoint(directory)
    return Tokenizer.from_pretrained(directory)


def test_llguidance_uses_the_tokenizer_pipeline(tokenizer):
    compiler = GrammarCompiler(tokenizer)
    assert compiler.llg_tokenizer.is_canonical
    assert compiler.vocab_size == tokenizer.vocab_size
    text = 'Zürich 東京 {"a": 1}'
    assert tokenizer.decode(compiler.llg_tokenizer.tokenize_str(text)) == text


@pytest.mark.parametrize("name", ["types", "nested_optional", "pattern_formats", "array_bounds"])
def test_random_generation_validates(tokenizer, generate, name):
    compiler = GrammarCompiler(tokenizer)
    schema = SCHEMAS[name]
    compiled = compiler.compile(JsonSchema(schema))
    finished = 0
    for seed, temperature in ((0, 0.0), (1, 1.0), (2, 1.0)):
        out = generate(
            compiled, tokenizer.token_bytes(), seed=seed, temperature=temperature, max_tokens=300
        )
        if out.finished:
            finished += 1
            # The text the user sees is the tokenizer's decode of the ids, not the raw bytes.
            text = tokenizer.decode(out.token_ids)
            assert text.encode() == out.text
            jsonschema.Draft202012Validator(schema).validate(json.loads(text))
    assert finished == 3


def test_forced_key_decodes_cleanly(tokenizer):
    compiler = GrammarCompiler(tokenizer)
    schema = {
        "type": "object",
        "properties": {"location": {"type": "string"}},
        "required": ["location"],
    }
    matcher = compiler.compile(JsonSchema(schema)).matcher()
    forced = matcher.compute_ff_tokens()
    # Forced up to where a token could merge the quote with the value's first characters.
    assert tokenizer.decode(forced) in ('{"location":', '{"location":"')
    matcher = compiler.compile(Regex(r"[0-9]{3}")).matcher()
    assert matcher.compute_ff_tokens() == []
