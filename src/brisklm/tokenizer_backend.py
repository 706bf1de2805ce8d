"""Builds the `tokenizers` backend from Hugging Face tokenizer files the way transformers 5.x does."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer

logger = logging.getLogger(__name__)

TOKENIZER_JSON = "tokenizer.json"
SENTENCEPIECE_MODEL = "tokenizer.model"
TOKENIZER_CONFIG = "tokenizer_config.json"
MODEL_CONFIG = "config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
ADDED_TOKENS_FILE = "added_tokens.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"

# transformers' named special-token attributes, in its order (the chat template sees them as variables)
NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# Defaults the tokenizer classes' __init__ signatures give when tokenizer_config.json leaves a token out
_LLAMA_SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
CLASS_SPECIAL_TOKEN_DEFAULTS: dict[str, dict[str, str]] = {
    "LlamaTokenizer": _LLAMA_SPECIAL_TOKENS,
    # CodeLlamaTokenizer also adds its infilling tokens (as additional special tokens).
    "CodeLlamaTokenizer": {
        **_LLAMA_SPECIAL_TOKENS,
        "prefix_token": "▁<PRE>",
        "middle_token": "▁<MID>",
        "suffix_token": "▁<SUF>",
        "eot_token": "▁<EOT>",
        "fill_token": "<FILL_ME>",
    },
    "Qwen2Tokenizer": {
        "unk_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
    },
}
# config.json model_type -> the tokenizer class transformers registers for it, where that overrides the named one
REGISTERED_TOKENIZER_CLASSES = {
    "mistral": "TokenizersBackend",
    "mixtral": "TokenizersBackend",
    "qwen2": "Qwen2Tokenizer",
}
# Classes that rebuild a sentencepiece-style tokenizer.json from its vocab and merges
# (``build_llama_backend``); CodeLlama's never in the legacy way.
LLAMA_CLASSES = ("LlamaTokenizer", "CodeLlamaTokenizer")
SENTENCEPIECE_CONTROL, SENTENCEPIECE_USER_DEFINED = 3, 4
SENTENCEPIECE_BPE = 2


@dataclass
class BackendSpec:
    """What from_pretrained learned besides the backend: named special tokens and chat templates."""

    backend: BackendTokenizer
    named_special_tokens: dict[str, str]
    chat_templates: dict[str, str] = field(default_factory=dict)


def read_json(path: Path) -> dict[str, Any] | None:
    """Return the JSON object stored at `path`, or None if the file does not exist."""
    if not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"{path} should hold a JSON object, got {type(data).__name__}")
    return data


def _is_added_token_dict(value: Any) -> bool:
    return isinstance(value, Mapping) and "content" in value


def _added_token(value: Mapping[str, Any]) -> AddedToken:
    """A serialized AddedToken dict (``_is_added_token_dict``) as the AddedToken."""
    fields = {
        k: value[k]
        for k in ("single_word", "lstrip", "rstrip", "normalized", "special")
        if k in value
    }
    return AddedToken(value["content"], **fields)


def to_added_token(value: Any) -> AddedToken | str | None:
    """Turn a config value (a string or a serialized AddedToken dict) into what transformers holds."""
    if value is None or isinstance(value, str | AddedToken):
        return value
    if _is_added_token_dict(value):
        return _added_token(value)
    raise ValueError(f"a special token must be a string or an AddedToken dict, got {value!r}")


def _token_repr(token: AddedToken) -> tuple:
    return (
        token.content,
        token.single_word,
        token.lstrip,
        token.rstrip,
        token.normalized,
        token.special,
    )


def generate_merges(vocab: dict[str, int]) -> list[tuple[str, str]]:
    """BPE merges implied by a sentencepiece vocabulary, ranked like transformers' `generate_merges`.

    Every split of a piece into two pieces of the vocabulary is a merge; merges rank by the id of the merged
    piece (sentencepiece BPE ids follow piece scores), then by the lengths of the two halves.
    """
    merges: list[tuple[str, str, int]] = []
    for piece, piece_id in vocab.items():
        local = [
            (piece[:cut], piece[cut:], piece_id)
            for cut in range(1, len(piece))
            if piece[:cut] in vocab and piece[cut:] in vocab
        ]
        local.sort(key=lambda merge: (vocab[merge[0]], vocab[merge[1]]))
        merges.extend(local)
    merges.sort(key=lambda merge: (merge[2], len(merge[0]), len(merge[1])))
    return [(left, right) for left, right, _ in merges]


def read_sentencepiece(path: Path) -> tuple[dict[str, int], list[AddedToken]]:
    """Vocabulary of a sentencepiece BPE model plus its control and user-defined pieces as added tokens."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as error:  # protobuf raises its own DecodeError type
        raise ValueError(f"{path} is not a sentencepiece model: {error}") from error
    if proto.trainer_spec.model_type != SENTENCEPIECE_BPE:
        raise ValueError(
            f"{path} is a sentencepiece model of type {proto.trainer_spec.model_type}; brisklm reads "
            "sentencepiece BPE models (Llama 2, Mistral), or a tokenizer.json for anything else"
        )
    vocab = {piece.piece: index for index, piece in enumerate(proto.pieces)}
    added = [
        AddedToken(piece.piece, normalized=False, special=piece.type == SENTENCEPIECE_CONTROL)
        for piece in proto.pieces
        if piece.type in (SENTENCEPIECE_CONTROL, SENTENCEPIECE_USER_DEFINED)
    ]
    return vocab, added


