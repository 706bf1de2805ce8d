"""The public entry point: ``LLM.from_pretrained(dir)`` then generate / stream / chat, sync or async."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import uuid
from collections.abc import (
    AsyncGenerator,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeAlias, overload

import torch
from numpy import ndarray

from brisklm.chat_template import check_messages_list
from brisklm.checks import check_bool, is_token_id
from brisklm.config import checkpoint_directory
from brisklm.constrained.compiler import DEFAULT_GRAMMAR_CACHE_SIZE
from brisklm.constrained.matcher import GrammarMatcher
from brisklm.constrained.spec import AfterThinking, Constraint, Grammar
from brisklm.engine.llm_engine import (
    EngineConfig,
    LLMEngine,
    check_kv_cache_fits,
    num_cache_slots,
)
from brisklm.engine.loop import AsyncCollector, EngineLoop, SyncCollector, check_request_list
from brisklm.engine.request import Request
from brisklm.engine.scratch_thread import call_in_scratch_thread
from brisklm.engine.speculation import Speculator
from brisklm.engine.thinking_budget import ThinkingBudget
from brisklm.heap import return_free_memory
from brisklm.kernels import native
from brisklm.kernels.omp import BusyCpus, at_most_threads, available_cpus, threads_beside
from brisklm.loader import load_model, resolve_device, resolve_dtype, resolve_kv_cache_dtype
from brisklm.models.layers import LinearFactory
from brisklm.models.llama import LlamaForCausalLM
from brisklm.offload import run_off_loop
from brisklm.openai_format import response_format_schema
from brisklm.outputs import ChatOutput, GenerationOutput, SpeculativeStats, StreamChunk
from brisklm.progress import BatchProgress
from brisklm.quant.loading import linear_factory_for
from brisklm.reasoning import CLOSE as CLOSE_TAG
from brisklm.reasoning import OPEN as OPEN_TAG
from brisklm.reasoning import (
    may_close_thinking,
    prompt_thinking,
    split_reasoning,
    template_reasons,
    thinks_first,
)
from brisklm.request_stream import AsyncRequestStream, RequestStream
from brisklm.sampling import SamplingParams, make_generator
from brisklm.sampling.generation_config import sampling_defaults
from brisklm.speculative import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    DraftLengthSchedule,
    DraftModelProposer,
    NgramProposer,
    make_draft_generator,
)
from brisklm.tokenizer import Tokenizer
from brisklm.tool_calls import (
    check_parallel_tool_calls,
    openai_tool_choice,
    tool_name,
    turn_finish_reason,
)
from brisklm.tool_formats import ReplyConstraint, ToolCallFormat, detect_tool_call_format
from brisklm.tool_schema import check_tools_list

logger = logging.getLogger(__name__)

# One prompt: text, or token ids (a list of ints, a 1-D array or tensor; a 2-D one is a batch).
# Real objects, not strings: typing.get_type_hints and pydantic's validate_call resolve them.
TokenIds: TypeAlias = list[int] | tuple[int, ...] | torch.Tensor | ndarray
Prompt: TypeAlias = str | TokenIds
ParamsArg = SamplingParams | Sequence[SamplingParams] | None
Message = Mapping[str, Any]


# Blanks a reply may write before a think tag (LLM._may_begin).
_BLANK_RUNS = ("", *(c * n for c in " \n\t" for n in (1, 2, 3)), "\r\n")


def _as_list(value: Any) -> Any:
    """A numpy array or torch tensor of token ids as (nested) lists of ints; others unchanged.
    An array of floats or bools is refused here: as lists, they read as lists of prompts."""
    if (
        hasattr(value, "tolist")
        and hasattr(value, "ndim")
        and not isinstance(value, str)
        and not _is_bytes(value)  # (a memoryview has both: refused as bytes, not read as ids)
    ):
        dtype = getattr(value, "dtype", None)
        if value.ndim == 0 and is_token_id(value):
            raise TypeError(
                f"a 0-d {type(value).__name__} ({value!r:.40}) is one token id, not a prompt: "
                "pass a 1-d one or a list of ids"
            )
        if _holds_non_integers(dtype):
            raise TypeError(
                f"token ids must be integers, but the {type(value).__name__} given holds "
                f"{str(dtype).removeprefix('torch.')} values"
            )
        if value.ndim > 2:
            raise TypeError(
                f"a {value.ndim}-d {type(value).__name__} of token ids: give a 1-d one (a prompt) "
                "or a 2-d one (a batch of prompts of one length)"
            )
        if value.ndim == 1 and len(value) == 0:
            raise ValueError(
                f"the prompt is empty: the 1-d {type(value).__name__} given holds no token ids"
            )
        return value.tolist()
    return value


def _holds_non_integers(dtype: Any) -> bool:
    """Whether a numpy or torch dtype is of floats, complex numbers or bools."""
    if isinstance(dtype, torch.dtype):
        return dtype.is_floating_point or dtype.is_complex or dtype == torch.bool
    return getattr(dtype, "kind", None) in ("f", "c", "b")  # numpy's kinds of those


def _one_prompt(prompt: Any, call: str) -> Any:
    """``prompt`` (an array as lists) for a call that takes one (stream, astream): a list holding
    strs or lists is refused as the list of prompts it looks like, which only generate takes."""
    prompt = _as_list(prompt)
    if isinstance(prompt, list | tuple):
        for index, item in enumerate(prompt):
            if isinstance(item, str | list | tuple):
                raise TypeError(
                    f"{call} takes one prompt, a str or a list of token ids (ints), but item "
                    f"{index} of the list is a {type(item).__name__} ({item!r:.40}); generate "
                    "takes a list of prompts"
                )
    return prompt


def _shape_error(prompt: Any) -> TypeError:
    """Why `prompt` (neither a str nor a list of token ids) is not a prompt."""
    if isinstance(prompt, list | tuple):
        index = next(i for i, t in enumerate(prompt) if not is_token_id(t))
        item = prompt[index]
        hint = (
            "; a list of prompts is a list of strs or lists of ids: [[1, 2], 'Hi']"
            if isinstance(item, str | list | tuple)
            else ""
        )
        return TypeError(
            "a prompt given as a list must hold only token ids (ints), but item "
            f"{index} is a {type(item).__name__} ({item!r:.40}){hint}"
        )
    return TypeError(
        f"a prompt must be a str or a list of token ids, got {type(prompt).__name__}"
        + (" (decode bytes to str first)" if _is_bytes(prompt) else "")
    )


def _naming_prompt(error: Exception, index: int, count: int) -> Exception:
    """``error`` (of one prompt of a list) again, its message saying which prompt it was about."""
    try:
        return type(error)(f"prompt {index} of {count}: {error}")
    except Exception:  # an error type whose constructor takes other arguments: keep it as it is
        return error


@contextlib.contextmanager
def naming_prompt(index: int, count: int) -> Iterator[None]:
    """A ValueError or TypeError raised inside, about prompt ``index`` of a list of ``count``,
    says which prompt it was (``prompt 1 of 3: ...``)."""
    try:
        yield
    except (ValueError, TypeError) as error:
        named = _naming_prompt(error, index, count)
        if named is error:
            raise
        raise named.with_traceback(error.__traceback__) from None


def _is_bytes(value: Any) -> bool:
    return isinstance(value, bytes | bytearray | memoryview)


# Keywords a chat call takes for the template's variables (enable_thinking=..., a template's own
# names) and passes on to it: these would be taken there silently, as variables no template reads.
NOT_TEMPLATE_VARIABLES = frozenset(
    {f.name for f in dataclasses.fields(SamplingParams)}
    | {"sampling_params", "tool_choice", "response_format", "parallel_tool_calls"}
)


class _ChatFormat(NamedTuple):
    """How a ``chat`` call decodes and reads its reply (``LLM._chat_format``)."""

    format: ToolCallFormat | None  # (None: no calls are read)
    params: SamplingParams
    reasoning_start: bool | None
    under_grammar: bool  # the tools' grammar decodes it (``LLM.chat_output``)


@dataclasses.dataclass(frozen=True)
class _ChatOptions:
    """A ``chat`` call's OpenAI-style request options."""

    tool_choice: str | Mapping[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: Mapping[str, Any] | None = None

    def constraint(
        self, format: ToolCallFormat | None, tools: Sequence[Any], own: bool
    ) -> ReplyConstraint | None:
        """The reply's constraint for ``tools`` (called in ``format``): None where no option
        asks for one (the calls are parsed, not enforced), and where the params have one of
        their ``own`` (then no option may be given)."""
        parallel = self.parallel_tool_calls
        check_parallel_tool_calls(parallel)
        schema = response_format_schema(self.response_format)
        if self.tool_choice is None and parallel is None and schema is None:
            return None
        if own:
            raise ValueError(
                "chat got params with a constraint of their own and tool_choice, "
                "parallel_tool_calls or response_format: give one (the params' constraint "
                "decides the reply)"
            )
        choice = openai_tool_choice(self.tool_choice, [tool_name(tool) for tool in tools])
        return ReplyConstraint.of_request(format, tools, choice, parallel, schema)


def check_template_kwargs(template_kwargs: Mapping[str, Any]) -> None:
    """Refuse a sampling option or an OpenAI-style request field given to chat as a keyword: the
    keywords are the chat template's variables, and such a value would change nothing; and
    ``add_generation_prompt``, which chat always sets."""
    if "add_generation_prompt" in template_kwargs:
        raise ValueError(
            "add_generation_prompt is not a chat option: chat always renders the prompt of "
            "the assistant's next turn"
        )
    for name in template_kwargs:
        if name not in NOT_TEMPLATE_VARIABLES:
            continue
        if name in ("tool_choice", "parallel_tool_calls", "response_format"):
            hint = f"it is an option of the request (chat's {name}=, the server's field)"
        elif name == "sampling_params":
            hint = "pass it as params=..."
        else:
            hint = f"pass params=SamplingParams({name}=...)"
        raise TypeError(
            f"chat got the keyword {name}=, which is not a chat template variable (extra "
            f"keywords go to the template): {hint}"
        )


def _texts(chunks: Generator[StreamChunk, None, None]) -> Generator[str, None, None]:
    with contextlib.closing(chunks):  # closing the texts stops the request now, not at collection
        for chunk in chunks:
            if chunk.text:
                yield chunk.text


async def _atexts(chunks: AsyncGenerator[StreamChunk, None]) -> AsyncGenerator[str, None]:
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            if chunk.text:
                yield chunk.text


def _flat(groups: list[list[Request]]) -> list[Request]:
    return [request for group in groups for request in group]


def _with_choices(
    groups: list[list[Request]], outputs: list[GenerationOutput]
) -> list[GenerationOutput]:
    """Each group's first output, the group's others in its ``other_choices`` (``outputs``: the
    groups' requests' in order)."""
    firsts = []
    start = 0
    for group in groups:
        first, *others = outputs[start : start + len(group)]
        first.other_choices = others
        firsts.append(first)
        start += len(group)
    return firsts


def default_model_path(draft: bool = False) -> Path:
    """The bundled default chat model (or, with ``draft``, its draft model) shipped in the package."""
    path = Path(__file__).parent / "assets" / ("brisk-draft" if draft else "brisk-chat")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"the bundled default model is missing from {path}; pass a model directory explicitly"
        )
    return path


