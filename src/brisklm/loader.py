"""Load safetensors checkpoints (single file or sharded) into a model built on the meta device.

Parameters are materialised once on the target device and each checkpoint tensor is copied into
place as it is read, so the weights never exist twice in memory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import safe_open
from torch import nn
from tqdm.auto import tqdm

from brisklm.config import ModelConfig
from brisklm.engine.scratch_thread import raise_if_cancelled
from brisklm.kernels import native
from brisklm.models import native_forward
from brisklm.models.layers import LinearFactory
from brisklm.models.llama import PACKED_MODULES, LlamaForCausalLM

logger = logging.getLogger(__name__)

SUPPORTED_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# Non-persistent buffers some exporters wrote into checkpoints; they carry nothing we need.
_IGNORED_TENSORS = re.compile(r"(^|\.)rotary_emb\.inv_freq$|(^|\.)masked_bias$|(^|\.)attn\.bias$")
# Tensor names that mark a GPTQ layer: named in the error when a dense layer meets them.
_GPTQ_TENSOR_NAMES = ("qweight", "qzeros", "scales", "g_idx")
# The ones stored as integers (packed codes and zero points, group indices); every other is float.
_INTEGER_TENSOR_NAMES = ("qweight", "qzeros", "g_idx")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: names the file and tensor at fault."""


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """float32 on CPU and bfloat16 on CUDA unless asked otherwise (the arithmetic's dtype: see
    ``load_model`` for the weights of a half-precision checkpoint on CPU)."""
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in SUPPORTED_DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; supported: {', '.join(SUPPORTED_DTYPES)}")
        return dtype
    if not isinstance(dtype, str) or dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
    return SUPPORTED_DTYPES[dtype]


def resolve_kv_cache_dtype(
    kv_cache_dtype: str | torch.dtype | None, device: torch.device
) -> torch.dtype | None:
    """The KV cache dtype asked for; None (or "auto"): the model's own, decided when it loads."""
    if kv_cache_dtype is None or kv_cache_dtype == "auto":
        return None
    try:
        return resolve_dtype(kv_cache_dtype, device)
    except ValueError as error:
        raise ValueError(f"kv_cache_dtype: {error}") from None


def check_device_name(device: str | torch.device) -> torch.device:
    """The device a name means, ValueError unless it is a CPU or CUDA one (whether this machine
    has CUDA is ``resolve_device``'s question)."""
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ValueError(f"unsupported device {str(device)!r}; supported: cpu, cuda") from None
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {str(device)!r}; supported: cpu, cuda")
    return resolved


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = check_device_name(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} was requested but CUDA is not available")
    if resolved.type == "cuda" and resolved.index is not None:
        count = torch.cuda.device_count()
        if resolved.index >= count:
            raise ValueError(
                f"device {str(device)!r} was requested but this machine has {count} CUDA "
                f"device(s): cuda:0 to cuda:{count - 1}"
            )
    return resolved


def checkpoint_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint: model.safetensors where there is one (as in
    transformers: saving a model unsharded over a sharded one leaves the old index behind), else
    the shard index's files, else every safetensors file."""
    return _checkpoint_layout(directory)[0]


