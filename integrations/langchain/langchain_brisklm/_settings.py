"""Fields and request building shared by ChatBrisk and BriskLLM."""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from pydantic import BaseModel, Field, model_validator

from brisklm import LLM, EngineConfig, SamplingParams
from brisklm.constrained.compiler import DEFAULT_GRAMMAR_CACHE_SIZE
from brisklm.llm import check_draft_options
from brisklm.loader import check_device_name, resolve_dtype, resolve_kv_cache_dtype
from brisklm.sampling.params import MAX_LOGPROBS
from langchain_brisklm._engines import (
    default_model,
    get_engine,
    get_tokenizer,
    model_display_name,
)

# Per-call keyword arguments that override a field for one call, e.g. invoke(..., temperature=0).
SAMPLING_FIELDS = (
    "temperature",
    "max_tokens",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "n",
    "thinking_token_budget",
)
# Accepted for compatibility with hosted chat models' standard parameters; a local engine has no
# network connection, so none of them does anything here.
_REMOTE_ONLY_PARAMS = frozenset({"api_key", "base_url", "timeout", "max_retries", "organization"})


class BriskSettings(BaseModel):
    """Which model to run and how to sample from it."""

    model: str | None = Field(default_factory=default_model)
    """Checkpoint directory (Hugging Face layout); default: $BRISKLM_MODEL, else the bundled model."""
    device: str | None = None
    """"cpu" or "cuda" (default: cuda when available)."""
    dtype: str | None = None
    """"float32", "bfloat16" or "float16" (default: float32 on CPU, bfloat16 on CUDA)."""
    max_batch_size: int = 8
    """Requests the shared engine decodes together."""
    max_seq_len: int | None = None
    """Context length of the engine (default: the model's)."""
    draft: str | None = None
    """Speculative decoding: a draft model directory, "default" (the bundled draft) or "ngram".
    The output is the same as without it; only the speed changes."""
    num_speculative_tokens: int | None = None
    """Most tokens the draft proposes per step (with ``draft``, which it needs; default 5)."""
    draft_length: str | None = None
    """"adaptive" (default with a draft model: shorter proposals after rejections) or "fixed"
    (default with "ngram": always ``num_speculative_tokens``)."""
    kv_cache_dtype: str | None = None
    """The KV cache's elements: "float32", "bfloat16", "float16" or "auto" (default: the model's)."""
    prefill_chunk_size: int | None = None
    """Most prompt tokens a request feeds per forward pass (default: 512 on CPU, 2048 on CUDA):
    a long prompt then does not stall the requests decoding beside it."""
    prefix_caching: bool = True
    """Reuse the keys and values of an earlier prompt's shared start (the system prompt, tools
    and earlier turns of a conversation). On CPU (float and GPTQ int4 models) any shared start,
    the output the same either way; elsewhere (CUDA, int4 on torch's kernel, GPTQ shards with
    different act-order groups) whole prompt chunks only, the same output for a call alone (see
    brisklm's README, "Design")."""
    grammar_cache_size: int = DEFAULT_GRAMMAR_CACHE_SIZE
    """Compiled constraints (structured-output schemas, tool lists) the engine keeps for reuse,
    least recently used dropped first: an app with a schema or tool list per user bounds their
    memory with it, or keeps more of them compiled."""
    max_decode_steps: int = 8
    """Decoding through brisklm's native CPU pass (greedy or sampled, with a logit bias,
    penalties or logprobs too; not under a grammar or a pending min_tokens) runs up to this many
    steps a call of its kernels (about 20 ms of them), so a stream's chunks may hold several
    tokens; 1: a token a step, a chunk a token. The tokens are the same either way, a seed's
    too."""
    prefix_cache_slots: int = 0
    """KV cache slots beyond ``max_batch_size`` that only keep finished calls' prefixes: with
    prefix caching, at most ``max_batch_size`` conversations keep their history's keys; an app
    serving more conversations at once keeps up to ``max_batch_size + prefix_cache_slots``
    (each slot costs ``max_seq_len`` positions of KV cache memory)."""

    temperature: float | None = None
    """Sampling temperature; 0 is greedy. None (like the other sampling fields): the model's
    generation_config.json value, else brisklm's default (1.0)."""
    max_tokens: int | None = None
    """Most tokens to generate; None: until the model stops or the context is full."""
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    """Seed of the request's sampler: the same seed and prompt give the same output."""
    logit_bias: dict[int, float] | None = None
    logprobs: bool | None = Field(default=None, strict=True)
    """Report each generated token's logprob (ChatOpenAI's field): in ``response_metadata
    ["logprobs"]`` (ChatBrisk) or ``generation_info["logprobs"]`` (BriskLLM), as OpenAI's."""
    top_logprobs: int | None = Field(default=None, strict=True)
    """With ``logprobs``: the most likely alternatives reported per token (0-20)."""
    stop: list[str] | None = None
    """Stop sequences; stop sequences passed to a call replace these for that call."""
    streaming: bool = False
    """Generate through the streaming path, so callbacks see each new token."""
    n: int = 1
    """Completions of each prompt (ChatOpenAI's ``n``), each a generation of the result; with a
    ``seed``, completion i samples with seed + i. A stream is one completion: 1 when streaming."""
    thinking_token_budget: int | None = None
    """A reasoning model's thinking block (Qwen3's ``<think>``) holds at most so many tokens,
    then its closing tag is forced and the reply goes on to its answer or tool calls (vLLM's
    field). None: unbounded; ignored for a model whose chat template knows no thinking."""

    @model_validator(mode="before")
    @classmethod
    def _drop_remote_only_params(cls, values: Any) -> Any:
        if isinstance(values, dict):
            ignored = sorted(k for k in values if k in _REMOTE_ONLY_PARAMS)
            if ignored:
                warnings.warn(
                    f"{cls.__name__} runs the model locally and ignores {', '.join(ignored)}",
                    stacklevel=4,
                )
                values = {k: v for k, v in values.items() if k not in _REMOTE_ONLY_PARAMS}
            if "model" in values and values["model"] is None:  # as if left out
                values = {**values, "model": default_model()}
            # Directories may be given as paths (pathlib.Path), as a per-call model may be.
            paths = {
                k: os.fspath(values[k])
                for k in ("model", "draft")
                if isinstance(values.get(k), os.PathLike)
            }
            values = {**values, **paths}
        return values

    @model_validator(mode="after")
    def _check_settings(self) -> BriskSettings:
        """A setting the engine would refuse is refused here, at construction, not at the first
        call (which may come long after, in another part of the program). The model itself is
        not read: construction stays cheap."""
        sampling = {name: getattr(self, name) for name in SAMPLING_FIELDS}
        check_one_when_streaming(self.n, self.streaming)
        SamplingParams(
            stop=self.stop or None,
            **_engine_options({k: v for k, v in sampling.items() if v is not None}),
        )
        EngineConfig(
            max_batch_size=self.max_batch_size,
            max_seq_len=self.max_seq_len,
            prefill_chunk_size=self.prefill_chunk_size,
            prefix_caching=self.prefix_caching,
            grammar_cache_size=self.grammar_cache_size,
            max_decode_steps=self.max_decode_steps,
            prefix_cache_slots=self.prefix_cache_slots,
        )
        cpu = torch.device("cpu")  # names only: whether the device has CUDA is the engine's
        if self.device not in (None, "auto"):
            check_device_name(self.device)
        resolve_dtype(self.dtype, cpu)
        resolve_kv_cache_dtype(self.kv_cache_dtype, cpu)
        # Checked here too: the shared engine for these settings may be loaded already, and then
        # LLM.from_pretrained (which checks them) is not called.
        check_draft_options(self.draft, self.num_speculative_tokens, self.draft_length)
        return self

    @property
    def model_name(self) -> str:
        """The model's name as reported in metadata and traces."""
        return model_display_name(self.model)

    def _display_name(self, model: Any) -> str:
        """The name of a call's model: its per-call ``model`` (str or Path), else this one's."""
        return model_display_name(model) if model is not None else self.model_name

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "device": self.device,
            "dtype": self.dtype,
            "draft": self.draft,
            **{name: getattr(self, name) for name in SAMPLING_FIELDS if name != "logit_bias"},
            # JSON-friendly (traces); in LangChain's cache key, so outputs under other biases,
            # context sizes or cache precisions are not served for these.
            "logit_bias": sorted(self.logit_bias.items()) if self.logit_bias else None,
            "max_seq_len": self.max_seq_len,
            "kv_cache_dtype": self.kv_cache_dtype,
            "stop": self.stop,
        }

    def _engine(self, model: str | None = None) -> LLM:
        """The shared engine for this model (or a per-call `model` override), loaded on first use."""
        return get_engine(
            model if model is not None else self.model,
            device=self.device,
            dtype=self.dtype,
            max_batch_size=self.max_batch_size,
            max_seq_len=self.max_seq_len,
            draft=self.draft,
            num_speculative_tokens=self.num_speculative_tokens,
            draft_length=self.draft_length,
            kv_cache_dtype=self.kv_cache_dtype,
            prefill_chunk_size=self.prefill_chunk_size,
            prefix_caching=self.prefix_caching,
            grammar_cache_size=self.grammar_cache_size,
            max_decode_steps=self.max_decode_steps,
            prefix_cache_slots=self.prefix_cache_slots,
        )

    def get_token_ids(self, text: str) -> list[int]:
        """The model's own token ids for ``text`` (no special tokens added), read with its
        tokenizer: LangChain's default would count with GPT-2's, fetched from the network."""
        return get_tokenizer(self.model).encode(text, add_special_tokens=False)

    def _sampling_params(
        self,
        llm: LLM,
        num_prompt_tokens: int,
        stop: list[str] | None,
        overrides: dict[str, Any],
        **constraint: Any,
    ) -> SamplingParams:
        values = {name: getattr(self, name) for name in SAMPLING_FIELDS}
        values.update({k: v for k, v in overrides.items() if k in SAMPLING_FIELDS})
        options = _engine_options({k: v for k, v in values.items() if v is not None})
        # Unset fields take the checkpoint's generation_config.json sampling (not its length limit).
        recommended = {k: v for k, v in llm.sampling_defaults.items() if k != "max_tokens"}
        options = {**recommended, **options}
        # Without a limit, generate until the model stops; the engine also stops at the context's end.
        options.setdefault("max_tokens", max(1, llm.max_seq_len - num_prompt_tokens))
        stops = stop if stop is not None else self.stop
        return SamplingParams(stop=stops or None, **options, **constraint)


