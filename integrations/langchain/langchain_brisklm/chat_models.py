"""ChatBrisk: a LangChain chat model running a local model on brisklm, with grammar-checked tool calls
and structured output."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.language_models.model_profile import ModelProfile
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import InputTokenDetails, UsageMetadata
from langchain_core.messages.tool import ToolCallChunk
from langchain_core.output_parsers.base import OutputParserLike
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import ConfigDict, field_validator

from brisklm import LLM, EngineConfig
from brisklm.config import ModelConfig
from brisklm.constrained.compiler import check_json_schema
from brisklm.engine.loop import POLL_S
from brisklm.engine.request import Request
from brisklm.llm import check_template_kwargs
from brisklm.offload import run_off_loop
from brisklm.openai_format import chat_logprobs, reply_logprobs, response_format_schema
from brisklm.outputs import GenerationOutput, StreamChunk, TokenLogprob, Usage, choices_usage
from brisklm.reasoning import ReasoningSplitter, split_reasoning
from brisklm.tool_call_chunks import ToolCallChunker
from brisklm.tool_calls import check_parallel_tool_calls, turn_finish_reason
from brisklm.tool_formats import ReplyConstraint, ToolCallFormat
from langchain_brisklm._batched import BatchSubmission
from langchain_brisklm._engines import get_tokenizer, resolve_model_path
from langchain_brisklm._messages import to_template_messages
from langchain_brisklm._settings import (
    BriskSettings,
    check_one_when_streaming,
    split_call_kwargs,
)
from langchain_brisklm._structured import (
    CUT_TOOL_CALL,
    WholeJsonOutputKeyToolsParser,
    WholeJsonOutputParser,
    WholePydanticOutputParser,
    WholePydanticToolsParser,
)
from langchain_brisklm._tools import (
    ToolChoice,
    cut_call_chunks,
    cut_call_error,
    format_tools,
    is_bare_json_schema,
    normalize_tool_choice,
    parse_reply,
    response_format_as_function,
    without_unique_items,
)

StructuredOutputMethod = Literal["json_schema", "function_calling", "json_mode"]
# Keyword arguments that bind_tools / with_structured_output bind, besides sampling overrides.
_CALL_OPTIONS = frozenset(
    {
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "model",
        "stream",
        "chat_template_kwargs",
    }
)
# Set while ChatBrisk.abatch runs: its calls' requests reach the engine together.
_BATCH: contextvars.ContextVar[BatchSubmission | None] = contextvars.ContextVar(
    "brisklm_batch", default=None
)


def _stopping_batch() -> BatchSubmission | None:
    """The ``abatch`` this call is an input of, where one input's error stops the others."""
    batch = _BATCH.get()
    return batch if batch is not None and batch.stop_on_error else None


# Set while a ChatBrisk.ainvoke runs: a call made inside it (a callback's) is nested.
_IN_CALL: contextvars.ContextVar[bool] = contextvars.ContextVar("brisklm_in_call", default=False)


@dataclass
class _Call:
    """One prepared chat call's requests (a completion each: ``n``) and how to read their
    outputs."""

    llm: LLM
    requests: list[Request]
    parse_tools: bool
    model_name: str
    tool_format: ToolCallFormat
    # How a reply may open with a thinking block (LLM.reasoning_start; None: it shows none).
    reasoning_start: bool | None = None

    @property
    def request(self) -> Request:
        """The first completion's request (a stream's only one)."""
        return self.requests[0]


def _json_schema_of(schema: dict[str, Any] | type) -> dict[str, Any]:
    """A JSON Schema for a pydantic class, TypedDict, JSON Schema dict, OpenAI tool/function dict
    or Anthropic tool dict."""
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        # The reply is validated by the class itself, which makes a set field's list a set.
        return without_unique_items(schema.model_json_schema())
    if isinstance(schema, dict) and isinstance(schema.get("input_schema"), dict):
        # Anthropic's {"name", "description", "input_schema"}: taken whole as a JSON Schema, its
        # unknown keys were ignored and any JSON passed.
        return schema["input_schema"]
    if isinstance(schema, dict) and ("function" not in schema and "parameters" not in schema):
        return schema  # already a JSON Schema
    return convert_to_json_schema(schema)


def _usage_metadata(usage: Usage) -> UsageMetadata:
    metadata = UsageMetadata(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
    )
    if usage.cached_prompt_tokens:  # prompt tokens an earlier request's cache served
        metadata["input_token_details"] = InputTokenDetails(cache_read=usage.cached_prompt_tokens)
    return metadata