def _checkpoint_layout(directory: Path) -> tuple[list[Path], dict[str, Path]]:
    """``checkpoint_files``, and the file the shard index names for each tensor (empty without
    an index; ``_read_headers`` reads a tensor stored in two shards from that one)."""
    single = directory / "model.safetensors"
    if single.is_file():
        return [single], {}
    index_file = directory / "model.safetensors.index.json"
    if index_file.is_file():
        expected = (
            'expected a JSON object whose "weight_map" maps each tensor name to the file name '
            "of its shard, both strings"
        )
        try:
            index = json.loads(index_file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{index_file}: not valid JSON ({exc}); {expected}") from None
        if not isinstance(index, dict) or "weight_map" not in index:
            raise CheckpointError(f'{index_file}: no "weight_map"; {expected}')
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict):
            raise CheckpointError(
                f'{index_file}: "weight_map" is a JSON {_json_type(weight_map)}; {expected}'
            )
        for tensor_name, shard_name in weight_map.items():
            if not isinstance(shard_name, str) or not shard_name:
                raise CheckpointError(
                    f'{index_file}: "weight_map" gives tensor {tensor_name!r} the shard '
                    f"{json.dumps(shard_name)} (a JSON {_json_type(shard_name)}); {expected}"
                )
        names = sorted(set(weight_map.values()))
        files = [directory / name for name in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(
                f"{index_file} lists shards that do not exist: {', '.join(missing)}"
            )
        return files, {name: directory / shard for name, shard in weight_map.items()}
    others = sorted(directory.glob("*.safetensors"))
    if others:
        return others, {}
    pickled = sorted(p.name for p in directory.glob("*.bin"))
    hint = (
        f"; {', '.join(pickled)}: PyTorch's pickle format, which brisklm does not read: "
        "convert it with transformers (model.save_pretrained(directory))"
        if pickled
        else ""
    )
    raise FileNotFoundError(
        f"no safetensors weights in {str(directory)!r} (expected model.safetensors or "
        f"model.safetensors.index.json with its shards){hint}"
    )


def _json_type(value: object) -> str:
    """The JSON name of a parsed JSON value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string" if value else "empty string"
    if isinstance(value, list):
        return "array"
    return "object"


_HEAD = "lm_head.weight"
_EMBEDDING = "model.embed_tokens.weight"
# The modules of LlamaForCausalLM's base model ("model."), as a checkpoint saved from the base
# model alone (transformers' LlamaModel) names its tensors.
_BASE_MODEL_TENSOR = re.compile(r"(?:embed_tokens|layers|norm)\.")


def _model_name(name: str) -> str:
    """A checkpoint tensor's name in the model: one saved from the base model alone
    (``layers.0...``) gains the ``model.`` prefix, and one saved from a model wrapped once more
    (``model.model.layers.0...``) loses one, as transformers maps them."""
    if name.startswith(("model.model.", "model.lm_head.")):
        return name.removeprefix("model.")
    if _BASE_MODEL_TENSOR.match(name):
        return "model." + name
    return name


_COMPARE_ROWS = 4096  # rows of the head and the embedding read at a time when comparing them


# A Mistral bias flag of config.json and the tensor name that shows the checkpoint stores it.
_MISTRAL_BIASES = {
    "qkv_bias": "self_attn.q_proj.bias",
    "o_proj_bias": "self_attn.o_proj.bias",
    "mlp_bias": "mlp.down_proj.bias",
}


def _mistral_biases_as_stored(
    config: ModelConfig, stored: dict[str, tuple[Path, str]]
) -> ModelConfig:
    """A Mistral config whose attention_bias/mlp_bias the checkpoint does not bear out:
    transformers' Mistral layers have no biases whatever config.json says (it loads such a
    checkpoint and ignores biases it stores); vLLM's apply them. So biases are applied where the
    checkpoint stores them and not required where it does not (``stored``: ``_tensor_files``)."""
    flags = [flag for flag in _MISTRAL_BIASES if getattr(config, flag)]
    if not flags:
        return config
    absent = {
        flag: False
        for flag in flags
        if not any(name.endswith(_MISTRAL_BIASES[flag]) for name in stored)
    }
    if absent:
        logger.info(
            "config.json sets %s, but the checkpoint stores no such biases: none applied (as "
            "transformers' Mistral, which has none)",
            " and ".join(sorted(absent)),
        )
    return dataclasses.replace(config, **absent)


def _open(path: Path) -> Any:
    """safetensors' ``safe_open`` of a checkpoint file (its header read), or a CheckpointError
    naming the file and why it cannot be read. safetensors reports a file the process may not
    read, and a directory, as missing ("No such file or directory", "No such device"): the
    system's own reason is given where opening the file fails too, with a link's target (a
    Hugging Face cache snapshot whose blob is missing)."""
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        reason = str(exc)
        try:
            with open(path, "rb"):
                pass
        except OSError as error:
            reason = error.strerror or str(error)
            if path.is_symlink():
                reason += f"; it is a link to {os.readlink(path)}"
        raise CheckpointError(f"{path}: cannot read safetensors file ({reason})") from None


class _Stored(NamedTuple):
    """A tensor as a checkpoint file's header lists it."""

    model_name: str  # its name in the model (``_model_name``)
    dtype: str  # safetensors' name of its dtype ("BF16")


