"""Quantize a float checkpoint to GPTQ int4 (or RTN) and write a v1 GPTQ checkpoint other loaders accept.

GPTQ runs layer by layer, as the paper's sequential procedure does:
  1. embed the calibration sequences: hidden states [n, L, E] in float32 (the one large buffer);
  2. for each decoder layer in order, for each group of linears sharing an input
     (qkv_proj; o_proj; gate_up_proj; down_proj, in execution order; one group of all four without
     ``true_sequential``): run the layer over the calibration batches with hooks that fold each
     linear's input into a Hessian (q/k/v share one, gate/up share one) and stop the forward pass
     once the group's inputs are seen; quantize each weight with GPTQ; put the dequantized weight
     back, so the next group and every later layer see this layer already quantized;
  3. run the (now quantized) layer once more to turn its inputs into the next layer's inputs, in place.
Memory: the float model, the calibration hidden states (n * L * E * 4 bytes), one KV cache of one
layer for a batch of sequences, and the Hessians of one group (at most one layer's: 3 * E^2 + I^2
floats without true_sequential). RTN needs no calibration and no forward pass.

The output directory holds model.safetensors with HF names (``...q_proj.qweight`` etc.), config.json
with ``quantization_config``, quantize_config.json as auto-gptq writes it, and every other
non-weight file of the source (tokenizer, generation config) copied.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from tqdm.auto import tqdm

from brisklm.attention import AttentionMetadata, select_backend
from brisklm.cache.contiguous import KVCache
from brisklm.config import ModelConfig
from brisklm.loader import load_model, resolve_device
from brisklm.models.layers import Linear, strided_dense_linear
from brisklm.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from brisklm.tokenizer import Tokenizer
from brisklm.tokenizer_backend import CHAT_TEMPLATE_DIR

from .calibration import calibration_token_ids, read_calibration_samples
from .config import QUANTIZE_CONFIG_FILE, GPTQConfig
from .gptq import GPTQ, quantize_rtn
from .gptq_format import PACK_FACTOR, GPTQTensors
from .loading import checkpoint_module_names

logger = logging.getLogger(__name__)

METHODS = ("gptq", "rtn")
# A decoder layer's linears in execution order, and the groups true-sequential GPTQ quantizes in turn.
LAYER_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".ckpt")
_SAVE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class QuantizeOptions:
    """How to quantize. ``num_samples`` sequences of ``seq_len`` tokens calibrate GPTQ;
    ``batch_size`` of them go through a layer at a time."""

    method: str = "gptq"
    group_size: int = 128
    sym: bool = True
    act_order: bool = False
    quantize_lm_head: bool = False
    damp_percent: float = 0.01
    true_sequential: bool = True
    num_samples: int = 128
    seq_len: int = 512
    batch_size: int = 4

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.method == "rtn" and self.act_order:
            raise ValueError("act_order needs calibration data: use method 'gptq'")
        if not 0.0 < self.damp_percent < 1.0:
            raise ValueError(f"damp_percent must be in (0, 1), got {self.damp_percent}")
        for name in ("num_samples", "seq_len", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        self.gptq_config()  # validates group_size (-1 or a multiple of 32)

    def gptq_config(self) -> GPTQConfig:
        return GPTQConfig(
            bits=4,
            group_size=self.group_size,
            desc_act=self.act_order,
            sym=self.sym,
            checkpoint_format="gptq",
            lm_head=self.quantize_lm_head,
            damp_percent=self.damp_percent,
            true_sequential=self.true_sequential,
        )


@dataclass
class QuantizeResult:
    """What ``quantize_model`` did: per checkpoint module, GPTQ's objective (0 for RTN)."""

    out_dir: Path
    method: str
    num_sequences: int
    seq_len: int
    seconds: float
    losses: dict[str, float] = field(default_factory=dict)


