"""ChatBrisk.with_structured_output on the tiny random model: every method and schema form.

The random model's values are nonsense, but the grammar makes them valid: enums, bounded numbers and
strings with a maxLength keep the output short enough to finish.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import jsonschema
import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.outputs import ChatGeneration
from langchain_core.utils.function_calling import convert_to_json_schema
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from langchain_brisklm import ChatBrisk
from langchain_brisklm._structured import WholeJsonOutputKeyToolsParser, WholeJsonOutputParser


class Weather(BaseModel):
    """A weather report."""

    city: Literal["Paris", "Tokyo", "Lima"]
    temperature: int = Field(ge=-50, le=50)
    sunny: bool
    note: str = Field(max_length=8)


class WeatherDict(TypedDict):
    """A weather report."""

    city: Literal["Paris", "Tokyo", "Lima"]
    temperature: Annotated[Literal[-5, 0, 20], ..., "Degrees Celsius"]
    sunny: bool


WEATHER_JSON_SCHEMA = {
    "title": "Weather",
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Tokyo", "Lima"]},
        "temperature": {"type": "integer", "minimum": -50, "maximum": 50},
        "sunny": {"type": "boolean"},
    },
    "required": ["city", "temperature", "sunny"],
}
PROMPT = "What is the weather in Paris?"
SCHEMA_BODY = {k: v for k, v in WEATHER_JSON_SCHEMA.items() if k != "title"}
ANTHROPIC_TOOL = {
    "name": "Weather",
    "description": "A weather report.",
    "input_schema": SCHEMA_BODY,
}
OPENAI_FUNCTION = {"name": "Weather", "description": "A weather report.", "parameters": SCHEMA_BODY}
# OpenAI's json_schema response format, and its entry (ChatOpenAI's with_structured_output takes
# both): the entry was read as a function of no parameters, so anything passed.
OPENAI_RESPONSE_ENTRY = {"name": "Weather", "schema": SCHEMA_BODY, "strict": True}
OPENAI_RESPONSE_FORMAT = {"type": "json_schema", "json_schema": OPENAI_RESPONSE_ENTRY}


class _Options(BaseCallbackHandler):
    def __init__(self) -> None:
        self.options: list[Any] = []

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self.options.append(kwargs.get("options"))


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_pydantic(chat: ChatBrisk, method: str) -> None:
    structured = chat.with_structured_output(Weather, method=method)
    handler = _Options()
    result = structured.invoke(PROMPT, config={"callbacks": [handler]})
    assert isinstance(result, Weather)
    (options,) = handler.options
    assert options["ls_structured_output_format"]["schema"] == convert_to_json_schema(Weather)
    assert options["ls_structured_output_format"]["kwargs"]["method"] == method
    chunks = list(structured.stream(PROMPT))
    assert chunks and all(isinstance(c, Weather) for c in chunks)
    assert chunks[-1] == result


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
@pytest.mark.parametrize(
    "schema",
    # The Anthropic form was not enforced with json_schema: any JSON passed.
    [
        WeatherDict,
        WEATHER_JSON_SCHEMA,
        ANTHROPIC_TOOL,
        OPENAI_FUNCTION,
        OPENAI_RESPONSE_ENTRY,
        OPENAI_RESPONSE_FORMAT,
    ],
    ids=["typeddict", "json", "anthropic", "openai", "response-entry", "response-format"],
)
def test_dict_schemas(chat: ChatBrisk, method: str, schema: Any) -> None:
    structured = chat.with_structured_output(schema, method=method)
    result = structured.invoke(PROMPT)
    assert isinstance(result, dict)
    jsonschema.validate(result, WEATHER_JSON_SCHEMA)
    assert list(structured.stream(PROMPT))[-1] == result


async def test_async(chat: ChatBrisk) -> None:
    structured = chat.with_structured_output(Weather)
    result = await structured.ainvoke(PROMPT)
    assert isinstance(result, Weather)
    chunks = [chunk async for chunk in structured.astream(PROMPT)]
    assert chunks[-1] == result


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_include_raw(chat: ChatBrisk, method: str) -> None:
    result = chat.with_structured_output(Weather, method=method, include_raw=True).invoke(PROMPT)
    assert isinstance(result["raw"], AIMessage)
    if method == "json_mode":  # any JSON object: a random model does not pick Weather's keys
        assert result["parsing_error"] is not None or isinstance(result["parsed"], Weather)
    else:
        assert result["parsing_error"] is None
        assert isinstance(result["parsed"], Weather)


def test_json_schema_reply_is_the_json(chat: ChatBrisk) -> None:
    result = chat.with_structured_output(Weather, include_raw=True).invoke(PROMPT)
    raw = result["raw"]
    assert Weather.model_validate_json(raw.content) == result["parsed"]
    assert ", " in raw.content and '": ' in raw.content  # json.dumps' separators
    assert raw.response_metadata["finish_reason"] == "stop"


def test_json_mode_gives_json_objects(tiny_chat_dir: Any) -> None:
    # Any object is allowed, so a random model may write one longer than max_tokens; those that
    # finish must be JSON objects.
    finished = 0
    for seed in range(8):
        chat = ChatBrisk(
            model=str(tiny_chat_dir), temperature=1.0, seed=seed, max_tokens=120, device="cpu",
            max_batch_size=4, max_seq_len=1536,
        )  # fmt: skip
        raw = chat.with_structured_output(WEATHER_JSON_SCHEMA, method="json_mode", include_raw=True)
        message = raw.invoke(PROMPT)["raw"]
        if message.response_metadata["finish_reason"] == "stop":
            assert isinstance(json.loads(message.content), dict)
            finished += 1
    assert finished >= 2


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_a_schema_that_cannot_be_enforced_is_refused_when_bound(
    chat: ChatBrisk, method: str
) -> None:
    """json_schema refused it only at the first invoke (function_calling already at binding)."""

    class Share(BaseModel):
        part: float = Field(gt=0, le=0.5)

    with pytest.raises(ValueError, match=f"method='{method}'.*#/properties/part"):
        chat.with_structured_output(Share, method=method)


def test_unknown_method(chat: ChatBrisk) -> None:
    with pytest.raises(ValueError, match="method"):
        chat.with_structured_output(Weather, method="xml")  # type: ignore[arg-type]


# ------------------------------------------------------------------ response_format
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Tokyo", "Lima"]}},
    "required": ["city"],
    "additionalProperties": False,
}


def test_response_format_shapes(chat: ChatBrisk) -> None:
    flat = chat.invoke(PROMPT, response_format={"type": "json_schema", "schema": CITY_SCHEMA})
    jsonschema.validate(json.loads(flat.content), CITY_SCHEMA)
    openai = {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True},
    }
    assert chat.invoke(PROMPT, response_format=openai).content == flat.content
    # The schema `true`: any JSON value.
    anything = chat.invoke(PROMPT, response_format={"type": "json_schema", "schema": True})
    if anything.response_metadata["finish_reason"] == "stop":
        json.loads(anything.content)


def test_tools_beside_a_response_format_give_calls_or_that_json(chat: ChatBrisk) -> None:
    # create_agent(model, tools, response_format=...) binds both (OpenAI's semantics: the reply
    # is tool calls or the answer in the format); ChatBrisk refused every such call.
    response_format = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY_SCHEMA}}
    outcomes = set()
    for seed in range(8):
        bound = chat.bind_tools([Weather], response_format=response_format)
        message = bound.invoke(PROMPT, temperature=1.0, seed=seed)
        if message.tool_calls:
            assert message.response_metadata["finish_reason"] == "tool_calls"
            Weather.model_validate(message.tool_calls[0]["args"])
        else:
            assert message.response_metadata["finish_reason"] == "stop"
            jsonschema.validate(json.loads(message.content), CITY_SCHEMA)
        outcomes.add(bool(message.tool_calls))
        streamed = list(bound.stream(PROMPT, temperature=1.0, seed=seed))
        whole = streamed[0]
        for chunk in streamed[1:]:
            whole += chunk
        assert whole.content == message.content
        assert [c["args"] for c in whole.tool_calls] == [c["args"] for c in message.tool_calls]
    assert outcomes == {True, False}  # both kinds of reply occur
    answer = chat.bind_tools([Weather], tool_choice="none", response_format=response_format)
    jsonschema.validate(json.loads(answer.invoke(PROMPT).content), CITY_SCHEMA)
    called = chat.bind_tools([Weather], tool_choice="any", response_format=response_format)
    assert [c["name"] for c in called.invoke(PROMPT).tool_calls] == ["Weather"]


@pytest.mark.parametrize(
    ("response_format", "match"),
    [
        ("json", "unsupported response_format 'json'"),
        ({}, "unsupported response_format"),
        ({"type": "text", "schema": {}}, "unsupported response_format"),
        ({"type": "json_schema"}, "has no schema"),
        ({"type": "json_schema", "schema": 3}, "schema must be a JSON Schema dict"),
        ({"type": "json_schema", "schema": [1]}, "schema must be a JSON Schema dict"),
        ({"type": "json_schema", "schema": False}, "no JSON value matches"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "must be a dict with a schema"),
        ({"type": "json_schema", "json_schema": "x"}, "must be a dict with a schema"),
        ({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}, "strict must be a bool"),
        ({"type": "json_schema", "schema": {}, "json_schema": {"schema": {}}}, "give the schema once"),
        ({"type": "json_schema", "schema": {"x-guidance": 1}}, "x-guidance"),
    ],
)  # fmt: skip
def test_bad_response_format_is_refused(chat: ChatBrisk, response_format: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        chat.invoke(PROMPT, response_format=response_format)
    assert "response_format" in str(info.value)


def test_text_response_format_is_no_constraint(chat: ChatBrisk) -> None:
    """OpenAI's default response_format, which code forwarding options sends: plain text."""
    plain = chat.invoke(PROMPT, max_tokens=8, temperature=0)
    text = chat.invoke(PROMPT, max_tokens=8, temperature=0, response_format={"type": "text"})
    assert text.content == plain.content
    tokens = ("input_tokens", "output_tokens")  # (how many prompt tokens a cache held may differ)
    assert [text.usage_metadata[k] for k in tokens] == [plain.usage_metadata[k] for k in tokens]


