"""The OpenAI-compatible HTTP server behind ``brisklm serve``: ``/v1/chat/completions`` (tools,
``tool_choice``, ``response_format``, logprobs, ``n``, streaming), ``/v1/completions`` (also
``echo``), ``/v1/models``, vLLM's ``/tokenize`` and ``/detokenize``, ``/metrics`` (Prometheus)
and ``/health``, on Starlette (the ``server`` extra). Requests are
decoded by the LLM's engine thread, batched together; a request whose client goes away, streamed
or not, is aborted."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from brisklm.constrained import ConstraintError
from brisklm.engine.request import Request
from brisklm.llm import LLM, ContextLengthError
from brisklm.offload import run_off_loop
from brisklm.openai_format import chat_logprobs, reply_logprobs
from brisklm.outputs import (
    GenerationOutput,
    StreamChunk,
    TokenLogprob,
    Usage,
    choices_usage,
)
from brisklm.reasoning import ReasoningSplitter
from brisklm.sampling import SamplingParams
from brisklm.server import protocol
from brisklm.server.metrics import CONTENT_TYPE as METRICS_TYPE
from brisklm.server.metrics import metrics_text
from brisklm.server.protocol import ApiError, ChatRequest, CompletionRequest
from brisklm.server.tokenize import detokenize, tokenize
from brisklm.tool_call_chunks import CallChunk, ToolCallChunker
from brisklm.tool_calls import turn_finish_reason
from brisklm.tool_formats import ToolCallFormat

logger = logging.getLogger(__name__)

Handler = Callable[[HttpRequest], Awaitable[Response]]
T = TypeVar("T")
_GONE = Response(status_code=499)  # (nobody reads it: the client has gone)


def build_app(llm: LLM, model_name: str, api_key: str | None = None) -> Starlette:
    """The server's ASGI app for ``llm``, which it serves as ``model_name``; with ``api_key``,
    every route but ``/health`` wants it as a bearer token (``Authorization: Bearer KEY``), as
    OpenAI's."""
    server = _Server(llm, model_name)
    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.metrics, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/models/{model:path}", _answering_errors(server.model), methods=["GET"]),
        Route("/v1/completions", _answering_errors(server.completions), methods=["POST"]),
        Route("/v1/chat/completions", _answering_errors(server.chat), methods=["POST"]),
        Route("/tokenize", _answering_errors(server.tokenize), methods=["POST"]),
        Route("/detokenize", _answering_errors(server.detokenize), methods=["POST"]),
    ]
    middleware = [Middleware(_RequireApiKey, key=api_key)] if api_key else []
    return Starlette(
        routes=routes, middleware=middleware, exception_handlers={HTTPException: _http_error}
    )


