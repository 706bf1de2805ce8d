"""Loaded models shared by every ChatBrisk / BriskLLM in the process: one engine per model and settings."""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from brisklm import LLM, Tokenizer, default_model_path
from brisklm.config import ModelConfig, hub_id_hint
from brisklm.constrained.compiler import DEFAULT_GRAMMAR_CACHE_SIZE
from brisklm.engine.llm_engine import EngineConfig
from brisklm.llm import draft_schedule, speculative_tokens
from brisklm.loader import resolve_device, resolve_dtype, resolve_kv_cache_dtype
from brisklm.speculative.draft_length import DEFAULT_NUM_SPECULATIVE_TOKENS

T = TypeVar("T")

MODEL_ENV_VAR = "BRISKLM_MODEL"
"""Environment variable naming the default model directory (else the bundled model is used)."""


@dataclass(frozen=True)
class EngineKey:
    """What makes two engines different: the checkpoint, where it runs, and the engine's limits.

    Settings are stored resolved (the model's dtype, the device's default chunk size, the
    context the model's config gives, the draft's directory and its length schedule)."""

    path: str
    device: str
    dtype: str
    max_batch_size: int
    max_seq_len: int
    draft: str | None = None
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    draft_length: str | None = None
    kv_cache_dtype: str | None = None
    prefill_chunk_size: int | None = None
    prefix_caching: bool = True
    grammar_cache_size: int = DEFAULT_GRAMMAR_CACHE_SIZE
    max_decode_steps: int = 8
    prefix_cache_slots: int = 0


_engines: dict[EngineKey, LLM] = {}
_lock = threading.Lock()  # guards the two dicts; held for lookups only, never across a load
_loading: dict[EngineKey, threading.Lock] = {}  # one per key: its first callers load it once


def _forget_the_parents_engines() -> None:
    """In a forked child (a preforking server's worker): the parent's engines cannot serve here
    (their threads are the parent's), so the child loads its own; the locks may be copied held."""
    global _lock
    _engines.clear()
    _loading.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_the_parents_engines)


def default_model() -> str | None:
    """The model named by $BRISKLM_MODEL, or None for the bundled default model."""
    return os.environ.get(MODEL_ENV_VAR) or None


def resolve_model_path(model: str | os.PathLike[str] | None) -> Path:
    """The checkpoint directory for a model argument (None: the bundled default model)."""
    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        if model == os.environ.get(MODEL_ENV_VAR):
            raise FileNotFoundError(
                f"no model checkpoint at {path}, the directory ${MODEL_ENV_VAR} names: set it to "
                "the directory of a Hugging Face checkpoint (config.json, safetensors weights, "
                "tokenizer), or unset it for the bundled model"
            )
        raise FileNotFoundError(
            f"no model checkpoint at {path}: pass the directory of a Hugging Face checkpoint "
            "(config.json, safetensors weights, tokenizer), or leave model unset for the bundled "
            f"model{hub_id_hint(model)}"
        )
    return path


_tokenizers: dict[Path, Tokenizer] = {}


def get_tokenizer(model: str | os.PathLike[str] | None) -> Tokenizer:
    """The model's tokenizer alone, for counting tokens: a loaded engine's if there is one, else
    read from the checkpoint once (its weights are not loaded)."""
    path = resolve_model_path(model).resolve()
    with _lock:
        for key, llm in _engines.items():
            if Path(key.path) == path:
                return llm.tokenizer
        tokenizer = _tokenizers.get(path)
    if tokenizer is None:
        tokenizer = Tokenizer.from_pretrained(path)
        with _lock:
            tokenizer = _tokenizers.setdefault(path, tokenizer)
    return tokenizer


def model_display_name(model: str | os.PathLike[str] | None) -> str:
    """The model's name in response metadata: what the caller passed, or the bundled model's name."""
    return str(model) if model is not None else "brisk-chat"


@functools.lru_cache(maxsize=64)
def _max_positions_of(path: Path, mtime_ns: int, size: int) -> int:
    return ModelConfig.from_pretrained(path).max_position_embeddings