def test_function_calling_needs_an_object_schema(chat: ChatBrisk) -> None:
    with pytest.raises(ValueError, match="needs an object schema"):
        chat.with_structured_output({"title": "T", "type": "string"}, method="function_calling")
    tool = {"name": "T", "parameters": {"type": "array"}}
    with pytest.raises(ValueError, match="must be an object schema"):
        chat.with_structured_output(tool, method="function_calling")
    # The same schema is fine as plain structured output.
    chat.with_structured_output({"title": "T", "type": "string"}, method="json_schema")


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_a_reply_cut_by_max_tokens_is_an_error_not_a_result(chat: ChatBrisk, method: str) -> None:
    """LangChain's JSON parsers accept partial JSON: a cut reply came back as a result with
    fields missing (a TypedDict) or as None with no parsing error (function_calling)."""
    cut = chat.model_copy(update={"max_tokens": 3})
    with pytest.raises(OutputParserException, match="cut off after 3 tokens"):
        cut.with_structured_output(WeatherDict, method=method).invoke(PROMPT)
    raw = cut.with_structured_output(WeatherDict, method=method, include_raw=True).invoke(PROMPT)
    assert raw["parsed"] is None
    assert isinstance(raw["parsing_error"], OutputParserException)
    assert raw["raw"].response_metadata["finish_reason"] == "length"
    with pytest.raises(OutputParserException, match="cut off"):
        list(cut.with_structured_output(WeatherDict, method=method).stream(PROMPT))