# A checkpoint's tensors as its files' headers list them: each file's tensors to read from it,
# by their names there, in its order.
_Headers = dict[Path, dict[str, _Stored]]


def _read_headers(files: list[Path], index: dict[str, Path]) -> _Headers:
    """Each file's tensors to read from it (headers only): all it stores but those the shard
    ``index`` places in another file that stores them too (a tensor in two shards is read from
    the index's, as transformers reads it; one the index places in a shard lacking it is read
    where it is)."""
    headers: _Headers = {}
    for path in files:
        with _open(path) as handle:
            headers[path] = {
                name: _Stored(_model_name(name), handle.get_slice(name).get_dtype())
                for name in handle.keys()
            }
    for path, tensors in headers.items():
        for name in [n for n in tensors if index.get(n, path) != path]:
            if name in headers.get(index[name], {}):
                del tensors[name]
    return headers


def _tensor_files(headers: _Headers) -> dict[str, tuple[Path, str]]:
    """Each tensor the checkpoint stores, by its name in the model -> the file it is read from
    and its name there."""
    where: dict[str, tuple[Path, str]] = {}
    for path, tensors in headers.items():
        for name, tensor in tensors.items():
            where.setdefault(tensor.model_name, (path, name))
    return where


def _stored_head_that_differs(where: dict[str, tuple[Path, str]]) -> Path | None:
    """The file storing an lm_head.weight that differs from the embedding matrix, if any
    (``where``: ``_tensor_files``).

    A tied checkpoint normally stores only the embedding; some store both, equal (torch .bin
    exports, some converters), and those stay tied. One whose head differs was trained untied
    with a wrong config: transformers then keeps both (and warns), and so do we. Compared a
    slice of rows at a time, so neither matrix is read whole here."""
    if _HEAD not in where or _EMBEDDING not in where:
        return None  # the head alone is the shared matrix (see load_model)
    (head_path, head_name), (embedding_path, embedding_name) = where[_HEAD], where[_EMBEDDING]
    try:
        with (
            safe_open(str(head_path), framework="pt", device="cpu") as head_file,
            safe_open(str(embedding_path), framework="pt", device="cpu") as embedding_file,
        ):
            head = head_file.get_slice(head_name)
            embedding = embedding_file.get_slice(embedding_name)
            if head.get_shape() != embedding.get_shape():
                return head_path
            rows = head.get_shape()[0] if head.get_shape() else 0
            for start in range(0, rows, _COMPARE_ROWS):
                end = min(start + _COMPARE_ROWS, rows)
                if not torch.equal(head[start:end].float(), embedding[start:end].float()):
                    return head_path
    except Exception as exc:
        raise CheckpointError(
            f"{head_path}: cannot compare lm_head.weight with the embedding ({exc})"
        ) from None
    return None


# safetensors' names of the floating dtypes a checkpoint's weights may keep on CPU.
_HALF_STORAGE = {"BF16": torch.bfloat16, "F16": torch.float16}
_FLOAT_STORAGE = {"BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2"}


def _stored_half_dtype(
    headers: _Headers, counts: Callable[[str], bool] = lambda name: True
) -> torch.dtype | None:
    """bfloat16 or float16 when every floating tensor of the checkpoint that ``counts`` (by its
    name in the model) is stored in it, else None."""
    found: set[str] = set()
    for tensors in headers.values():
        for name, tensor in tensors.items():
            if _IGNORED_TENSORS.search(name) or not counts(tensor.model_name):
                continue
            if tensor.dtype in _FLOAT_STORAGE:
                found.add(tensor.dtype)
    if len(found) != 1:
        return None
    return _HALF_STORAGE.get(found.pop())


