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
    with pytest.raises(TypeError, match="tool_choice=.*an option of the request"):
        chat.invoke(MESSAGES, chat_template_kwargs={"tool_choice": "required"})
    with pytest.raises(TypeError, match="chat_template_kwargs must be a dict"):
        chat.invoke(MESSAGES, chat_template_kwargs=["enable_thinking"])


def test_a_thinking_block_goes_to_reasoning_content_whole_and_streamed(qwen3_dir: Path) -> None:
    # The tiny model does not think of itself: its replies are given here, as the engine would
    # hand them over, through ChatBrisk's reading of a call on this Qwen3-style template.
    from brisklm.outputs import GenerationOutput, StreamChunk, Usage
    from langchain_brisklm._messages import to_template_messages
    from langchain_brisklm.chat_models import _ChunkConverter

    chat = ChatBrisk(model=str(qwen3_dir), max_tokens=8, **TINY_ENGINE)
    call = chat._prepare(MESSAGES, None, {})
    assert call.reasoning_start is False  # the template shows thinking; the prompt opens none
    text = "<think>\nThe user greets.\n</think>\n\nHello!"
    usage = Usage(5, 9)
    output = GenerationOutput("r", None, [], text, [5] * 9, "stop", usage)
    message = chat._generation(call, output, usage).message
    assert message.content == "Hello!"
    assert message.additional_kwargs == {"reasoning_content": "The user greets."}
    converter = _ChunkConverter(call)
    pieces = ["<thi", "nk>\nThe user", " greets.\n</th", "ink>\n\nHel", "lo!"]
    chunks = [StreamChunk("r", piece, [5]) for piece in pieces[:-1]]
    chunks.append(StreamChunk("r", pieces[-1], [5], finish_reason="stop", usage=usage))
    merged = None
    for chunk in chunks:
        for piece in converter.convert(chunk):
            merged = piece if merged is None else merged + piece
    assert merged is not None and merged.message.content == "Hello!"
    assert merged.message.additional_kwargs == {"reasoning_content": "The user greets."}
    # ... and goes back into the history, where Qwen3's template shows it within a tool loop
    (_, rendered) = to_template_messages([HumanMessage("Hi"), message])
    assert rendered["reasoning_content"] == "The user greets."
    plain = GenerationOutput("r", None, [], "Hello!", [5], "stop", usage)
    assert chat._generation(call, plain, usage).message.additional_kwargs == {}
