"""ChatBrisk's chat_template_kwargs: variables of the model's chat template (Qwen3's
enable_thinking), as a field and per call, in the prompt and in the token count."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from langchain_brisklm import ChatBrisk
from tests.engine.test_qwen3 import make_qwen3_checkpoint
from tests.integrations.langchain.conftest import TINY_ENGINE

MESSAGES = [HumanMessage("Hi")]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory, _ = make_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3"))
    return directory


def test_template_variables_reach_the_prompt_as_a_field_and_per_call(qwen3_dir: Path) -> None:
    settings = {"model": str(qwen3_dir), "temperature": 0, "max_tokens": 6, **TINY_ENGINE}
    thinking = ChatBrisk(**settings)
    quiet = ChatBrisk(**settings, chat_template_kwargs={"enable_thinking": False})
    on, off = thinking.invoke(MESSAGES), quiet.invoke(MESSAGES)
    # enable_thinking=False closes an empty think block in the prompt: more prompt tokens
    assert off.usage_metadata["input_tokens"] > on.usage_metadata["input_tokens"]
    assert quiet.get_num_tokens_from_messages(MESSAGES) == off.usage_metadata["input_tokens"]
    assert thinking.get_num_tokens_from_messages(MESSAGES) == on.usage_metadata["input_tokens"]
    per_call = thinking.invoke(MESSAGES, chat_template_kwargs={"enable_thinking": False})
    assert per_call.content == off.content
    assert per_call.usage_metadata["input_tokens"] == off.usage_metadata["input_tokens"]
    # a call's own variables override the field's
    again = quiet.invoke(MESSAGES, chat_template_kwargs={"enable_thinking": True})
    assert again.usage_metadata["input_tokens"] == on.usage_metadata["input_tokens"]


def test_a_sampling_option_or_the_generation_prompt_is_not_a_template_variable(
    qwen3_dir: Path,
) -> None:
    with pytest.raises(TypeError, match="not a chat template variable"):
        ChatBrisk(model=str(qwen3_dir), chat_template_kwargs={"temperature": 0})
    with pytest.raises(ValueError, match="add_generation_prompt is not a chat option"):
        ChatBrisk(model=str(qwen3_dir), chat_template_kwargs={"add_generation_prompt": False})
    chat = ChatBrisk(model=str(qwen3_dir), max_tokens=2, **TINY_ENGINE)
    with pytest.raises(TypeError, match="not a chat template variable"):
        chat.invoke(MESSAGES, chat_template_kwargs={"max_tokens": 3})
    with pytest.raises(TypeError, match="chat_template_kwargs must be a dict"):
        chat.invoke(MESSAGES, chat_template_kwargs=["enable_thinking"])