def _iter_tensors(
    headers: _Headers, show_progress: bool
) -> Iterator[tuple[Path, str, str, torch.Tensor]]:
    """Each tensor to read (``_read_headers``) with the file it comes from, its name there and
    its name in the model."""
    # No tqdm object at all unless it shows: even a disabled bar can start tqdm's monitor thread.
    shown = show_progress and len(headers) >= 2
    for path in tqdm(headers, desc="Loading shards", unit="shard") if shown else headers:
        with _open(path) as handle:
            for name, stored in headers[path].items():
                raise_if_cancelled()
                try:
                    tensor = handle.get_tensor(name)
                except Exception as exc:
                    raise CheckpointError(f"{path}: cannot read tensor {name!r} ({exc})") from None
                yield path, name, stored.model_name, tensor


def _expected_entries(
    model: nn.Module,
) -> tuple[set[tuple[str, str, int | None]], set[tuple[str, str, int | None]]]:
    """Every (module, tensor, shard) the checkpoint must provide, and those it may provide.

    Modules with ``expected_tensors()`` (merged or quantized layers) list their own tensors, and
    may list optional ones with ``optional_tensors()`` (e.g. a GPTQ g_idx)."""
    expected: set[tuple[str, str, int | None]] = set()
    optional: set[tuple[str, str, int | None]] = set()
    for module_name, module in model.named_modules():
        expected_tensors = getattr(module, "expected_tensors", None)
        if callable(expected_tensors):
            shards = getattr(module, "shard_sizes", (0,))
            shard_ids: list[int | None] = [None] if len(shards) == 1 else list(range(len(shards)))
            optional_tensors = getattr(module, "optional_tensors", None)
            for target, names in (
                (expected, expected_tensors()),
                (optional, optional_tensors() if callable(optional_tensors) else ()),
            ):
                for tensor_name in names:
                    for shard in shard_ids:
                        target.add((module_name, tensor_name, shard))
            continue
        if list(module.children()):
            continue
        for tensor_name, _ in module.named_parameters(recurse=False):
            expected.add((module_name, tensor_name, None))
    return expected, optional


def _checkpoint_name_to_entry(name: str) -> tuple[str, str, int | None]:
    module_name, _, tensor_name = name.rpartition(".")
    parent, _, leaf = module_name.rpartition(".")
    if leaf in PACKED_MODULES:
        merged, shard = PACKED_MODULES[leaf]
        return f"{parent}.{merged}", tensor_name, shard
    return module_name, tensor_name, None


