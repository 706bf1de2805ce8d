"""``brisklm serve``'s app through OpenAI's own Python client (its request and response models
are the reference for the API's shapes), on the bundled model: each endpoint gives what the
Python API gives for the same request, streams add up to the whole reply, and bad requests get
OpenAI's error body naming the field."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import jsonschema
import pytest

pytest.importorskip("starlette")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from brisklm import LLM, SamplingParams  # noqa: E402
from brisklm.server.app import build_app  # noqa: E402

pytestmark = pytest.mark.bundled_model

NAME = "brisk-chat"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CONVERT = {
    "type": "function",
    "function": {
        "name": "celsius_to_fahrenheit",
        "description": "Convert a temperature from Celsius to Fahrenheit",
        "parameters": {
            "type": "object",
            "properties": {"celsius": {"type": "number"}},
            "required": ["celsius"],
        },
    },
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def llm():
    model = LLM.from_pretrained(None, max_batch_size=4, show_progress=False)
    yield model
    model.close()


@pytest.fixture(scope="module")
def app(llm):
    return build_app(llm, NAME)


@pytest.fixture(scope="module")
def http(app):
    with TestClient(app) as client:
        yield client


@pytest.fixture(scope="module")
def client(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http)


@pytest.fixture(scope="module")
def live(app):
    """The app on uvicorn over a socket, as ``brisklm serve`` runs it: its base URL."""
    import threading
    import time

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def aborted(llm, monkeypatch) -> list[str]:
    """The ids of the requests aborted while the test runs."""
    ids: list[str] = []
    abort = llm._loop.abort
    monkeypatch.setattr(llm._loop, "abort", lambda rid: (ids.append(rid), abort(rid)))
    return ids


def wait_for(condition, seconds: float = 30) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_models_lists_the_served_model(client, llm) -> None:
    (model,) = client.models.list().data
    assert model.id == NAME and model.owned_by == "brisklm"
    assert model.model_extra["max_model_len"] == llm.max_seq_len


def test_a_chat_reply_is_the_python_apis(client, llm) -> None:
    reply = client.chat.completions.create(model=NAME, messages=ask("Hello!"), max_tokens=24)
    expected = llm.chat(ask("Hello!"), llm.default_sampling_params(max_tokens=24))
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == expected.content
    assert choice.finish_reason == expected.finish_reason and choice.message.tool_calls is None
    assert reply.usage.prompt_tokens == expected.usage.prompt_tokens
    assert reply.usage.completion_tokens == expected.usage.completion_tokens
    assert reply.id.startswith("chatcmpl-") and reply.model == NAME


def test_a_streamed_chat_reply_adds_up_to_the_whole(client) -> None:
    whole = client.chat.completions.create(model=NAME, messages=ask("Hello!"), max_tokens=24)
    chunks = list(
        client.chat.completions.create(
            model=NAME,
            messages=ask("Hello!"),
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_a_tool_call_comes_back_in_openais_shape(client) -> None:
    reply = client.chat.completions.create(
        model=NAME, messages=ask("What is the weather in Paris?"), tools=[WEATHER, CONVERT]
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_a_streamed_tool_call_is_the_same_call(client) -> None:
    """Streamed as OpenAI streams calls: a call's first delta has its id, type and name, the
    next ones pieces of its arguments, which join to the whole reply's arguments."""
    messages = ask("What is the weather in Paris?")
    whole = client.chat.completions.create(model=NAME, messages=messages, tools=[WEATHER])
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(
        model=NAME, messages=messages, tools=[WEATHER], stream=True
    ):
        for delta in chunk.choices[0].delta.tool_calls or []:
            if delta.index not in calls:
                assert delta.id and delta.type == "function" and delta.function.name
                calls[delta.index] = {"id": delta.id, "name": delta.function.name, "args": ""}
            else:
                assert delta.id is None and delta.function.name is None
            calls[delta.index]["args"] += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    (expected,) = whole.choices[0].message.tool_calls
    (call,) = calls.values()
    assert call["name"] == expected.function.name
    assert json.loads(call["args"]) == json.loads(expected.function.arguments)
    assert finish == "tool_calls"


def test_a_stop_sequence_does_not_cut_a_tool_call(client) -> None:
    """As OpenAI's, stop sequences apply to the reply's text, not inside its calls: "Paris"
    (copied into the call) and "city" ended the reply inside the call, which came back as
    nothing (streamed: a name and half its arguments)."""
    messages = ask("What is the weather in Paris?")
    for choice in ("auto", "required"):
        reply = client.chat.completions.create(
            model=NAME, messages=messages, tools=[WEATHER], tool_choice=choice, stop=["Paris"]
        )
        assert reply.choices[0].finish_reason == "tool_calls"
        (call,) = reply.choices[0].message.tool_calls
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        arguments = ""
        for chunk in client.chat.completions.create(
            model=NAME,
            messages=messages,
            tools=[WEATHER],
            tool_choice=choice,
            stop=["city", "Paris"],
            stream=True,
        ):
            for delta in chunk.choices[0].delta.tool_calls or []:
                arguments += delta.function.arguments or ""
        assert json.loads(arguments) == {"city": "Paris"}