def test_a_call_cut_in_a_stream_that_invoke_merges_is_an_error(chat: ChatBrisk) -> None:
    """With streaming=True, invoke merges the stream's chunks. LangChain's partial-JSON merge made
    a call cut inside its arguments a call with the fields written so far: function_calling
    returned them ({"city": "Paris"} of three required fields, or a pydantic ValidationError) with
    no parsing error. The cut call is an invalid tool call, and the last chunk says the reply ended
    inside a call."""
    streaming = chat.model_copy(update={"max_tokens": 40, "streaming": True})
    method = "function_calling"
    raw = streaming.with_structured_output(WeatherDict, method=method, include_raw=True).invoke(
        PROMPT
    )
    assert raw["raw"].tool_calls == []
    assert raw["raw"].invalid_tool_calls[0]["args"].startswith('{"city": "Paris"')
    assert raw["raw"].response_metadata["cut_tool_call"] is True
    assert raw["parsed"] is None
    assert isinstance(raw["parsing_error"], OutputParserException)
    for schema in (WeatherDict, Weather):
        with pytest.raises(OutputParserException, match="cut off after 40 tokens"):
            streaming.with_structured_output(schema, method=method).invoke(PROMPT)
    whole = chat.model_copy(update={"streaming": True})
    raw = whole.with_structured_output(WeatherDict, method=method, include_raw=True).invoke(PROMPT)
    assert "cut_tool_call" not in raw["raw"].response_metadata
    assert raw["parsing_error"] is None and set(raw["parsed"]) == set(WeatherDict.__annotations__)


