"""BriskLLM: a LangChain text-completion model running a local model on brisklm."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import nullcontext
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM
from langchain_core.language_models.base import LangSmithParams
from langchain_core.outputs import Generation, GenerationChunk, LLMResult
from pydantic import ConfigDict

from brisklm import LLM
from brisklm.engine.request import Request
from brisklm.llm import naming_prompt
from brisklm.offload import run_off_loop
from brisklm.openai_format import completion_logprobs
from brisklm.outputs import GenerationOutput, StreamChunk, TokenLogprob, Usage, choices_usage
from langchain_brisklm._engines import get_tokenizer
from langchain_brisklm._settings import (
    BriskSettings,
    check_one_when_streaming,
    split_call_kwargs,
)

# Constrained decoding options a call may pass, e.g. llm.invoke(prompt, regex=r"[0-9]+").
_CONSTRAINT_OPTIONS = frozenset(
    {"json_schema", "json_object", "regex", "choice", "grammar", "grammar_syntax"}
)
_CALL_OPTIONS = _CONSTRAINT_OPTIONS | {"model"}


def _generation_info(
    finish_reason: str | None,
    stop_reason: Any,
    usage: Usage | None,
    logprobs: Sequence[TokenLogprob] | None = None,
) -> dict:
    info: dict[str, Any] = {"finish_reason": finish_reason}
    if logprobs is not None:
        info["logprobs"] = completion_logprobs(logprobs)
    if stop_reason is not None:
        info["stop_reason"] = stop_reason
    if usage is not None:
        info["usage"] = usage.counts()
    return info


class BriskLLM(BriskSettings, BaseLLM):
    """A completion model (prompt string in, text out) running a local checkpoint with brisklm.

    `generate` / `batch` run all prompts in one engine batch. Construction is cheap: the model loads
    on first use and is shared with every ChatBrisk / BriskLLM using the same model and settings.
    A call may pass sampling overrides (`temperature=0`) and one constraint: `json_schema`,
    `json_object`, `regex`, `choice` or `grammar` (see `brisklm.SamplingParams`).

    Example:
        ```python
        from langchain_brisklm import BriskLLM

        llm = BriskLLM(model="path/to/checkpoint", temperature=0, max_tokens=64)
        llm.invoke("The capital of France is")
        ```
    """

    # A misspelled or unknown setting (temprature=, max_new_tokens=, model_name=) is an error that
    # names it, not a setting silently left at its default (LangChain's models ignore extras).
    model_config = ConfigDict(extra="forbid")

    @property
    def _llm_type(self) -> str:
        return "brisklm"

    @classmethod
    def is_lc_serializable(cls) -> bool:
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        return ["langchain_brisklm", "llms"]

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "brisklm"
        model = kwargs.get("model")
        params["ls_model_name"] = self._display_name(model)
        return params

    def get_num_tokens(self, text: str) -> int:
        """The tokens ``text`` takes as a prompt, as usage reports them: its token ids and the
        special tokens the tokenizer adds to a prompt (BOS), which ``get_token_ids`` leaves out."""
        return len(get_tokenizer(self.model).encode(text, add_special_tokens=True))

    def _requests(
        self,
        prompts: Sequence[str],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        streaming: bool = False,
    ) -> tuple[LLM, list[Request], str, int]:
        """The engine, the requests (each prompt's ``n`` completions in turn), the model's name
        and ``n``."""
        overrides = split_call_kwargs(kwargs, _CALL_OPTIONS)
        constraint = {k: v for k, v in kwargs.items() if k in _CONSTRAINT_OPTIONS}
        model = kwargs.get("model")
        llm = self._engine(model)
        requests = []
        n = 1
        for index, prompt in enumerate(prompts):
            ids = llm.tokenizer.encode(prompt, add_special_tokens=True)
            # A bad prompt of a batch is named (LangChain's batch fails them all with its error).
            with naming_prompt(index, len(prompts)) if len(prompts) > 1 else nullcontext():
                params = self._sampling_params(llm, len(ids), stop, overrides, **constraint)
                check_one_when_streaming(params.n, streaming)
                requests += llm.make_requests(ids, params)
            n = params.n  # (the same for every prompt: the call's)
        return llm, requests, self._display_name(model), n

    @staticmethod
    def _result(outputs: Sequence[GenerationOutput], model_name: str, n: int) -> LLMResult:
        """Each prompt's ``n`` generations; the token usage counts each prompt once."""
        generations = [
            Generation(
                text=o.text,
                generation_info=_generation_info(
                    o.finish_reason, o.stop_reason, o.usage, o.logprobs
                ),
            )
            for o in outputs
        ]
        usage = choices_usage([o.usage for o in outputs], n)
        return LLMResult(
            generations=[generations[i : i + n] for i in range(0, len(generations), n)],
            llm_output={"token_usage": usage.counts(), "model_name": model_name},
        )

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        streams = self.streaming and run_manager is not None
        llm, requests, model_name, n = self._requests(prompts, stop, kwargs, streams)
        if not streams:
            return self._result(llm.run_requests(requests), model_name, n)
        # Streaming: every request still decodes in the shared batch; tokens reach the callbacks
        # on this thread, tagged with the prompt they belong to.
        with contextlib.closing(llm.stream_requests(requests)) as chunks:
            for index, chunk in chunks:
                if chunk.text:
                    piece = GenerationChunk(text=chunk.text)
                    run_manager.on_llm_new_token(chunk.text, chunk=piece, prompt_index=index)
        return self._result([r.to_output() for r in requests], model_name, n)

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        streams = self.streaming and run_manager is not None
        llm, requests, model_name, n = await run_off_loop(
            self._requests, prompts, stop, kwargs, streams
        )
        if not streams:
            return self._result(await llm.arun_requests(requests), model_name, n)
        async with contextlib.aclosing(llm.astream_requests(requests)) as chunks:
            async for index, chunk in chunks:
                if chunk.text:
                    piece = GenerationChunk(text=chunk.text)
                    await run_manager.on_llm_new_token(chunk.text, chunk=piece, prompt_index=index)
        return self._result([r.to_output() for r in requests], model_name, n)

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        llm, (request,), _, _ = self._requests([prompt], stop, kwargs, streaming=True)
        for chunk in llm.stream_request(request):
            piece = _generation_chunk(chunk)
            if piece is None:
                continue
            if run_manager is not None:
                run_manager.on_llm_new_token(piece.text, chunk=piece)
            yield piece

    async def _astream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationChunk]:
        llm, (request,), _, _ = await run_off_loop(self._requests, [prompt], stop, kwargs, True)
        async for chunk in llm.astream_request(request):
            piece = _generation_chunk(chunk)
            if piece is None:
                continue
            if run_manager is not None:
                await run_manager.on_llm_new_token(piece.text, chunk=piece)
            yield piece


def _generation_chunk(chunk: StreamChunk) -> GenerationChunk | None:
    """The text of a stream chunk (and its tokens' logprobs); the last also carries finish
    reason and usage. The logprobs lists of the chunks join when LangChain adds them up."""
    if not chunk.finished:
        if chunk.logprobs:
            info = {"logprobs": completion_logprobs(chunk.logprobs)}
            return GenerationChunk(text=chunk.text, generation_info=info)
        return GenerationChunk(text=chunk.text) if chunk.text else None
    info = _generation_info(chunk.finish_reason, chunk.stop_reason, chunk.usage, chunk.logprobs)
    return GenerationChunk(text=chunk.text, generation_info=info)
