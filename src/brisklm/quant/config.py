"""GPTQ quantization config: read quantize_config.json / quantization_config as auto-gptq, GPTQModel and transformers write them."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brisklm.config import json_bool

SUPPORTED_BITS = (4,)
# Group sizes we are tested on; any positive multiple of 32 is accepted too (see `_check_group_size`).
TESTED_GROUP_SIZES = (32, 64, 128, -1)
CHECKPOINT_FORMATS = ("gptq", "gptq_v2")
QUANTIZE_CONFIG_FILE = "quantize_config.json"
SUPPORTED_MSG = (
    "brisklm supports GPTQ int4 checkpoints only: quant_method 'gptq', bits 4, "
    "group_size -1 or a positive multiple of 32 (32, 64, 128 tested), "
    "checkpoint_format 'gptq' (v1) or 'gptq_v2', pack_dtype int32"
)

# Fields that change how the tensors must be read or which modules hold them; quantize_config.json
# and config.json must agree on those both files state. (sym and desc_act do not matter: zero points
# and g_idx are stored in the tensors.)
_FORMAT_FIELDS = (
    "bits",
    "group_size",
    "checkpoint_format",
    "lm_head",
    "modules_in_block_to_quantize",
    "modules_to_not_convert",
    "skip_patterns",
)
# Fields taken from quantize_config.json where config.json leaves them out, but not compared: a
# missing g_idx is an error only for desc_act checkpoints, so config.json's default (False) must not
# hide quantize_config.json's true.
_MERGED_FIELDS = (*_FORMAT_FIELDS, "desc_act", "sym", "static_groups")
# The config keys behind each field, to tell whether a file states it.
_FIELD_KEYS = {
    "desc_act": ("desc_act",),
    "sym": ("sym",),
    "static_groups": ("static_groups",),
    "bits": ("bits",),
    "group_size": ("group_size",),
    "checkpoint_format": ("format", "checkpoint_format"),
    "lm_head": ("lm_head",),
    "modules_in_block_to_quantize": ("modules_in_block_to_quantize",),
    "modules_to_not_convert": ("modules_to_not_convert",),
    "skip_patterns": ("dynamic",),
}

logger = logging.getLogger(__name__)


def _check_group_size(group_size: int) -> None:
    # The int4 kernels work on groups of 32..256 columns; any group that is a multiple of 32 maps onto
    # them by repeating its scale, and -1 (one group over all of K) the same way.
    if group_size == -1 or (group_size > 0 and group_size % 32 == 0):
        return
    raise ValueError(
        f"group_size={group_size} is not supported: use -1 or a positive multiple of 32 "
        f"(tested: {', '.join(map(str, TESTED_GROUP_SIZES))}). {SUPPORTED_MSG}"
    )


@dataclass(frozen=True)
class GPTQConfig:
    """How a GPTQ int4 checkpoint is laid out.

    `lm_head` says whether the output projection is quantized too; `modules_to_not_convert` lists
    module names (or name fragments, matched as transformers does) left in float; `skip_patterns`
    holds GPTQModel `dynamic` rules of the form ``-:regex`` (modules left in float);
    `modules_in_block_to_quantize` (transformers / optimum), when given, lists the modules of each
    decoder layer that are quantized (``self_attn.q_proj``, ...), the others being float. The remaining
    fields (`damp_percent`, `true_sequential`, `static_groups`) only describe how the quantizer ran.
    """

    bits: int = 4
    group_size: int = 128
    desc_act: bool = False
    sym: bool = True
    checkpoint_format: str = "gptq"
    lm_head: bool = False
    modules_to_not_convert: tuple[str, ...] = ()
    skip_patterns: tuple[str, ...] = ()
    modules_in_block_to_quantize: tuple[str, ...] = ()
    damp_percent: float = 0.01
    true_sequential: bool = True
    static_groups: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.bits not in SUPPORTED_BITS:
            raise ValueError(f"bits={self.bits} is not supported. {SUPPORTED_MSG}")
        if not isinstance(self.group_size, int) or isinstance(self.group_size, bool):
            raise ValueError(f"group_size must be an int, got {self.group_size!r}. {SUPPORTED_MSG}")
        _check_group_size(self.group_size)
        if self.checkpoint_format not in CHECKPOINT_FORMATS:
            raise ValueError(
                f"checkpoint_format={self.checkpoint_format!r} is not supported. {SUPPORTED_MSG}"
            )
        if not 0.0 <= self.damp_percent < 1.0:
            raise ValueError(f"damp_percent={self.damp_percent} must be in [0, 1)")
        for pattern in self.skip_patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"skip_patterns: invalid regex {pattern!r}: {exc}") from exc

    # ------------------------------------------------------------------ reading

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> GPTQConfig:
        """Parse one config dict (quantize_config.json or config.json's quantization_config)."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"quantization config must be a JSON object, got {type(raw).__name__}")
        cfg = {str(k).lower(): v for k, v in raw.items()}
        meta = cfg.get("meta") if isinstance(cfg.get("meta"), Mapping) else {}

        method = cfg.get("quant_method", cfg.get("method"))
        if method is None and (cfg.get("load_in_4bit") or cfg.get("load_in_8bit")):
            method = "bitsandbytes"  # transformers' reading of a config without quant_method
        method = "gptq" if method is None else method
        if not isinstance(method, str) or method.lower() != "gptq":
            raise ValueError(f"quant_method={method!r} is not supported. {SUPPORTED_MSG}")
        if cfg.get("is_marlin_format"):
            raise ValueError(
                f"is_marlin_format=true (Marlin-repacked weights) is not supported. {SUPPORTED_MSG}"
            )

        fmt = _read_format(cfg)
        pack_dtype = str(cfg.get("pack_dtype", "int32")).lower().removeprefix("torch.")
        if pack_dtype != "int32":
            raise ValueError(f"pack_dtype={pack_dtype!r} is not supported. {SUPPORTED_MSG}")

        bits = _as_int(cfg.get("bits", 4), "bits")
        group_size = _as_int(cfg.get("group_size", 128), "group_size")
        skip = _read_dynamic(cfg.get("dynamic"), bits, group_size)

        not_convert = cfg.get("modules_to_not_convert") or ()
        if isinstance(not_convert, str):
            not_convert = (not_convert,)
        if not isinstance(not_convert, (list, tuple)):
            raise ValueError(f"modules_to_not_convert must be a list of names, got {not_convert!r}")

        return cls(
            bits=bits,
            group_size=group_size,
            desc_act=json_bool(cfg.get("desc_act", False), "desc_act"),
            sym=json_bool(cfg.get("sym", True), "sym"),
            checkpoint_format=fmt,
            lm_head=json_bool(cfg.get("lm_head", False), "lm_head"),
            modules_to_not_convert=tuple(str(m) for m in not_convert),
            skip_patterns=skip,
            modules_in_block_to_quantize=_read_block_modules(
                cfg.get("modules_in_block_to_quantize")
            ),
            damp_percent=_informational_float(cfg, meta, "damp_percent", 0.01),
            true_sequential=json_bool(
                cfg.get("true_sequential", meta.get("true_sequential", True)), "true_sequential"
            ),
            static_groups=json_bool(
                cfg.get("static_groups", meta.get("static_groups", False)), "static_groups"
            ),
            extra=dict(raw),
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> GPTQConfig | None:
        """The GPTQ config of a checkpoint directory, or None when it is not quantized.

        config.json's `quantization_config` wins (as in transformers); when quantize_config.json is
        there too, the two must agree on every field that changes how tensors are read.
        """
        model_dir = Path(model_dir)
        from_config_json = None
        config_path = model_dir / "config.json"
        if config_path.is_file():
            qc = _read_json(config_path).get("quantization_config")
            if qc is not None:
                from_config_json = _from_file(cls, qc, f"{config_path}'s quantization_config")
        from_quantize_json = None
        qpath = model_dir / QUANTIZE_CONFIG_FILE
        if qpath.is_file():
            from_quantize_json = _from_file(cls, _read_json(qpath), str(qpath))
        if from_config_json is not None and from_quantize_json is not None:
            diff = [
                f"{name}: {getattr(from_config_json, name)!r} vs {getattr(from_quantize_json, name)!r}"
                for name in _FORMAT_FIELDS
                if _states(from_config_json, name)
                and _states(from_quantize_json, name)
                and _comparable(getattr(from_config_json, name))
                != _comparable(getattr(from_quantize_json, name))
            ]
            if diff:
                raise ValueError(
                    f"{model_dir}: config.json's quantization_config and {QUANTIZE_CONFIG_FILE} "
                    f"disagree ({'; '.join(diff)})"
                )
            # What only quantize_config.json states (checkpoint_format, desc_act) is not a default.
            stated = {
                name: getattr(from_quantize_json, name)
                for name in _MERGED_FIELDS
                if _states(from_quantize_json, name) and not _states(from_config_json, name)
            }
            return dataclasses.replace(from_config_json, **stated)
        return from_config_json if from_config_json is not None else from_quantize_json

    # ------------------------------------------------------------------ using

    @property
    def is_v2(self) -> bool:
        return self.checkpoint_format == "gptq_v2"

    def is_quantized(self, module_name: str) -> bool:
        """Whether the linear layer `module_name` (e.g. ``model.layers.0.mlp.up_proj``) holds GPTQ tensors."""
        if module_name == "lm_head" or module_name.endswith(".lm_head"):
            return self.lm_head
        if any(key in module_name for key in self.modules_to_not_convert):
            return False
        if self.modules_in_block_to_quantize and _LAYER_PREFIX.match(module_name):
            # optimum's rule: a layer's module is quantized when its name ends with an entry
            # ("self_attn.q_proj" or just "q_proj").
            if not any(module_name.endswith(m) for m in self.modules_in_block_to_quantize):
                return False
        return not any(re.match(pattern, module_name) for pattern in self.skip_patterns)

    def to_quantize_config(self) -> dict[str, Any]:
        """The quantize_config.json that auto-gptq, GPTQModel and transformers all read (an int4
        ``lm_head``, though, only GPTQModel and brisklm load: auto-gptq skips the head and
        transformers' GPTQConfig drops the key)."""
        out: dict[str, Any] = {
            "bits": self.bits,
            "group_size": self.group_size,
            "damp_percent": self.damp_percent,
            "desc_act": self.desc_act,
            "static_groups": self.static_groups,
            "sym": self.sym,
            "true_sequential": self.true_sequential,
            "lm_head": self.lm_head,
            "quant_method": "gptq",
            "checkpoint_format": self.checkpoint_format,
            "pack_dtype": "int32",
        }
        if self.modules_to_not_convert:
            out["modules_to_not_convert"] = list(self.modules_to_not_convert)
        if self.skip_patterns:
            out["dynamic"] = {f"-:{p}": {} for p in self.skip_patterns}
        if self.modules_in_block_to_quantize:
            out["modules_in_block_to_quantize"] = [list(self.modules_in_block_to_quantize)]
        return out


def _from_file(cls: type[GPTQConfig], raw: Any, source: str) -> GPTQConfig:
    """``cls.from_dict(raw)``, its ValueError naming ``source`` (the file, and the key within it)."""
    try:
        return cls.from_dict(raw)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


# Everything up to a decoder layer's own modules: "model.layers.3." in "model.layers.3.mlp.up_proj".
_LAYER_PREFIX = re.compile(r"^(?:.*\.)?layers\.\d+\.")


def _comparable(value: Any) -> Any:
    """Module lists compare as sets: their order carries no meaning."""
    return frozenset(value) if isinstance(value, tuple) else value


def _states(config: GPTQConfig, name: str) -> bool:
    """Whether the file ``config`` was read from states field ``name`` (defaults are not compared)."""
    keys = _FIELD_KEYS[name]
    return any(str(k).lower() in keys and v is not None for k, v in config.extra.items())


def _read_block_modules(value: Any) -> tuple[str, ...]:
    """transformers' ``modules_in_block_to_quantize``: a list of lists (the quantizer's sequential
    groups) or a flat list of module names within a decoder layer."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError(
            f"modules_in_block_to_quantize must be a list of lists of module names, got {value!r}"
        )
    names: list[str] = []
    for item in value:
        group = item if isinstance(item, list) else [item]
        if not all(isinstance(name, str) and name for name in group):
            raise ValueError(
                f"modules_in_block_to_quantize must hold module names (str), got {item!r}"
            )
        names.extend(group)
    return tuple(names)


def _informational_float(
    cfg: Mapping[str, Any], meta: Mapping[str, Any], name: str, default: float
) -> float:
    """A field that only describes how the quantizer ran: null or absent reads as the default."""
    value = cfg.get(name, meta.get(name))
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not 0.0 <= number < 1.0:  # the weights read the same: say so, do not refuse the model
        logger.warning("%s=%r in the quantization config is out of [0, 1); ignored", name, value)
        return default
    return number


class UnreadableConfigError(ValueError):
    """A config file that is not a JSON object: the checkpoint is broken, not its quantization."""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UnreadableConfigError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise UnreadableConfigError(f"{path}: expected a JSON object")
    return data


def _as_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name} must be an integer, got {value!r}. {SUPPORTED_MSG}")
    try:
        as_float = float(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}. {SUPPORTED_MSG}") from None
    if as_float != int(as_float):
        raise ValueError(f"{name} must be an integer, got {value!r}. {SUPPORTED_MSG}")
    return int(as_float)


def _read_format(cfg: Mapping[str, Any]) -> str:
    # transformers 5 writes `format` and the legacy `checkpoint_format`; GPTQModel writes both too;
    # auto-gptq 0.7 writes `checkpoint_format`; older auto-gptq writes neither (v1).
    values = {
        key: str(cfg[key]).lower()
        for key in ("format", "checkpoint_format")
        if cfg.get(key) is not None
    }
    if len(set(values.values())) > 1:
        raise ValueError(f"conflicting checkpoint formats {values}. {SUPPORTED_MSG}")
    fmt = next(iter(values.values()), "gptq")
    if fmt not in CHECKPOINT_FORMATS:
        raise ValueError(f"checkpoint_format={fmt!r} is not supported. {SUPPORTED_MSG}")
    return fmt


def _read_dynamic(dynamic: Any, bits: int, group_size: int) -> tuple[str, ...]:
    """GPTQModel's per-module rules as skip patterns: its first matching rule decides a module
    (``dynamic_get``), so a '-:regex' rule skips what no rule before it matches: each becomes
    ``(?!earlier)...regex`` over the positive rules before it. Overrides we cannot honour are
    refused."""
    if not dynamic:
        return ()
    if not isinstance(dynamic, Mapping):
        raise ValueError(f"dynamic must be a mapping of module regex to overrides, got {dynamic!r}")
    skip: list[str] = []
    earlier: list[str] = []  # the positive rules so far, which take the modules they match
    for key, overrides in dynamic.items():
        if key.startswith("-:"):
            skip.append("".join(f"(?!{pattern})" for pattern in earlier) + key[2:])
            continue
        earlier.append(key.removeprefix("+:"))
        overrides = overrides or {}
        changed = {
            name: overrides[name]
            for name, base in (("bits", bits), ("group_size", group_size))
            if name in overrides and overrides[name] != base
        }
        if changed:
            raise ValueError(
                f"dynamic rule {key!r} overrides {changed}: per-module bits/group_size are not "
                f"supported (only '-:regex' skip rules are). {SUPPORTED_MSG}"
            )
    return tuple(skip)