def _materialize(model: nn.Module, device: torch.device) -> None:
    """Give the meta model's parameters and buffers uninitialised memory on ``device`` (what
    ``Module.to_empty`` does, whose ``empty_like`` of a meta tensor imports torch's symbolic shapes
    and sympy: 0.5-1 s of a process's first load, most of the bundled model's)."""
    made: dict[int, torch.Tensor] = {}  # a tensor registered twice stays one

    def empty(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            made[id(t)] = torch.empty(t.shape, dtype=t.dtype, device=device)
        return made[id(t)]

    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and p.is_meta:
                module._parameters[name] = nn.Parameter(empty(p), requires_grad=p.requires_grad)
        for name, b in module._buffers.items():
            if b is not None and b.is_meta:
                module._buffers[name] = empty(b)


def load_model(
    path: str | Path,
    config: ModelConfig | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    make_linear: LinearFactory | None = None,
    show_progress: bool = True,
) -> LlamaForCausalLM:
    """Build the model for ``path`` and load its weights; errors name the file and tensor at fault.

    ``dtype`` None (or "auto") on CPU is float32 arithmetic. A checkpoint whose weights are all
    stored in bfloat16 (or all in float16; a GPTQ layer's own scales and biases aside) then keeps
    them so where the native kernels run the model: they widen each weight exactly as they read it, and the KV cache is float32, so the
    logits are the bits of float32 weights, from half the memory and half the bytes a decode step
    reads (the bundled model's one-token step 0.58 ms against 0.96 on a 2-vCPU Xeon). An explicit
    "float32" widens the weights at load, as before. ``make_linear`` builds the linear layers; by
    default it is chosen for the checkpoint (dense, or GPTQ int4 when the checkpoint is
    quantized: see ``brisklm.quant.loading``).
    """
    directory = Path(path)
    config = config or ModelConfig.from_pretrained(directory)
    device_ = resolve_device(device)
    dtype_ = resolve_dtype(dtype, device_)
    float32_by_default = (dtype is None or dtype == "auto") and device_.type == "cpu"
    if make_linear is None:
        from brisklm.quant.loading import linear_factory_for

        make_linear = linear_factory_for(directory, device=device_, activation_dtype=dtype_)
    files, index = _checkpoint_layout(directory)
    headers = _read_headers(files, index)
    stored = _tensor_files(headers)
    if config.architecture == "MistralForCausalLM":
        config = _mistral_biases_as_stored(config, stored)
    with torch.device("meta"):
        model = LlamaForCausalLM(config, make_linear)
    # A tied checkpoint may store the shared matrix as the head alone: safetensors' save_model
    # keeps the first name of tensors that share memory, and "lm_head" sorts first.
    head_is_the_embedding = False
    if config.tie_word_embeddings and isinstance(
        getattr(model.lm_head, "weight", None), nn.Parameter
    ):
        where = {name: stored[name] for name in (_HEAD, _EMBEDDING) if name in stored}
        head_is_the_embedding = _EMBEDDING not in where and _HEAD in where
        head_file = _stored_head_that_differs(where)
        if head_file is not None:
            # As transformers does: a stored head that differs from the embedding is the head.
            logger.warning(
                "config.json in %s sets tie_word_embeddings, but %s stores its own lm_head.weight, "
                "different from model.embed_tokens.weight: using the stored head, untied (set "
                "tie_word_embeddings to false in config.json to silence this warning)",
                str(directory),
                head_file,
            )
            config = dataclasses.replace(config, tie_word_embeddings=False)
            with torch.device("meta"):
                model = LlamaForCausalLM(config, make_linear)
    exact_half = None
    # Structure first: a model the kernels cannot run shall not be told to install gcc.
    if float32_by_default and native_forward.supports_structure(model) and native.available():
        # An int4 layer's own float tensors (scales, biases: float16 in GPTQ checkpoints, whatever
        # the model's dtype) keep their dtype; the rest decides.
        def model_dtype_tensor(name: str) -> bool:
            try:  # (a name in the model: _stored_half_dtype maps it)
                module = model.get_submodule(_checkpoint_name_to_entry(name)[0])
            except AttributeError:  # not a module of the model: the loop below names it
                return True
            return not native_forward.is_int4(module)

        exact_half = _stored_half_dtype(headers, model_dtype_tensor)
        if exact_half is not None:
            dtype_ = exact_half
    model.to(dtype_)
    _materialize(model, device_)
    model.tie_weights()
    expected, optional = _expected_entries(model)
    if config.tie_word_embeddings:
        expected.discard(("lm_head", "weight", None))
    # -> the file it came from and its name there
    loaded: dict[tuple[str, str, int | None], tuple[Path, str]] = {}
    for file, name, model_name, tensor in _iter_tensors(headers, show_progress):
        if _IGNORED_TENSORS.search(name):
            continue
        entry = _checkpoint_name_to_entry(model_name)
        if config.tie_word_embeddings and entry == ("lm_head", "weight", None):
            if not head_is_the_embedding:
                continue  # tied: the embedding matrix is the head
            entry = _checkpoint_name_to_entry(_EMBEDDING)
        if entry not in expected and entry not in optional:
            hint = ""
            if entry[1] in _GPTQ_TENSOR_NAMES:
                hint = (
                    "; it is a GPTQ tensor: the layer was built dense, so the checkpoint's "
                    "quantization config (config.json quantization_config or quantize_config.json) "
                    "is missing or leaves this module in float"
                )
            elif entry[1] == "weight" and (entry[0], "qweight", entry[2]) in expected:
                hint = (
                    "; the quantization config quantizes this module but the checkpoint stores a "
                    "float weight for it (check modules_to_not_convert, "
                    "modules_in_block_to_quantize or dynamic in the quantization config)"
                )
            raise CheckpointError(
                f"{file}: unexpected tensor {name!r} (not part of a {config.architecture}{hint})"
            )
        if entry in loaded:
            first_file, first_name = loaded[entry]
            also = "" if first_file == file else f" and in {first_file}"
            if first_name != name:
                also += f" (as {first_name!r})"
            unindexed = ""
            if first_file != file and not index:
                unindexed = (
                    " (with no model.safetensors.index.json every *.safetensors file of the "
                    "directory is read: a stray copy of the weights there is read too)"
                )
            raise CheckpointError(
                f"{file}: tensor {name!r} appears more than once in the checkpoint{also}{unindexed}"
            )
        _copy_into(model, entry, tensor, f"{file}: tensor {name!r}")
        loaded[entry] = file, name
    missing = expected - loaded.keys()
    if missing:
        names = sorted(_describe(entry) for entry in missing)
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        # (an untied head is a tensor of its own; transformers fills a missing one with random
        # weights)
        hint = ""
        if ("lm_head", "weight", None) in missing and not config.tie_word_embeddings:
            hint = " (config.json's tie_word_embeddings is false, so the head is not the embedding)"
            if not _config_sets(directory, "tie_word_embeddings"):
                hint = (
                    " (config.json leaves tie_word_embeddings out, false by default, so the head "
                    "is not the embedding)"
                )
        raise CheckpointError(f"checkpoint in {str(directory)!r} is missing tensors: {shown}{hint}")
    if dtype_ in native.HALF_TYPES and device_.type == "cpu":
        # Half-precision weights, float32 arithmetic through the native kernels, where they run it.
        in_float32 = native_forward.compute_in_float32(model)
        if exact_half is not None:  # float32 was asked for, by default
            if in_float32:
                model.kv_cache_dtype = torch.float32
            else:  # not expected (the structure was checked): float32 weights, as asked
                model.to(torch.float32)
    if native_forward.supports(model):
        native_forward.use_native_layout(model)
    for module in model.modules():
        finalize = getattr(module, "finalize", None)
        if callable(finalize) and module is not model:
            raise_if_cancelled()
            finalize()
    model.eval()
    return model


def _config_sets(directory: Path, key: str) -> bool:
    """Whether ``directory``'s config.json sets ``key`` (for an error's hint: False where it
    cannot be read)."""
    try:
        raw = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and key in raw


def _describe(entry: tuple[str, str, int | None]) -> str:
    module_name, tensor_name, shard = entry
    if shard is None:
        return f"{module_name}.{tensor_name}"
    merged = module_name.rpartition(".")[2]
    originals = [
        leaf
        for leaf, (target, index) in PACKED_MODULES.items()
        if target == merged and index == shard
    ]
    parent = module_name.rpartition(".")[0]
    return (
        f"{parent}.{originals[0]}.{tensor_name}"
        if originals
        else f"{module_name}[{shard}].{tensor_name}"
    )


def _copy_into(
    model: nn.Module, entry: tuple[str, str, int | None], tensor: torch.Tensor, source: str
) -> None:
    module_name, tensor_name, shard = entry
    if tensor_name not in _INTEGER_TENSOR_NAMES and not tensor.dtype.is_floating_point:
        # A cast would load int8 or bool values as weights without a word.
        raise CheckpointError(
            f"{source}: stored as {str(tensor.dtype).removeprefix('torch.')}; expected a float "
            "tensor (float32, bfloat16 or float16)"
        )
    module = model.get_submodule(module_name)
    load_tensor = getattr(module, "load_tensor", None)
    if callable(load_tensor):
        load_tensor(tensor_name, tensor, shard, source)
        return
    param = getattr(module, tensor_name)
    if tuple(param.shape) != tuple(tensor.shape):
        raise CheckpointError(
            f"{source}: shape {tuple(tensor.shape)} does not match the model's {tuple(param.shape)}"
        )
    with torch.no_grad():
        param.copy_(tensor)