def test_tool_choice_forces_a_named_tool_or_none(client) -> None:
    forced = client.chat.completions.create(
        model=NAME,
        messages=ask("Hello!"),
        tools=[WEATHER, CONVERT],
        tool_choice={"type": "function", "function": {"name": "celsius_to_fahrenheit"}},
        max_tokens=40,
    )
    (call,) = forced.choices[0].message.tool_calls
    assert call.function.name == "celsius_to_fahrenheit"
    parameters = CONVERT["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), parameters)
    plain = client.chat.completions.create(
        model=NAME,
        messages=ask("What is the weather in Paris?"),
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=24,
    )
    assert plain.choices[0].message.tool_calls is None
    assert isinstance(plain.choices[0].message.content, str)


def test_a_tool_result_goes_back_in(client) -> None:
    """The assistant's call (arguments as JSON text, as OpenAI's clients send them) and the tool's
    result render with the template; the reply answers."""
    first = client.chat.completions.create(
        model=NAME, messages=ask("What is the weather in Paris?"), tools=[WEATHER]
    )
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *ask("What is the weather in Paris?"),
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees"},
    ]
    second = client.chat.completions.create(
        model=NAME, messages=messages, tools=[WEATHER], max_tokens=40
    )
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls


def test_response_format_and_logprobs(client) -> None:
    reply = client.chat.completions.create(
        model=NAME,
        messages=ask("Ada is 36. Reply in JSON."),
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        max_tokens=40,
        logprobs=True,
        top_logprobs=2,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PERSON)
    entries = choice.logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    assert all(e.logprob <= 0 and len(e.top_logprobs) <= 2 for e in entries)
    assert b"".join(bytes(e.bytes) for e in entries).decode() == choice.message.content


def test_chat_logprobs_are_the_contents_tokens_without_the_end_of_turn(client) -> None:
    # The eos that ended the turn had an entry (and a streamed chunk with no delta of its own);
    # OpenAI's content lists, and ChatBrisk's, hold the content's tokens only.
    options = dict(model=NAME, messages=ask("Hello!"), max_tokens=30, logprobs=True)
    reply = client.chat.completions.create(**options)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content
    entries = choice.logprobs.content
    assert len(entries) == reply.usage.completion_tokens - 1  # the eos counts as a token
    assert b"".join(bytes(e.bytes) for e in entries).decode() == choice.message.content
    streamed = []
    for chunk in client.chat.completions.create(**options, stream=True):
        for part in chunk.choices:
            if part.logprobs is not None:
                assert part.delta.content  # no entry without text of its own
                streamed += part.logprobs.content
    assert [e.token for e in streamed] == [e.token for e in entries]


def test_completions_are_the_python_apis(client, llm) -> None:
    prompts = ["Once upon a time", "The capital of France is"]
    reply = client.completions.create(model=NAME, prompt=prompts, max_tokens=8, logprobs=2)
    expected = llm.generate(prompts, llm.default_sampling_params(max_tokens=8, logprobs=2))
    assert [c.index for c in reply.choices] == [0, 1]
    assert [c.text for c in reply.choices] == [o.text for o in expected]
    assert [c.finish_reason for c in reply.choices] == [o.finish_reason for o in expected]
    first = reply.choices[0].logprobs
    assert first.token_logprobs == pytest.approx([e.logprob for e in expected[0].logprobs])
    assert all(len(top) <= 2 for top in first.top_logprobs)
    assert reply.usage.completion_tokens == sum(o.usage.completion_tokens for o in expected)
    ids = llm.tokenizer.encode(prompts[0])
    by_ids = client.completions.create(model=NAME, prompt=ids, max_tokens=8)
    assert by_ids.choices[0].text == expected[0].text