def draft_schedule(
    draft: str | Path, num_speculative_tokens: int | None, draft_length: str | None
) -> str:
    """The draft length schedule for ``draft``, checked: ``draft_length``, or the proposer's
    default, adaptive for a draft model and fixed for n-gram lookup (whose proposals cost no
    draft passes, so shortening them only loses accepted tokens)."""
    schedule = draft_length or ("fixed" if str(draft) == "ngram" else "adaptive")
    DraftLengthSchedule(speculative_tokens(num_speculative_tokens), schedule)  # checks them
    return schedule


def speculative_tokens(num_speculative_tokens: int | None) -> int:
    """The most tokens a step proposes: ``num_speculative_tokens``, None the default (5)."""
    if num_speculative_tokens is None:
        return DEFAULT_NUM_SPECULATIVE_TOKENS
    return num_speculative_tokens


def check_draft_options(
    draft: str | Path | None, num_speculative_tokens: int | None, draft_length: str | None
) -> str | None:
    """ValueError (FileNotFoundError for a missing directory) for speculative options
    ``from_pretrained`` would refuse, checked before anything loads; the draft length schedule
    they resolve to (None without a draft)."""
    if draft is not None:
        schedule = draft_schedule(draft, num_speculative_tokens, draft_length)
        if str(draft) not in ("ngram", "default"):
            checkpoint_directory(draft, "draft model")
        return schedule
    for name, value in (
        ("draft_length", draft_length),
        ("num_speculative_tokens", num_speculative_tokens),
    ):
        if value is not None:  # (the CLI refuses its flags alike)
            draft_schedule("ngram", num_speculative_tokens, None)  # a bad value named as such
            raise ValueError(
                f"{name}={value!r} needs speculative decoding: pass draft= (a draft model "
                "directory, 'default' or 'ngram')"
            )
    return None


def build_speculator(
    draft: str | Path,
    num_speculative_tokens: int,
    target: LlamaForCausalLM,
    tokenizer: Tokenizer,
    config: EngineConfig,
    device: torch.device,
    dtype: str | torch.dtype | None,
    show_progress: bool = True,
    draft_length: str | None = None,
    kv_cache_dtype: torch.dtype | None = None,
    int4_compute_dtype: torch.dtype | None = None,
) -> Speculator:
    """A proposer for ``draft``: "ngram" (prompt lookup), "default" (the bundled draft) or a model
    directory; ``draft_length`` is the schedule of tokens proposed per step (:func:`draft_schedule`);
    ``kv_cache_dtype``: the draft's cache dtype (None: the draft model's own);
    ``int4_compute_dtype``: what a GPTQ draft's int4 layers compute in, as the target's."""
    schedule = draft_schedule(draft, num_speculative_tokens, draft_length)
    if str(draft) == "ngram":
        return Speculator(
            NgramProposer(num_speculative_tokens=num_speculative_tokens),
            num_speculative_tokens,
            schedule,
        )
    directory = default_model_path(draft=True) if str(draft) == "default" else Path(draft)
    draft_model = load_model(
        directory,
        device=device,
        dtype=dtype,
        make_linear=linear_factory_for(
            directory,
            device=device,
            compute_dtype=int4_compute_dtype,
            activation_dtype=resolve_dtype(dtype, torch.device(device)),
        ),
        show_progress=show_progress,
    )
    if kv_cache_dtype is not None:
        draft_model.kv_cache_dtype = kv_cache_dtype
    # Both caches, before the draft's is allocated.
    max_seq_len = config.resolved_max_seq_len(target.config.max_position_embeddings)
    check_kv_cache_fits(target, config, draft=draft_model)
    has_tokenizer = any(
        (directory / name).is_file() for name in ("tokenizer.json", "tokenizer.model")
    )
    proposer = DraftModelProposer(
        draft_model,
        num_cache_slots(config, target),  # the target's slots (those keeping prefixes too)
        max_seq_len,
        num_speculative_tokens,
        config.attention_backend,
        cuda_graphs=config.cuda_graphs,
        target_config=target.config,
        tokenizer=tokenizer,
        draft_tokenizer=Tokenizer.from_pretrained(directory) if has_tokenizer else None,
        max_batch_size=config.max_batch_size,
    )
    return Speculator(proposer, num_speculative_tokens, schedule)