def quantize_model(
    model_dir: str | Path,
    out_dir: str | Path,
    options: QuantizeOptions | None = None,
    *,
    calibration: str | Path | None = None,
    device: str | torch.device | None = "cpu",
    show_progress: bool = True,
) -> QuantizeResult:
    """Quantize the float checkpoint in ``model_dir`` and write a GPTQ v1 checkpoint to ``out_dir``.

    ``calibration``: a text file (see ``brisklm.quant.calibration``); default: the built-in text.
    """
    options = options or QuantizeOptions()
    # Resolved: `--out .` has no name and `.` for a parent, and the staging folder would be made
    # inside the output folder itself.
    model_dir, out_dir = Path(model_dir), Path(out_dir).resolve()
    config = ModelConfig.from_pretrained(model_dir)
    if config.quantization is not None or (model_dir / QUANTIZE_CONFIG_FILE).is_file():
        raise ValueError(f"{model_dir} is already quantized: quantize a float checkpoint")
    _check_out_dir(model_dir, out_dir)
    _check_packable_shapes(config, options)
    device_ = resolve_device(device)
    start = time.perf_counter()
    samples = read_calibration_samples(calibration) if options.method == "gptq" else []
    model = load_model(
        model_dir,
        config,
        device=device_,
        dtype=torch.float32,
        make_linear=strided_dense_linear,
        show_progress=show_progress,
    )
    num_sequences, seq_len = 0, 0
    if options.method == "gptq":
        seq_len = min(options.seq_len, config.max_position_embeddings)
        ids = calibration_token_ids(
            Tokenizer.from_pretrained(model_dir), samples, options.num_samples, seq_len
        )
        if int(ids.max()) >= config.vocab_size:
            raise ValueError(
                f"the tokenizer produced id {int(ids.max())}, outside the model's vocabulary "
                f"of {config.vocab_size}"
            )
        num_sequences, seq_len = ids.shape
        quantized = _quantize_gptq(model, ids.to(device_), options, show_progress)
    else:
        quantized = _quantize_rtn(model, options, show_progress)
    _write_checkpoint(model, quantized, model_dir, out_dir, options)
    return QuantizeResult(
        out_dir=out_dir,
        method=options.method,
        num_sequences=num_sequences,
        seq_len=seq_len,
        seconds=time.perf_counter() - start,
        losses={name: loss for name, (_, loss) in quantized.items()},
    )


# Our module name (e.g. model.layers.0.self_attn.qkv_proj) -> (v1 tensors of the merged weight, loss).
Quantized = dict[str, tuple[GPTQTensors, float]]


def _quantized_linears(model: LlamaForCausalLM, options: QuantizeOptions) -> list[str]:
    names = [
        f"model.layers.{i}.{linear}"
        for i in range(len(model.model.layers))
        for linear in LAYER_LINEARS
    ]
    return names + (["lm_head"] if options.quantize_lm_head else [])


def _check_packable_shapes(config: ModelConfig, options: QuantizeOptions) -> None:
    """Refuse, before any work, a model whose quantized layers GPTQ int4 cannot store.

    GPTQ packs eight int4 values to an int32 along two dimensions: qweight [in/8, out] along the
    input, qzeros [groups, out/8] along the output. So every quantized layer's input size and the
    output size of each checkpoint layer must be multiples of 8 (a merged q/k/v or gate/up is
    split back into its layers along packed qzeros words, so each part counts on its own).
    Sizes that are multiples of 8 but not of 32 are logged: brisklm reads them, but auto-gptq and
    GPTQModel size their buffers as size // 32 * 4 words and refuse such a checkpoint.
    """
    with torch.device("meta"):
        model = LlamaForCausalLM(config, strided_dense_linear)
    unaligned: list[str] = []
    for name in _quantized_linears(model, options):
        module = model.get_submodule(name)
        sizes = [("input", name, module.in_features)] + [
            ("output", layer, size)
            for layer, size in zip(checkpoint_module_names(name), module.shard_sizes)
        ]
        for side, layer, size in sizes:
            if size % PACK_FACTOR == 0:
                if size % 32:
                    unaligned.append(f"{layer} ({side} {size})")
                continue
            if name == "lm_head":
                field = "vocab_size" if side == "output" else "hidden_size"
                what = f"{size} (the model's {field})"
                fix = (
                    "leave the head in float: drop --quantize-lm-head "
                    "(QuantizeOptions.quantize_lm_head=False)"
                )
            else:
                what = str(size)
                fix = "brisklm quantizes every decoder layer, so this model cannot be quantized"
            raise ValueError(
                f"cannot quantize {layer}: its {side} size is {what}, not a multiple of "
                f"{PACK_FACTOR}; GPTQ int4 packs {PACK_FACTOR} values to an int32 along each "
                f"quantized layer's input and output, so both must be multiples of "
                f"{PACK_FACTOR}; {fix}"
            )
    if unaligned:
        logger.warning(
            "%d layer size(s) are multiples of 8 but not of 32: %s%s. brisklm loads the "
            "checkpoint; auto-gptq and GPTQModel (which size their buffers as size // 32 * 4 "
            "int32 words) and transformers through them do not",
            len(unaligned),
            ", ".join(unaligned[:4]),
            f" and {len(unaligned) - 4} more" if len(unaligned) > 4 else "",
        )