def test_streamed_completions_add_up_per_prompt(client) -> None:
    prompts = ["Once upon a time", "Hello"]
    whole = client.completions.create(model=NAME, prompt=prompts, max_tokens=12)
    texts = ["", ""]
    finishes = [None, None]
    usage = None
    for chunk in client.completions.create(
        model=NAME,
        prompt=prompts,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if not chunk.choices:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    assert texts == [c.text for c in whole.choices]
    assert finishes == [c.finish_reason for c in whole.choices]
    assert usage is not None and usage.total_tokens == whole.usage.total_tokens


def test_prompt_logprobs_extension(http, llm) -> None:
    body = {"prompt": "The capital of France is", "max_tokens": 1, "prompt_logprobs": 0}
    reply = http.post("/v1/completions", json=body).json()
    entries = reply["choices"][0]["prompt_logprobs"]
    expected = llm.generate(body["prompt"], SamplingParams(max_tokens=1, prompt_logprobs=0))
    assert entries[0] is None and len(entries) == len(expected.prompt_token_ids)
    assert [e["logprob"] for e in entries[1:]] == pytest.approx(
        [e.logprob for e in expected.prompt_logprobs[1:]], abs=1e-5
    )


async def test_concurrent_requests_each_get_their_own_reply(app, llm) -> None:
    """Requests arriving together decode in one batch; each reply is the one it gets alone."""
    prompts = ["Hello!", "What is 2+2?", "Tell me a joke.", "Thanks!"]
    params = llm.default_sampling_params(max_tokens=16)
    expected = [llm.chat(ask(p), params).content for p in prompts]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:

        async def one(prompt: str) -> str:
            body = {"messages": ask(prompt), "max_tokens": 16}
            response = await http.post("/v1/chat/completions", json=body)
            return response.json()["choices"][0]["message"]["content"]

        replies = await asyncio.gather(*(one(p) for p in prompts))
    assert list(replies) == expected


def test_a_guided_grammar_is_read_as_gbnf_where_it_has_a_root_rule(http) -> None:
    """vLLM's clients send GBNF (`root ::= ...`); Lark grammars (`start: ...`) still work."""
    for grammar in ('root ::= "yes" | "no"', '\n  root::= ("yes") | "no"\n', 'start: "yes" | "no"'):
        body = {"prompt": "Answer:", "guided_grammar": grammar, "max_tokens": 5}
        response = http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] in ("yes", "no"), grammar
    response = http.post("/v1/completions", json={"prompt": "x", "guided_grammar": "root ::= ("})
    assert response.status_code == 400 and "GBNF" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    [
        ({"model": "gpt-4o", "messages": ask("x")}, 404, "model", "does not exist"),
        ({"messages": ask("x"), "temperature": -1}, 400, "temperature", "temperature"),
        ({"messages": ask("x"), "top_p": 2}, 400, "top_p", "top_p"),
        ({"messages": ask("x"), "frobnicate": 1}, 400, "frobnicate", "unrecognized"),
        ({"messages": ask("x"), "n": 0}, 400, "n", "n must be an integer in [1, 128]"),
        ({"messages": []}, 400, "messages", "non-empty"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages", "role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "messages",
            "text only",
        ),
        (
            {
                "messages": ask("x"),
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
            400,
            "tool_choice",
            "not among the tools",
        ),
        ({"messages": ask("x"), "tool_choice": "required"}, 400, "tool_choice", "needs tools"),
        (
            {"messages": ask("x"), "response_format": {"type": "xml"}},
            400,
            "response_format",
            "response_format",
        ),
        (
            {"messages": ask("x"), "stream_options": {"include_usage": True}},
            400,
            "stream_options",
            "stream: true",
        ),
        ({"messages": ask("x"), "top_logprobs": 2}, 400, "top_logprobs", "logprobs: true"),
        ({"messages": ask("x"), "guided_regex": "(a"}, 400, "guided_regex", "regex"),
        ({"messages": ask("x"), "guided_grammar": 5}, 400, "guided_grammar", "grammar"),
        ({"messages": ask("x"), "max_completion_tokens": "5"}, 400, "max_completion_tokens", "max"),
        (
            {"messages": ask("x"), "logprobs": True, "top_logprobs": 50},
            400,
            "top_logprobs",
            "top_logprobs must be an integer in [0, 20], got 50",
        ),
        (
            {
                "messages": ask("x"),
                "response_format": {"type": "json_schema", "schema": {"type": "nonsense"}},
            },
            400,
            "response_format",
            "schema",
        ),
        (  # beside tools too (its error was the tools')
            {
                "messages": ask("x"),
                "tools": [WEATHER],
                "response_format": {"type": "json_schema", "schema": {"type": "nonsense"}},
            },
            400,
            "response_format",
            "nonsense",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": 5}]},
            400,
            "messages",
            "a list of calls",
        ),
        ({"model": 5, "messages": ask("x")}, 400, "model", "a string"),
        # OpenAI's fields without effect here are still of their types (they were taken as any)
        ({"messages": ask("x"), "user": 5}, 400, "user", "user must be a string"),
        ({"messages": ask("x"), "metadata": "x"}, 400, "metadata", "an object"),
        ({"messages": ask("x"), "store": "x"}, 400, "store", "true or false"),
        ({"messages": ask("x"), "service_tier": 5}, 400, "service_tier", "a string"),
        ({"messages": ask("x"), "n": True}, 400, "n", "n must be an integer"),
        ({"messages": ask("word " * 2000)}, 400, "messages", "context"),
        ({"messages": ask("word " * 2000), "max_tokens": 3}, 400, "messages", "prompt"),
        ({"messages": ask("x"), "max_tokens": 5000}, 400, "max_tokens", "lower max_tokens"),
        # Errors the template or the vocabulary finds name their field too (they named messages).
        (
            {"messages": ask("x"), "tools": [{**WEATHER, "function": {"name": ""}}]},
            400,
            "tools",
            "non-empty str name",
        ),
        ({"messages": ask("x"), "tools": [WEATHER, WEATHER]}, 400, "tools", "must be unique"),
        ({"messages": ask("x"), "logit_bias": {"99999": 1}}, 400, "logit_bias", "vocab_size"),
    ],
)
def test_bad_chat_requests_get_openais_error_body(http, body, status, param, words) -> None:
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert words in error["message"] and error["param"] == param and error["type"]


