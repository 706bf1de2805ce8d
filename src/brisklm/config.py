"""Model configuration: a Hugging Face config.json read into a frozen, validated dataclass."""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Architecture name in config.json -> our model family. All share one network definition (Qwen3
# adds an RMSNorm over each query and key head: ModelConfig.qk_norm).
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "dynamic", "llama3", "yarn")
# The keys each rope type's block must set, as transformers requires them.
_REQUIRED_ROPE_KEYS: dict[str, tuple[str, ...]] = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}
SUPPORTED_ACTIVATIONS: tuple[str, ...] = ("silu",)

_DEFAULT_ROPE_THETA = 10000.0


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding parameters, normalised from either transformers 4 or 5 keys."""

    rope_type: str = "default"
    theta: float = _DEFAULT_ROPE_THETA
    factor: float = 1.0
    # Pretraining context length for llama3 / yarn (transformers defaults it to max_position_embeddings).
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn: None = derived from factor / mscale
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"unsupported rope type {self.rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        _require(
            math.isfinite(self.theta) and self.theta > 0,
            f"rope theta must be a positive number, got {self.theta}",
        )
        _require(
            math.isfinite(self.factor) and self.factor > 0,
            f"rope factor must be a positive number, got {self.factor}",
        )
        if self.rope_type == "llama3":
            _require(
                self.high_freq_factor > self.low_freq_factor > 0,
                "llama3 rope needs high_freq_factor > low_freq_factor > 0, got "
                f"{self.high_freq_factor} and {self.low_freq_factor}",
            )
        if self.rope_type in ("llama3", "yarn"):
            original = self.original_max_position_embeddings
            _require(
                original is not None and original >= 1,
                f"{self.rope_type} rope needs original_max_position_embeddings >= 1, got {original}",
            )
        if self.rope_type == "yarn":
            # Its correction range divides by log(theta) and takes logs of the betas.
            _require(self.theta != 1, "yarn rope needs a rope theta other than 1")
            _require(
                self.beta_fast > 0 and self.beta_slow > 0,
                f"yarn rope needs beta_fast and beta_slow > 0, got {self.beta_fast} and "
                f"{self.beta_slow}",
            )

    @classmethod
    def from_hf(cls, raw: dict[str, Any], max_position_embeddings: int) -> RopeConfig:
        """Read rope settings from a config.json dict (``rope_theta``/``rope_scaling`` or ``rope_parameters``)."""
        scaling = raw.get("rope_scaling")
        rope_parameters = raw.get("rope_parameters")
        if not isinstance(rope_parameters, dict):
            rope_parameters = {}
        # A rope_scaling block replaces rope_parameters whole (model cards tell users to add one
        # for long context to a config that has rope_parameters), as transformers 5 reads them,
        # but for rope_theta: taken from rope_parameters if the block has none (transformers 5.25
        # falls back to 10000 there; the model was trained with its own theta).
        from_scaling = isinstance(scaling, dict) and bool(scaling)
        params: dict[str, Any] = {
            k: v
            for k, v in (scaling if from_scaling else rope_parameters).items()
            if v is not None  # a null setting is an unset one
        }
        rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            block = "rope_scaling" if from_scaling else "rope_parameters"
            key = "rope_type" if "rope_type" in params else "type"
            raise ValueError(
                f"unsupported rope type {rope_type!r} (config.json's {block}.{key}); supported: "
                f"{', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        # transformers 4 wrote dynamic NTK as "dynamic"; some configs carry "ntk" aliases we do not guess at.
        theta = _first_set(
            params.get("rope_theta"), rope_parameters.get("rope_theta"), raw.get("rope_theta")
        )
        if (
            from_scaling
            and _first_set(params.get("rope_theta"), raw.get("rope_theta")) is None
            and theta not in (None, _DEFAULT_ROPE_THETA)
        ):
            logger.warning(
                "config.json's rope_scaling has no rope_theta: brisklm takes rope_parameters' "
                "(%s), with which the model was trained; transformers 5 reads %s there",
                theta,
                _DEFAULT_ROPE_THETA,
            )
        original = params.get("original_max_position_embeddings")
        if rope_type in ("llama3", "yarn"):
            # As transformers: a top-level original_max_position_embeddings (Phi-3 style) wins
            # over the rope block's, and the context length stands in for a missing one.
            original = _first_set(
                raw.get("original_max_position_embeddings"), original, max_position_embeddings
            )
        elif original is None:
            original = raw.get("original_max_position_embeddings")
        # (transformers refuses such configs too: a guess would change the frequencies the model
        # was trained with; a factor of 1.0 would be no scaling at all)
        missing = [k for k in _REQUIRED_ROPE_KEYS.get(rope_type, ()) if k not in params]
        if missing:
            block = "rope_scaling" if from_scaling else "rope_parameters"
            raise ValueError(
                f"{rope_type} rope needs {' and '.join(missing)}; config.json's {block} has none"
            )
        factor = params.get("factor")
        return cls(
            rope_type=rope_type,
            theta=float(theta if theta is not None else _DEFAULT_ROPE_THETA),
            factor=float(factor) if factor is not None else 1.0,
            original_max_position_embeddings=int(original) if original is not None else None,
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),  # (llama3's are required)
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            beta_fast=float(_first_set(params.get("beta_fast"), 32.0)),
            beta_slow=float(_first_set(params.get("beta_slow"), 1.0)),
            attention_factor=params.get("attention_factor"),
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            truncate=bool(params.get("truncate", True)),
        )


@dataclass(frozen=True)
class ModelConfig:
    """The network shape and options of a Llama-family checkpoint."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    # Qwen3: each query and key head goes through an RMSNorm of its own weights (over head_dim)
    # before the rotary embedding.
    qk_norm: bool = False
    # Window of keys each query sees (including itself), per layer; None = full causal attention.
    sliding_windows: tuple[int | None, ...] = ()
    rope: RopeConfig = field(default_factory=RopeConfig)
    torch_dtype: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    quantization: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; supported: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            _require(
                isinstance(value, int) and value >= 1,
                f"config field {name} must be a positive integer, got {value!r}",
            )
        _require(
            self.num_attention_heads % self.num_key_value_heads == 0,
            f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
            f"num_key_value_heads ({self.num_key_value_heads})",
        )
        _require(
            self.head_dim % 2 == 0,
            f"head_dim must be even for rotary embeddings, got {self.head_dim}",
        )
        _require(
            self.rms_norm_eps > 0,
            f"config field rms_norm_eps must be positive, got {self.rms_norm_eps}",
        )
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(
                f"unsupported hidden_act {self.hidden_act!r}; supported: {', '.join(SUPPORTED_ACTIVATIONS)}"
            )
        if not self.sliding_windows:
            object.__setattr__(self, "sliding_windows", (None,) * self.num_hidden_layers)
        _require(
            len(self.sliding_windows) == self.num_hidden_layers,
            f"sliding_windows has {len(self.sliding_windows)} entries for "
            f"{self.num_hidden_layers} layers",
        )
        for window in self.sliding_windows:
            _require(
                window is None or window >= 1, f"sliding_window must be >= 1 or null, got {window}"
            )

    @property
    def model_type(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.architecture]

    @property
    def num_query_groups(self) -> int:
        """Query heads per key/value head (1 = plain multi-head attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from the parsed contents of a Hugging Face ``config.json``."""
        architectures = raw.get("architectures") or []
        if isinstance(architectures, str):  # one name, not a list: transformers reads it too
            architectures = [architectures]
        by_type = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}
        model_type = raw.get("model_type")
        if not architectures:
            if model_type not in by_type:
                raise ValueError(
                    f"config.json names no architecture and model_type {model_type!r} is not one of "
                    f"{', '.join(by_type)}; supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}"
                )
            architectures = [by_type[model_type]]
        architecture = architectures[0]
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {architecture!r} (config.json's architectures); "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        family = SUPPORTED_ARCHITECTURES[architecture]
        if model_type != family and model_type in by_type:
            # transformers' AutoModelForCausalLM builds the network model_type names (its config
            # class picks the model class); "architectures" only records what saved the file.
            logger.warning(
                "config.json names architecture %r but model_type %r: building %s, as "
                "transformers does",
                architecture,
                model_type,
                by_type[model_type],
            )
            architecture, family = by_type[model_type], model_type
        hidden_size = _int_field(raw, "hidden_size")
        num_heads = _int_field(raw, "num_attention_heads")
        num_layers = _int_field(raw, "num_hidden_layers")
        intermediate_size = _int_field(raw, "intermediate_size")
        vocab_size = _int_field(raw, "vocab_size")
        # Left out: transformers' default for the family; null: one per attention head (Qwen2
        # and transformers 4's Mistral read it so; transformers 5's Mistral refuses it).
        missing = "num_key_value_heads" not in raw
        num_kv_heads = _int_field(
            raw,
            "num_key_value_heads",
            _DEFAULT_KV_HEADS.get(family, num_heads) if missing else num_heads,
        )
        if missing and num_heads % num_kv_heads:
            raise ValueError(
                f"config.json leaves out num_key_value_heads, and transformers' default for "
                f"{family} ({num_kv_heads}) does not divide num_attention_heads ({num_heads}): "
                "give num_key_value_heads"
            )
        # 0: derived, as transformers does (null too, but for Qwen3, which transformers refuses
        # and brisklm reads as left out); 16.5 was read as 16. Left out: Qwen3's config class
        # gives 128 whatever the sizes.
        head_dim = _int_field(raw, "head_dim", _DEFAULT_HEAD_DIM.get(family, 0))
        head_dim = head_dim or hidden_size // num_heads
        max_positions = _int_field(raw, "max_position_embeddings", _DEFAULT_MAX_POSITIONS[family])
        windows = _sliding_windows(raw, family, num_layers)
        if family == "qwen2":
            qkv_bias, o_bias, mlp_bias = True, False, False
        elif family == "qwen3":  # (its MLP has no bias whatever the file says)
            qkv_bias = o_bias = bool(raw.get("attention_bias", False))
            mlp_bias = False
        else:  # Mistral's too: the loader keeps only the biases its checkpoint stores
            qkv_bias = o_bias = bool(raw.get("attention_bias", False))
            mlp_bias = bool(raw.get("mlp_bias", False))
        hidden_act = raw.get("hidden_act", "silu")
        if hidden_act == "swish":  # transformers' ACT2FN runs it as SiLU too
            hidden_act = "silu"
        if hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(
                f"unsupported activation {hidden_act!r} (config.json's hidden_act); supported: "
                f"{', '.join(SUPPORTED_ACTIVATIONS)}"
            )
        eos = raw.get("eos_token_id")
        eos_ids = token_ids(eos)
        if eos_ids is None:
            raise ValueError(
                f"config.json's field 'eos_token_id' must be a token id or a list of token ids, "
                f"got {eos!r}"
            )
        quant = raw.get("quantization_config")
        return cls(
            architecture=architecture,
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=head_dim,
            max_position_embeddings=max_positions,
            rms_norm_eps=float(_first_set(raw.get("rms_norm_eps"), 1e-6)),
            hidden_act=hidden_act,
            tie_word_embeddings=json_bool(
                raw.get("tie_word_embeddings"), "config.json's tie_word_embeddings"
            ),
            qkv_bias=qkv_bias,
            o_proj_bias=o_bias,
            mlp_bias=mlp_bias,
            qk_norm=family == "qwen3",
            sliding_windows=windows,
            rope=RopeConfig.from_hf(raw, max_positions),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            quantization=dict(quant) if isinstance(quant, dict) else None,
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read ``config.json`` from a checkpoint directory."""
        directory = checkpoint_directory(path)
        config_file = directory / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"no config.json in model directory {str(directory)!r}")
        try:
            raw = json.loads(config_file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{config_file} is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{config_file} must hold a JSON object")
        try:
            return cls.from_dict(raw)
        except ValueError as exc:  # say which file: a model directory has several config files
            raise ValueError(f"{config_file}: {exc}") from None


def checkpoint_directory(path: str | Path, what: str = "model") -> Path:
    """``path`` as a Path, if it is a directory; a FileNotFoundError or NotADirectoryError (both
    OSError) naming ``what`` it was to be otherwise; a TypeError or ValueError for a path that
    is no str or os.PathLike, or is empty (``Path("")`` is the current directory)."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"the {what} path must be a str or os.PathLike (a checkpoint directory), got "
            f"{type(path).__name__}"
        )
    if not os.fspath(path):
        raise ValueError(f"the {what} path is empty: give a checkpoint directory")
    directory = Path(path)
    if directory.is_dir():
        return directory
    if directory.exists():
        raise NotADirectoryError(
            f"{what} directory {str(directory)!r} is a file, not a checkpoint directory: pass the "
            "directory that holds config.json and the weights"
        )
    raise FileNotFoundError(
        f"{what} directory {str(directory)!r} does not exist{hub_id_hint(path)}"
    )


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def hub_id_hint(path: str | Path) -> str:
    """For a missing directory named like a Hugging Face hub id ("org/name"): what to do."""
    name = str(path)
    if not _HUB_ID.fullmatch(name) or Path(name).parent.exists():  # (a folder here: a local path)
        return ""
    return (
        f" (brisklm loads local checkpoint directories and downloads nothing: for the hub's "
        f"{name}, download it first, e.g. `huggingface-cli download {name} --local-dir DIR`, "
        "and pass DIR)"
    )


def _first_set(*values: Any) -> Any:
    """The first value that is not None (None if all are)."""
    return next((v for v in values if v is not None), None)


def token_ids(value: Any) -> tuple[int, ...] | None:
    """A config's token id or list of them (null: none) as ids; None when it holds anything else
    (a string was read character by character: "41" became ids 4 and 1). Integral floats are
    ids, as int() read them."""
    values = value if isinstance(value, list) else [] if value is None else [value]
    integral = (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
        for v in values
    )
    if not all(integral):
        return None
    return tuple(int(v) for v in values)


def json_bool(value: Any, name: str) -> bool:
    """A flag as JSON writes it; "true"/"false" strings and 0/1 too (bool("false") is True: an
    act-order checkpoint read so would group its columns wrong)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if value is None:
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def _int_field(raw: dict[str, Any], name: str, default: int | None = None) -> int:
    """config.json's integer ``name``; missing or null takes ``default`` (if there is one)."""
    value = raw.get(name)
    if value is None:
        if default is not None:
            return default
        what = "missing" if name not in raw else "null"
        raise ValueError(f"config.json's required field {name!r} is {what}: it must be an integer")
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ValueError(f"config.json's field {name!r} must be an integer, got {value!r}")
    return int(value)


# transformers' defaults where a config.json leaves these out.
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768, "qwen3": 32768}
_DEFAULT_SLIDING_WINDOW = {"mistral": 4096, "qwen2": 4096, "qwen3": 4096}
# (Llama's is num_attention_heads.)
_DEFAULT_KV_HEADS = {"mistral": 8, "qwen2": 32, "qwen3": 32}
# (The others' is hidden_size // num_attention_heads.)
_DEFAULT_HEAD_DIM = {"qwen3": 128}