@torch.no_grad()
def _quantize_rtn(
    model: LlamaForCausalLM, options: QuantizeOptions, show_progress: bool
) -> Quantized:
    quantized: Quantized = {}
    names = _quantized_linears(model, options)
    for name in tqdm(names, desc="Quantizing (rtn)", unit="linear", disable=not show_progress):
        weight = model.get_submodule(name).weight
        result = quantize_rtn(weight, group_size=options.group_size, sym=options.sym)
        quantized[name] = (_to_cpu(result.tensors), 0.0)
    return quantized


class _StopForward(Exception):
    """Raised by a hook once the inputs it was waiting for are captured: skips the rest of the layer."""


class _LayerRunner:
    """Runs one decoder layer over the calibration hidden states, ``batch_size`` sequences at a time."""

    def __init__(self, model: LlamaForCausalLM, batch_size: int, seq_len: int) -> None:
        config = model.config
        self.model = model
        self.device = model.model.embed_tokens.weight.device
        self.batch_size = batch_size
        self.cache = KVCache(
            num_layers=1,
            num_slots=batch_size,
            max_seq_len=seq_len,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            dtype=torch.float32,
            device=self.device,
        )
        self.seq_len = seq_len
        self.backend = select_backend("sdpa", self.device)
        self._inputs: dict[int, tuple[AttentionMetadata, torch.Tensor, torch.Tensor]] = {}

    def inputs(self, rows: int) -> tuple[AttentionMetadata, torch.Tensor, torch.Tensor]:
        if rows not in self._inputs:
            meta = AttentionMetadata.build(
                list(range(rows)), [0] * rows, [self.seq_len] * rows, self.device
            )
            cos, sin = self.model.rotary(
                meta.positions, torch.float32, meta.query_lens, meta.row_max_positions
            )
            self._inputs[rows] = (meta, cos, sin)
        return self._inputs[rows]

    def batches(self, count: int) -> list[slice]:
        return [slice(s, min(s + self.batch_size, count)) for s in range(0, count, self.batch_size)]

    def run(self, layer: LlamaDecoderLayer, hidden: torch.Tensor, *, write: bool) -> None:
        """Run ``layer`` on every batch of ``hidden``; with ``write``, replace the batch by its output."""
        for rows in self.batches(hidden.shape[0]):
            meta, cos, sin = self.inputs(rows.stop - rows.start)
            x = hidden[rows].reshape(-1, hidden.shape[-1])  # the model runs on packed (N, E) tokens
            try:
                out = layer(x, cos, sin, self.cache.layer(0), meta, self.backend)
            except _StopForward:
                continue
            if write:
                hidden[rows] = out.view_as(hidden[rows])


@torch.no_grad()
def _quantize_gptq(
    model: LlamaForCausalLM, ids: torch.Tensor, options: QuantizeOptions, show_progress: bool
) -> Quantized:
    runner = _LayerRunner(model, options.batch_size, ids.shape[1])
    hidden = torch.empty(*ids.shape, model.config.hidden_size, device=ids.device)  # (n, L, E)
    for rows in runner.batches(ids.shape[0]):
        hidden[rows] = model.model.embed_tokens(ids[rows]).float()
    groups = (
        [[linear] for linear in LAYER_LINEARS] if options.true_sequential else [list(LAYER_LINEARS)]
    )
    quantized: Quantized = {}
    bar = tqdm(
        total=len(model.model.layers) * len(groups) + options.quantize_lm_head,
        desc="Quantizing (gptq)",
        unit="step",
        disable=not show_progress,
    )
    for index, layer in enumerate(model.model.layers):
        for group in groups:
            bar.set_postfix_str(f"layer {index} {' '.join(n.split('.')[-1] for n in group)}")
            modules = {name: layer.get_submodule(name) for name in group}
            hessians = _collect_hessians(runner, layer, hidden, modules, group)
            for name, module in modules.items():
                quantized[f"model.layers.{index}.{name}"] = _gptq_one(
                    hessians.pop(name), module, options
                )
            bar.update()
        runner.run(layer, hidden, write=True)  # next layer's inputs, through the quantized layer
    if options.quantize_lm_head:
        bar.set_postfix_str("lm_head")
        gptq = GPTQ(in_features=model.config.hidden_size, device=hidden.device)
        for rows in runner.batches(hidden.shape[0]):
            gptq.add_batch(model.model.norm(hidden[rows]))
        # No write-back: nothing runs after the head, and a tied head is the embedding matrix.
        quantized["lm_head"] = _gptq_one(gptq, model.lm_head, options, write_back=False)
        bar.update()
    bar.close()
    return quantized


