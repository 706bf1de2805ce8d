"""A Qwen3 checkpoint end to end: transformers' greedy tokens through the engine on both CPU
kernel paths, alone and batched, and a chat turn with tools under its Hermes-style template."""

from __future__ import annotations

import pytest
import torch

from brisklm import LLM, SamplingParams
from tests.hf_models import build_hf_model, save_hf_model
from tests.test_chat_template import REASONING_TEMPLATE
from tests.tokenizer_fixtures import build_byte_level_bpe

transformers = pytest.importorskip("transformers")

PROMPTS = [[1, 17, 93, 5, 44, 120, 8, 61], [1, 300, 9], [1, 33, 150, 9, 70, 2, 140, 17, 88, 3]]
STEPS = 24
# Bounded arguments, so that a random model's call ends well within max_tokens.
FORECAST = {
    "type": "function",
    "function": {
        "name": "get_forecast",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Zürich"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}


def make_qwen3_checkpoint(directory):
    """A tiny random Qwen3 checkpoint with a Qwen-style tokenizer and a reasoning chat template
    (``enable_thinking``): its directory and the transformers model saved there. q/k norms, a
    head_dim other than hidden_size // heads, q/k/v and o biases, tied embeddings."""
    hf = build_hf_model(
        "qwen3", vocab_size=640, head_dim=32, attention_bias=True, tie_word_embeddings=True
    )
    save_hf_model(hf, directory)
    build_byte_level_bpe(
        directory, qwen_style=True, config_overrides={"chat_template": REASONING_TEMPLATE}
    )
    return directory, hf


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return make_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3"))


def hf_greedy(hf, prompt: list[int], real_tokens: int) -> list[int]:
    """transformers' greedy tokens among the tokenizer's (the embedding is padded past them)."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=STEPS,
            min_new_tokens=STEPS,
            do_sample=False,
            pad_token_id=0,
            suppress_tokens=list(range(real_tokens, hf.config.vocab_size)),
        )
    return out[0, len(prompt) :].tolist()


def test_greedy_tokens_match_transformers_alone_and_batched(qwen3, kernels):
    directory, hf = qwen3
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    with LLM.from_pretrained(directory, show_progress=False, max_seq_len=128) as llm:
        assert llm.engine.num_real_tokens < hf.config.vocab_size
        expected = [hf_greedy(hf, p, llm.engine.num_real_tokens) for p in PROMPTS]
        assert (llm.engine.runner.native is not None) == (kernels == "native")
        assert [o.token_ids for o in llm.generate(PROMPTS, params)] == expected
        assert [llm.generate(p, params).token_ids for p in PROMPTS] == expected


def test_a_chat_turn_with_tools_calls_one_under_the_grammar(qwen3):
    directory, _ = qwen3
    with LLM.from_pretrained(directory, show_progress=False, max_seq_len=512) as llm:
        assert llm.tool_call_format().name == "hermes"
        messages = [{"role": "user", "content": "Weather in Zürich?"}]
        prompt = llm.chat_prompt_ids(messages, tools=[FORECAST], enable_thinking=False)
        text = llm.tokenizer.decode(prompt, skip_special_tokens=False)
        assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        grammar = llm.tool_call_format().grammar([FORECAST], "required", parallel=False)
        params = SamplingParams(temperature=0, max_tokens=64, grammar=grammar)
        reply = llm.chat(messages, params, tools=[FORECAST], enable_thinking=False)
        assert [c.name for c in reply.tool_calls] == ["get_forecast"]
        arguments = reply.tool_calls[0].arguments
        assert arguments["city"] in ("Paris", "Zürich") and 1 <= arguments["days"] <= 7
        assert reply.finish_reason == "tool_calls"