def _sliding_windows(raw: dict[str, Any], family: str, num_layers: int) -> tuple[int | None, ...]:
    """Per-layer sliding window, following transformers' rules for each family.

    Mistral's model windows the layers ``layer_types`` names, or every layer without it
    (transformers warns that its Mistral class does not take ``layer_types``, but its masks follow
    it); Qwen2's and Qwen3's window none unless ``use_sliding_window`` is true (its config then sets
    the window to None, whatever ``layer_types`` says), and then the layers ``layer_types`` names,
    or without it those from ``max_window_layers`` on.
    """
    window = raw.get("sliding_window", _DEFAULT_SLIDING_WINDOW.get(family))
    if family == "llama" or window is None:
        return (None,) * num_layers
    window = _int_field({"sliding_window": window}, "sliding_window")
    if family != "mistral" and not json_bool(
        raw.get("use_sliding_window"), "config.json's use_sliding_window"
    ):
        return (None,) * num_layers
    layer_types = raw.get("layer_types")
    if not layer_types:
        if family == "mistral":
            return (window,) * num_layers
        first_sliding = _int_field(raw, "max_window_layers", 28)
        return tuple(window if i >= first_sliding else None for i in range(num_layers))
    if not isinstance(layer_types, list) or len(layer_types) != num_layers:
        raise ValueError(
            f"config.json's layer_types must be a list of one entry per layer ({num_layers}), "
            f"got {layer_types!r}"
        )
    for kind in layer_types:
        if kind not in ("full_attention", "sliding_attention"):
            raise ValueError(
                f"config.json's layer_types holds {kind!r}: a {family.capitalize()} layer is "
                "'full_attention' or 'sliding_attention'"
            )
    return tuple(window if kind == "sliding_attention" else None for kind in layer_types)