def _max_positions(path: Path) -> int:
    """The checkpoint's max_position_embeddings, read once per version of its config.json (every
    call asks: parsing it was ~0.13 ms of each)."""
    try:
        stat = (path / "config.json").stat()
    except OSError:  # ModelConfig names what is missing
        return ModelConfig.from_pretrained(path).max_position_embeddings
    return _max_positions_of(path, stat.st_mtime_ns, stat.st_size)


def get_engine(
    model: str | os.PathLike[str] | None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    max_batch_size: int = 8,
    max_seq_len: int | None = None,
    draft: str | None = None,
    num_speculative_tokens: int | None = None,
    draft_length: str | None = None,
    kv_cache_dtype: str | None = None,
    prefill_chunk_size: int | None = None,
    prefix_caching: bool = True,
    grammar_cache_size: int = DEFAULT_GRAMMAR_CACHE_SIZE,
    max_decode_steps: int = 8,
    prefix_cache_slots: int = 0,
) -> LLM:
    """The shared LLM for these settings, loading it on first use (thread-safe)."""
    path = resolve_model_path(model).resolve()
    device_ = resolve_device(device)
    dtype_ = resolve_dtype(dtype, device_)
    # Settings are keyed as the engine resolves them, so that ways of asking for the same engine
    # (None, "auto" or the model's own cache dtype; None or the device's chunk size) share one.
    cache_dtype = resolve_kv_cache_dtype(kv_cache_dtype, device_) or dtype_
    engine = EngineConfig(
        prefill_chunk_size=prefill_chunk_size,
        max_seq_len=max_seq_len,
        prefix_caching=prefix_caching,
        grammar_cache_size=grammar_cache_size,
        max_decode_steps=max_decode_steps,
        prefix_cache_slots=prefix_cache_slots,
    )
    chunk_size = engine.resolved_prefill_chunk_size(device_)
    context = engine.resolved_max_seq_len(_max_positions(path))
    # (Checked at construction and by LLM.from_pretrained: no directory look-up per call.)
    schedule = draft_schedule(draft, num_speculative_tokens, draft_length) if draft else None
    key = EngineKey(
        path=str(path),
        device=str(device_),
        dtype=str(dtype_),
        max_batch_size=max_batch_size,
        max_seq_len=context,
        draft=_draft_key(draft),
        num_speculative_tokens=speculative_tokens(num_speculative_tokens) if draft else 0,
        draft_length=schedule,
        kv_cache_dtype=str(cache_dtype),
        prefill_chunk_size=chunk_size,
        prefix_caching=prefix_caching,
        grammar_cache_size=grammar_cache_size,
        max_decode_steps=max_decode_steps,
        prefix_cache_slots=prefix_cache_slots,
    )
    with _lock:
        llm = _engines.get(key)
        if llm is not None:
            return llm
        key_lock = _loading.setdefault(key, threading.Lock())
    # Concurrent first calls for one key load it once; other models load meanwhile.
    with key_lock:
        with _lock:
            llm = _engines.get(key)
        if llm is None:
            llm = LLM.from_pretrained(
                path,
                device=device_,
                dtype=dtype,
                max_batch_size=max_batch_size,
                max_seq_len=max_seq_len,
                draft=draft,
                num_speculative_tokens=num_speculative_tokens,
                draft_length=draft_length,
                kv_cache_dtype=kv_cache_dtype,
                prefill_chunk_size=prefill_chunk_size,
                prefix_caching=prefix_caching,
                grammar_cache_size=grammar_cache_size,
                max_decode_steps=max_decode_steps,
                prefix_cache_slots=prefix_cache_slots,
                show_progress=False,
            )
            with _lock:
                _engines[key] = llm
        return llm


def _draft_key(draft: str | os.PathLike[str] | None) -> str | None:
    """The draft as the engine resolves it: "default" is the bundled draft's directory."""
    if draft is None or str(draft) == "ngram":
        return None if draft is None else str(draft)
    directory = default_model_path(draft=True) if str(draft) == "default" else Path(draft)
    return str(directory.expanduser().resolve())


def loaded_engines() -> dict[EngineKey, LLM]:
    """A snapshot of the engines loaded so far."""
    with _lock:
        return dict(_engines)


def close_engines() -> None:
    """Stop and forget every shared engine (the next call loads its model again)."""
    with _lock:
        engines = list(_engines.values())
        _engines.clear()
    for llm in engines:
        llm.close()