def build_llama_backend(
    vocab: dict[str, int], merges: list[tuple[str, str]], *, legacy: bool, add_prefix_space: bool
) -> BackendTokenizer:
    """The backend transformers 5's LlamaTokenizer builds: byte-fallback BPE behind a Metaspace pre-tokenizer.

    With `legacy=False` (the default) '▁' is prepended only at the very start of the text, not after
    special tokens, and a leading space of the text merges into that '▁'; with `legacy=True` every
    chunk between special tokens gets one. `add_prefix_space=False` prepends nothing.
    """
    backend = BackendTokenizer(
        models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None)
    )
    backend.normalizer = None
    if not add_prefix_space:
        prepend_scheme = "never"
    else:
        prepend_scheme = "always" if legacy else "first"
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme=prepend_scheme, split=False
    )
    sequence = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix_space:
        sequence.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(sequence)
    return backend


# transformers 5's Qwen2Tokenizer pre-tokenizer regex (one digit per piece).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def build_qwen2_backend(
    vocab: dict[str, int], merges: list[tuple[str, str]], *, add_prefix_space: bool
) -> BackendTokenizer:
    """The backend transformers 5's Qwen2Tokenizer builds from a tokenizer.json's vocabulary and
    merges, whatever pipeline the file describes: NFC, Qwen's split regex, byte-level BPE. It is
    the class of every checkpoint of model_type qwen2 (DeepSeek-R1-Distill-Qwen's files, too)."""
    backend = BackendTokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    backend.decoder = decoders.ByteLevel()
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False),
        ]
    )
    return backend


def _json_vocab_and_merges(tokenizer_json: dict[str, Any], path: Path) -> tuple[dict, list]:
    model = tokenizer_json.get("model", {})
    if model.get("type", "BPE") != "BPE":
        raise ValueError(f"{path}: a LlamaTokenizer needs a BPE model, found {model.get('type')!r}")
    vocab = model.get("vocab", {})
    if isinstance(vocab, list):
        vocab = {(item[0] if isinstance(item, list) else item): i for i, item in enumerate(vocab)}
    merges = [
        tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge)
        for merge in model.get("merges", [])
    ]
    return vocab, merges


def _normalize_class_name(name: Any) -> str | None:
    if not isinstance(name, str):
        return None
    return name[: -len("Fast")] if name.endswith("Fast") else name