_NOT_COPYABLE = (
    "an LLM cannot be pickled or copied: it owns loaded weights and an engine thread; pass the "
    "model path and make the LLM in the worker (e.g. in a ProcessPoolExecutor initializer), or "
    "share this one between threads"
)


class ContextLengthError(ValueError):
    """A prompt that leaves no room in the model's context for a generated token."""


# The most torch threads (num_threads) LLM.from_pretrained takes for each CPU the process may run
# on.
MAX_THREADS_PER_CPU = 8


def _warn_of_more_threads_than_cpus(num_threads: int) -> None:
    available = available_cpus()
    if num_threads > available:
        logger.warning(
            "num_threads=%d is more than the %d CPUs this process may run on: the threads take "
            "turns on them and wait for each other, usually slower than %d",
            num_threads,
            available,
            available,
        )


class LLM:
    """A loaded model and tokenizer with an engine thread that batches every caller's requests."""

    def __init__(self, engine: LLMEngine, model_path: Path) -> None:
        self.engine = engine
        self.tokenizer: Tokenizer = engine.tokenizer
        self.model_path = model_path
        # The checkpoint's recommended sampling (generation_config.json), used when no params are given.
        self.sampling_defaults: dict[str, Any] = sampling_defaults(model_path)
        self._loop = EngineLoop(engine)
        self._request_counter = itertools.count()
        self._id_prefix = uuid.uuid4().hex[:8]

    # pickle (a process pool's arguments, Ray, celery) and copy.deepcopy went into the engine
    # and failed on a ctypes pointer; copy.copy shared the engine, whose close() it had.
    def __reduce__(self) -> Any:
        raise TypeError(_NOT_COPYABLE)

    def __copy__(self) -> LLM:
        raise TypeError(_NOT_COPYABLE)

    def __deepcopy__(self, memo: dict[int, Any]) -> LLM:
        raise TypeError(_NOT_COPYABLE)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        max_batch_size: int = 8,
        max_seq_len: int | None = None,
        attention_backend: str = "auto",
        draft: str | Path | None = None,
        num_speculative_tokens: int | None = None,
        draft_length: str | None = None,
        show_progress: bool = True,
        int4_compute_dtype: str | torch.dtype | None = None,
        num_threads: int | None = None,
        kv_cache_dtype: str | torch.dtype | None = None,
        prefill_chunk_size: int | None = None,
        max_prefill_tokens: int = 8192,
        cuda_graphs: bool = True,
        prefix_caching: bool = True,
        grammar_cache_size: int = DEFAULT_GRAMMAR_CACHE_SIZE,
        max_decode_steps: int = 8,
        prefix_cache_slots: int = 0,
    ) -> LLM:
        """Load a Hugging Face checkpoint directory (default: the bundled model).

        ``device``: "cpu" or "cuda" (default: cuda when available); ``dtype``: "float32",
        "bfloat16" or "float16" (default: float32 on CPU, bfloat16 on CUDA; on CPU a checkpoint
        stored in bfloat16 or float16, the bundled models too, then keeps its weights so and the
        native kernels widen them exactly as they read them: float32's logits from half the
        memory, see ``brisklm.loader.load_model``). ``kv_cache_dtype``:
        the KV cache's elements, one of the same three (default, or "auto": the dtype the model
        computes in, the ``dtype`` asked for; without one float32 on CPU, even for a checkpoint
        stored in bfloat16, and bfloat16 on CUDA), for the draft model's cache too. A
        half-precision cache holds keys and values rounded to nearest even and takes half the
        memory of a float32 one; attention widens them back to its own dtype.
        ``draft`` turns on speculative decoding: a draft model directory sharing the target's
        tokenizer, "default" for the bundled draft model, or "ngram" for prompt lookup; each step
        proposes up to ``num_speculative_tokens`` tokens (5 by default; without ``draft`` it is
        refused, as the CLI refuses its flag). ``draft_length="adaptive"`` (the default
        with a draft model) follows each request's acceptance: one token more after a step whose
        proposals were all accepted, one fewer after a step that kept under half of them, between 1
        and ``num_speculative_tokens``, and pauses a request (plain steps) while its proposals do
        not pay (``brisklm.speculative.draft_length``); "fixed" (the default with "ngram") always
        proposes up to ``num_speculative_tokens``. The output is unchanged: greedy output is the
        target's own, sampled output follows the target's distribution exactly.
        GPTQ int4 checkpoints load as int4 layers (see ``brisklm.quant``); ``int4_compute_dtype``
        is what their kernels compute in: by default (or "auto") float32 on CPU through the native
        kernels (exact products of the dequantized weight; without a C compiler, torch's kernel in
        bfloat16), "bfloat16" takes torch's kernel (2.4x slower a token at batch 1 on a 245M
        model), "float16" torch's kernel in float16 (~10x slower again; a warning says so); on
        CUDA the kernel's own. Other quantizations are refused.
        ``num_threads`` sets torch's intra-op threads for the whole process (``torch.set_num_threads``;
        default: torch's, one per core; more than the CPUs the process may run on is warned of,
        more than 8 for each of them refused). On
        CPU, leave one core free of other busy processes per thread: with one of two cores taken by
        another process, two threads decoded the bundled model at 130-640 tokens/s and one thread
        at 630-1,320 (2,400 with both free: the threads wait on each other's time slices). The
        engine runs fewer threads while it sees that (``brisklm.kernels.team_size``), at most
        this many, and so does the load (``brisklm.kernels.omp.BusyCpus``, measured over ~40 ms
        as the tokenizer loads).
        ``prefill_chunk_size``: the most prompt tokens a request feeds per forward pass (default:
        512 on CPU, 2048 on CUDA). A longer prompt enters the cache over several passes, each of
        which also carries every other running request's next token, so a long prompt does not
        stall the requests decoding beside it. ``max_prefill_tokens``: the most prompt tokens of
        all requests together per pass (at least one chunk runs). ``cuda_graphs``: on CUDA, decode
        steps (one token per request, no seeded request in the batch) replay CUDA graphs captured
        per batch size and key-length bucket, one launch a step instead of hundreds (the draft
        model's too); False runs every pass eagerly. No effect on CPU. ``prefix_caching``: a
        finished request's keys and values stay in its cache slot, and a request whose prompt
        starts with the same tokens (a chat's system prompt and tools) takes that slot and computes
        only the rest (``usage.cached_prompt_tokens`` counts what it reused); the output is the
        same either way through the native CPU pass (float and GPTQ int4 models on CPU), which
        reuses any shared prefix; other paths (CUDA, int4 on torch's kernel or with q/k/v shards
        of different act-order groups, ``prefill_chunk_size`` over 512) reuse whole prompt
        chunks a pass computed for their request alone (a prompt shorter than a chunk reuses
        nothing: lower ``prefill_chunk_size`` to reuse more), and there the same holds for a
        request alone (a batch rounds each row by what shares its
        pass, which prefix caching changes). ``grammar_cache_size``: how many compiled grammars
        (JSON schemas, regexes, choices, grammars, tool lists) are kept for reuse, least recently
        used dropped first; a grammar compiles again when it comes back after being dropped.
        ``max_decode_steps``: through the native CPU pass, a batch decoding greedy or sampled with
        temperature, top-k, top-p and min-p, after a logit bias and penalties, with or without
        logprobs (no grammar or pending ``min_tokens``; with a draft, where its schedule pauses
        every row) runs up to this many one-token steps in one call of the kernels, as many as take
        about 20 ms, so that the Python around a step runs once for them (the tokens are the same, a
        seed's too; a stream gets them a few at a time, and a request that arrives meanwhile waits
        for the call); 1 runs a call a step.
        ``prefix_cache_slots``: cache slots beyond ``max_batch_size`` that only keep finished
        requests' prefixes: with prefix caching, the keys of at most ``max_batch_size`` earlier
        conversations stay (the one retained longest ago gives way), so more conversations taking
        turns than that recompute their history at every turn; with this many more slots, up to
        ``max_batch_size + prefix_cache_slots`` keep theirs. Each slot is ``max_seq_len``
        positions of KV cache memory (the draft model's too), allocated up front.
        """
        if num_threads is not None and (
            isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1
        ):
            raise ValueError(f"num_threads must be None or an int >= 1, got {num_threads!r}")
        cpus = available_cpus()
        if num_threads is not None and num_threads > MAX_THREADS_PER_CPU * cpus:
            # (OpenMP's thread creation fails, or the process crashes, long before 100,000)
            raise ValueError(
                f"num_threads={num_threads} is more than {MAX_THREADS_PER_CPU} threads for each "
                f"of the {cpus} CPUs this process may run on: at most {MAX_THREADS_PER_CPU * cpus} "
                "(more threads than CPUs take turns on them; None: one per CPU)"
            )
        check_bool("show_progress", show_progress)
        directory = checkpoint_directory(path if path is not None else default_model_path())
        check_draft_options(draft, num_speculative_tokens, draft_length)
        num_speculative_tokens = speculative_tokens(num_speculative_tokens)
        config = EngineConfig(
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            max_prefill_tokens=max_prefill_tokens,
            attention_backend=attention_backend,
            prefill_chunk_size=prefill_chunk_size,
            cuda_graphs=cuda_graphs,
            prefix_caching=prefix_caching,
            grammar_cache_size=grammar_cache_size,
            max_decode_steps=max_decode_steps,
            prefix_cache_slots=prefix_cache_slots,
        )
        device_ = resolve_device(device)
        resolve_dtype(dtype, device_)  # a bad value fails before anything loads
        try:
            compute_dtype = (
                None  # the kernels' own (native float32 on CPU), as "auto" means for the dtypes
                if int4_compute_dtype is None or int4_compute_dtype == "auto"
                else resolve_dtype(int4_compute_dtype, device_)
            )
        except ValueError as error:
            raise ValueError(f"int4_compute_dtype: {error}") from None
        cache_dtype = resolve_kv_cache_dtype(kv_cache_dtype, device_)
        threads_before = torch.get_num_threads()
        if num_threads is not None:
            _warn_of_more_threads_than_cpus(num_threads)
            torch.set_num_threads(num_threads)

        def build() -> LLMEngine:
            wanted = torch.get_num_threads()
            busy = BusyCpus() if device_.type == "cpu" and wanted > 1 else None
            make_linear = linear_factory_for(
                directory,
                device=device_,
                compute_dtype=compute_dtype,
                activation_dtype=resolve_dtype(dtype, device_),
            )
            tokenizer = Tokenizer.from_pretrained(directory)
            # Where other processes keep cores busy, the load's torch ops take the CPUs left
            # (its many small parallel ops each waited a time slice for a preempted thread;
            # its bits do not depend on the count).
            threads = wanted if busy is None else threads_beside(busy.measure(), wanted)
            if threads < wanted:
                logger.info("loading on %d thread(s): other processes keep CPUs busy", threads)
            with at_most_threads(threads):
                return build_engine(make_linear, tokenizer)

        def build_engine(make_linear: LinearFactory, tokenizer: Tokenizer) -> LLMEngine:
            model = load_model(
                directory,
                device=device_,
                dtype=dtype,
                make_linear=make_linear,
                show_progress=show_progress,
            )
            if cache_dtype is not None:
                model.kv_cache_dtype = cache_dtype
            # Before the draft model's cache, which would fail to allocate first; with a draft
            # model, after it loads (build_speculator), so that the advice counts both caches.
            if draft is None or str(draft) == "ngram":
                check_kv_cache_fits(model, config)
            speculator = None
            if draft is not None:
                speculator = build_speculator(
                    draft,
                    num_speculative_tokens,
                    model,
                    tokenizer,
                    config,
                    device_,
                    dtype,
                    show_progress,
                    draft_length,
                    cache_dtype,
                    compute_dtype,
                )
            return LLMEngine(model, tokenizer, config, speculator)

        def build_saying_so() -> LLMEngine:  # (a first build of the kernels takes ~8 s)
            with native.announcing_build(show_progress):
                return build()

        # Loading runs kernels on OpenMP: in a scratch thread, its pool does not outlive it and
        # slow the engine thread down (see brisklm.engine.scratch_thread).
        try:
            engine = call_in_scratch_thread(build_saying_so)
        except BaseException:
            if num_threads is not None:  # a load that failed leaves the process as it was
                torch.set_num_threads(threads_before)
            raise
        return_free_memory()  # (the load's temporaries, which malloc would keep)
        return cls(engine, directory)

    # ----------------------------------------------------------------- requests
    def _params_or_default(self, params: SamplingParams | None) -> SamplingParams:
        """``params`` of a call about one prompt, checked; None: ``default_sampling_params()``."""
        if params is None:
            return self.default_sampling_params()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams or None, got {type(params).__name__}")
        return params

    def default_sampling_params(self, **changes: Any) -> SamplingParams:
        """The SamplingParams used when a call passes none: brisklm's defaults, overridden by the
        checkpoint's generation_config.json (``sampling_defaults``: temperature, top_k, top_p,
        min_p, repetition_penalty, max_new_tokens as max_tokens), then by ``changes``."""
        return SamplingParams(**{**self.sampling_defaults, **changes})

    @property
    def max_seq_len(self) -> int:
        return self.engine.max_seq_len

    def _next_id(self) -> str:
        return f"req-{self._id_prefix}-{next(self._request_counter)}"

    def make_request(
        self, prompt: Prompt, params: SamplingParams, add_special_tokens: bool = True
    ) -> Request:
        """Validate and tokenize one prompt. Raises ValueError/TypeError before anything is queued.

        A request is one completion: ``params.n`` must be 1 (``make_requests`` makes one request
        for each of its ``n``)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.n != 1:
            raise ValueError(
                f"SamplingParams.n={params.n}: a request (and a stream) is one completion; "
                "generate, agenerate, chat and achat take n, and make_requests makes a request "
                "for each completion"
            )
        prompt = _as_list(prompt)
        if isinstance(prompt, str):
            text: str | None = prompt
            ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        elif isinstance(prompt, list | tuple) and all(type(t) is int for t in prompt):
            text = None  # plain ints (what chat and LangChain pass): no per-id conversion
            ids = list(prompt)
        elif isinstance(prompt, list | tuple) and all(is_token_id(t) for t in prompt):
            text = None
            ids = [int(t) for t in prompt]
        else:
            raise _shape_error(prompt)
        # A text's tokens too: a tokenizer may hold tokens added without resizing the embedding.
        vocab = self.engine.num_real_tokens
        bad = (
            [t for t in ids if not 0 <= t < vocab]
            if ids and (min(ids) < 0 or max(ids) >= vocab)
            else []
        )
        if bad:
            past = "" if text is None else " (the tokenizer has tokens the model's embedding lacks)"
            raise ValueError(f"prompt token ids must be in [0, {vocab}){past}; got {bad[:5]}")
        if not ids:
            raise ValueError("the prompt is empty: it encodes to no tokens")
        if len(ids) >= self.max_seq_len:
            raise ContextLengthError(
                f"the prompt has {len(ids)} tokens but the context holds {self.max_seq_len} "
                "(prompt plus at least one generated token); shorten it or raise max_seq_len"
            )
        room = self.max_seq_len - len(ids)
        if params.min_tokens > room:  # (the reply would end at the context's end, short of it)
            raise ContextLengthError(
                f"SamplingParams.min_tokens={params.min_tokens} cannot be met: the context holds "
                f"{self.max_seq_len} tokens and the prompt has {len(ids)}, which leaves {room} "
                "for the reply; lower min_tokens or shorten the prompt"
            )
        params.validate_for_vocab(self.engine.num_real_tokens, self.tokenizer.eos_token_ids)
        matcher = self.engine.structured.matcher_for(params)
        thinking = None
        if params.thinking_token_budget is not None:
            thinking = self._thinking_budget(ids, params, matcher)
        return Request(
            request_id=self._next_id(),
            prompt=text,
            prompt_token_ids=ids,
            params=params,
            eos_token_ids=frozenset()
            if params.ignore_eos
            else frozenset(self.tokenizer.eos_token_ids),
            max_seq_len=self.max_seq_len,
            detokenizer=self.tokenizer.detokenizer(
                ids,
                skip_special_tokens=params.skip_special_tokens,
                keep_first_space=matcher is not None,  # the grammar counted it
            ),
            generator=make_generator(params, self.engine.device),
            draft_generator=make_draft_generator(params, self.engine.device)
            if self.engine.speculator
            else None,
            # With a proposer, outputs always carry stats (zero for one that ends on its first
            # token), so that out.speculative.acceptance_rate reads without a None check.
            speculative=SpeculativeStats() if self.engine.speculator else None,
            matcher=matcher,
            thinking=thinking,
        )

    def _thinking_budget(
        self, prompt_ids: Sequence[int], params: SamplingParams, matcher: GrammarMatcher | None
    ) -> ThinkingBudget | None:
        """The count of ``params.thinking_token_budget`` for a reply to ``prompt_ids``, which may
        open a thinking block or begins inside one the prompt opened (``prompt_thinking``); None
        where it bounds nothing: the prompt closed one in the reply's turn, or the reply's
        constraint (``matcher``'s) takes it from its first token (as ``generate`` applies one, and
        ``chat`` one that writes the block itself), where a block would be the constraint's own
        text (logged where the constraint may begin with the tag). Raises ValueError for such a
        constraint after a block the prompt opened: the budget could not close it."""
        tail = self._thinking_tail(prompt_ids)
        start = prompt_thinking(tail)
        if start is None:
            return None
        if params.constraint is not None and not thinks_first(params.constraint):
            assert matcher is not None
            if not start:
                if self._may_begin(matcher, OPEN_TAG):
                    logger.warning(
                        "thinking_token_budget=%d is not applied: the %s constraint takes the "
                        "reply from its first token and may write a thinking block itself, which "
                        "no budget can close (give it as brisklm.AfterThinking to bound one)",
                        params.thinking_token_budget,
                        type(params.constraint).__name__,
                    )
                return None
            raise ValueError(
                f"SamplingParams.thinking_token_budget={params.thinking_token_budget} needs the "
                "reply's thinking block before its constraint, and this "
                f"{type(params.constraint).__name__} takes the reply from its first token (it "
                "may write the block itself; generate applies a constraint so): give "
                "constraint=brisklm.AfterThinking(constraint, opened=...), or no budget"
            )
        constraint = params.constraint
        if isinstance(constraint, AfterThinking) and constraint.opened != start:
            # The count would start where the grammar does not: it waits for a block the
            # grammar has the reply inside, or forces a tag the grammar refuses.
            raise ValueError(
                f"SamplingParams.thinking_token_budget={params.thinking_token_budget} with "
                f"AfterThinking(opened={constraint.opened}), but the prompt "
                + ("has opened a thinking block" if start else "opens no thinking block")
                + f": give AfterThinking(constraint, opened={start})"
            )
        opened = tail[tail.rfind(OPEN_TAG) + len(OPEN_TAG) :] if start else None
        return ThinkingBudget(
            params.thinking_token_budget,  # type: ignore[arg-type]
            opened,
            self.tokenizer.token_bytes(),
            self._thinking_closing,
        )

    @functools.cached_property
    def _thinking_closing(self) -> tuple[list[int], list[int]]:
        """The tokens a thinking budget forces to close a block, after thinking text that ends
        with a newline and after text that does not: ``"</think>\\n\\n"`` and
        ``"\\n</think>\\n\\n"``, as chat templates lay the block out, tokenized as text in
        the middle of a sequence (no sentencepiece dummy prefix), the tag as its own token where
        it is a special one (text cannot spell it)."""
        tokenize = self.engine.structured.compiler.llg_tokenizer.tokenize_str
        close_id = self.tokenizer.token_to_id(CLOSE_TAG)
        if close_id is None or close_id not in self.tokenizer.special_token_ids:
            return tokenize(CLOSE_TAG + "\n\n"), tokenize("\n" + CLOSE_TAG + "\n\n")
        after = tokenize("\n\n")
        return [close_id, *after], [*tokenize("\n"), close_id, *after]

    def make_requests(
        self, prompt: Prompt, params: SamplingParams, add_special_tokens: bool = True
    ) -> list[Request]:
        """The requests of ``params.n`` completions of one prompt (``params.per_choice()``: with
        a seed, choice i samples with seed + i), the prompt validated and tokenized once."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        first, *others = params.per_choice()
        requests = [self.make_request(prompt, first, add_special_tokens)]
        for choice in others:
            request = self.make_request(requests[0].prompt_token_ids, choice)
            request.prompt = requests[0].prompt
            requests.append(request)
        return requests

    def _make_requests(self, prompts: Sequence[Prompt], params: ParamsArg) -> list[list[Request]]:
        """Each prompt's requests, one a completion (``SamplingParams.n``)."""
        if not prompts:
            raise ValueError("no prompts given: pass a prompt or a non-empty list of prompts")
        if params is None or isinstance(params, SamplingParams):
            params_list = [params or self.default_sampling_params()] * len(prompts)
        elif isinstance(params, list | tuple):
            params_list = list(params)
            if len(params_list) != len(prompts):
                raise ValueError(
                    f"got {len(params_list)} SamplingParams for {len(prompts)} prompts"
                )
        else:
            raise TypeError(
                "params must be a SamplingParams, a list of them (one per prompt) or None, got "
                f"{type(params).__name__}"
            )
        prompts = [_as_list(p) for p in prompts]
        for index, prompt in enumerate(prompts):
            if not isinstance(prompt, str | list | tuple):
                raise TypeError(
                    f"prompt {index} of the list is {prompt!r:.40} ({type(prompt).__name__}): a "
                    "list of prompts holds strs or lists of token ids"
                    + (
                        ", and a tokenized prompt is a list of ints alone"
                        if len(prompts) > 1
                        else ""
                    )
                    + (" (decode bytes to str first)" if _is_bytes(prompt) else "")
                )
        if len(prompts) == 1:
            return [self.make_requests(prompts[0], params_list[0])]
        groups = []
        for index, (prompt, sampling) in enumerate(zip(prompts, params_list)):
            with naming_prompt(index, len(prompts)):
                groups.append(self.make_requests(prompt, sampling))
        return groups

    @staticmethod
    def _prompt_list(prompts: Any) -> tuple[list[Any], bool]:
        """The prompts of a generate call as a list, and whether one prompt was given (not a list)."""
        prompts = _as_list(prompts)
        if isinstance(prompts, str):
            return [prompts], True
        if isinstance(prompts, list | tuple):
            single = len(prompts) > 0 and is_token_id(prompts[0])
            return ([prompts] if single else list(prompts)), single
        raise TypeError(
            "prompts must be a str, a list of token ids, or a list of those, got "
            f"{type(prompts).__name__}"
            + (" (decode bytes to str first)" if _is_bytes(prompts) else "")
        )

    # ----------------------------------------------------------------- sync API
    @overload  # a str is also a Sequence[str]: the first overload wins
    def generate(  # type: ignore[overload-overlap]
        self,
        prompts: str | list[int] | tuple[int, ...],
        params: ParamsArg = None,
        *,
        show_progress: bool = False,
    ) -> GenerationOutput: ...
    @overload
    def generate(
        self, prompts: Sequence[Prompt], params: ParamsArg = None, *, show_progress: bool = False
    ) -> list[GenerationOutput]: ...
    @overload  # 1-D: one prompt, 2-D: a batch (not told apart by a type): Any, not a union
    def generate(
        self,
        prompts: torch.Tensor | ndarray,
        params: ParamsArg = None,
        *,
        show_progress: bool = False,
    ) -> Any: ...

    def generate(
        self, prompts: Any, params: ParamsArg = None, *, show_progress: bool = False
    ) -> Any:
        """Complete one prompt (returns one output) or a list (returns a list, batched in one engine batch).

        ``show_progress``: a progress bar on stderr (tqdm) of the completions finished and the output
        tokens a second, for a long list."""
        prompt_list, single = self._prompt_list(prompts)
        groups = self._make_requests(prompt_list, params)
        outputs = self.run_requests(_flat(groups), show_progress=show_progress)
        firsts = _with_choices(groups, outputs)
        return firsts[0] if single else firsts

    def run_requests(
        self, requests: list[Request], *, show_progress: bool = False
    ) -> list[GenerationOutput]:
        """Submit prepared requests together and block until all finish (``show_progress``: a
        progress bar, as ``generate``'s)."""
        check_request_list(requests)
        with (
            contextlib.closing(self._results(requests, final_only=True)) as results,
            BatchProgress(len(requests), show_progress) as progress,
        ):
            for _, request, result in results:
                if isinstance(result, BaseException):
                    raise result
                if result.finished:
                    progress.finished(request)
        return [r.to_output() for r in requests]

    def _results(
        self, requests: list[Request], final_only: bool
    ) -> Generator[tuple[int, Request, StreamChunk | BaseException], None, None]:
        """Submit ``requests`` together (one engine batch) and yield ``(index, request, chunk or
        error)`` as the engine delivers them (``final_only``: each request's last alone, no
        hand-off a token) until every one has finished or failed; closing the generator early
        aborts the requests not yet finished."""
        collector = SyncCollector(final_only=final_only)
        self._loop.submit(requests, collector)
        index = {r.request_id: i for i, r in enumerate(requests)}
        pending = set(index)
        try:
            while pending:
                request, result = collector.get()
                if isinstance(result, BaseException) or result.finished:
                    pending.discard(request.request_id)
                yield index[request.request_id], request, result
        finally:
            for request_id in pending:
                self._loop.abort(request_id)

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> RequestStream[str]:
        """Yield the completion's text as it is generated (never text that a stop string later claims).

        Bad input and a closed LLM raise here, at the call; generation starts at the first ``next``.
        The stream names its request (``request_id``): ``stream.abort()`` stops it from any thread.
        """
        request = self._streamed_request(prompt, params, "stream")
        return RequestStream(_texts(self.stream_request(request)), request, self._loop.abort)

    def stream_chunks(
        self, prompt: Prompt, params: SamplingParams | None = None
    ) -> RequestStream[StreamChunk]:
        """Like ``stream`` but yields StreamChunks with token ids, logprobs, finish reason and usage."""
        request = self._streamed_request(prompt, params, "stream")
        return RequestStream(self.stream_request(request), request, self._loop.abort)

    def _streamed_request(self, prompt: Prompt, params: SamplingParams | None, api: str) -> Request:
        request = self.make_request(_one_prompt(prompt, api), self._params_or_default(params))
        self._check_open()
        return request

    def _check_open(self) -> None:
        if self._loop.closed:
            raise RuntimeError("the engine is closed")

    def stream_request(self, request: Request) -> Generator[StreamChunk, None, None]:
        """Stream one prepared request (``stream_requests`` of one)."""
        with contextlib.closing(self.stream_requests([request])) as chunks:
            for _, chunk in chunks:
                yield chunk

    def stream_requests(
        self, requests: list[Request]
    ) -> Generator[tuple[int, StreamChunk], None, None]:
        """Submit prepared requests together (one engine batch) and yield each one's chunks,
        ``(index, chunk)``, as they come. The first request to fail raises; closing the
        generator early aborts the requests not yet finished."""
        with contextlib.closing(self._results(requests, final_only=False)) as results:
            for index, _, result in results:
                if isinstance(result, BaseException):
                    raise result
                yield index, result

    # ---------------------------------------------------------------- async API
    @overload  # a str is also a Sequence[str]: the first overload wins
    async def agenerate(  # type: ignore[overload-overlap]
        self,
        prompts: str | list[int] | tuple[int, ...],
        params: ParamsArg = None,
        *,
        show_progress: bool = False,
    ) -> GenerationOutput: ...
    @overload
    async def agenerate(
        self, prompts: Sequence[Prompt], params: ParamsArg = None, *, show_progress: bool = False
    ) -> list[GenerationOutput]: ...
    @overload  # 1-D: one prompt, 2-D: a batch (not told apart by a type): Any, not a union
    async def agenerate(
        self,
        prompts: torch.Tensor | ndarray,
        params: ParamsArg = None,
        *,
        show_progress: bool = False,
    ) -> Any: ...

    async def agenerate(
        self, prompts: Any, params: ParamsArg = None, *, show_progress: bool = False
    ) -> Any:
        """Async ``generate``: awaits without blocking the event loop (the prompts are tokenized
        and their grammars compiled in a worker thread: a new tool grammar takes ~0.1-0.3 s)."""
        prompt_list, single = self._prompt_list(prompts)
        groups = await run_off_loop(self._make_requests, prompt_list, params)
        outputs = await self.arun_requests(_flat(groups), show_progress=show_progress)
        firsts = _with_choices(groups, outputs)
        return firsts[0] if single else firsts

    async def arun_requests(
        self, requests: list[Request], *, show_progress: bool = False
    ) -> list[GenerationOutput]:
        """Async ``run_requests``: the first request to fail raises, and the others are aborted."""
        check_request_list(requests)
        async with contextlib.aclosing(self.arun_requests_each(requests)) as results:
            with BatchProgress(len(requests), show_progress) as progress:
                async for index, result in results:
                    if isinstance(result, BaseException):
                        raise result
                    progress.finished(requests[index])
        return [r.to_output() for r in requests]

    async def arun_requests_each(
        self, requests: list[Request]
    ) -> AsyncGenerator[tuple[int, GenerationOutput | BaseException], None]:
        """Submit prepared requests together (one engine batch) and yield ``(index, output)`` as
        each finishes, or ``(index, error)`` for one that fails while the others go on. Closing
        the generator (``aclose``, or ``contextlib.aclosing`` around the loop, so that leaving it
        early closes it) or cancelling the task in it aborts the requests not yet finished."""
        # (final_only: no wake-up of the event loop per token)
        async with contextlib.aclosing(self._aresults(requests, final_only=True)) as results:
            async for index, request, result in results:
                if isinstance(result, BaseException):
                    yield index, result
                elif result.finished:
                    yield index, request.to_output()

    async def _aresults(
        self, requests: list[Request], final_only: bool
    ) -> AsyncGenerator[tuple[int, Request, StreamChunk | BaseException], None]:
        """Async ``_results``: cancelling the task in it aborts the requests not yet finished
        too."""
        collector = AsyncCollector(final_only=final_only)
        self._loop.submit(requests, collector)
        index = {r.request_id: i for i, r in enumerate(requests)}
        pending = set(index)
        try:
            while pending:
                request, result = await collector.queue.get()
                if isinstance(result, BaseException) or result.finished:
                    pending.discard(request.request_id)
                yield index[request.request_id], request, result
        finally:
            for request_id in pending:
                self._loop.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Stop a submitted request (``Request.request_id``): it finishes with finish reason
        ``abort`` and the text so far. An id that is unknown or already finished is ignored."""
        if not isinstance(request_id, str):  # a Request itself matched no id, silently
            raise TypeError(
                "abort takes a request id (a str: Request.request_id), got "
                f"{type(request_id).__name__}"
                + (": pass request.request_id" if isinstance(request_id, Request) else "")
            )
        self._loop.abort(request_id)

    def abort_all(self) -> None:
        """Stop every request submitted so far (from any thread): each finishes with finish
        reason ``abort`` and its text so far, as ``abort`` ends one. Requests made later run."""
        self._loop.abort(None)

    def astream(
        self, prompt: Prompt, params: SamplingParams | None = None
    ) -> AsyncRequestStream[str]:
        """Async ``stream`` (use with ``async for``); bad input raises at the call."""
        request = self._streamed_request(prompt, params, "astream")
        return AsyncRequestStream(_atexts(self.astream_request(request)), request, self._loop.abort)

    def astream_chunks(
        self, prompt: Prompt, params: SamplingParams | None = None
    ) -> AsyncRequestStream[StreamChunk]:
        """Async ``stream_chunks`` (use with ``async for``); bad input raises at the call."""
        request = self._streamed_request(prompt, params, "astream")
        return AsyncRequestStream(self.astream_request(request), request, self._loop.abort)

    async def astream_request(self, request: Request) -> AsyncGenerator[StreamChunk, None]:
        """Async ``stream_request``."""
        async with contextlib.aclosing(self.astream_requests([request])) as chunks:
            async for _, chunk in chunks:
                yield chunk

    async def astream_requests(
        self, requests: list[Request]
    ) -> AsyncGenerator[tuple[int, StreamChunk], None]:
        """Async ``stream_requests``: closing the generator (``aclose``, or
        ``contextlib.aclosing`` around the loop) or cancelling the task in it aborts the requests
        not yet finished."""
        async with contextlib.aclosing(self._aresults(requests, final_only=False)) as results:
            async for index, _, result in results:
                if isinstance(result, BaseException):
                    raise result
                yield index, result

    # --------------------------------------------------------------------- chat
    def chat_prompt_ids(
        self,
        messages: Sequence[Message],
        tools: Sequence[Any] | None = None,
        **template_kwargs: Any,
    ) -> list[int]:
        """Render messages (and tools) with the model's chat template and tokenize the result."""
        check_messages_list(messages, sequence=True)
        if not messages:
            raise ValueError("messages is empty: a chat needs at least one message")
        check_template_kwargs(template_kwargs)
        if tools is not None:
            check_tools_list(tools)
        text = self.tokenizer.apply_chat_template(
            list(messages),
            tools=None if tools is None else list(tools),  # [] renders as transformers does
            add_generation_prompt=True,
            **template_kwargs,
        )
        # The template writes special tokens (bos, role markers) itself.
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise ValueError("the chat template rendered no tokens for these messages")
        return ids

    def chat(
        self,
        messages: Sequence[Message],
        params: SamplingParams | None = None,
        tools: Sequence[Any] | None = None,
        *,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        response_format: Mapping[str, Any] | None = None,
        **template_kwargs: Any,
    ) -> ChatOutput:
        """One assistant turn for ``messages``; with ``tools``, tool calls are parsed out of the
        reply, and a reasoning model's thinking block out of its start (``ChatOutput.reasoning``;
        see ``reasoning_start``).

        As OpenAI's request fields, any of which decodes the reply under a grammar of the
        tools' schemas (and the answer's), after a reasoning model's thinking, so that each
        call is one of the tools with arguments its schema accepts: ``tool_choice`` ("auto",
        "required", "none" or ``{"type": "function", "function": {"name": ...}}``),
        ``parallel_tool_calls`` (False: one call at most) and ``response_format``
        (``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {"name":
        ..., "schema": ...}}``; its default, ``{"type": "text"}``, asks for nothing).
        Without them the reply is decoded freely and its calls parsed, not enforced (a
        grammar takes the decoding off its fastest paths, and a reply under one ends where
        the grammar does: ``ignore_eos`` does not apply, and ``min_tokens`` is refused).
        ``params`` with a constraint of their own (a grammar, a JSON schema) decide the
        reply: then give none of these."""
        options = _ChatOptions(tool_choice, parallel_tool_calls, response_format)
        ids = self.chat_prompt_ids(messages, tools, **template_kwargs)
        chosen = self._chat_format(ids, tools, params, options, template_kwargs)
        output = self.generate(ids, chosen.params)
        return self.chat_output(output, chosen.format, chosen.reasoning_start, chosen.under_grammar)

    async def achat(
        self,
        messages: Sequence[Message],
        params: SamplingParams | None = None,
        tools: Sequence[Any] | None = None,
        *,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        response_format: Mapping[str, Any] | None = None,
        **template_kwargs: Any,
    ) -> ChatOutput:
        """Async ``chat``."""
        options = _ChatOptions(tool_choice, parallel_tool_calls, response_format)

        def prepare() -> tuple[list[int], _ChatFormat]:
            ids = self.chat_prompt_ids(messages, tools, **template_kwargs)
            return ids, self._chat_format(ids, tools, params, options, template_kwargs)

        ids, chosen = await run_off_loop(prepare)  # the template, off the loop
        output = await self.agenerate(ids, chosen.params)
        return self.chat_output(output, chosen.format, chosen.reasoning_start, chosen.under_grammar)

    def stream_chat(
        self,
        messages: Sequence[Message],
        params: SamplingParams | None = None,
        tools: Sequence[Any] | None = None,
        *,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        response_format: Mapping[str, Any] | None = None,
        **template_kwargs: Any,
    ) -> RequestStream[str]:
        """Stream the assistant's reply text (with tools, decoded as ``chat`` decodes it: a
        special-token tag that starts the model's calls is kept, so the text parses with
        ``tool_call_format().parse`` or its ``stream_parser``; a reasoning model's thinking
        block included: ``brisklm.reasoning.ReasoningSplitter`` tells it apart)."""
        options = _ChatOptions(tool_choice, parallel_tool_calls, response_format)
        ids = self.chat_prompt_ids(messages, tools, **template_kwargs)
        return self.stream(
            ids, self._chat_format(ids, tools, params, options, template_kwargs).params
        )

    def reasoning_start(
        self, prompt_ids: Sequence[int], chat_template: str | None = None, has_tools: bool = False
    ) -> bool | None:
        """How a chat reply to ``prompt_ids`` may hold a thinking block (``brisklm.reasoning``):
        None where the chat template knows none, True where the prompt has opened one (the
        reply begins inside it, as DeepSeek-R1's templates and a reasoning prefill make it),
        False where the reply may open one (Qwen3's), None too where the prompt closed one in
        the reply's turn (Qwen3's ``enable_thinking=False``; ``prompt_thinking``).
        ``chat_template`` and ``has_tools`` pick the template as ``chat`` does."""
        try:
            template = self.tokenizer.template_for(chat_template, has_tools=has_tools)
        except ValueError:
            return None
        if not template_reasons(template):
            return None
        return prompt_thinking(self._thinking_tail(prompt_ids))

    def _block_under(
        self, constraint: Constraint, opened: bool
    ) -> Literal["own", "before", "none"]:
        """How a chat reply's thinking block goes with a ``constraint`` of the caller's (see
        ``chat_decoding``): "own", the constraint writes the block itself (its text names the
        closing tag, ``may_close_thinking``, or it may begin with the block's tag: the closing one
        inside a block the prompt ``opened``, else the opening one; a regex of any text, the
        tools' "auto" grammar built without ``thinking``); "before", the block comes before it
        (``AfterThinking``); "none", neither, where the block's rules would change what the
        constraint takes: tags that are special tokens (which the rules' text does not read), a
        constraint that may begin with a newline (the newlines after the block are the block's:
        the content would lose them) or a Lark grammar that asks llguidance for an initial skip
        (which it does not make behind a reference). Special-token tags come first: no
        constraint's text can write them, so one that may begin with their text gets "none"."""
        if isinstance(constraint, AfterThinking) or may_close_thinking(constraint):
            return "own"
        tags = (CLOSE_TAG,) if opened else (OPEN_TAG, CLOSE_TAG)
        if any(self.tokenizer.token_to_id(t) in self.tokenizer.special_token_ids for t in tags):
            return "none"
        try:
            matcher = self.engine.structured.compiler.compile(constraint).matcher()
        except ValueError:  # (a constraint that does not compile fails its request, named)
            return "own"
        if self._may_begin(matcher, CLOSE_TAG if opened else OPEN_TAG):
            return "own"
        skip = isinstance(constraint, Grammar) and constraint.llguidance_options.get(
            "allow_initial_skip"
        )
        return "none" if skip or self._may_begin(matcher, "\n") else "before"

    def _may_begin(self, matcher: GrammarMatcher, start: str) -> bool:
        """Whether output under ``matcher`` (at its start) may begin with ``start``: a newline,
        or a think tag, alone or after the blanks a model writes before it
        (``brisklm.reasoning.block_opening`` takes any: these are the runs of spaces, newlines
        and tabs up to three, and a CRLF)."""
        return any(matcher.validate_tokens(ids) == len(ids) for ids in self._openings[start])

    @functools.cached_property
    def _openings(self) -> dict[str, list[list[int]]]:
        """The token sequences ``_may_begin`` tries for each start it is asked about (tokenized
        once per model, as text in the middle of a sequence)."""
        tokenize = self.engine.structured.compiler.llg_tokenizer.tokenize_str
        tags = {tag: [tokenize(run + tag) for run in _BLANK_RUNS] for tag in (OPEN_TAG, CLOSE_TAG)}
        return {"\n": [tokenize("\n")], **tags}

    def _thinking_tail(self, prompt_ids: Sequence[int]) -> str:
        """The prompt's text from its last opening tag where that tag is one token, else all of
        it (a window of its last 512 tokens missed the tag of a longer reasoning prefill, and the
        reply was taken for one that may open a block; such templates are rare, and only those
        that know thinking blocks get here)."""
        ids = list(prompt_ids)
        start = 0
        open_id = self.tokenizer.token_to_id(OPEN_TAG)
        if open_id is not None:
            if open_id not in ids:
                return ""
            start = len(ids) - 1 - ids[::-1].index(open_id)
        return self.tokenizer.decode(ids[start:], skip_special_tokens=False)

    def tool_call_format(self, chat_template: str | None = None) -> ToolCallFormat:
        """How the model writes tool calls (hermes, llama3_json or mistral), read from the chat
        template it gets with tools (or ``chat_template``, a template name or source)."""
        try:
            template = self.tokenizer.template_for(chat_template, has_tools=True)
        except ValueError:  # no template: tools cannot be rendered anyway
            if chat_template is not None:  # a name that is not one of them: a mistake
                raise
            template = None
        tokenizer = self.tokenizer
        return detect_tool_call_format(template, tokenizer.token_to_id, tokenizer.special_token_ids)

    def _chat_format(
        self,
        prompt_ids: Sequence[int],
        tools: Sequence[Any] | None,
        params: SamplingParams | None,
        options: _ChatOptions,
        template_kwargs: Mapping[str, Any],
    ) -> _ChatFormat:
        """Of a ``chat`` call: the tool-call format to parse its reply with (None without tools,
        or with tool_choice "none"), the params to decode it with (the tools' and response
        format's grammar; stop strings only before the calls, special tokens kept when the
        format's calls start with one), its ``reasoning_start`` (for the template it rendered
        with: tools given, even an empty list, pick the tool_use one) and whether the tools'
        grammar decodes it."""
        template = template_kwargs.get("chat_template")
        format = self.tool_call_format(template) if tools else None
        chosen = self._params_or_default(params)
        reply = options.constraint(format, tools or (), chosen.constraint is not None)
        if reply is not None:
            format = reply.calls_format
        chosen, start = self.chat_decoding(
            prompt_ids, chosen, format, template, tools is not None, reply
        )
        return _ChatFormat(format, chosen, start, reply is not None and format is not None)

    def chat_decoding(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        tool_format: ToolCallFormat | None,
        chat_template: str | None = None,
        has_tools: bool = False,
        constraint: ReplyConstraint | None = None,
    ) -> tuple[SamplingParams, bool | None]:
        """The params a chat reply to ``prompt_ids`` decodes with, and its ``reasoning_start``
        (``chat_template`` and ``has_tools`` as there): with a ``tool_format`` (a reply that may
        hold calls), stop strings only before the calls and special tokens kept where the calls'
        tag is one; without, no ``reply_calls``. ``constraint``: the tools' or a response
        format's, in place of the one the params hold, built for the prompt (the tools' grammar
        with the thinking block first). A reasoning model's thinking comes before a constraint,
        as vLLM applies guided decoding after the reasoning, where it neither writes the block
        itself nor would take the reply otherwise behind it (``_block_under``; such a constraint
        decides the reply from its first token, and a block the prompt opened that it cannot
        close leaves the reply none). A ``thinking_token_budget`` is dropped where the reply holds
        no block (the template knows none, or the constraint leaves none); beside a constraint
        that writes the block itself, ``make_request`` decides (``_thinking_budget``). ``chat``,
        the server and ChatBrisk decode so."""
        start = self.reasoning_start(prompt_ids, chat_template, has_tools)
        if constraint is not None:
            params = params.with_changes(**constraint.changes(start))
        own = params.constraint
        block = None
        if own is not None and start is not None:
            block = self._block_under(own, start)
            if block == "before":
                params = params.with_changes(constraint=AfterThinking(own, start))
            elif block == "none" and start:
                start = None  # (the reply is all content)
        if params.thinking_token_budget is not None and (start is None or block == "none"):
            params = params.with_changes(thinking_token_budget=None)  # (the reply holds no block)
        if tool_format is None:
            return (params.with_changes(reply_calls=None) if params.reply_calls else params), start
        return params.with_changes(**tool_format.decoding_options(start)), start

    @staticmethod
    def chat_output(
        output: GenerationOutput,
        format: ToolCallFormat | None,
        reasoning_start: bool | None = None,
        under_grammar: bool = False,
    ) -> ChatOutput:
        """The turn's reasoning, content and calls. ``reasoning_start`` (``reasoning_start``'s):
        not None, a thinking block that opens the reply is its ``reasoning``, and the rest is
        read as the reply, as ``ToolCallFormat.read_reply`` reads it (``under_grammar``: the
        reply was decoded under the tools' grammar, where a call's start is a call): a call the
        reply ended inside is neither content nor a call (the server's reply alike, streamed or
        not), its text is ``cut_call``."""
        reasoning, text = split_reasoning(output.text, reasoning_start)
        if format is None:
            content, calls, cut_call, cut = text, [], None, False
        else:
            content, calls, cut_call, cut = format.read_reply(text, output.cut_short, under_grammar)
        finish = turn_finish_reason(output.finish_reason, bool(calls), cut)
        others = [
            LLM.chat_output(c, format, reasoning_start, under_grammar) for c in output.other_choices
        ]
        return ChatOutput(
            content=content,
            tool_calls=calls,
            finish_reason=finish,
            output=output,
            other_choices=others,
            reasoning=reasoning,
            cut_call=cut_call,
        )

    # ---------------------------------------------------------------- lifecycle
    def close(self, timeout: float = 30.0) -> None:
        """Stop the engine thread, waiting up to ``timeout`` seconds for the step it is in (one
        that runs longer ends it as it ends); requests still queued or running fail with an error
        (their callers get a RuntimeError), and later calls are refused. The weights and KV cache
        are freed with the LLM object, once nothing refers to it (``del llm``)."""
        # The grammar worker stops once the engine thread has (a step that outlasts the wait
        # still masks through it).
        self._loop.close(timeout, then=self.engine.structured.close)

    async def aclose(self, timeout: float = 30.0) -> None:
        """``close`` for a coroutine: it waits for the engine's current step (up to ``timeout``
        seconds) in a worker thread, not on the event loop."""
        await run_off_loop(self.close, timeout)

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> LLM:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
