"""The bundled models (brisk-chat and its draft brisk-draft): load in brisklm and transformers with
the same logits, render tools identically, emit tool calls that parse back, and serve as defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from brisklm import LLM, SamplingParams, Tokenizer, default_model_path
from brisklm.cli import main
from brisklm.engine.model_runner import ForwardBatch, ModelRunner
from brisklm.loader import load_model
from brisklm.tool_calls import parse_tool_calls, tool_call_grammar

ASSETS = Path(default_model_path.__code__.co_filename).parent / "assets"
MODELS = ["brisk-chat", "brisk-draft"]

# Names, people and places the training data never holds (training/pools.py held-out pools).
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "book_kayak_rental",
            "description": "Book the kayak rental.",
            "parameters": {
                "type": "object",
                "properties": {"harbor": {"type": "string"}, "guests": {"type": "integer"}},
                "required": ["harbor", "guests"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_tide_table",
            "description": "Get the tide table.",
            "parameters": {
                "type": "object",
                "properties": {"ridge": {"type": "string"}},
                "required": ["ridge"],
            },
        },
    },
]
MESSAGES = [
    {"role": "user", "content": 'Book the kayak rental with harbor "Ljubljana" and guests 7.'}
]


@pytest.fixture(scope="module")
def chat_llm():
    with LLM.from_pretrained(dtype="float32", show_progress=False) as llm:
        yield llm


@pytest.mark.parametrize("name", MODELS)
def test_brisklm_and_transformers_logits_match(name):
    transformers = pytest.importorskip("transformers")
    directory = ASSETS / name
    tokenizer = Tokenizer.from_pretrained(directory)
    text = tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    hf_tok = transformers.AutoTokenizer.from_pretrained(directory)
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == ids

    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor([ids])).logits[0]  # (T, V)
    model = load_model(directory, device="cpu", dtype="float32", show_progress=False)
    runner = ModelRunner(model, num_slots=1, max_seq_len=len(ids) + 8, attention_backend="sdpa")
    got = runner.forward(ForwardBatch([0], [0], [ids], [len(ids)])).float()  # (T, V)
    assert got.shape == expected.shape
    # bf16 weights computed in float32: the difference is float32 summation order only.
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("name", MODELS)
def test_chat_template_renders_tools_like_transformers(name):
    transformers = pytest.importorskip("transformers")
    directory = ASSETS / name
    ours = Tokenizer.from_pretrained(directory)
    hf = transformers.AutoTokenizer.from_pretrained(directory)
    history = MESSAGES + [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {
                        "name": "book_kayak_rental",
                        "arguments": {"harbor": "Ljubljana", "guests": 7},
                    },
                }
            ],
        },
        {"role": "tool", "content": json.dumps({"status": "booked"})},
    ]
    for msgs in (MESSAGES, history):
        for gen in (True, False):
            a = ours.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=gen)
            b = hf.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=gen, tokenize=False)
            assert a == b
    assert "<tools>" in a and '"name": "book_kayak_rental"' in a


def test_emitted_tool_call_parses_back(chat_llm):
    ids = chat_llm.chat_prompt_ids(MESSAGES, TOOLS)
    params = SamplingParams(temperature=0, max_tokens=80, grammar=tool_call_grammar(TOOLS, "auto"))
    content, calls = parse_tool_calls(chat_llm.generate(ids, params).text)
    assert [(c.name, c.arguments) for c in calls] == [
        ("book_kayak_rental", {"harbor": "Ljubljana", "guests": 7})
    ]


def test_default_model_is_brisk_chat(chat_llm):
    assert chat_llm.model_path == ASSETS / "brisk-chat"
    out = chat_llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0, max_tokens=24),
    )
    assert out.content == "The capital of France is Paris."


def test_cli_generate_without_model(capsys):
    code = main(["generate", "--temperature", "0", "--max-tokens", "8", "Once upon a time"])
    assert code == 0
    assert capsys.readouterr().out.strip()


SPECULATIVE_PROMPTS = [
    "Once upon a time",
    [{"role": "user", "content": "Hello!"}],
    [
        {
            "role": "user",
            "content": 'Reply in JSON with keys "city" and "year": Ada moved to Oslo in 1999.',
        }
    ],
]


def test_bundled_draft_keeps_greedy_output(chat_llm):
    """Speculative decoding with the bundled draft returns the target's own greedy tokens."""
    params = SamplingParams(temperature=0, max_tokens=48)
    with LLM.from_pretrained(
        dtype="float32", show_progress=False, draft="default", num_speculative_tokens=4
    ) as spec:
        for prompt in SPECULATIVE_PROMPTS:
            if isinstance(prompt, str):
                expected, got = chat_llm.generate(prompt, params), spec.generate(prompt, params)
            else:
                ids = chat_llm.chat_prompt_ids(prompt)
                expected, got = chat_llm.generate(ids, params), spec.generate(ids, params)
            assert got.token_ids == expected.token_ids
            assert got.speculative is not None and got.speculative.num_accepted > 0


EXTRACTION_CASES = [
    ("Orla Quist is 47 years old.", {"name": "Orla Quist", "age": 47}),
    ("Pedro Alves is 29 and lives in Porto.", {"name": "Pedro Alves", "age": 29}),
    ("Ingrid Sørensen turned 63 this year.", {"name": "Ingrid Sørensen", "age": 63}),
    ("Tomasz Wrona is aged 35 and works at Globex.", {"name": "Tomasz Wrona", "age": 35}),
    ("Amara Okafor is 52 years old and has a blue car.", {"name": "Amara Okafor", "age": 52}),
    (
        "Lucía Fernández is a teacher by trade and is 41 years old.",
        {"name": "Lucía Fernández", "age": 41},
    ),
    ("Kenji Watanabe, 18, lives in Osaka.", {"name": "Kenji Watanabe", "age": 18}),
    ("Greta Lindqvist is 76 years old and lives in Malmö.", {"name": "Greta Lindqvist", "age": 76}),
]


def test_json_schema_extraction_is_valid_and_copies(chat_llm):
    """Every reply is a valid object (the grammar); most copy both values exactly.

    The floor (6 of 8) is a regression guard well under the model's held-out field accuracy (85%,
    training/README.md); the shipped model gets 7 (it puts "Porto" in `name` once).
    """
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    params = SamplingParams(temperature=0, max_tokens=60, json_schema=schema)
    prompts = [
        chat_llm.chat_prompt_ids(
            [
                {
                    "role": "user",
                    "content": f"{sentence}\nExtract the data as JSON with this schema: "
                    f"{json.dumps(schema)}",
                }
            ]
        )
        for sentence, _ in EXTRACTION_CASES
    ]
    objects = [json.loads(out.text) for out in chat_llm.generate(prompts, params)]
    for obj in objects:
        assert set(obj) == {"name", "age"} and isinstance(obj["age"], int)
    right = [obj == expected for obj, (_, expected) in zip(objects, EXTRACTION_CASES, strict=True)]
    assert sum(right) >= 6, objects