def _read_chat_templates(directory: Path, config: dict[str, Any]) -> dict[str, str]:
    """Templates by name ("default" first); standalone .jinja files take priority over the config entry."""
    from_files: dict[str, str] = {}
    if (directory / CHAT_TEMPLATE_FILE).is_file():
        from_files["default"] = (directory / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    if (directory / CHAT_TEMPLATE_DIR).is_dir():
        for path in sorted((directory / CHAT_TEMPLATE_DIR).glob("*.jinja")):
            from_files[path.stem] = path.read_text(encoding="utf-8")
    if from_files:
        return from_files
    template = config.get("chat_template")
    if isinstance(template, str):
        return {"default": template}
    if isinstance(template, list):
        if not all(
            isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and isinstance(entry.get("template"), str)
            for entry in template
        ):
            raise ValueError(
                f"{directory / TOKENIZER_CONFIG}: chat_template, as a list, holds entries with a "
                'str "name" and a str "template"'
            )
        return {entry["name"]: entry["template"] for entry in template}
    if isinstance(template, dict):
        return dict(template)
    return {}


def _effective_class(hub_class: str | None, model_type: str | None, json_text: str | None) -> str:
    """The transformers class AutoTokenizer ends up with: LlamaTokenizer, CodeLlamaTokenizer,
    Qwen2Tokenizer or TokenizersBackend.

    Follows AutoTokenizer's checks: a byte-level tokenizer.json named LlamaTokenizer loads as is, and a
    config.json model_type whose registered tokenizer differs from the named one (mistral, mixtral:
    TokenizersBackend; qwen2: Qwen2Tokenizer) wins. A lone tokenizer.model is read as LlamaTokenizer
    (CodeLlamaTokenizer when so named).
    """
    if json_text is None:
        return "CodeLlamaTokenizer" if hub_class == "CodeLlamaTokenizer" else "LlamaTokenizer"
    registered = REGISTERED_TOKENIZER_CLASSES.get(model_type or "")
    if registered is not None and registered != hub_class:
        return registered
    if hub_class in LLAMA_CLASSES and '"ByteLevel"' in json_text:
        return "TokenizersBackend"
    if hub_class in (*LLAMA_CLASSES, "Qwen2Tokenizer"):
        return hub_class
    return "TokenizersBackend"


def _read_added_tokens(
    config: dict[str, Any], tokenizer_json: dict[str, Any] | None
) -> dict[int, AddedToken]:
    """tokenizer_config.json's added_tokens_decoder, else (legacy layout) tokenizer.json's added tokens."""
    if "added_tokens_decoder" in config:
        decoder = config["added_tokens_decoder"]
        if not isinstance(decoder, dict):
            raise ValueError(
                f"{TOKENIZER_CONFIG}: added_tokens_decoder must be an object, got {decoder!r}"
            )
        tokens: dict[int, AddedToken] = {}
        for i, token in decoder.items():
            if not _is_added_token_dict(token) or not str(i).isdigit():
                # (transformers raises a ValueError too; a str here crashed a step later)
                raise ValueError(
                    f"{TOKENIZER_CONFIG}: added_tokens_decoder maps token ids (as strings of "
                    f'digits) to AddedToken objects (with a "content"), got {i!r}: {token!r}'
                )
            tokens[int(i)] = _added_token(token)
        return tokens
    added: dict[int, AddedToken] = {}
    for entry in (tokenizer_json or {}).get("added_tokens", []):
        added[int(entry["id"])] = AddedToken(**{k: v for k, v in entry.items() if k != "id"})
    return added


def _legacy_added_tokens(
    directory: Path, config: dict[str, Any], named: dict[str, Any], extra: list[Any]
) -> dict[int, AddedToken]:
    """added_tokens.json ({content: id}), which tokenizers saved before transformers 4.34 wrote
    beside tokenizer.model instead of an added_tokens_decoder: special when it is a named or
    extra special token (then not normalized), as transformers reads it."""
    if "added_tokens_decoder" in config:
        return {}
    table = read_json(directory / ADDED_TOKENS_FILE)
    if not isinstance(table, dict):
        return {}
    specials = {str(t) for t in (*named.values(), *extra)}
    return {
        int(i): AddedToken(content, special=content in specials, normalized=content not in specials)
        for content, i in table.items()
        if isinstance(content, str) and isinstance(i, int)
    }


def _token_content(token: Any) -> str:
    """A token's text, given as a string or an AddedToken dict."""
    return str(token.get("content")) if isinstance(token, dict) else str(token)


def _extra_special_tokens(
    config: dict[str, Any], special_map: dict[str, Any]
) -> tuple[dict[str, Any], list[Any]]:
    """Model-specific named tokens and the list of extra special tokens, as transformers 5 reads
    them: tokenizer_config.json's extra_special_tokens (or additional_special_tokens), a dict of
    named tokens or a list, then special_tokens_map.json's extra_special_tokens added to them; the
    map's additional_special_tokens only where the config has neither."""
    own = config.get("extra_special_tokens") or config.get("additional_special_tokens")
    named = dict(own) if isinstance(own, dict) else {}
    tokens = list(own) if isinstance(own, list) else []
    in_map = special_map.get("extra_special_tokens")
    if in_map is None and not own:
        in_map = special_map.get("additional_special_tokens")
    if isinstance(in_map, dict):
        named.update(in_map)
    elif isinstance(in_map, list):
        known = {_token_content(token) for token in tokens}
        tokens += [token for token in in_map if _token_content(token) not in known]
    return named, tokens


def _special_tokens(
    config: dict[str, Any],
    tokenizer_class: str,
    added_tokens_decoder: dict[int, AddedToken],
    extra: tuple[dict[str, Any], list[Any]],
) -> tuple[dict[str, Any], list[Any]]:
    """Named special tokens (bos_token, ..., any other "*_token" string and the model-specific
    ones of ``extra``) and the extra special tokens (``extra``'s list).

    Named tokens start from the class defaults; a token also listed in added_tokens_decoder takes that
    entry's flags, as transformers maps them.
    """
    added_by_content = {token.content: token for token in added_tokens_decoder.values()}
    named: dict[str, Any] = dict(CLASS_SPECIAL_TOKEN_DEFAULTS.get(tokenizer_class, {}))
    for key, value in config.items():
        if key in NAMED_SPECIAL_TOKENS or (key.endswith("_token") and isinstance(value, str)):
            named[key] = to_added_token(value)
    extra_named, extra_list = extra
    # Model-specific named tokens, e.g. {"image_token": "<image>"}.
    named.update({key: to_added_token(value) for key, value in extra_named.items()})
    named = {key: added_by_content.get(str(value), value) for key, value in named.items() if value}
    # transformers' order (missing tokens get ids in it): bos, eos, ..., mask, then the others.
    named = {
        **{key: named[key] for key in NAMED_SPECIAL_TOKENS if key in named},
        **{key: value for key, value in named.items() if key not in NAMED_SPECIAL_TOKENS},
    }
    return named, [to_added_token(token) for token in extra_list]


def load_backend(directory: Path) -> BackendSpec:
    """Build the backend for a checkpoint directory, replaying transformers 5's AutoTokenizer steps.

    A tokenizer.json is loaded as is, unless transformers would use LlamaTokenizer for it (see
    `_effective_class`): LlamaTokenizer rebuilds the pipeline from the file's vocab and merges (see
    `build_llama_backend`), and so do we. A tokenizer.model alone is read with sentencepiece and
    converted the same way, with merges from `generate_merges`. Added tokens from tokenizer_config.json
    and missing special tokens are then added, and a tokenizer.model's post-processor follows
    add_bos_token / add_eos_token (transformers ignores those two keys when there is a tokenizer.json).
    """
    config = read_json(directory / TOKENIZER_CONFIG) or {}
    model_config = read_json(directory / MODEL_CONFIG) or {}
    hub_class = _normalize_class_name(
        config.get("tokenizer_class") or model_config.get("tokenizer_class")
    )
    json_path, spm_path = directory / TOKENIZER_JSON, directory / SENTENCEPIECE_MODEL
    json_text: str | None = None
    tokenizer_json: dict[str, Any] | None = None
    if json_path.is_file():
        json_text = json_path.read_text(encoding="utf-8")
        try:
            tokenizer_json = json.loads(json_text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{json_path} is not valid JSON: {error}") from error
    elif not spm_path.is_file():
        raise FileNotFoundError(
            f"no tokenizer found in {directory}: expected {TOKENIZER_JSON} (Hugging Face tokenizers) "
            f"or {SENTENCEPIECE_MODEL} (sentencepiece)"
        )
    tokenizer_class = _effective_class(hub_class, model_config.get("model_type"), json_text)

    added_tokens_decoder = _read_added_tokens(config, tokenizer_json)
    # special_tokens_map.json only counts in the legacy layout, without added_tokens_decoder
    special_map = (
        {} if "added_tokens_decoder" in config else read_json(directory / SPECIAL_TOKENS_MAP) or {}
    )
    named, extra = _special_tokens(
        {**config, **special_map},
        tokenizer_class,
        added_tokens_decoder,
        _extra_special_tokens(config, special_map),
    )
    if tokenizer_json is None:  # tokenizer.model alone: added tokens may be in added_tokens.json
        legacy = _legacy_added_tokens(directory, config, named, extra)
        added_tokens_decoder = {**legacy, **added_tokens_decoder}

    if tokenizer_class == "Qwen2Tokenizer" and tokenizer_json is not None:
        vocab, merges = _json_vocab_and_merges(tokenizer_json, json_path)
        backend = build_qwen2_backend(
            vocab, merges, add_prefix_space=bool(config.get("add_prefix_space") or False)
        )
        backend.post_processor = _file_post_processor(tokenizer_json)
    elif tokenizer_class not in LLAMA_CLASSES:
        try:
            backend = BackendTokenizer.from_str(json_text)
        except Exception as error:  # the tokenizers library raises a bare Exception
            raise ValueError(
                f"{json_path}: not a tokenizer the tokenizers library can load ({error})"
            ) from None
        model_kind = (tokenizer_json or {}).get("model", {}).get("type", "BPE")
        if model_kind != "BPE" and config.get("clean_up_tokenization_spaces") is True:
            logger.warning(
                "%s: clean_up_tokenization_spaces is true for this %s tokenizer, which brisklm "
                'does not apply: decoded text keeps the spaces before punctuation ("Hello , '
                'world .") that transformers removes',
                json_path,
                model_kind,
            )
    else:
        post_processor = None
        if tokenizer_json is not None:
            vocab, merges = _json_vocab_and_merges(tokenizer_json, json_path)
            post_processor = _file_post_processor(tokenizer_json)
        else:
            vocab, spm_added = read_sentencepiece(spm_path)
            merges = generate_merges(vocab)
            extra = extra or spm_added
        add_prefix_space = config.get("add_prefix_space")
        backend = build_llama_backend(
            vocab,
            merges,
            legacy=tokenizer_class == "LlamaTokenizer" and bool(config.get("legacy", False)),
            add_prefix_space=True if add_prefix_space is None else bool(add_prefix_space),
        )
        backend.post_processor = post_processor
    # transformers encodes without the truncation / padding a tokenizer.json may carry
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = bool(config.get("split_special_tokens", False))

    _add_tokens_like_transformers(backend, added_tokens_decoder, named, extra)
    if tokenizer_class == "Qwen2Tokenizer":
        # Qwen2Tokenizer.__init__ re-adds every named and extra special token as special
        backend.add_tokens(
            [
                AddedToken(str(t), special=True)
                for t in dict.fromkeys(map(str, [*named.values(), *extra]))
            ]
        )
    explicit_bos_eos = tokenizer_json is None and (
        "add_bos_token" in config or "add_eos_token" in config
    )
    # With a tokenizer.json, BOS/EOS come from its post-processor alone: with none (null),
    # transformers adds neither, whatever add_bos_token says (it drops the two keys whenever
    # there is a tokenizer.json, for the rebuilt Llama classes too).
    flags_apply = tokenizer_json is None
    if explicit_bos_eos or backend.post_processor is None:
        backend.post_processor = _bos_eos_post_processor(
            backend,
            bos=str(named["bos_token"]) if named.get("bos_token") else None,
            eos=str(named["eos_token"]) if named.get("eos_token") else None,
            add_bos=flags_apply and bool(config.get("add_bos_token", False)),
            add_eos=flags_apply and bool(config.get("add_eos_token", False)),
        )
    return BackendSpec(
        backend=backend,
        named_special_tokens={key: str(value) for key, value in named.items()},
        chat_templates=_read_chat_templates(directory, config),
    )


def _file_post_processor(tokenizer_json: dict[str, Any]) -> Any:
    """The post-processor of a tokenizer.json (all that a rebuilt pipeline keeps of the file but its
    vocabulary and merges); an empty vocabulary keeps the parse cheap."""
    minimal = {**tokenizer_json, "added_tokens": []}
    minimal["model"] = {**tokenizer_json["model"], "vocab": {}, "merges": []}
    return BackendTokenizer.from_str(json.dumps(minimal)).post_processor


def _add_tokens_like_transformers(
    backend: BackendTokenizer,
    added_tokens_decoder: dict[int, AddedToken],
    named: dict[str, Any],
    extra: list[Any],
) -> None:
    """Add configured added tokens and missing special tokens, as TokenizersBackend.__init__ does."""
    present = {_token_repr(token) for token in backend.get_added_tokens_decoder().values()}
    to_add: list[AddedToken | str] = [
        token
        for _, token in sorted(added_tokens_decoder.items())
        if _token_repr(token) not in present
    ]
    known = {token.content for token in backend.get_added_tokens_decoder().values()}
    known |= {str(token) for token in to_add}
    for token in [*named.values(), *extra]:
        if token is not None and str(token) not in known:
            to_add.append(token)
            known.add(str(token))
    named_contents = {str(token) for token in named.values()}
    tokens: list[AddedToken] = []
    for token in to_add:
        if isinstance(token, str):
            token = AddedToken(token, special=True)
        elif not token.special and token.content in named_contents:
            token = _as_special(token)
        tokens.append(token)
    # A named token that the files list as not special (an eos added with add_tokens, then
    # named) is made special with its flags, as transformers re-adds every named token.
    tokens += [
        _as_special(token)
        for token in backend.get_added_tokens_decoder().values()
        if not token.special and token.content in named_contents
    ]
    if tokens:
        backend.add_tokens(tokens)


def _as_special(token: AddedToken) -> AddedToken:
    """``token`` with its flags, made special."""
    return AddedToken(
        token.content,
        single_word=token.single_word,
        lstrip=token.lstrip,
        rstrip=token.rstrip,
        normalized=token.normalized,
        special=True,
    )


def _bos_eos_post_processor(
    backend: BackendTokenizer, *, bos: str | None, eos: str | None, add_bos: bool, add_eos: bool
) -> processors.TemplateProcessing:
    """transformers' `update_post_processor`: `<bos> $A <eos>` with each end as configured."""
    add_bos = add_bos and bos is not None
    add_eos = add_eos and eos is not None
    single = f"{(bos + ':0 ') if add_bos else ''}$A:0{(' ' + eos + ':0') if add_eos else ''}"
    pair = f"{single}{(' ' + bos + ':1') if add_bos else ''} $B:1{(' ' + eos + ':1') if add_eos else ''}"
    special_tokens = []
    if add_bos:
        special_tokens.append((bos, backend.token_to_id(bos)))
    if add_eos:
        special_tokens.append((eos, backend.token_to_id(eos)))
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special_tokens)