def _collect_hessians(
    runner: _LayerRunner,
    layer: LlamaDecoderLayer,
    hidden: torch.Tensor,
    modules: dict[str, nn.Module],
    group: list[str],
) -> dict[str, GPTQ]:
    """One Hessian per linear of ``group``, from its inputs over the calibration set."""
    hessians = {
        name: GPTQ(in_features=module.in_features, device=hidden.device)
        for name, module in modules.items()
    }
    # Stop after the group's last linear, unless the layer has nothing after it.
    stop_at = group[-1] if group[-1] != LAYER_LINEARS[-1] else None

    def hook_for(name: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            hessians[name].add_batch(args[0])
            if name == stop_at:
                raise _StopForward

        return hook

    handles = [module.register_forward_pre_hook(hook_for(name)) for name, module in modules.items()]
    try:
        runner.run(layer, hidden, write=False)
    finally:
        for handle in handles:
            handle.remove()
    return hessians


def _gptq_one(
    gptq: GPTQ, module: nn.Module, options: QuantizeOptions, *, write_back: bool = True
) -> tuple[GPTQTensors, float]:
    result = gptq.quantize(
        module.weight,
        group_size=options.group_size,
        sym=options.sym,
        act_order=options.act_order,
        percdamp=options.damp_percent,
    )
    gptq.free()
    if write_back:
        module.weight.copy_(result.dequantized.to(module.weight.dtype))
    return _to_cpu(result.tensors), result.loss


def _to_cpu(tensors: GPTQTensors) -> GPTQTensors:
    return GPTQTensors(*(t.detach().to("cpu").contiguous() for t in tensors))


# ---------------------------------------------------------------------------------------- writing


def _check_out_dir(model_dir: Path, out_dir: Path) -> None:
    if out_dir.resolve() == model_dir.resolve():
        raise ValueError("the output directory must differ from the model directory")
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"output directory {str(out_dir)!r} is a file")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ValueError(f"output directory {str(out_dir)!r} exists and is not empty")
    # Before the work, not after it: the nearest folder that exists must take the new one.
    existing = next(p for p in (out_dir, *out_dir.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"cannot write the output directory {str(out_dir)!r}: {existing} is not a writable folder"
        )
    # What the writing will do, tried: a folder that passes access() may still take none (/proc,
    # some network and FUSE mounts), which failed only after the work, naming a staging folder.
    try:
        probe = tempfile.mkdtemp(prefix=f".{out_dir.name}.probe-", dir=existing)
    except OSError as error:
        raise ValueError(
            f"cannot write the output directory {str(out_dir)!r}: {existing} takes no new folder "
            f"({error.strerror})"
        ) from None
    os.rmdir(probe)


def _split_rows(tensor: torch.Tensor, sizes: tuple[int, ...], dim: int) -> list[torch.Tensor]:
    return [part.contiguous() for part in torch.split(tensor, list(sizes), dim=dim)]


def _shard_tensors(tensors: GPTQTensors, sizes: tuple[int, ...]) -> list[GPTQTensors]:
    """Split a merged layer's tensors into its checkpoint layers (shards concatenate along N)."""
    if any(size % PACK_FACTOR for size in sizes):
        raise ValueError(f"GPTQ needs output sizes that are multiples of 8, got {list(sizes)}")
    qweights = _split_rows(tensors.qweight, sizes, 1)
    qzeros = _split_rows(tensors.qzeros, tuple(s // PACK_FACTOR for s in sizes), 1)
    scales = _split_rows(tensors.scales, sizes, 1)
    return [
        GPTQTensors(q, z, s, tensors.g_idx.clone()) for q, z, s in zip(qweights, qzeros, scales)
    ]


def _checkpoint_tensors(
    model: LlamaForCausalLM, quantized: Quantized, save_dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    # named_parameters() lists a tied head once, as the embedding: HF checkpoints leave it out too.
    for name, param in model.named_parameters():
        module_name, _, kind = name.rpartition(".")
        module = model.get_submodule(module_name)
        if module_name in quantized and kind == "weight":
            continue
        if isinstance(module, Linear) and len(module.shard_sizes) > 1:
            parts = _split_rows(param.detach(), module.shard_sizes, 0)
            for hf_name, part in zip(checkpoint_module_names(module_name), parts):
                out[f"{hf_name}.{kind}"] = part.to("cpu", save_dtype)
        else:
            out[name] = param.detach().to("cpu", save_dtype).contiguous()
    for module_name, (tensors, _) in quantized.items():
        module = model.get_submodule(module_name)
        sizes = getattr(module, "shard_sizes", (module.weight.shape[0],))
        for hf_name, shard in zip(
            checkpoint_module_names(module_name), _shard_tensors(tensors, sizes)
        ):
            for kind, tensor in shard._asdict().items():
                out[f"{hf_name}.{kind}"] = tensor
    return out


_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def _stored_float_dtype(model_dir: Path) -> torch.dtype | None:
    """The dtype of the first floating-point tensor in the checkpoint's safetensors headers (a
    float32 checkpoint whose config names no dtype was written back as float16, and bfloat16
    weights past float16's range would become inf)."""
    for path in sorted(model_dir.glob("*.safetensors")):
        try:
            with path.open("rb") as handle:
                size = int.from_bytes(handle.read(8), "little")
                header = json.loads(handle.read(size))
        except (OSError, ValueError):
            continue
        for name, entry in header.items():
            if name != "__metadata__" and entry.get("dtype") in _SAFETENSORS_DTYPES:
                return _SAFETENSORS_DTYPES[entry["dtype"]]
    return None


def _write_checkpoint(
    model: LlamaForCausalLM,
    quantized: Quantized,
    model_dir: Path,
    out_dir: Path,
    options: QuantizeOptions,
) -> None:
    from brisklm import __version__

    raw_config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    dtype_name = raw_config.get("torch_dtype") or raw_config.get("dtype")
    if dtype_name is None:  # the config does not say: the dtype the weights were stored in
        save_dtype = _stored_float_dtype(model_dir) or torch.float16
    else:
        save_dtype = _SAVE_DTYPES.get(str(dtype_name).removeprefix("torch."), torch.float16)
    tensors = _checkpoint_tensors(model, quantized, save_dtype)

    quant = options.gptq_config().to_quantize_config()
    quant["meta"] = {"quantizer": [f"brisklm:{__version__}"], "method": options.method}
    raw_config["quantization_config"] = quant
    if options.quantize_lm_head or not model.config.tie_word_embeddings:
        # The head is written as its own tensor: an int4 head, or one loaded untied (config.json
        # may say tied while the checkpoint stores its own, different lm_head.weight: load_model).
        raw_config["tie_word_embeddings"] = False
    quantize_config = {
        **quant,
        "model_name_or_path": None,
        "model_file_base_name": "model",
        "is_marlin_format": False,
    }

    # Write into a sibling temporary directory and rename: no half-written checkpoint on failure.
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        metadata = {"format": "pt", "quantized_by": f"brisklm {__version__}", "gptq_bits": "4"}
        save_file(tensors, str(staging / "model.safetensors"), metadata=metadata)
        (staging / "config.json").write_text(json.dumps(raw_config, indent=2) + "\n")
        (staging / QUANTIZE_CONFIG_FILE).write_text(json.dumps(quantize_config, indent=2) + "\n")
        for path in sorted(model_dir.iterdir()):
            if not path.is_file() or path.name in ("config.json", QUANTIZE_CONFIG_FILE):
                continue
            if path.name.endswith(_WEIGHT_SUFFIXES) or path.name.endswith(".index.json"):
                continue
            shutil.copy2(path, staging / path.name)
        # Of the subdirectories only the named chat templates travel (transformers 5 saves the
        # default template as chat_template.jinja and the others, e.g. tool_use, as
        # additional_chat_templates/<name>.jinja): they are tokenizer data, read by brisklm and
        # transformers alike, and the model is the same model. Other subdirectories are not
        # copied: what checkpoints keep there is weights in other formats (original/ with Meta's
        # consolidated.*.pth, onnx/, gguf/), training checkpoints or download caches (.cache/),
        # which describe the float model rather than the quantized one, and can be large.
        templates = model_dir / CHAT_TEMPLATE_DIR
        if templates.is_dir():
            shutil.copytree(templates, staging / CHAT_TEMPLATE_DIR)
        if out_dir.exists():  # empty (checked before quantizing): fill it, keep the folder itself
            for path in sorted(staging.iterdir()):
                path.rename(out_dir / path.name)
            staging.rmdir()
        else:
            staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("wrote %s (%d tensors)", out_dir, len(tensors))
