"""Tokenizer for local Hugging Face checkpoints: tokenizer.json or tokenizer.model, matching transformers."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from brisklm.chat_template import render_chat_template
from brisklm.checks import check_bool, is_token_id
from brisklm.config import token_ids
from brisklm.detokenizer import IncrementalDetokenizer
from brisklm.tokenizer_backend import MODEL_CONFIG, load_backend, read_json


def check_encodable(text: str) -> None:
    """Refuse text the tokenizer cannot take (a lone surrogate, e.g. from a bad decode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"the prompt is not valid Unicode text: {error.reason} at position {error.start} "
            f"({text[error.start : error.end]!r})"
        ) from None


GENERATION_CONFIG = "generation_config.json"
_BYTE_FALLBACK_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# Characters from which ``encode`` releases the GIL. A shorter text holds it for tens of ms at
# most (20,000 characters with the bundled tokenizer: 7 ms of spaces, 20 of digits, 31 of CJK on
# a 2-core VM), and ``encode_batch`` marks the tokenizers library's thread pool as used (it warns
# in a process forked after that), which a short text's encode is not worth.
_RELEASE_GIL_FROM = 20_000


def gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-unicode table, which byte-level BPE vocabularies are written in."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    byte_values = list(printable)
    code_points = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            byte_values.append(byte)
            code_points.append(256 + extra)
            extra += 1
    return {
        chr(code_point): byte for code_point, byte in zip(code_points, byte_values, strict=True)
    }


def _ids_from_config(generation_config: Mapping[str, Any], key: str, source: str) -> list[int]:
    value = generation_config.get(key)
    ids = token_ids(value)
    if ids is None:
        raise ValueError(
            f"{source}: {key} must be a token id or a list of token ids, got {value!r}"
        )
    return list(ids)


def _is_id(value: object) -> bool:
    """A token id as the backend takes it (``is_token_id``) in [0, 2**32)."""
    return is_token_id(value) and 0 <= int(value) < 2**32  # type: ignore[call-overload]


def _not_an_id(value: object) -> Exception:
    if is_token_id(value):
        return ValueError(
            f"token ids must be ints in [0, 2**32) (ids past the vocabulary have no text), "
            f"got {value}"
        )
    return TypeError(f"token ids must be ints, got {value!r} ({type(value).__name__})")