def test_bad_bodies_and_paths(http) -> None:
    response = http.post("/v1/completions", content=b"{not json")
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    response = http.post("/v1/completions", json=["a"])
    assert response.status_code == 400 and "JSON object" in response.json()["error"]["message"]
    response = http.post("/v1/completions", json={"prompt": [1, "a"]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    response = http.post("/v1/completions", json={"prompt": "a", "user": ["u"]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "user"
    response = http.post("/v1/completions", json={"prompt": "a", "echo": 1})
    assert response.status_code == 400 and response.json()["error"]["param"] == "echo"
    response = http.post("/v1/completions", json={"prompt": "a", "max_tokens": 0})
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"
    # JSON that Python's reader gives up on: nested too deep, a number of too many digits (500s)
    for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"n": ' + b"9" * 5000 + b"}"):
        response = http.post("/v1/chat/completions", content=raw)
        assert response.status_code == 400, response.json()
        assert "not valid JSON" in response.json()["error"]["message"]
    # Text that is not valid Unicode (a lone surrogate): /tokenize answered 500, and completions
    # named the prompt with the tokenizer's "TextInputSequence must be str".
    for path, body in (
        ("/tokenize", {"prompt": "a\ud800"}),
        ("/tokenize", {"messages": ask("a\ud800")}),
        ("/v1/completions", {"prompt": "a\ud800", "max_tokens": 1}),
    ):
        response = http.post(path, content=json.dumps(body))  # ("\\ud800", as clients send it)
        error = response.json()["error"]
        assert response.status_code == 400, error
        assert "not valid Unicode text: surrogates not allowed" in error["message"]
        assert error["param"] == ("messages" if "messages" in body else "prompt")
    response = http.get("/v1/nothing")
    error = response.json()["error"]
    assert response.status_code == 404 and error["type"] == "invalid_request_error"
    assert error["message"] == "GET /v1/nothing: Not Found"
    assert http.get("/health").json() == {"status": "ok"}
    # The server goes on serving after each of these.
    ok = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] is not None


def test_a_client_that_leaves_while_sending_its_body_is_no_server_failure(live, caplog) -> None:
    """Starlette's ClientDisconnect from reading the body was a 500 to a closed socket, logged
    as "request failed" (the operator saw a server error, with no cause under `brisklm serve`)."""
    import socket
    import urllib.parse

    address = urllib.parse.urlsplit(live)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        'Content-Length: 1000\r\n\r\n{"messages"'
    )
    with caplog.at_level(logging.INFO, logger="brisklm.server.app"):
        with socket.create_connection((address.hostname, address.port)) as connection:
            connection.sendall(head.encode())
            time.sleep(0.3)
        assert wait_for(lambda: "left while sending" in caplog.text), caplog.text
    assert "request failed" not in caplog.text
    client = openai.OpenAI(base_url=live, api_key="unused")
    assert client.chat.completions.create(model=NAME, messages=ask("Hi"), max_tokens=2).choices


def test_a_client_that_leaves_a_stream_aborts_its_request(live, aborted) -> None:
    """Over a real socket: a client that closes a stream early aborts its request in the engine,
    which goes on serving."""
    client = openai.OpenAI(base_url=live, api_key="unused")
    body = {"max_tokens": 900, "temperature": 0.9, "seed": 1, "extra_body": {"ignore_eos": True}}
    stream = client.chat.completions.create(
        model=NAME, messages=ask("Tell me a story."), stream=True, **body
    )
    for index, _ in enumerate(stream):
        if index == 2:
            break
    stream.close()
    assert wait_for(lambda: aborted), "the request was not aborted"
    reply = client.chat.completions.create(model=NAME, messages=ask("Hello!"), max_tokens=8)
    assert reply.choices[0].message.content


def test_a_failure_after_the_request_was_taken_is_a_server_error(http, llm, monkeypatch) -> None:
    async def fail(requests):
        raise ValueError("the engine broke")

    monkeypatch.setattr(llm, "arun_requests", fail)
    response = http.post("/v1/chat/completions", json={"messages": ask("Hello!")})
    assert response.status_code == 500
    assert response.json()["error"] == {
        "message": "the engine broke",
        "type": "server_error",
        "param": None,
        "code": None,
    }


def test_prompt_logprobs_carry_their_alternatives(http) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 1, "prompt_logprobs": 2}
    entries = http.post("/v1/completions", json=body).json()["choices"][0]["prompt_logprobs"]
    assert entries[0] is None
    for entry in entries[1:]:
        tops = entry["top_logprobs"]
        assert len(tops) == 2 and tops[0]["logprob"] >= tops[1]["logprob"]
        assert entry["rank"] >= 1 and (
            entry["rank"] > 2 or entry["token_id"] in {t["token_id"] for t in tops}
        )


def test_a_reply_cut_inside_a_call_holds_no_markup(client) -> None:
    """max_tokens ends the reply inside its second call: the first call stands, the cut one is
    dropped (its markup is no content), and the finish reason says "length"; streamed alike."""
    tools = [WEATHER]
    messages = ask("What's the weather in Paris and in Rome?")
    whole = client.chat.completions.create(model=NAME, messages=messages, tools=tools)
    (first, second) = whole.choices[0].message.tool_calls  # (two calls when not cut)
    full = whole.usage.completion_tokens
    cut = client.chat.completions.create(
        model=NAME, messages=messages, tools=tools, max_tokens=full - 4
    )
    choice = cut.choices[0]
    assert choice.finish_reason == "length"
    assert "<tool_call>" not in (choice.message.content or "")
    assert [c.function.arguments for c in choice.message.tool_calls] == [first.function.arguments]
    streamed = client.chat.completions.create(
        model=NAME, messages=messages, tools=tools, max_tokens=full - 4, stream=True
    )
    content = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert "<tool_call>" not in content


def test_without_max_tokens_a_reply_may_fill_the_context(http, llm, monkeypatch) -> None:
    """A checkpoint whose generation_config.json sets no max_new_tokens: a request without
    max_tokens may run to the end of the context, as OpenAI's do."""
    defaults = {k: v for k, v in llm.sampling_defaults.items() if k != "max_tokens"}
    monkeypatch.setattr(llm, "sampling_defaults", defaults)
    body = {"prompt": "Once upon a time", "ignore_eos": True}
    reply = http.post("/v1/completions", json=body).json()
    usage = reply["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == llm.max_seq_len
    assert reply["choices"][0]["finish_reason"] == "length"


def test_a_client_that_leaves_before_the_reply_aborts_its_request(live, aborted) -> None:
    """Over a real socket: a non-streamed request whose client times out is aborted."""
    hasty = openai.OpenAI(base_url=live, api_key="unused", timeout=0.05, max_retries=0)
    with pytest.raises(openai.APITimeoutError):
        hasty.completions.create(
            model=NAME, prompt="Once upon a time", max_tokens=900, extra_body={"ignore_eos": True}
        )
    assert wait_for(lambda: aborted), "the request was not aborted"
    client = openai.OpenAI(base_url=live, api_key="unused")
    assert client.completions.create(model=NAME, prompt="Hello", max_tokens=4).choices[0].text


def test_the_readmes_example_runs(live) -> None:
    """The README's client example, against the app on a socket (its URL for the README's)."""
    from tests.readme_examples import python_blocks

    (block,) = python_blocks("OpenAI-compatible server")
    assert "http://127.0.0.1:8000/v1" in block
    namespace: dict = {}
    exec(compile(block.replace("http://127.0.0.1:8000/v1", live), "README.md", "exec"), namespace)
    reply = namespace["reply"]
    assert reply.choices[0].message.content and reply.model == NAME


def test_n_choices_a_prompt(client, llm) -> None:
    """n choices: a seeded request's choice i is what seed + i gives alone; the usage counts the
    prompt once; streamed, each choice's deltas add up to its reply."""
    body = {"temperature": 0.9, "seed": 5, "max_tokens": 16, "n": 3}
    reply = client.chat.completions.create(model=NAME, messages=ask("Tell me a joke."), **body)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    params = llm.default_sampling_params(temperature=0.9, max_tokens=16)
    turns = [llm.chat(ask("Tell me a joke."), params.with_changes(seed=5 + i)) for i in range(3)]
    alone = [turn.content for turn in turns]
    assert [c.message.content for c in reply.choices] == alone
    assert reply.usage.prompt_tokens == turns[0].usage.prompt_tokens
    assert reply.usage.completion_tokens == sum(t.usage.completion_tokens for t in turns)
    texts = ["", "", ""]
    finishes = [None, None, None]
    for chunk in client.chat.completions.create(
        model=NAME, messages=ask("Tell me a joke."), stream=True, **body
    ):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    assert texts == alone and finishes == [c.finish_reason for c in reply.choices]
    completions = client.completions.create(
        model=NAME, prompt=["Once upon a time", "Hello"], max_tokens=6, n=2, temperature=0.9, seed=1
    )
    assert [c.index for c in completions.choices] == [0, 1, 2, 3]
    expected = [
        llm.generate(p, llm.default_sampling_params(temperature=0.9, seed=1 + i, max_tokens=6)).text
        for p in ("Once upon a time", "Hello")
        for i in range(2)
    ]
    assert [c.text for c in completions.choices] == expected


def test_an_api_key_guards_the_v1_routes(llm) -> None:
    with TestClient(build_app(llm, NAME, api_key="s3cret")) as guarded:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            response = guarded.get("/v1/models", headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
        assert guarded.get("/health").status_code == 200  # (open, for load balancers)
        refused = guarded.post("/tokenize", json={"prompt": "Hi"})
        assert refused.status_code == 401  # (vLLM leaves it open)
        assert guarded.get("/metrics").status_code == 401
        headers = {"Authorization": "Bearer s3cret"}
        assert guarded.post("/tokenize", json={"prompt": "Hi"}, headers=headers).status_code == 200
        # The scheme in any case, spaces after it (RFC 7235); the key as given.
        for given, status in (
            ("bearer s3cret", 200),
            ("BEARER  s3cret", 200),
            ("Bearer S3cret", 401),
            ("Basic s3cret", 401),
        ):
            response = guarded.get("/v1/models", headers={"Authorization": given})
            assert response.status_code == status, given
        refused = guarded.get("/v1/models", headers={"Authorization": "Basic s3cret"}).json()
        assert "an Authorization header that is not Bearer <key>" in refused["error"]["message"]
        keyed = openai.OpenAI(
            base_url="http://testserver/v1", api_key="s3cret", http_client=guarded
        )
        assert keyed.models.list().data[0].id == NAME
        wrong = openai.OpenAI(base_url="http://testserver/v1", api_key="nope", http_client=guarded)
        with pytest.raises(openai.AuthenticationError):
            wrong.chat.completions.create(model=NAME, messages=ask("Hello!"))


def test_tokenize_and_detokenize_as_vllm_answers_them(http, llm) -> None:
    reply = http.post("/tokenize", json={"model": NAME, "prompt": "Hello, Zürich!"}).json()
    ids = llm.tokenizer.encode("Hello, Zürich!")
    assert reply == {"count": len(ids), "max_model_len": llm.max_seq_len, "tokens": ids,
                     "token_strs": None}  # fmt: skip
    # A chat: the ids a chat request sends the model (tools included), and without the
    # assistant's turn opened.
    body = {"messages": ask("Weather in Oslo?"), "tools": [WEATHER], "return_token_strs": True}
    reply = http.post("/tokenize", json=body).json()
    assert reply["tokens"] == llm.chat_prompt_ids(ask("Weather in Oslo?"), [WEATHER])
    assert reply["token_strs"] == [llm.tokenizer.id_to_token(i) for i in reply["tokens"]]
    closed = http.post("/tokenize", json={**body, "add_generation_prompt": False}).json()
    assert (
        closed["count"] < reply["count"] and reply["tokens"][: closed["count"]] == closed["tokens"]
    )
    text = http.post("/detokenize", json={"tokens": reply["tokens"]}).json()["prompt"]
    assert text == llm.tokenizer.decode(reply["tokens"], skip_special_tokens=False)
    assert "<|im_start|>assistant" in text and "get_weather" in text
    for path, bad, param in [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": ask("b")}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "a", "add_generation_prompt": True}, "add_generation_prompt"),
        ("/tokenize", {"messages": ask("b"), "add_special_tokens": "yes"}, "add_special_tokens"),
        ("/tokenize", {"messages": ask("b"), "tools": [WEATHER, WEATHER]}, "tools"),
        ("/tokenize", {"prompt": "a", "suffix": "b"}, "suffix"),
        ("/detokenize", {"tokens": [1, 10**9]}, "tokens"),
        ("/detokenize", {"tokens": "12"}, "tokens"),
    ]:
        response = http.post(path, json=bad)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, bad
    assert http.post("/tokenize", json={"model": "other", "prompt": "a"}).status_code == 404


def test_metrics_count_what_the_engine_finished(http, client) -> None:
    def read() -> dict[str, float]:
        response = http.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        values = {}
        for line in response.text.splitlines():
            if not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    label = f'model_name="{NAME}"'
    before = read()
    assert before[f"brisklm_requests_running{{{label}}}"] == 0
    assert before[f"brisklm_kv_cache_slots{{{label}}}"] == 4
    reply = client.chat.completions.create(model=NAME, messages=ask("Hello!"), max_tokens=6)
    after = read()
    generated = f"brisklm_generation_tokens_total{{{label}}}"
    assert after[generated] - before[generated] == reply.usage.completion_tokens
    prompt = f"brisklm_prompt_tokens_total{{{label}}}"
    assert after[prompt] - before[prompt] == reply.usage.prompt_tokens
    reason = "stop" if reply.choices[0].finish_reason == "stop" else "length"
    finished = f'brisklm_request_finished_total{{{label},finished_reason="{reason}"}}'
    assert after[finished] - before[finished] == 1


def test_a_context_too_small_for_max_tokens_is_refused(http, llm) -> None:
    body = {"messages": ask("Hello!"), "max_completion_tokens": llm.max_seq_len}
    error = http.post("/v1/chat/completions", json=body).json()["error"]
    assert error["param"] == "max_completion_tokens" and error["code"] == "context_length_exceeded"
    assert f"context is {llm.max_seq_len} tokens" in error["message"]
    long = {"prompt": "hello " * llm.max_seq_len, "max_tokens": 1}
    error = http.post("/v1/completions", json=long).json()["error"]
    assert error["param"] == "prompt" and error["code"] == "context_length_exceeded"
    # min_tokens past the room the prompt leaves, with max_tokens unset (the reply would run to
    # the context's end): it came back 200, short of min_tokens, finish_reason "length".
    ids = [1] + [100] * (llm.max_seq_len - 25)
    short = {"prompt": ids, "min_tokens": 200, "ignore_eos": True}
    error = http.post("/v1/completions", json=short).json()["error"]
    assert error["param"] == "min_tokens" and error["code"] == "context_length_exceeded"
    assert "leaves 24 for the reply" in error["message"]
    room = http.post("/v1/completions", json={**short, "min_tokens": 24}).json()
    assert room["usage"]["completion_tokens"] == 24
    # Only the prompt's length: an error whose text says "context" (a grammar's rule named so)
    # was given that code.
    for field, value in [("guided_grammar", "start: context_rule"),
                         ("guided_json", {"$ref": "#/defs/context"})]:  # fmt: skip
        error = http.post("/v1/completions", json={"prompt": "a", field: value}).json()["error"]
        assert error["param"] == field and error["code"] is None, error


def test_two_guided_constraints_are_refused_naming_the_second(http) -> None:
    body = {"prompt": "a", "guided_choice": ["x"], "guided_regex": "y", "guided_json": {}}
    response = http.post("/v1/completions", json=body)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "guided_regex", error
    assert error["message"] == (
        "at most one guided_* constraint may be given, got guided_choice, guided_regex, guided_json"
    )


def test_echo_scores_a_prompt_as_lm_eval_asks(client, llm) -> None:
    """echo with logprobs and max_tokens 0 (lm-eval's loglikelihood request): the prompt's text
    and its tokens' logprobs (the first None), no reply tokens; with max_tokens, the reply
    follows the prompt, in text and logprobs; streamed alike."""
    prompt = "The capital of France is Paris"
    scored = client.completions.create(
        model=NAME, prompt=prompt, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    choice = scored.choices[0]
    expected = llm.generate(prompt, SamplingParams(max_tokens=1, prompt_logprobs=1))
    assert choice.text == prompt and choice.finish_reason == "length"
    assert scored.usage.completion_tokens == 0
    assert scored.usage.prompt_tokens == len(expected.prompt_token_ids)
    lp = choice.logprobs
    assert len(lp.tokens) == len(expected.prompt_token_ids) and lp.token_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(
        [e.logprob for e in expected.prompt_logprobs[1:]], abs=1e-5
    )
    assert lp.top_logprobs[0] is None
    # The likeliest token and the prompt's own (OpenAI: up to logprobs + 1 entries)
    for token, logprob, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert top[token] == logprob and len(top) <= 2 and max(top.values()) >= logprob
    body = dict(model=NAME, prompt=prompt, max_tokens=4, echo=True, logprobs=0, temperature=0)
    grown = client.completions.create(**body)
    reply = llm.generate(prompt, SamplingParams(max_tokens=4, temperature=0, logprobs=0))
    assert grown.choices[0].text == prompt + reply.text
    assert len(grown.choices[0].logprobs.tokens) == len(expected.prompt_token_ids) + 4
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **body))
    assert streamed == prompt + reply.text
    plain = client.completions.create(model=NAME, prompt=prompt, max_tokens=4, echo=True)
    assert plain.choices[0].text == prompt + reply.text and plain.choices[0].logprobs is None


def test_text_offsets_lay_the_tokens_end_to_end(client) -> None:
    """Completions' text_offset: where each token's text begins, whole or streamed."""
    body = dict(model=NAME, prompt="Once upon a time", max_tokens=12, logprobs=1, temperature=0)
    whole = client.completions.create(**body).choices[0].logprobs
    starts = [sum(len(t) for t in whole.tokens[:i]) for i in range(len(whole.tokens))]
    assert whole.text_offset == starts
    streamed: list[int] = []
    for chunk in client.completions.create(stream=True, **body):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.text_offset
    assert streamed == whole.text_offset
    echoed = client.completions.create(echo=True, **body).choices[0].logprobs
    assert echoed.text_offset[0] == 0 and echoed.text_offset[1] == len(echoed.tokens[0])


def test_openais_hint_fields_are_taken_and_checked(client, http, llm) -> None:
    """Fields the openai client sends that ask nothing a local reply differs by (400 before:
    LangChain's ChatOpenAI sends verbosity and reasoning_effort where they are set)."""
    params = SamplingParams(max_tokens=5, temperature=0)
    expected = llm.chat(ask("Hi"), params).content
    reply = client.chat.completions.create(
        model=NAME,
        messages=ask("Hi"),
        max_tokens=5,
        temperature=0,
        safety_identifier="user-1",
        prompt_cache_key="conversation-7",
        prompt_cache_retention="24h",
        prediction={"type": "content", "content": "Hello"},
        verbosity="low",
        modalities=["text"],
        reasoning_effort="low",  # (a template variable no template here reads)
    )
    assert reply.choices[0].message.content == expected
    body = {"messages": ask("Hi"), "max_tokens": 5}
    for field, value, words in [
        ("modalities", ["text", "audio"], 'modalities must be ["text"]'),
        ("modalities", [{"type": "text"}], 'modalities must be ["text"]'),  # (a 500 before)
        ("safety_identifier", 7, "safety_identifier must be a string"),
        ("prediction", "Hello", "prediction must be an object"),
        ("reasoning_effort", 1, "reasoning_effort must be a string"),
    ]:
        response = http.post("/v1/chat/completions", json={**body, field: value})
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == field, error
        assert words in error["message"]


def test_chat_template_kwargs_reach_the_template(tmp_path) -> None:
    # vLLM's chat_template_kwargs: Qwen3's enable_thinking=false closes an empty think block.
    from tests.engine.test_qwen3 import make_qwen3_checkpoint

    directory, _ = make_qwen3_checkpoint(tmp_path / "qwen3")
    with LLM.from_pretrained(directory, show_progress=False, max_seq_len=256) as tiny:
        with TestClient(build_app(tiny, "tiny")) as http:
            body = {"messages": ask("Hi"), "max_tokens": 6, "temperature": 0}
            off = {**body, "chat_template_kwargs": {"enable_thinking": False}}
            reply = http.post("/v1/chat/completions", json=off).json()
            plain = http.post("/v1/chat/completions", json=body).json()
            expected = tiny.chat(
                ask("Hi"), SamplingParams(max_tokens=6, temperature=0), enable_thinking=False
            )
            assert reply["choices"][0]["message"]["content"] == expected.content
            assert reply["usage"]["prompt_tokens"] == expected.usage.prompt_tokens
            assert plain["usage"]["prompt_tokens"] < reply["usage"]["prompt_tokens"]
            # reasoning_effort is the template's variable too, as vLLM passes it
            seen: list[dict] = []
            chat_prompt_ids = tiny.chat_prompt_ids

            def spy(messages, tools=None, **variables):
                seen.append(variables)
                return chat_prompt_ids(messages, tools, **variables)

            tiny.chat_prompt_ids = spy
            try:
                http.post("/v1/chat/completions", json={**body, "reasoning_effort": "high"})
                # vLLM's other way to give it (a 400 while it was only a field)
                kwargs = {"chat_template_kwargs": {"reasoning_effort": "low"}}
                http.post("/v1/chat/completions", json={**body, **kwargs})
                both = {**body, **kwargs, "reasoning_effort": "high"}
                response = http.post("/v1/chat/completions", json=both)
            finally:
                del tiny.chat_prompt_ids
            assert seen == [{"reasoning_effort": "high"}, {"reasoning_effort": "low"}]
            error = response.json()["error"]
            assert response.status_code == 400 and error["param"] == "reasoning_effort"
            for kwargs, words in [
                ([1], "must be an object"),
                ({"tools": []}, "a field of the request"),
                ({"add_generation_prompt": False}, "set by the server"),
                ({"regex": "a"}, "a sampling option"),
            ]:
                response = http.post(
                    "/v1/chat/completions", json={**body, "chat_template_kwargs": kwargs}
                )
                error = response.json()["error"]
                assert response.status_code == 400 and error["param"] == "chat_template_kwargs"
                assert words in error["message"]