def _engine_options(options: dict[str, Any]) -> dict[str, Any]:
    """The SamplingParams options of set fields: ``logprobs`` (a flag, as ChatOpenAI's) and
    ``top_logprobs`` become the engine's ``logprobs`` (how many alternatives, 0 for none)."""
    options = dict(options)
    wanted, top = options.pop("logprobs", None), options.pop("top_logprobs", None)
    if wanted is not None and not isinstance(wanted, bool):
        raise ValueError(f"logprobs must be True or False, got {wanted!r}")
    if top is not None and wanted is None:
        raise ValueError(f"top_logprobs={top!r} needs logprobs=True")
    if wanted is False:  # (a call turning off logprobs its model reports, with their count)
        top = None
    if top is not None and (
        isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_LOGPROBS
    ):
        raise ValueError(f"top_logprobs must be an int in [0, {MAX_LOGPROBS}], got {top!r}")
    if wanted:
        options["logprobs"] = 0 if top is None else top
    return options


def check_one_when_streaming(n: Any, streaming: bool) -> None:
    """A stream is one completion: ``n`` must be 1 (as ChatOpenAI requires)."""
    if streaming and n != 1:
        raise ValueError(f"n must be 1 when streaming (a stream is one completion), got {n!r}")


def split_call_kwargs(kwargs: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
    """The per-call sampling overrides in kwargs; TypeError for anything not understood."""
    unknown = sorted(k for k in kwargs if k not in SAMPLING_FIELDS and k not in known)
    if unknown:
        raise TypeError(
            f"unexpected keyword argument(s) {', '.join(unknown)}; per-call options are "
            f"{', '.join(sorted((*SAMPLING_FIELDS, *known)))}"
        )
    return {k: v for k, v in kwargs.items() if k in SAMPLING_FIELDS}
