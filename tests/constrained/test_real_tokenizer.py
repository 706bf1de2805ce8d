"""The grammar machinery on brisklm's own Tokenizer (byte-level BPE and sentencepiece), not stand-ins:
llguidance reads the tokenizer's JSON pipeline, forced text decodes exactly, outputs validate."""

from __future__ import annotations

import json

import jsonschema
import pytest

from brisklm import Tokenizer
from brisklm.constrained import Grammar, GrammarCompiler, JsonSchema, Regex
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


def test_added_non_special_tokens_stay_text(tmp_path):
    """Hermes `<tool_call>` tags added as ordinary tokens: a grammar forcing that text must accept them."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HfTokenizer

    directory = make_tiny_checkpoint(tmp_path / "m")
    hf = HfTokenizer.from_file(str(directory / "tokenizer.json"))
    hf.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    hf.save(str(directory / "tokenizer.json"))
    tokenizer = Tokenizer.from_pretrained(directory)
    tag = tokenizer.token_to_id("<tool_call>")
    assert tag is not None and tag not in tokenizer.special_token_ids
    compiler = GrammarCompiler(tokenizer)
    matcher = compiler.compile(Grammar('start: "<tool_call>" /[0-9]/')).matcher()
    forced = matcher.compute_ff_tokens()
    assert forced[:1] == [tag]
    assert matcher.accept_tokens(forced) == len(forced)


def test_constrained_output_keeps_its_leading_space_without_prompt_text(tmp_path):
    # Sentencepiece decoding strips the first token's "▁", which the grammar counted as a space:
    # with an empty prompt (or BOS alone), choice=[" yes", " no"] gave "no".
    import sentencepiece

    from brisklm import LLM, SamplingParams
    from tests.hf_models import build_hf_model, save_hf_model

    directory = build_sentencepiece(tmp_path / "spm")
    size = sentencepiece.SentencePieceProcessor(
        model_file=str(directory / "tokenizer.model")
    ).vocab_size()
    model = build_hf_model(
        "llama", seed=0, vocab_size=size + 8, bos_token_id=1, eos_token_id=2, initializer_range=0.1
    )
    save_hf_model(model, directory)
    with LLM.from_pretrained(directory, max_seq_len=64, show_progress=False) as llm:
        spaced = {i: 8.0 for i in range(size) if llm.tokenizer.id_to_token(i).startswith("▁")}
        for prompt in ("", [llm.tokenizer.bos_token_id], "Say:"):
            for constraint, valid in (
                ({"choice": [" yes", " no"]}, {" yes", " no"}.__contains__),
                ({"regex": " [a-z]{2,8}"}, lambda t: t[0] == " " and t[1:].isalpha()),
            ):
                params = SamplingParams(
                    temperature=0, max_tokens=12, logit_bias=spaced, **constraint
                )
                text = llm.generate(prompt, params).text
                assert valid(text), (prompt, constraint, text)
                assert "".join(llm.stream(prompt, params)) == text