class Tokenizer:
    """Encodes and decodes text exactly like transformers' AutoTokenizer for the same directory.

    Everything runs on a `tokenizers` backend, built as transformers 5 builds it (tokenizer_backend.py).
    A tokenizer.json is used as is, unless transformers would load it as a LlamaTokenizer; a
    tokenizer.model (sentencepiece BPE: Llama 2, Mistral) is read with sentencepiece. Both of those become
    the byte-fallback BPE of transformers 5's LlamaTokenizer, whose `legacy` defaults to False: '▁' is
    prepended only at the very start of the text (not after special tokens), a leading space of the text
    merges into that '▁', and decoding strips one leading space. `legacy: true` in tokenizer_config.json
    prepends '▁' after every special token too; `add_prefix_space: false` never prepends nor strips.
    Note this differs from sentencepiece itself for text that starts with a space.
    """

    def __init__(
        self,
        backend: Any,
        *,
        named_special_tokens: Mapping[str, str],
        chat_templates: Mapping[str, str],
        generation_config: Mapping[str, Any],
        name_or_path: str = "",
        generation_config_source: str = GENERATION_CONFIG,
    ) -> None:
        self._backend = backend
        self.name_or_path = name_or_path
        self.named_special_tokens = dict(named_special_tokens)
        self.chat_templates = dict(chat_templates)
        self.chat_template: str | None = self.chat_templates.get("default")
        self.bos_token: str | None = self.named_special_tokens.get("bos_token")
        self.eos_token: str | None = self.named_special_tokens.get("eos_token")
        self.pad_token: str | None = self.named_special_tokens.get("pad_token")
        self.unk_token: str | None = self.named_special_tokens.get("unk_token")

        vocab = backend.get_vocab(with_added_tokens=True)
        self.vocab_size: int = max(vocab.values()) + 1 if vocab else 0
        added = backend.get_added_tokens_decoder()
        self.special_token_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
        self._added_token_ids = frozenset(added)

        self.bos_token_id: int | None = self._named_id(self.bos_token)
        if self.bos_token_id is None:
            self.bos_token_id = next(
                iter(_ids_from_config(generation_config, "bos_token_id", generation_config_source)),
                None,
            )
        self.pad_token_id: int | None = self._named_id(self.pad_token)
        if self.pad_token_id is None:
            self.pad_token_id = next(
                iter(_ids_from_config(generation_config, "pad_token_id", generation_config_source)),
                None,
            )
        eos_ids = _ids_from_config(generation_config, "eos_token_id", generation_config_source)
        tokenizer_eos = self._named_id(self.eos_token)
        if tokenizer_eos is not None and tokenizer_eos not in eos_ids:
            eos_ids.append(tokenizer_eos)
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_ids))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load the tokenizer of a checkpoint directory.

        Reads tokenizer.json or tokenizer.model, tokenizer_config.json (special and added tokens, chat
        template), chat_template.jinja if present, and generation_config.json (or config.json) for the
        end-of-sequence ids. Raises FileNotFoundError for a directory without a tokenizer.
        """
        directory = Path(path)
        if not directory.is_dir():
            raise FileNotFoundError(
                f"tokenizer directory {directory} does not exist or is not a directory"
            )
        spec = load_backend(directory)
        source = directory / GENERATION_CONFIG
        generation_config = read_json(source)
        if generation_config is None:
            source = directory / MODEL_CONFIG
            generation_config = read_json(source) or {}
        return cls(
            spec.backend,
            named_special_tokens=spec.named_special_tokens,
            chat_templates=spec.chat_templates,
            generation_config=generation_config,
            name_or_path=str(directory),
            generation_config_source=str(source),
        )

    def _named_id(self, token: str | None) -> int | None:
        return None if token is None else self._backend.token_to_id(token)

    def __repr__(self) -> str:
        return f"Tokenizer({self.name_or_path!r}, vocab_size={self.vocab_size})"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in the text are recognised as such.

        A long text is encoded with the GIL released (the binding's ``encode`` holds it: a 3 MB
        prompt took 1.8 s in which a server's event loop and the engine thread's Python stood
        still); ``encode_batch`` of the one text gives the same ids and releases it. Text that
        is not valid Unicode (a lone surrogate, from a bad decode) is a ValueError that says
        where (the backend's error named neither)."""
        try:
            if len(text) < _RELEASE_GIL_FROM:
                return self._backend.encode(text, add_special_tokens=add_special_tokens).ids
            return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        except (TypeError, UnicodeError):
            if not isinstance(text, str):
                raise TypeError(f"text must be a str, got {type(text).__name__}") from None
            if not isinstance(add_special_tokens, bool):
                raise TypeError(
                    f"add_special_tokens must be True or False, got {add_special_tokens!r}"
                ) from None
            check_encodable(text)
            raise

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; unlike transformers, special tokens are skipped by default.

        Ids without a token are ignored, as the backend does.
        """
        # tolist() accepts tensors and arrays as well as lists
        if (
            isinstance(ids, str | bytes)
            or not hasattr(ids, "__iter__")
            or getattr(ids, "ndim", 1) == 0
        ):
            raise TypeError(f"ids must be a list of token ids (ints), got {type(ids).__name__}")
        token_ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        try:
            return self._backend.decode(token_ids, skip_special_tokens=skip_special_tokens)
        except (TypeError, OverflowError):  # (the backend's own messages named no id)
            bad = next((i for i in token_ids if not _is_id(i)), None)
            if bad is None:
                raise
            raise _not_an_id(bad) from None

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary string of an id (byte-level or '▁' form, not decoded text)."""
        if not _is_id(token_id):  # (3.7 was read as 3, True as 1)
            raise _not_an_id(token_id)
        token = self._backend.id_to_token(int(token_id))
        if token is None:
            raise IndexError(
                f"token id {token_id} is not in the vocabulary (size {self.vocab_size})"
            )
        return token

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary string, or None if it is not one."""
        if not isinstance(token, str):
            raise TypeError(f"token must be a str, got {type(token).__name__}")
        return self._backend.token_to_id(token)

    @cached_property
    def _decoder_types(self) -> frozenset[str]:
        decoder = self._backend.decoder
        if decoder is None:
            return frozenset()
        state = json.loads(decoder.__getstate__())
        nested = state.get("decoders", [state])
        return frozenset(part.get("type", "") for part in nested)

    @cached_property
    def byte_fallback_ids(self) -> frozenset[int]:
        """Ids of `<0xNN>` pieces that the decoder turns into raw bytes (empty without ByteFallback)."""
        if "ByteFallback" not in self._decoder_types:
            return frozenset()
        return frozenset(
            token_id
            for token_id in range(self.vocab_size)
            if token_id not in self._added_token_ids
            and _BYTE_FALLBACK_PIECE.fullmatch(self._backend.id_to_token(token_id) or "")
        )

    @cached_property
    def context_token_id(self) -> int | None:
        """An ordinary one-letter token ("a", ...) to put before text decoded without context:
        sentencepiece decoders strip the leading space of the text's first token, which a
        grammar (matching each token's bytes, '▁' as a space) counted. None if there is none."""
        for letter in "abcdefghijklmnopqrstuvwxyz":
            token_id = self._backend.token_to_id(letter)
            if (
                token_id is not None
                and token_id not in self._added_token_ids
                and token_id not in self.byte_fallback_ids
                and self.decode([token_id]) == letter
            ):
                return token_id
        return None

    @cached_property
    def decodes_by_concatenation(self) -> bool:
        """Whether ``decode(ids)`` (special tokens skipped) is the UTF-8 decoding, invalid bytes
        replaced, of the ids' ``token_bytes`` joined: a byte-level BPE (the decoder is ByteLevel
        alone) whose added tokens that are not special decode to their own text. Then text can be
        streamed from each token's bytes (``IncrementalDetokenizer``)."""
        return self._decode_concatenates(self._added_token_ids - self.special_token_ids, True)

    @cached_property
    def decodes_specials_by_concatenation(self) -> bool:
        """``decodes_by_concatenation`` for ``decode(ids, skip_special_tokens=False)``: every
        added token, special ones too, decodes to its own text (a chat with tools keeps special
        tokens, whose calls start with one: its stream then needs no decode call a token either)."""
        return self._decode_concatenates(self._added_token_ids, False)

    def _decode_concatenates(self, added: Iterable[int], skip_special_tokens: bool) -> bool:
        """Whether the decoder is ByteLevel alone and each of the ``added`` tokens decodes to the
        text of its ``token_bytes``."""
        if self._decoder_types != frozenset({"ByteLevel"}):
            return False
        table = self._token_bytes
        return all(
            self._backend.decode([token_id], skip_special_tokens=skip_special_tokens)
            == table[token_id].decode("utf-8", "replace")
            for token_id in added
        )

    def token_bytes(self) -> list[bytes]:
        """The raw bytes each id stands for, indexed by id (b"" for ids without a token).

        Byte-level BPE tokens map back through the GPT-2 byte table; sentencepiece pieces turn '▁' into a
        space and `<0xNN>` into that byte; added and special tokens are their text in UTF-8.
        """
        return self._token_bytes

    @cached_property
    def _token_bytes(self) -> list[bytes]:
        byte_level = "ByteLevel" in self._decoder_types
        byte_fallback = "ByteFallback" in self._decoder_types
        metaspace = "Replace" in self._decoder_types or "Metaspace" in self._decoder_types
        to_latin1 = _byte_level_translation() if byte_level else {}
        table: list[bytes] = []
        for token_id in range(self.vocab_size):
            token = self._backend.id_to_token(token_id)
            if token is None:
                table.append(b"")
            elif token_id in self._added_token_ids:
                table.append(token.encode("utf-8"))
            elif byte_level:
                table.append(_byte_level_bytes(token, to_latin1))
            elif byte_fallback and (match := _BYTE_FALLBACK_PIECE.fullmatch(token)):
                table.append(bytes([int(match.group(1), 16)]))
            else:
                table.append((token.replace("▁", " ") if metaspace else token).encode("utf-8"))
        return table

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any] | Callable[..., Any] | type] | None = None,
        add_generation_prompt: bool = True,
        *,
        chat_template: str | None = None,
        continue_final_message: bool | str = False,
        **extra: Any,
    ) -> str:
        """Render a conversation with the checkpoint's chat template, as transformers'
        tokenize=False does (but ``add_generation_prompt`` is True by default, transformers' False:
        the text ends where the assistant's reply begins, as a prompt for it).

        `chat_template` may name one of the checkpoint's templates or be a template itself; by default the
        "tool_use" template is used when tools are given and the checkpoint has one, else "default".
        `continue_final_message` leaves the last message (or the field it names, e.g.
        "reasoning_content") open for the model to continue (a prefill) and then no generation
        prompt is added. Extra keyword arguments become template variables (`documents`
        included). Raises ValueError without a chat template.
        """
        check_bool("add_generation_prompt", add_generation_prompt)
        if extra.pop("tokenize", False) or any(
            extra.get(name) for name in ("return_tensors", "return_dict")
        ):
            raise TypeError(
                "apply_chat_template returns the rendered text (transformers' tokenize=False); "
                "for ids, encode it: tokenizer.encode(text, add_special_tokens=False)"
            )
        if extra.pop("sanitize_control_tokens", False):
            # A variable the template never reads: the caller would think the prompt guarded.
            raise TypeError(
                "sanitize_control_tokens is not supported: control tokens written in message "
                "text (e.g. '<|im_end|>') are encoded as those tokens; remove them from "
                "untrusted text before rendering"
            )
        template = self._select_template(chat_template, has_tools=tools is not None)
        return render_chat_template(
            template,
            messages,
            tools,
            add_generation_prompt,
            self.named_special_tokens,
            continue_final_message=continue_final_message,
            **extra,
        )

    def template_for(self, requested: str | None = None, has_tools: bool = False) -> str:
        """The template source ``apply_chat_template`` renders with: ``requested`` (a name of the
        checkpoint's templates or a template itself), else the ``tool_use`` one when tools are
        given, else the default. ValueError when the checkpoint has none."""
        return self._select_template(requested, has_tools)

    def _select_template(self, requested: str | None, has_tools: bool) -> str:
        if requested is not None and not isinstance(requested, str):
            raise TypeError(
                "chat_template must be a str: the name of one of the tokenizer's templates or "
                f"Jinja template source, got {type(requested).__name__}"
            )
        if requested is not None:
            if requested in self.chat_templates:
                return self.chat_templates[requested]
            if "{{" not in requested and "{%" not in requested:
                # transformers renders it as a template: the same text whatever the messages.
                raise ValueError(
                    f"chat_template {requested[:60]!r} is neither a template of this tokenizer "
                    f"({sorted(self.chat_templates) or 'it has none'}) nor Jinja template source "
                    "(it has no {{ }} or {% %})"
                )
            return requested
        if not self.chat_templates:
            raise ValueError(
                f"the tokenizer in {self.name_or_path or 'this directory'} has no chat template "
                "(tokenizer_config.json has no chat_template and there is no chat_template.jinja); "
                "pass chat_template=... or use plain text prompts"
            )
        if has_tools and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        if "default" in self.chat_templates:
            return self.chat_templates["default"]
        raise ValueError(
            f"the tokenizer has no chat template named 'default', only "
            f"{sorted(self.chat_templates)}; pass chat_template=<name>"
        )

    def detokenizer(
        self,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        keep_first_space: bool = False,
    ) -> IncrementalDetokenizer:
        """A streaming decoder for the tokens generated after `prompt_ids` (see
        ``IncrementalDetokenizer`` for ``keep_first_space``)."""
        return IncrementalDetokenizer(
            self,
            prompt_ids,
            skip_special_tokens=skip_special_tokens,
            keep_first_space=keep_first_space,
        )


@cache
def _byte_level_translation() -> dict[int, str]:
    """``str.translate`` table from GPT-2's byte characters to the Latin-1 character of each
    byte; any other character below U+0100 goes to U+FFFF, so that, like every character past
    U+00FF, it fails the Latin-1 encoding (see ``_byte_level_bytes``)."""
    table = {ord(char): chr(byte) for char, byte in gpt2_unicode_to_byte().items()}
    table.update({code: "\uffff" for code in range(256) if code not in table})
    return table


def _byte_level_bytes(token: str, to_latin1: Mapping[int, str]) -> bytes:
    """A byte-level token's bytes, as the ByteLevel decoder gives them: each character is one
    byte of GPT-2's table; a token with a character outside the table decodes as its own UTF-8,
    whole (the decoder's fallback), "Ġ" and all. (One translate, not a loop per character: a
    128k vocabulary's table took 0.6 s, now 0.13 s.)"""
    try:
        return token.translate(to_latin1).encode("latin-1")
    except UnicodeEncodeError:
        return token.encode("utf-8")