class _RequireApiKey:
    """401 with OpenAI's error body for a request without the key (``/health`` alone is open,
    for load balancers; vLLM leaves ``/tokenize`` open too, which this does not)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.expected = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = given.partition(b" ")
            # (the scheme's case is free, and spaces may follow it: RFC 7235)
            bearer = scheme.lower() == b"bearer"
            if not bearer or not hmac.compare_digest(token.lstrip(b" "), self.expected):
                what = "an API key that is not this server's"
                if not given:
                    what = "no API key"
                elif not bearer:
                    what = "an Authorization header that is not Bearer <key>"
                error = ApiError(
                    f"the request has {what}: send Authorization: Bearer <the key brisklm serve "
                    "was started with>",
                    status=401,
                    code="invalid_api_key",
                )
                await _error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _http_error(request: HttpRequest, error: Exception) -> Response:
    """Starlette's own refusals (an unknown path, a wrong method) in OpenAI's error shape (its
    type for an unknown URL is invalid_request_error too)."""
    assert isinstance(error, HTTPException)
    message = f"{request.method} {request.url.path}: {error.detail}"
    return _error_response(ApiError(message, status=error.status_code))


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def _as_api_error(error: Exception) -> ApiError:
    """A request's failure as the client sees it: its own mistakes (found while it is prepared,
    ``_refused``) as they were raised, any later failure 500."""
    if isinstance(error, ApiError):
        return error
    logger.error("request failed", exc_info=error)
    return ApiError(str(error) or type(error).__name__, status=500, kind="server_error")


def _refused(error: Exception, param: str | None) -> ApiError:
    """A mistake in a request, found while preparing it (a prompt too long for the context, a
    grammar that does not compile, a token id past the vocabulary): 400, naming ``param``."""
    if isinstance(error, ApiError):
        return error
    code = "context_length_exceeded" if isinstance(error, ContextLengthError) else None
    return ApiError(str(error), param=protocol.field_in_error(error, param), code=code)


@contextlib.contextmanager
def _refusing(plan: ChatRequest | CompletionRequest, param: str) -> Iterator[None]:
    """A library error while a request is prepared as a 400 (``_refused``), naming ``param``, or
    the field that gave the constraint for a ConstraintError."""
    try:
        yield
    except (ValueError, TypeError, ConstraintError) as error:
        constraint = isinstance(error, ConstraintError)
        raise _refused(error, plan.constraint_field if constraint else param) from None


async def _disconnected(http: HttpRequest) -> None:
    """Returns once the client has gone (its request body already read)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(http: HttpRequest, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None once the client has gone; the work is then cancelled (which
    aborts its requests in the engine), as a stream's is when its client goes."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(http))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        logger.info("the client left before its reply: its request was aborted")
        return None
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()


def _answering_errors(handler: Handler) -> Handler:
    async def answered(request: HttpRequest) -> Response:
        try:
            return await handler(request)
        except ClientDisconnect:  # gone while sending its body: nobody to answer, nothing failed
            logger.info("the client left while sending its request")
            return _GONE
        except Exception as error:  # noqa: BLE001 - every failure gets OpenAI's error body
            return _error_response(_as_api_error(error))

    return answered


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


_DONE = "data: [DONE]\n\n"


def _chat_choice(
    index: int,
    output: GenerationOutput,
    format: ToolCallFormat | None,
    request: Request,
    reasoning_start: bool | None = None,
) -> dict[str, Any]:
    """A whole reply as a chat choice: its reasoning, content and calls as ``LLM.chat`` reads
    them (less a call it was cut inside: a ``format`` here is the tools' grammar's), its
    logprobs those of its tokens (not the one ending the turn)."""
    turn = LLM.chat_output(output, format, reasoning_start, under_grammar=True)
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if turn.reasoning is not None:  # (vLLM's and DeepSeek's field)
        message["reasoning_content"] = turn.reasoning
    if turn.tool_calls:
        message["content"] = turn.content or None
        message["tool_calls"] = [protocol.tool_call_dict(call) for call in turn.tool_calls]
    return {
        "index": index,
        "message": message,
        "logprobs": _turn_logprobs(output.logprobs, output.token_ids, output.stop_reason, request),
        "finish_reason": turn.finish_reason,
    }


def _turn_logprobs(
    entries: list[TokenLogprob] | None, token_ids: list[int], stop_reason: Any, request: Request
) -> dict[str, Any] | None:
    """A chat choice's (or a chunk's) ``logprobs``: without the token that ended the turn (an
    eos or a stop token id, which OpenAI's content lists do not hold)."""
    if entries is None:
        return None
    return chat_logprobs(reply_logprobs(entries, token_ids, stop_reason, request.eos_token_ids))


class _StreamedReply:
    """One choice of a streamed chat reply: its engine chunks as deltas (content, and each tool
    call's id and name once its name is whole, then its arguments piece by piece, as OpenAI
    streams them) and, at its end, its finish reason."""

    def __init__(self, format: ToolCallFormat | None, reasoning_start: bool | None) -> None:
        self.chunker = ToolCallChunker(format) if format is not None else None
        self.reasoning = None if reasoning_start is None else ReasoningSplitter(reasoning_start)

    def take(self, piece: StreamChunk) -> tuple[dict[str, Any], str | None]:
        chunker = self.chunker
        thought, text = "", piece.text
        if self.reasoning is not None:
            thought, text = self.reasoning.take(text, piece.finished)
        if chunker is None:
            content, chunks = text, []
        else:
            content, chunks = chunker.feed(text)
            if piece.finished:  # (a call the reply ended inside is no content)
                more_content, more_chunks = chunker.finish()
                content += more_content
                chunks += more_chunks
        delta: dict[str, Any] = {}
        empty = piece.finished and self.reasoning is not None and self.reasoning.empty_block
        if thought or empty:
            delta["reasoning_content"] = thought
        if content:
            delta["content"] = content
        if chunks:
            delta["tool_calls"] = [_call_delta(chunk) for chunk in chunks]
        if not piece.finished:
            return delta, None
        called = chunker is not None and chunker.num_calls > 0
        cut = chunker is not None and chunker.cut
        return delta, turn_finish_reason(piece.finish_reason, called, cut)


def _call_delta(chunk: CallChunk) -> dict[str, Any]:
    """A tool-call chunk as OpenAI's delta: the first of a call with its id, type and name."""
    delta: dict[str, Any] = {"index": chunk["index"]}
    if chunk["id"] is not None:
        delta.update(id=chunk["id"], type="function")
    function: dict[str, Any] = {"arguments": chunk["args"] or ""}
    if chunk["name"] is not None:
        function["name"] = chunk["name"]
    delta["function"] = function
    return delta


class _Server:
    def __init__(self, llm: LLM, model_name: str) -> None:
        self.llm = llm
        self.model_name = model_name

    async def health(self, request: HttpRequest) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(self, request: HttpRequest) -> Response:
        return Response(metrics_text(self.llm, self.model_name), media_type=METRICS_TYPE)

    async def tokenize(self, http: HttpRequest) -> Response:
        body = protocol.read_body(await http.body())
        return JSONResponse(await run_off_loop(tokenize, self.llm, body, self.model_name))

    async def detokenize(self, http: HttpRequest) -> Response:
        body = protocol.read_body(await http.body())
        return JSONResponse(detokenize(self.llm, body, self.model_name))

    async def models(self, request: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: HttpRequest) -> Response:
        name = request.path_params["model"]
        protocol.check_model({"model": name}, self.model_name)
        return JSONResponse(self._model_card())

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "brisklm",
            "max_model_len": self.llm.max_seq_len,
        }

    # ------------------------------------------------------------------------ completions
    async def completions(self, http: HttpRequest) -> Response:
        body = protocol.read_body(await http.body())
        plan, requests = await run_off_loop(self._prepare_completion, body)
        if plan.options.stream:
            return self._stream(self._completion_events(plan, requests))
        return await self._reply(
            http,
            plan,
            requests,
            "text_completion",
            "cmpl",
            lambda i, request, out: self._completion_choice(plan, i, request, out, first=True),
            lambda usage: self._usage(plan, usage),
        )

    async def _reply(
        self,
        http: HttpRequest,
        plan: ChatRequest | CompletionRequest,
        requests: list[Request],
        kind: str,
        id_prefix: str,
        choice: Callable[[int, Request, GenerationOutput], dict[str, Any]],
        usage: Callable[[Usage], Usage] = lambda usage: usage,
    ) -> Response:
        """A whole (not streamed) response: ``choice(i, request, output)`` each, and the usage
        of them all (``usage``: an output's as the response counts it); nothing if the client
        left (its requests are aborted)."""
        outputs = await _unless_disconnected(http, self.llm.arun_requests(requests))
        if outputs is None:
            return _GONE
        response = protocol.envelope(kind, protocol.new_id(id_prefix), self.model_name)
        response["choices"] = [
            choice(i, request, out)
            for i, (request, out) in enumerate(zip(requests, outputs, strict=True))
        ]
        usages = [usage(out.usage) for out in outputs]
        response["usage"] = protocol.usage_dict(choices_usage(usages, plan.n))
        return JSONResponse(response)

    def _stream_head(
        self, plan: ChatRequest | CompletionRequest, kind: str, id_prefix: str
    ) -> dict[str, Any]:
        """What every event of a stream holds besides its choices."""
        head = protocol.envelope(kind, protocol.new_id(id_prefix), self.model_name)
        if plan.options.include_usage:
            head["usage"] = None  # (as OpenAI's chunks before the last)
        return head

    @staticmethod
    def _usage_event(
        head: dict[str, Any], plan: ChatRequest | CompletionRequest, usages: list[Usage | None]
    ) -> Iterator[str]:
        """The stream's last event, with the usage of all its choices, where it was asked for."""
        if plan.options.include_usage:
            total = choices_usage([u for u in usages if u is not None], plan.n)
            yield _sse({**head, "choices": [], "usage": protocol.usage_dict(total)})

    def _requests(
        self, plan: ChatRequest | CompletionRequest, body: dict[str, Any], ids: list[int]
    ) -> list[Request]:
        """The ``n`` requests of a prompt's choices."""
        params = self._with_room(plan.params, body, len(ids))
        return self.llm.make_requests(ids, params.with_changes(n=plan.n))

    def _completion_choice(
        self,
        plan: CompletionRequest,
        index: int,
        request: Request,
        out: GenerationOutput | StreamChunk,
        first: bool,
        text_start: int = 0,
    ) -> dict[str, Any]:
        """A whole output, or a stream's chunk of one (``first``: its first), as a choice; with
        ``echo`` the first begins with the prompt's text and logprobs."""
        text, logprobs, finish = out.text, out.logprobs, out.finish_reason
        if plan.no_output:  # (the one token decoded is not the reply's)
            text, logprobs = "", None if logprobs is None else []
            finish = None if finish is None else "length"
        prompt_logprobs = out.prompt_logprobs if plan.prompt_logprobs else None
        if not (plan.echo and first):
            return protocol.completion_choice(
                index, text, logprobs, finish, prompt_logprobs, text_start
            )
        prompt = plan.prompts[index // plan.n]
        if not isinstance(prompt, str):
            prompt = self.llm.tokenizer.decode(prompt, skip_special_tokens=False)
        if logprobs is None:
            return protocol.completion_choice(index, prompt + text, None, finish, prompt_logprobs)
        table = self.llm.tokenizer.token_bytes()
        first_token = table[request.prompt_token_ids[0]].decode("utf-8", "replace")
        entries = [e for e in out.prompt_logprobs or [] if e is not None]
        choice = protocol.echoed_choice(
            index, prompt + text, first_token, entries, logprobs, finish
        )
        if prompt_logprobs is not None:
            choice["prompt_logprobs"] = protocol.prompt_logprob_entries(prompt_logprobs)
        return choice

    @staticmethod
    def _usage(plan: CompletionRequest, usage: Usage) -> Usage:
        """With max_tokens 0, the one token decoded is not the reply's."""
        return dataclasses.replace(usage, completion_tokens=0) if plan.no_output else usage

    def _prepare_completion(self, body: dict[str, Any]) -> tuple[CompletionRequest, list[Request]]:
        plan = protocol.completion_request(self.llm, body, self.model_name)
        requests = []  # (prompt i's choice j is request i * n + j, as OpenAI orders them)
        with _refusing(plan, "prompt"):
            for prompt in plan.prompts:
                ids = self.llm.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
                requests += self._requests(plan, body, ids)
        return plan, requests

    def _with_room(
        self, params: SamplingParams, body: dict[str, Any], prompt_len: int
    ) -> SamplingParams:
        """OpenAI's default for a request without max_tokens: the rest of the context (unless
        the checkpoint's generation_config.json sets max_new_tokens, which vLLM follows too)."""
        names = [k for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None]
        context = self.llm.max_seq_len
        # (a prompt that fills the context alone is refused as that, by make_request)
        if names and prompt_len < context and prompt_len + params.max_tokens > context:
            raise ApiError(
                f"the model's context is {context} tokens, and the request asks for "
                f"{prompt_len + params.max_tokens} ({prompt_len} in the prompt, {params.max_tokens} "
                f"for the reply): lower {names[0]} to at most {max(context - prompt_len, 0)}",
                param=names[0],
                code="context_length_exceeded",
            )
        if names or "max_tokens" in self.llm.sampling_defaults:
            return params
        return params.with_changes(max_tokens=max(1, self.llm.max_seq_len - prompt_len))

    async def _completion_events(
        self, plan: CompletionRequest, requests: list[Request]
    ) -> AsyncIterator[str]:
        head = self._stream_head(plan, "text_completion", "cmpl")
        usages: list[Usage | None] = [None] * len(
            requests
        )  # (by request: choices_usage reads the order)
        text_starts: dict[int, int] = {}  # (each choice's tokens' text so far: text_offset)
        async with contextlib.aclosing(self.llm.astream_requests(requests)) as chunks:
            async for index, chunk in chunks:
                first = index not in text_starts
                start = text_starts.get(index, 0)
                choice = self._completion_choice(plan, index, requests[index], chunk, first, start)
                text_starts[index] = start + protocol.text_length(choice)
                yield _sse({**head, "choices": [choice]})
                if chunk.usage is not None:
                    usages[index] = self._usage(plan, chunk.usage)
        for event in self._usage_event(head, plan, usages):
            yield event

    # ------------------------------------------------------------------------------- chat
    async def chat(self, http: HttpRequest) -> Response:
        body = protocol.read_body(await http.body())
        plan, requests = await run_off_loop(self._prepare_chat, body)
        if plan.options.stream:
            return self._stream(self._chat_events(plan, requests))
        return await self._reply(
            http,
            plan,
            requests,
            "chat.completion",
            "chatcmpl",
            lambda i, request, out: _chat_choice(
                i, out, plan.tool_format, request, plan.reasoning_start
            ),
        )

    def _prepare_chat(self, body: dict[str, Any]) -> tuple[ChatRequest, list[Request]]:
        plan = protocol.chat_request(self.llm, body, self.model_name)
        with _refusing(plan, "messages"):
            ids = self.llm.chat_prompt_ids(plan.messages, plan.tools, **plan.template_kwargs)
            plan.params, plan.reasoning_start = self.llm.chat_decoding(
                ids,
                plan.params,
                plan.tool_format,
                has_tools=bool(plan.tools),
                constraint=plan.reply_constraint,
            )
            return plan, self._requests(plan, body, ids)

    async def _chat_events(self, plan: ChatRequest, requests: list[Request]) -> AsyncIterator[str]:
        head = self._stream_head(plan, "chat.completion.chunk", "chatcmpl")

        def chunk(
            index: int, delta: dict[str, Any], finish: Any = None, logprobs: Any = None
        ) -> str:
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            return _sse({**head, "choices": [choice]})

        for index in range(len(requests)):
            yield chunk(index, {"role": "assistant", "content": ""})
        replies = [_StreamedReply(plan.tool_format, plan.reasoning_start) for _ in requests]
        usages: list[Usage | None] = [None] * len(requests)  # (by request, as choices_usage reads)
        async with contextlib.aclosing(self.llm.astream_requests(requests)) as pieces:
            async for index, piece in pieces:
                delta, finish = replies[index].take(piece)
                stop_reason = piece.stop_reason if piece.finished else None
                ids = piece.token_ids if piece.finished else []
                logprobs = _turn_logprobs(piece.logprobs, ids, stop_reason, requests[index])
                if delta or (logprobs and logprobs["content"]):
                    yield chunk(index, delta, None, logprobs)
                if finish is not None:
                    yield chunk(index, {}, finish)
                if piece.usage is not None:
                    usages[index] = piece.usage
        for event in self._usage_event(head, plan, usages):
            yield event

    # -------------------------------------------------------------------------- streaming
    @staticmethod
    def _stream(events: AsyncIterator[str]) -> StreamingResponse:
        """Server-sent events ending in ``[DONE]``; a failure mid-stream is an error event (the
        status line has gone out)."""

        async def body() -> AsyncIterator[str]:
            try:
                async for event in events:
                    yield event
            except Exception as error:  # noqa: BLE001 - reported in the stream
                yield _sse(_as_api_error(error).body())
            yield _DONE

        return StreamingResponse(body(), media_type="text/event-stream")