class ChatBrisk(BriskSettings, BaseChatModel):
    """A chat model running a local Hugging Face checkpoint with brisklm.

    Construction is cheap: the model loads on first use and is shared by every ChatBrisk and
    BriskLLM with the same model, device, dtype and engine limits; concurrent calls (batch,
    abatch, threads, asyncio) are decoded together in one engine batch.

    Tool calls and structured output are decoded under a grammar built from the schemas, so tool
    names and arguments and structured results are always valid (unless max_tokens cuts them off).

    Example:
        ```python
        from langchain_brisklm import ChatBrisk

        chat = ChatBrisk(temperature=0)  # the bundled model; or ChatBrisk(model="path/to/checkpoint")
        chat.invoke("Hello!")
        ```
    """

    # A misspelled or unknown setting (temprature=, max_new_tokens=, model_name=) is an error that
    # names it, not a setting silently left at its default (LangChain's models ignore extras).
    model_config = ConfigDict(extra="forbid")

    chat_template_kwargs: dict[str, Any] | None = None
    """Variables of the model's chat template besides messages and tools, as vLLM's field:
    ``{"enable_thinking": False}`` for Qwen3. A call's own ``chat_template_kwargs`` add to
    these."""

    @field_validator("chat_template_kwargs")
    @classmethod
    def _check_chat_template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        check_template_kwargs(value or {})
        return value

    def _template_kwargs(self, call: dict[str, Any] | None = None) -> dict[str, Any]:
        """The chat template's variables of a call: the field's, then the call's own."""
        if call is not None and not isinstance(call, dict):
            raise TypeError(f"chat_template_kwargs must be a dict, got {type(call).__name__}")
        merged = {**(self.chat_template_kwargs or {}), **(call or {})}
        check_template_kwargs(merged)
        return merged

    @property
    def _llm_type(self) -> str:
        return "brisklm-chat"

    @classmethod
    def is_lc_serializable(cls) -> bool:
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        return ["langchain_brisklm", "chat_models"]

    def _resolve_model_profile(self) -> ModelProfile | None:
        """What the model can do, for LangChain's agents and middleware (a summariser reads
        max_input_tokens; create_agent asks structured_output): the engine's context (the
        model's, at most 4096, or max_seq_len) read from config.json, and the capabilities that
        ChatBrisk gives every model (tool calls and structured output under a grammar). Text
        only. No weights are read."""
        config = ModelConfig.from_pretrained(resolve_model_path(self.model))
        context = EngineConfig(max_seq_len=self.max_seq_len).resolved_max_seq_len(
            config.max_position_embeddings
        )
        return ModelProfile(
            name=self.model_name,
            open_weights=True,
            max_input_tokens=context,
            max_output_tokens=context,
            text_inputs=True,
            image_inputs=False,
            audio_inputs=False,
            video_inputs=False,
            pdf_inputs=False,
            text_outputs=True,
            image_outputs=False,
            audio_outputs=False,
            video_outputs=False,
            reasoning_output=False,
            tool_calling=True,
            tool_choice=True,
            tool_call_streaming=True,
            structured_output=True,
        )

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "brisklm"
        model = kwargs.get("model")
        params["ls_model_name"] = self._display_name(model)
        if "ls_stop" not in params and (stop or self.stop):
            params["ls_stop"] = stop or self.stop
        return params

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """The prompt tokens these messages (and tools) take: the model's chat template rendered
        as a call renders it, the assistant's turn opened, read with the model's tokenizer."""
        tokenizer = get_tokenizer(self.model)
        text = tokenizer.apply_chat_template(
            to_template_messages(messages),
            tools=format_tools(tools) or None,
            add_generation_prompt=True,
            **self._template_kwargs(),
        )
        return len(tokenizer.encode(text, add_special_tokens=False))

    # ------------------------------------------------------------------ requests
    def _prepare(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: Any,
        streaming: bool = False,
    ) -> _Call:
        overrides = split_call_kwargs(kwargs, _CALL_OPTIONS)
        model = kwargs.get("model")
        # Per-call tools go through the same conversion and checks as bind_tools (idempotent on
        # the OpenAI dicts that bind_tools binds).
        tools = format_tools(kwargs.get("tools"))
        parallel = kwargs.get("parallel_tool_calls")
        check_parallel_tool_calls(parallel)
        names = [tool["function"]["name"] for tool in tools]
        # Checked without tools too: a choice that requires a call cannot be met without one.
        choice = normalize_tool_choice(kwargs.get("tool_choice"), names)
        answer = response_format_schema(kwargs.get("response_format"))
        llm = self._engine(model)  # loaded once the call's options are known to be valid
        # Calls are decoded and parsed in the model's own format (read from its chat template).
        tool_format = llm.tool_call_format()
        # With a response_format beside tools (create_agent's structured answer), as OpenAI: the
        # reply is tool calls or the answer in that format, never free text.
        reply = ReplyConstraint.of_request(tool_format, tools, choice, parallel, answer)
        calls_format = None if reply is None else reply.calls_format
        constraint = {} if reply is None else reply.changes()
        template_kwargs = self._template_kwargs(kwargs.get("chat_template_kwargs"))
        prompt_ids = llm.chat_prompt_ids(
            to_template_messages(messages), tools=tools or None, **template_kwargs
        )
        params = self._sampling_params(llm, len(prompt_ids), stop, overrides, **constraint)
        check_one_when_streaming(params.n, streaming)
        params, start = llm.chat_decoding(
            prompt_ids,
            params,
            calls_format,
            template_kwargs.get("chat_template"),
            bool(tools),
            reply,
        )
        requests = llm.make_requests(prompt_ids, params)
        parse_tools = calls_format is not None
        return _Call(llm, requests, parse_tools, self._display_name(model), tool_format, start)

    def _result(self, call: _Call, outputs: Sequence[GenerationOutput]) -> ChatResult:
        """A generation for each completion. As ChatOpenAI's, each message's usage is the
        call's: the prompt counted once, every completion's tokens."""
        usage = choices_usage([o.usage for o in outputs], len(outputs))
        return ChatResult(
            generations=[self._generation(call, output, usage) for output in outputs],
            llm_output={"model_name": call.model_name, "token_usage": usage.counts()},
        )

    def _combine_llm_outputs(self, llm_outputs: list[dict[str, Any] | None]) -> dict[str, Any]:
        """``generate``'s llm_output over several inputs, as ChatOpenAI's: the runs' token usage
        summed, and the model's name (LangChain's default gives {})."""
        outputs = [output for output in llm_outputs if output]
        if not outputs:
            return {}
        counts = [output["token_usage"] for output in outputs]
        return {
            "model_name": outputs[0]["model_name"],
            "token_usage": {key: sum(count[key] for count in counts) for key in counts[0]},
        }

    @staticmethod
    def _generation(call: _Call, output: GenerationOutput, usage: Usage) -> ChatGeneration:
        """One completion's message (``usage``: the call's)."""
        invalid = []
        reasoning, text = split_reasoning(output.text, call.reasoning_start)
        if call.parse_tools:
            # The context, not max_tokens, ended it when the reply filled the context (an unset
            # max_tokens is the room left in it, so the two limits meet there).
            own = output.usage
            full = own.prompt_tokens + own.completion_tokens >= call.llm.max_seq_len
            error = cut_call_error(
                output.finish_reason, output.stop_reason, call.llm.max_seq_len if full else None
            )
            content, calls, invalid = parse_reply(text, call.tool_format, error, output.cut_short)
        else:
            content, calls = text, []
        tool_calls = [
            {"name": c.name, "args": c.arguments, "id": c.id, "type": "tool_call"} for c in calls
        ]
        metadata = {
            "model_name": call.model_name,
            "finish_reason": turn_finish_reason(output.finish_reason, bool(calls), bool(invalid)),
        }
        if output.stop_reason is not None:
            metadata["stop_reason"] = output.stop_reason
        if invalid:  # parse_reply's only invalid call is the one the reply ended inside
            metadata[CUT_TOOL_CALL] = True
        if output.logprobs is not None:
            entries = reply_logprobs(
                output.logprobs, output.token_ids, output.stop_reason, call.request.eos_token_ids
            )
            metadata["logprobs"] = chat_logprobs(entries)
        if len(call.requests) > 1:  # (usage_metadata is then the whole call's)
            metadata["completion_tokens"] = output.usage.completion_tokens
        message = AIMessage(
            content=content,
            # (as langchain-deepseek and langchain-qwq put a reasoning model's thinking)
            additional_kwargs={} if reasoning is None else {"reasoning_content": reasoning},
            tool_calls=tool_calls,
            invalid_tool_calls=invalid,
            usage_metadata=_usage_metadata(usage),
            response_metadata=metadata,
        )
        return ChatGeneration(message=message, generation_info=dict(metadata))

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._prepare(messages, stop, kwargs)
        return self._result(call, call.llm.run_requests(call.requests))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        batch = _BATCH.get()
        if batch is not None:
            call, outputs = await batch.run(lambda: self._prepare(messages, stop, kwargs))
            return self._result(call, outputs)
        call = await run_off_loop(self._prepare, messages, stop, kwargs)
        return self._result(call, await call.llm.arun_requests(call.requests))

    async def abatch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """LangChain's `abatch` (callbacks, configs, `return_exceptions`), with the inputs'
        requests submitted to the engine together (`langchain_brisklm._batched`): prefilled in
        one pass and decoded as one batch."""
        # One input's error ends the batch, as in `batch`: the other inputs stop too, each
        # failing (its run reports it), and the batch raises that first error once all have.
        submission = BatchSubmission(stop_on_error=not return_exceptions)
        token = _BATCH.set(submission)
        outer = _IN_CALL.set(False)  # (its inputs are its own calls, inside a call or not)
        try:
            results = await super().abatch(inputs, config, return_exceptions=True, **kwargs)
        except BaseException:  # (an interrupt, a cancellation: nothing to wait for)
            submission.cancel_all()
            raise
        finally:
            _IN_CALL.reset(outer)
            _BATCH.reset(token)
        if not return_exceptions:
            error = submission.error or next((r for r in results if isinstance(r, Exception)), None)
            if error is not None:
                raise error
        return results  # type: ignore[return-value]

    async def ainvoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        # A call made inside another ChatBrisk call (a callback's, a tool's) is none of the
        # batch the outer call may be an input of: it neither joins nor stops it.
        batch = None if _IN_CALL.get() else _BATCH.get()
        tokens = (_IN_CALL.set(True), _BATCH.set(batch))
        stopping = _stopping_batch()
        try:
            if stopping is not None:  # (an input of `abatch` max_concurrency held back: no run)
                stopping.check_going()
            return await super().ainvoke(input, config, stop=stop, **kwargs)
        except Exception as error:
            if stopping is not None:
                stopping.stop_all(error)
            raise
        finally:
            _BATCH.reset(tokens[1])
            _IN_CALL.reset(tokens[0])

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """Run the inputs concurrently, so the engine decodes them together.

        The same as `abatch`, driven from one event loop on a helper thread: one consumer for all
        requests, rather than LangChain's default of a thread per input (a pool of a few threads,
        each woken for every token).
        """
        if len(inputs) <= 1:
            return super().batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        work = self.abatch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        return _run_cancellable(work)

    # ----------------------------------------------------------------- streaming
    def _should_stream(
        self,
        *,
        async_api: bool,
        run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> bool:
        """As LangChain decides, but a call of several completions (``n``) does not stream (a
        stream is one completion): ``invoke`` under ``astream_events`` or a streaming callback
        handler gets its whole result, and ``stream`` / ``astream`` (a chain streaming through
        the model) yield the first completion whole, in one chunk."""
        n = kwargs.get("n", self.n)
        if n is not None and n != 1:
            return False
        return super()._should_stream(async_api=async_api, run_manager=run_manager, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        call = self._prepare(messages, stop, kwargs, streaming=True)
        converter = _ChunkConverter(call)
        for stream_chunk in call.llm.stream_request(call.request):
            for chunk in converter.convert(stream_chunk):
                if run_manager is not None:
                    run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        stopping = _stopping_batch()
        call = await run_off_loop(self._prepare, messages, stop, kwargs, True)
        converter = _ChunkConverter(call)
        # (closed as the loop ends however it ends: an early end aborts the request)
        async with contextlib.aclosing(call.llm.astream_request(call.request)) as chunks:
            async for stream_chunk in chunks:
                if stopping is not None:  # (an input of `abatch` another input's error stops)
                    stopping.check_going()
                for chunk in converter.convert(stream_chunk):
                    if run_manager is not None:
                        await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                    yield chunk

    # ---------------------------------------------------------------- tools
    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: ToolChoice = None,
        parallel_tool_calls: bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools; their calls are decoded under a grammar built from their schemas.

        Args:
            tools: pydantic classes, functions, LangChain tools, or tool/JSON-schema dicts.
            tool_choice: "auto" (default: text or tool calls, the model's choice), "any" or
                "required" (at least one call), "none" (text only), or a tool's name (exactly one
                call of that tool); also True/False and the OpenAI/Anthropic dict forms.
            parallel_tool_calls: False allows at most one call per turn.
            strict: accepted for compatibility; calls always follow the schemas exactly.
        """
        del strict  # every call is decoded under its schema
        formatted = format_tools(tools)
        names = [tool["function"]["name"] for tool in formatted]
        choice = normalize_tool_choice(tool_choice, names)
        check_parallel_tool_calls(parallel_tool_calls)
        bound: dict[str, Any] = {"tools": formatted, "tool_choice": choice}
        if parallel_tool_calls is not None:
            bound["parallel_tool_calls"] = parallel_tool_calls
        return super().bind(**bound, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        method: StructuredOutputMethod = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
        """A runnable that returns outputs matching `schema`, valid by construction.

        Args:
            schema: a pydantic class (returns instances), a TypedDict, a JSON Schema dict, an
                OpenAI tool/function dict or an Anthropic tool dict (these return dicts).
            method: "json_schema" (default): the reply is JSON decoded under the schema;
                "function_calling": a forced call of a tool with the schema as its parameters;
                "json_mode": the reply is any JSON object (describe the keys in the prompt).
            include_raw: return {"raw": AIMessage, "parsed": ..., "parsing_error": ...}.
            strict: accepted for compatibility; json_schema and function_calling always follow
                the schema exactly.
        """
        if kwargs:
            raise ValueError(f"unsupported arguments: {sorted(kwargs)}")
        format_info = {"kwargs": {"method": method, "strict": strict}, "schema": schema}
        schema = response_format_as_function(schema)
        is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        parser: OutputParserLike
        if method == "function_calling":
            # A forced call's arguments are an object: refuse other schemas rather than lose them.
            if is_bare_json_schema(schema) and schema.get("type", "object") != "object":
                raise ValueError(
                    "with_structured_output(method='function_calling') needs an object schema "
                    f"(the arguments of a tool call), got type {schema['type']!r}; use "
                    "method='json_schema' for other schemas"
                )
            try:
                tool_name = format_tools([schema])[0]["function"]["name"]
            except ValueError as e:
                raise ValueError(
                    f"with_structured_output(method='function_calling') cannot use this schema: {e}"
                ) from e
            llm = self.bind_tools(
                [schema],
                tool_choice=tool_name,
                parallel_tool_calls=False,
                ls_structured_output_format=format_info,
            )
            if is_pydantic:
                parser = WholePydanticToolsParser(tools=[schema], first_tool_only=True)  # type: ignore[list-item]
            else:
                parser = WholeJsonOutputKeyToolsParser(key_name=tool_name, first_tool_only=True)
        elif method in ("json_schema", "json_mode"):
            if method == "json_schema":  # refused here, as function_calling's are, not at a call
                try:
                    check_json_schema(_json_schema_of(schema))
                except ValueError as e:
                    raise ValueError(
                        f"with_structured_output(method='json_schema') cannot use this schema: {e}"
                    ) from e
            response_format = (
                {"type": "json_schema", "schema": _json_schema_of(schema)}
                if method == "json_schema"
                else {"type": "json_object"}
            )
            llm = self.bind(
                response_format=response_format, ls_structured_output_format=format_info
            )
            parser = (
                WholePydanticOutputParser(pydantic_object=schema)  # type: ignore[arg-type]
                if is_pydantic
                else WholeJsonOutputParser()
            )
        else:
            raise ValueError(
                f"method must be 'json_schema', 'function_calling' or 'json_mode', got {method!r}"
            )
        if not include_raw:
            return llm | parser
        parser_assign = RunnablePassthrough.assign(
            parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
        )
        parser_none = RunnablePassthrough.assign(parsed=lambda _: None)
        parser_with_fallback = parser_assign.with_fallbacks(
            [parser_none], exception_key="parsing_error"
        )
        return RunnableMap(raw=llm) | parser_with_fallback


class _Cancellable:
    """A coroutine run by `asyncio.run` on another thread, which `cancel` (from any thread) stops
    at its next await, or before it starts."""

    def __init__(self, work: Any) -> None:
        self._work = work
        self._lock = threading.Lock()
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False

    async def run(self) -> Any:
        with self._lock:
            if self._cancelled:
                self._work.close()
                raise asyncio.CancelledError
            self._task = asyncio.current_task()
        return await self._work

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._task is None:
                return
            try:
                self._task.get_loop().call_soon_threadsafe(self._task.cancel)
            except RuntimeError:  # the loop has closed: the work is over, nothing to cancel
                pass


def _run_cancellable(work: Any) -> Any:
    """Run `work` (a coroutine) to its end on a helper thread's event loop. An interrupt (Ctrl-C)
    or any other exception in the waiting thread cancels it, so its requests are aborted in the
    engine, before it propagates: the batch used to run to its end first."""
    runner = _Cancellable(work)
    context = contextvars.copy_context()  # tracing and callback context go along
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = context.run(asyncio.run, runner.run())
        except BaseException as error:  # handed to the waiting thread
            outcome["error"] = error
        finally:
            done.set()

    # A plain thread, not a pool's: once the main thread has ended, Python refuses new work to
    # every thread pool, and a batch made then by another thread failed.
    threading.Thread(target=run, name="brisklm-batch", daemon=True).start()
    try:
        while not done.wait(POLL_S):  # in slices, so an interrupt without a signal is seen
            pass
    except BaseException:
        runner.cancel()
        done.wait()  # its requests are aborted before the interrupt goes on
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class _ChunkConverter:
    """Engine stream chunks -> ChatGenerationChunks: text, tool-call chunks, and a final chunk
    with usage, finish reason and model name (so input tokens are counted in one chunk only)."""

    def __init__(self, call: _Call) -> None:
        self.call = call
        self.chunker = ToolCallChunker(call.tool_format) if call.parse_tools else None
        self.held_logprobs: list[TokenLogprob] = []  # of tokens whose text is held back
        start = call.reasoning_start
        self.reasoning = None if start is None else ReasoningSplitter(start)

    def _take_logprobs(self, last: bool = False) -> dict[str, Any]:
        """The response metadata of the logprobs held so far; none: empty, but for the ``last``
        chunk of a reply that asked for them (an empty reply has a list too)."""
        if not self.held_logprobs and not (last and self.call.request.params.logprobs is not None):
            return {}
        entries, self.held_logprobs = self.held_logprobs, []
        return {"logprobs": chat_logprobs(entries)}

    def convert(self, chunk: StreamChunk) -> list[ChatGenerationChunk]:
        out: list[ChatGenerationChunk] = []
        thought, text = "", chunk.text
        if self.reasoning is not None:  # (a reasoning model's thinking told apart)
            thought, text = self.reasoning.take(text, chunk.finished)
        if thought:
            message = AIMessageChunk(content="", additional_kwargs={"reasoning_content": thought})
            out.append(ChatGenerationChunk(message=message))
        if self.chunker is None:
            pieces = [(text, [])]
        else:
            pieces = [self.chunker.feed(text)]
            if chunk.finished:
                pieces.append(self.chunker.finish())
                if cut_chunks := cut_call_chunks(self.chunker):
                    pieces.append(("", cut_chunks))
        if chunk.logprobs:
            entries = chunk.logprobs
            if chunk.finished:
                entries = reply_logprobs(
                    entries, chunk.token_ids, chunk.stop_reason, self.call.request.eos_token_ids
                )
            self.held_logprobs += entries
        for text, tool_chunks in pieces:
            if text or tool_chunks:
                # Logprobs ride on the next piece of the reply (of text held back, later), so a
                # stream has as many chunks with them as without.
                out.append(_chunk(text, tool_chunks, self._take_logprobs()))
        if chunk.finished:
            num_calls = self.chunker.num_calls if self.chunker is not None else 0
            cut = self.chunker is not None and self.chunker.cut
            metadata: dict[str, Any] = {
                "model_name": self.call.model_name,
                "finish_reason": turn_finish_reason(chunk.finish_reason, num_calls > 0, cut),
            }
            if chunk.stop_reason is not None:
                metadata["stop_reason"] = chunk.stop_reason
            if cut:  # its chunks merge into a call with the arguments so far: say it was cut
                metadata[CUT_TOOL_CALL] = True
            metadata.update(self._take_logprobs(last=True))
            empty = self.reasoning is not None and self.reasoning.empty_block
            message = AIMessageChunk(
                content="",
                additional_kwargs={"reasoning_content": ""} if empty else {},
                usage_metadata=_usage_metadata(chunk.usage) if chunk.usage else None,
                response_metadata=metadata,
                chunk_position="last",
            )
            out.append(ChatGenerationChunk(message=message, generation_info=dict(metadata)))
        return out


def _chunk(
    text: str, tool_chunks: list[ToolCallChunk], metadata: dict[str, Any] | None = None
) -> ChatGenerationChunk:
    message = AIMessageChunk(
        content=text, tool_call_chunks=tool_chunks, response_metadata=dict(metadata or {})
    )
    return ChatGenerationChunk(
        message=message, generation_info=dict(metadata) if metadata else None
    )