def test_a_reply_cut_by_a_stop_sequence_is_an_error_not_a_result(chat: ChatBrisk) -> None:
    """A stop sequence set on the model cut the reply at the first ', ': json_schema returned the
    fields before it and did not say why. (function_calling's answer is a tool call, which stop
    sequences do not cut, as OpenAI's.)"""
    method = "json_schema"
    cut = chat.model_copy(update={"stop": [", "]})
    whole = cut.with_structured_output(WeatherDict, method="function_calling").invoke(PROMPT)
    assert set(whole) == set(WeatherDict.__annotations__)
    with pytest.raises(OutputParserException, match="cut off by the stop sequence ', '"):
        cut.with_structured_output(WeatherDict, method=method).invoke(PROMPT)
    raw = cut.with_structured_output(WeatherDict, method=method, include_raw=True).invoke(PROMPT)
    assert raw["parsed"] is None
    assert raw["raw"].response_metadata["stop_reason"] == ", "
    streaming = cut.model_copy(update={"streaming": True})
    with pytest.raises(OutputParserException, match="cut off by the stop sequence ', '"):
        streaming.with_structured_output(WeatherDict, method=method).invoke(PROMPT)


def _generation(message: AIMessage) -> list[ChatGeneration]:
    return [ChatGeneration(message=message)]


def test_a_whole_reply_that_ends_at_the_limit_is_kept() -> None:
    """Only a reply the limit cut before it was whole is refused: one whose last allowed token
    closed it parses."""
    length = {"finish_reason": "length"}
    parser = WholeJsonOutputParser()
    whole = AIMessage('{"city": "Paris"}', response_metadata=length)
    assert parser.parse_result(_generation(whole)) == {"city": "Paris"}
    with pytest.raises(OutputParserException, match="cut off"):
        parser.parse_result(_generation(AIMessage('{"city": "Par', response_metadata=length)))
    stopped = AIMessage('{"city": "Par', response_metadata={"finish_reason": "stop"})
    assert parser.parse_result(_generation(stopped), partial=True) == {"city": "Par"}

    tools = WholeJsonOutputKeyToolsParser(key_name="Weather", first_tool_only=True)
    call = {"name": "Weather", "args": {"city": "Paris"}, "id": "c1", "type": "tool_call"}
    assert tools.parse_result(
        _generation(AIMessage("", tool_calls=[call], response_metadata=length))
    ) == {"city": "Paris"}
    invalid = {"name": "Weather", "args": '{"city": "Pa', "id": "c1", "error": "cut"}
    with pytest.raises(OutputParserException, match="cut off"):
        tools.parse_result(
            _generation(AIMessage("", invalid_tool_calls=[invalid], response_metadata=length))
        )
    chunk = {"name": "Weather", "args": '{"city": "Pa', "id": "c1", "index": 0}
    streamed = AIMessageChunk("", tool_call_chunks=[chunk], response_metadata=length)
    assert streamed.tool_calls  # LangChain parses the cut arguments as a call
    with pytest.raises(OutputParserException, match="cut off"):
        tools.parse_result(_generation(streamed), partial=True)


class Tagged(BaseModel):
    """Tags of a city."""

    city: Literal["Paris", "Tokyo", "Lima"]
    tags: set[Literal["warm", "wet"]] = Field(max_length=2)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_a_pydantic_set_field_is_decoded_as_a_list_and_validated_to_a_set(
    chat: ChatBrisk, method: str
) -> None:
    """A set field's JSON Schema says uniqueItems, which a grammar cannot enforce; the class's own
    validation makes the decoded list a set, so the schema is decoded without it."""
    result = chat.with_structured_output(Tagged, method=method).invoke(PROMPT)
    assert isinstance(result, Tagged) and isinstance(result.tags, set)


def test_a_dict_schema_with_unique_items_is_refused_where_it_is_given(chat: ChatBrisk) -> None:
    """A dict schema returns dicts, which nothing validates afterwards: refused, naming the tool,
    at bind time rather than as a grammar error when a call compiles."""
    schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    tool = {"type": "function", "function": {"name": "tag", "parameters": schema}}
    with pytest.raises(
        ValueError, match=r"tools\[0\]: the parameters of tool 'tag': .*uniqueItems"
    ):
        chat.bind_tools([tool])
    with pytest.raises(ValueError, match="uniqueItems"):
        chat.with_structured_output({"title": "T", **schema}).invoke(PROMPT)
