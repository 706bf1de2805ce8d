"""Tokenizer parity with transformers' AutoTokenizer, token bytes, eos ids, errors and the incremental detokenizer."""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from brisklm.sampling import find_stop_string
from brisklm.tokenizer import Tokenizer
from tests.tokenizer_fixtures import (
    TRICKY_STRINGS,
    build_byte_level_bpe,
    build_llama_hub_json,
    build_sentencepiece,
)

transformers = pytest.importorskip("transformers")

# Kinds whose decoder strips the one leading space that encoding prepends (sentencepiece, add_prefix_space)
STRIPS_LEADING_SPACE = {
    "spm",
    "spm_legacy",
    "spm_eos",
    "spm_added_tokens_json",
    "llama_hub_json",
    "mistral_hub_json",
    "codellama_hub_json",
    "llama_hub_json_null_post_processor",
}
KINDS = [
    "bytelevel",
    "qwen2",
    "spm",
    "spm_legacy",
    "spm_no_prefix",
    "spm_eos",
    "llama_hub_json",
    # transformers picks the tokenizer class from more than tokenizer_class: these check we follow it
    "bytelevel_named_llama",  # LlamaTokenizer named, byte-level tokenizer.json: loaded as is
    "mistral_hub_json",  # model_type mistral: tokenizer.json as is, even though LlamaTokenizer is named
    "qwen2_model_type",  # model_type qwen2 makes it a Qwen2Tokenizer whatever the name
    "bytelevel_model_type_qwen2",  # ... which rebuilds a pipeline other than Qwen's (NFC, digits)
    "bytelevel_model_type_qwen3",  # ... but model_type qwen3 keeps the class named
    "legacy_layout",  # no added_tokens_decoder: special_tokens_map.json and tokenizer.json's added tokens
    "spm_added_tokens_json",  # tokenizer.model with added_tokens.json (saved before transformers 4.34)
    "bytelevel_null_post_processor",  # add_bos_token beside a tokenizer.json without post-processor
    "codellama_hub_json",  # CodeLlamaTokenizer rebuilds it as LlamaTokenizer does, never legacy
    "llama_hub_json_null_post_processor",  # ... and no BOS without a post-processor, as above
    "bytelevel_eos_added_not_special",  # a named token listed as not special is special
]


def _code_llama(directory: Path) -> Path:
    """CodeLlama's layout: a Llama 2 hub tokenizer.json named CodeLlamaTokenizer (whose `legacy`
    transformers ignores) and its infilling tokens."""
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(tokenizer_class="CodeLlamaTokenizer", legacy=True)
    path.write_text(json.dumps(config))
    return directory


def _added_tokens_json(directory: Path) -> Path:
    import sentencepiece

    size = sentencepiece.SentencePieceProcessor(
        model_file=str(directory / "tokenizer.model")
    ).get_piece_size()
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("added_tokens_decoder", None)
    config["eos_token"] = "<|im_end|>"
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    added = {"<|im_end|>": size, "<|im_start|>": size + 1}
    (directory / "added_tokens.json").write_text(json.dumps(added))
    special_tokens_map = {"bos_token": "<s>", "eos_token": "<|im_end|>", "unk_token": "<unk>"}
    (directory / "special_tokens_map.json").write_text(json.dumps(special_tokens_map))
    return directory


def _null_post_processor(directory: Path) -> Path:
    path = directory / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["post_processor"] = None
    path.write_text(json.dumps(data), encoding="utf-8")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.update(add_bos_token=True, add_eos_token=True)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def _eos_added_not_special(directory: Path) -> Path:
    """A ChatML fine-tune's layout: <|im_end|> added with add_tokens (special: false) and then
    named eos_token; transformers makes every named token special."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        data = json.loads((directory / name).read_text(encoding="utf-8"))
        tokens = data["added_tokens"] if name == "tokenizer.json" else data["added_tokens_decoder"]
        for entry in tokens if isinstance(tokens, list) else tokens.values():
            if entry["content"] == "<|im_end|>":
                entry["special"] = False
        if name == "tokenizer_config.json":
            data["eos_token"] = "<|im_end|>"
        (directory / name).write_text(json.dumps(data), encoding="utf-8")
    return directory


def _legacy_layout(directory: Path) -> Path:
    config = json.loads((directory / "tokenizer_config.json").read_text())
    del config["added_tokens_decoder"]
    config["eos_token"] = "</s>"
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    special_tokens_map = {
        "eos_token": {
            "content": "<|im_end|>",
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
        },
        "pad_token": "<|pad|>",
        "additional_special_tokens": ["<|im_start|>", "<|extra|>"],
    }
    (directory / "special_tokens_map.json").write_text(json.dumps(special_tokens_map))
    return directory


def _with_model_config(directory: Path, model_type: str) -> Path:
    (directory / "config.json").write_text(json.dumps({"model_type": model_type}))
    return directory


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    spm = build_sentencepiece(root / "spm")
    return {
        "bytelevel": build_byte_level_bpe(
            root / "bytelevel", generation_config={"bos_token_id": 0, "eos_token_id": [3, 1]}
        ),
        "qwen2": build_byte_level_bpe(
            root / "qwen2",
            qwen_style=True,
            generation_config={"eos_token_id": [2, 0], "pad_token_id": 0},
        ),
        "spm": spm,
        "spm_legacy": build_sentencepiece(root / "spm_legacy", config_overrides={"legacy": True}),
        "spm_no_prefix": build_sentencepiece(
            root / "spm_no_prefix", config_overrides={"add_prefix_space": False}
        ),
        "spm_eos": build_sentencepiece(
            root / "spm_eos",
            config_overrides={"add_eos_token": True},
            generation_config={"bos_token_id": 1, "eos_token_id": 2},
        ),
        "llama_hub_json": build_llama_hub_json(root / "llama_hub_json", spm),
        "bytelevel_named_llama": build_byte_level_bpe(
            root / "bytelevel_named_llama", config_overrides={"tokenizer_class": "LlamaTokenizer"}
        ),
        "codellama_hub_json": _code_llama(build_llama_hub_json(root / "codellama", spm)),
        "mistral_hub_json": _with_model_config(
            build_llama_hub_json(root / "mistral_hub_json", spm), "mistral"
        ),
        "legacy_layout": _legacy_layout(build_byte_level_bpe(root / "legacy_layout")),
        "bytelevel_model_type_qwen2": _with_model_config(
            build_byte_level_bpe(root / "bytelevel_model_type_qwen2"), "qwen2"
        ),
        "bytelevel_model_type_qwen3": _with_model_config(
            build_byte_level_bpe(root / "bytelevel_model_type_qwen3"), "qwen3"
        ),
        "spm_added_tokens_json": _added_tokens_json(build_sentencepiece(root / "spm_added_json")),
        "bytelevel_null_post_processor": _null_post_processor(
            build_byte_level_bpe(root / "bytelevel_null_pp")
        ),
        "llama_hub_json_null_post_processor": _null_post_processor(
            build_llama_hub_json(root / "llama_null_pp", spm)
        ),
        "bytelevel_eos_added_not_special": _eos_added_not_special(
            build_byte_level_bpe(root / "eos_not_special")
        ),
        "qwen2_model_type": _with_model_config(
            build_byte_level_bpe(
                root / "qwen2_model_type",
                qwen_style=True,
                config_overrides={"tokenizer_class": "PreTrainedTokenizerFast"},
            ),
            "qwen2",
        ),
    }


@pytest.fixture(scope="module")
def loaded(tokenizer_dirs: dict[str, Path]) -> dict[str, tuple[Tokenizer, object]]:
    return {
        kind: (Tokenizer.from_pretrained(path), transformers.AutoTokenizer.from_pretrained(path))
        for kind, path in tokenizer_dirs.items()
    }


@pytest.mark.parametrize("kind", KINDS)
def test_encode_matches_transformers(loaded, kind: str) -> None:
    ours, reference = loaded[kind]
    for text in TRICKY_STRINGS:
        for add_special_tokens in (True, False):
            expected = reference.encode(text, add_special_tokens=add_special_tokens)
            assert ours.encode(text, add_special_tokens=add_special_tokens) == expected, (
                text,
                add_special_tokens,
            )


@pytest.mark.parametrize("kind", KINDS)
def test_text_that_is_not_unicode_is_refused_saying_where(loaded, kind: str) -> None:
    """A lone surrogate (a bad decode's): the backends' errors named neither the fault nor the
    place ("TextInputSequence must be str"), and the server's /tokenize answered 500."""
    from brisklm.tokenizer import _RELEASE_GIL_FROM

    ours, _ = loaded[kind]
    for text in ("ab\udc80c", "x" * _RELEASE_GIL_FROM + "\ud800"):
        position = text.index(text[-1] if text.endswith("\ud800") else "\udc80")
        with pytest.raises(ValueError, match=f"surrogates not allowed at position {position}"):
            ours.encode(text)
    assert ours.encode("abc")
    for value in (None, b"abc", 5):  # not text at all: the backend's TypeError (an
        with pytest.raises(TypeError):  # AttributeError from the check, for a moment)
            ours.encode(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS)
def test_a_long_text_encodes_alike_and_lets_other_threads_run(loaded, kind: str) -> None:
    """The binding's encode holds the GIL: a 3 MB prompt stopped a server's event loop and the
    engine thread's Python for 1.8 s. A long text is encoded with it released, to the same ids."""
    import threading
    import time

    from brisklm.tokenizer import _RELEASE_GIL_FROM

    ours, reference = loaded[kind]
    text = "".join(itertools.islice(itertools.cycle(TRICKY_STRINGS), 400))
    text = (text + " ") * (100_000 // len(text) + 1)
    assert len(text) >= _RELEASE_GIL_FROM
    assert ours.encode(text) == reference.encode(text)
    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        start = time.perf_counter()
        ours.encode(text)
        end = time.perf_counter()
    finally:
        stop.set()
        ticker.join()
    margin = (end - start) / 5
    # Python ran beside the encode (holding the GIL, it ran before and after it alone).
    assert sum(start + margin < t < end - margin for t in ticks) >= 3


@pytest.mark.parametrize("kind", KINDS)
def test_decode_matches_transformers(loaded, kind: str) -> None:
    ours, reference = loaded[kind]
    rng = random.Random(kind)
    sequences = [reference.encode(text) for text in TRICKY_STRINGS]
    sequences += [
        [rng.randrange(ours.vocab_size) for _ in range(rng.randrange(1, 12))] for _ in range(200)
    ]
    for ids in sequences:
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == reference.decode(
                ids, skip_special_tokens=skip
            ), ids


@pytest.mark.parametrize("kind", KINDS)
def test_vocabulary_and_special_tokens_match_transformers(loaded, kind: str) -> None:
    ours, reference = loaded[kind]
    vocab = reference.get_vocab()
    assert ours.vocab_size == max(vocab.values()) + 1
    assert ours.special_token_ids == {
        i for i, t in reference.added_tokens_decoder.items() if t.special
    }
    assert ours.bos_token == reference.bos_token
    assert ours.eos_token == reference.eos_token
    for token, token_id in list(vocab.items())[:: max(1, len(vocab) // 97)]:
        assert ours.token_to_id(token) == token_id
        assert ours.id_to_token(token_id) == token
    assert ours.token_to_id("definitely not a token ∅") is None
    with pytest.raises(IndexError):
        ours.id_to_token(ours.vocab_size + 5)


def test_misused_methods_name_what_they_take(loaded) -> None:
    """The backend's messages named no argument (OverflowError "number too small to fit in target
    type", "'NoneType' object is not iterable"), and id_to_token(3.7) was token 3."""
    ours, _ = loaded[KINDS[0]]
    for call, error, message in [
        (lambda: ours.id_to_token(3.7), TypeError, r"token ids must be ints, got 3.7 \(float\)"),
        (lambda: ours.id_to_token(True), TypeError, "got True"),
        (lambda: ours.id_to_token(-1), ValueError, r"token ids must be ints in \[0, 2\*\*32\)"),
        (lambda: ours.decode([5, -1]), ValueError, "got -1$"),
        (lambda: ours.decode([2**70]), ValueError, f"got {2**70}$"),
        (lambda: ours.decode([1.5]), TypeError, "got 1.5"),
        (lambda: ours.decode([[1, 2]]), TypeError, r"got \[1, 2\] \(list\)"),
        (lambda: ours.decode("abc"), TypeError, "ids must be a list of token ids .* got str"),
        (lambda: ours.decode(None), TypeError, "got NoneType"),
        (lambda: ours.encode(None), TypeError, "text must be a str, got NoneType"),
        (lambda: ours.encode(b"hi"), TypeError, "text must be a str, got bytes"),
        (lambda: ours.encode("x", add_special_tokens="no"), TypeError, "add_special_tokens"),
        (lambda: ours.token_to_id(None), TypeError, "token must be a str, got NoneType"),
    ]:
        with pytest.raises(error, match=message):
            call()
    assert ours.decode([]) == "" and ours.id_to_token(5) == ours.id_to_token(np.int64(5))


def test_named_tokens_and_eos_ids(loaded) -> None:
    bytelevel = loaded["bytelevel"][0]
    # generation_config's eos list comes first; the tokenizer's eos "</s>" (id 1) is already in it
    assert bytelevel.eos_token_ids == (3, 1)
    assert bytelevel.bos_token_id == bytelevel.token_to_id("<s>") == 0
    # "<pad>" is only named in tokenizer_config.json, so it was appended after the added tokens
    assert bytelevel.pad_token_id == bytelevel.vocab_size - 1
    qwen2 = loaded["qwen2"][0]
    assert qwen2.bos_token is None and qwen2.bos_token_id is None
    assert qwen2.eos_token_ids == (2, 0)
    assert qwen2.pad_token_id == qwen2.token_to_id("<|endoftext|>")
    spm = loaded["spm"][0]
    assert (spm.bos_token, spm.eos_token, spm.bos_token_id, spm.eos_token_ids) == (
        "<s>",
        "</s>",
        1,
        (2,),
    )
    assert spm.encode("hi")[0] == 1 and spm.encode("hi")[-1] != 2
    assert loaded["spm_eos"][0].encode("hi")[-1] == 2


def test_legacy_layout_reads_special_tokens_map(loaded) -> None:
    ours, _ = loaded["legacy_layout"]
    assert ours.eos_token == "<|im_end|>"
    assert ours.eos_token_ids == (ours.token_to_id("<|im_end|>"),)
    # "<|pad|>" and "<|extra|>" are not in tokenizer.json, so they are appended as special tokens
    assert {ours.pad_token_id, ours.token_to_id("<|extra|>")} == {
        ours.vocab_size - 2,
        ours.vocab_size - 1,
    }
    assert ours.encode("a<|extra|>b", add_special_tokens=False)[1] == ours.token_to_id("<|extra|>")
    assert ours.decode(ours.encode("a<|extra|>b")) == "ab"


def test_eos_from_config_json_without_generation_config(tmp_path: Path) -> None:
    directory = build_byte_level_bpe(tmp_path / "tok")
    (directory / "config.json").write_text(json.dumps({"eos_token_id": 2, "bos_token_id": 0}))
    tokenizer = Tokenizer.from_pretrained(directory)
    assert tokenizer.eos_token_ids == (2, 1)


def test_non_special_added_tokens_survive_skip_special_tokens(loaded) -> None:
    ours, _ = loaded["qwen2"]
    text = '<|im_start|>assistant\n<tool_call>\n{"name": "f"}\n</tool_call><|im_end|>'
    ids = ours.encode(text)
    assert ours.token_to_id("<tool_call>") in ids
    assert ours.decode(ids) == 'assistant\n<tool_call>\n{"name": "f"}\n</tool_call>'


@pytest.mark.parametrize("kind", KINDS)
def test_token_bytes_spell_out_the_decoded_text(loaded, kind: str) -> None:
    ours, reference = loaded[kind]
    table = ours.token_bytes()
    assert len(table) == ours.vocab_size
    assert ours.token_bytes() is table  # cached
    for text in TRICKY_STRINGS:
        ids = reference.encode(text, add_special_tokens=False)
        decoded = reference.decode(ids, skip_special_tokens=False)
        if kind in STRIPS_LEADING_SPACE and ids and table[ids[0]].startswith(b" "):
            decoded = " " + decoded
        assert b"".join(table[i] for i in ids) == decoded.encode("utf-8"), text
    for special in ours.special_token_ids:
        assert table[special] == ours.id_to_token(special).encode("utf-8")


def test_token_bytes_of_byte_pieces_and_spaces(loaded) -> None:
    spm, _ = loaded["spm"]
    table = spm.token_bytes()
    assert table[spm.token_to_id("<0xE2>")] == b"\xe2"
    assert table[spm.token_to_id("<0x41>")] == b"A"
    assert len(spm.byte_fallback_ids) == 256
    metaspace_piece = next(
        t for t in map(spm.id_to_token, range(spm.vocab_size)) if t.startswith("▁") and len(t) > 1
    )
    assert table[spm.token_to_id(metaspace_piece)] == metaspace_piece.replace("▁", " ").encode()
    bytelevel, _ = loaded["bytelevel"]
    assert bytelevel.token_bytes()[bytelevel.token_to_id("Ġ")] == b" "
    assert bytelevel.token_bytes()[bytelevel.token_to_id("Ċ")] == b"\n"
    assert bytelevel.byte_fallback_ids == frozenset()


def test_missing_tokenizer_errors_name_directory_and_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty_checkpoint"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="empty_checkpoint") as error:
        Tokenizer.from_pretrained(empty)
    assert "tokenizer.json" in str(error.value) and "tokenizer.model" in str(error.value)
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        Tokenizer.from_pretrained(tmp_path / "no_such_dir")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer.json"):
        Tokenizer.from_pretrained(broken)
    not_spm = tmp_path / "not_spm"
    not_spm.mkdir()
    (not_spm / "tokenizer.model").write_bytes(b"\x00garbage\xff" * 10)
    with pytest.raises(ValueError, match="sentencepiece"):
        Tokenizer.from_pretrained(not_spm)


# ---- incremental detokenizer ------------------------------------------------------------------------


def _stream(
    tokenizer: Tokenizer,
    ids: list[int],
    prompt: list[int] = (),
    skip: bool = True,
    keep_first_space: bool = False,
) -> list[str]:
    detokenizer = tokenizer.detokenizer(
        prompt, skip_special_tokens=skip, keep_first_space=keep_first_space
    )
    deltas = [detokenizer.add(token_id) for token_id in ids]
    deltas.append(detokenizer.flush())
    assert detokenizer.text == "".join(deltas)
    return deltas


@contextlib.contextmanager
def recorded_decodes(tokenizer: Tokenizer) -> Iterator[list[int]]:
    """The length of every id list ``tokenizer.decode`` is called with, while in the block."""
    lengths: list[int] = []
    original_decode = tokenizer.decode

    def recording_decode(token_ids, skip_special_tokens=True):
        lengths.append(len(token_ids))
        return original_decode(token_ids, skip_special_tokens)

    tokenizer.decode = recording_decode
    try:
        yield lengths
    finally:
        del tokenizer.decode


def _byte_piece_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return [tokenizer.token_to_id(f"<0x{byte:02X}>") for byte in text.encode("utf-8")]


@pytest.mark.parametrize("kind", KINDS)
def test_stream_of_random_ids_concatenates_to_decode(loaded, kind: str) -> None:
    ours, _ = loaded[kind]
    rng = random.Random(f"stream-{kind}")
    special = sorted(ours.special_token_ids)
    byte_ids = sorted(ours.byte_fallback_ids)
    for _ in range(150):
        ids = []
        for _ in range(rng.randrange(1, 25)):
            roll = rng.random()
            if roll < 0.1:
                ids.append(rng.choice(special))
            elif roll < 0.45 and byte_ids:
                ids.append(rng.choice(byte_ids))
            else:
                ids.append(rng.randrange(ours.vocab_size))
        for skip in (True, False):
            assert "".join(_stream(ours, ids, skip=skip)) == ours.decode(
                ids, skip_special_tokens=skip
            ), ids
            # After a prompt (ending on a complete character) the stream is the prompt's continuation
            prompt = ours.encode(rng.choice(TRICKY_STRINGS) + " ok")
            continuation = ours.decode(prompt + ids, skip)[len(ours.decode(prompt, skip)) :]
            assert "".join(_stream(ours, ids, prompt=prompt, skip=skip)) == continuation, (
                prompt,
                ids,
            )


@pytest.mark.parametrize("kind", KINDS)
def test_stream_of_real_text_never_emits_broken_characters(loaded, kind: str) -> None:
    ours, _ = loaded[kind]
    for text in TRICKY_STRINGS:
        ids = ours.encode(text, add_special_tokens=False)
        deltas = _stream(ours, ids)
        assert all("\ufffd" not in delta for delta in deltas), (text, deltas)
        assert "".join(deltas) == ours.decode(ids)


def test_adversarial_byte_runs_in_sentencepiece_streams(loaded) -> None:
    ours, _ = loaded["spm"]
    word = ours.encode("hello", add_special_tokens=False)
    eos, bos = 2, 1
    valid = _byte_piece_ids(ours, "é€😀")
    lone_continuation = _byte_piece_ids(ours, "é")[1:]
    truncated = _byte_piece_ids(ours, "😀")[:2]
    cases = [
        valid,
        word + valid + word,
        valid[:3] + [eos] + valid[3:] + word,  # a skipped special token does not end a byte run
        _byte_piece_ids(ours, "é")
        + lone_continuation
        + word,  # "é" then an invalid byte: the whole run is U+FFFD
        word + truncated + word + truncated,
        truncated,
        [bos] + valid + [bos] + lone_continuation,
    ]
    for ids in cases:
        for skip in (True, False):
            deltas = _stream(ours, ids, skip=skip)
            assert "".join(deltas) == ours.decode(ids, skip_special_tokens=skip), ids
    deltas = _stream(ours, word + valid + word)
    assert "".join(deltas) == "helloé€😀 hello"
    assert all("\ufffd" not in d for d in deltas) and any("é€😀" in d for d in deltas)


def _stop_request(tokenizer: Tokenizer, stop: list[str], min_tokens: int = 0):
    from brisklm.engine.request import Request
    from brisklm.sampling import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=1000, stop=stop, min_tokens=min_tokens)
    return Request("r", None, [1], params, frozenset(), 10_000, tokenizer.detokenizer([]))


def test_a_stop_string_made_of_byte_pieces_stops_at_the_token_that_completes_it(loaded) -> None:
    # Llama 2 and Mistral write "\n" as the byte piece <0x0A>: the detokenizer holds a byte run
    # until a later token ends it, and the stop used to be found there, a token late (the extra
    # token in token_ids and usage), and short of min_tokens a "\n" that completed before
    # min_tokens was still a stop once the run was released after it.
    spm, _ = loaded["spm"]
    word = spm.encode("hello", add_special_tokens=False)
    newline = _byte_piece_ids(spm, "\n")
    crab = _byte_piece_ids(spm, "🦀")
    for stop, ids, stops_after in (
        (["\n"], word + newline + word, len(word) + 1),
        (["\n\n"], word + newline + newline + word, len(word) + 2),
        (["🦀"], word + crab + word, len(word) + 4),
        (["o\n"], word + newline + word, len(word) + 1),
    ):
        request = _stop_request(spm, stop)
        for token_id in ids:
            request.append_token(token_id)
            if request.is_finished:
                break
        assert len(request.output_token_ids) == stops_after, stop
        assert request.finish_reason == "stop" and request.stop_reason == stop[0]
        assert request.text == ("hell" if stop == ["o\n"] else "hello")
    # Short of min_tokens the "\n" is ordinary text; the request runs on
    request = _stop_request(spm, ["\n"], min_tokens=len(word) + 2)
    for token_id in word + newline + word:
        request.append_token(token_id)
    assert not request.is_finished and request.text == "hello\n hello"
    # ... and the run stays whole: an invalid byte after it makes decode's whole run U+FFFD
    ids = word + newline + _byte_piece_ids(spm, "€")[:1] + word
    request = _stop_request(spm, ["\n"], min_tokens=len(ids))
    streamed = "".join(request.append_token(token_id).text for token_id in ids)
    streamed += request.abort("length").text
    assert streamed == request.text == spm.decode(ids)


def test_stop_strings_over_byte_pieces_match_a_character_stream(loaded) -> None:
    # Random outputs of words and characters spelled in byte pieces: the request stops at the
    # first token at or past min_tokens that completes a stop string in the decoded text, with
    # the text up to the stop, as a stream of characters would.
    spm, _ = loaded["spm"]
    rng = random.Random("byte-piece-stops")
    pieces = [_byte_piece_ids(spm, c) for c in ("\n", "é", "€", "🦀", ".")]
    pieces += [[i] for w in ("a", "hello", "x.") for i in spm.encode(w, add_special_tokens=False)]
    for _ in range(300):
        units = [rng.choice(pieces) for _ in range(rng.randrange(1, 12))]
        ids = [i for unit in units for i in unit]
        stop = [rng.choice(["\n", "é", "\né", "🦀", "€\n", "o\n", ".\n", "x"])]
        min_tokens = rng.choice([0, 0, 2, 5])
        # The text of the characters complete after each token: a character spelled in byte
        # pieces arrives with its last byte (decoding a prefix that ends inside one replaces
        # its whole byte run, earlier characters included, with U+FFFD)
        texts, previous = [], ""
        for end in itertools.accumulate(len(unit) for unit in units):
            texts += [previous] * (end - len(texts) - 1)
            previous = spm.decode(ids[:end])
            texts.append(previous)
        expected_k, expected_text, previous = None, texts[-1], ""
        for k, text in enumerate(texts, start=1):
            match = find_stop_string(text, stop, num_new_chars=len(text) - len(previous))
            previous = text
            if match is not None and k >= min_tokens:
                expected_k, expected_text = k, text[: match.start]
                break
        request = _stop_request(spm, stop, min_tokens)
        streamed = ""
        for token_id in ids:
            streamed += request.append_token(token_id).text
            if request.is_finished:
                break
        if not request.is_finished:
            streamed += request.abort("length").text
        assert request.text == streamed == expected_text, (ids, stop, min_tokens)
        assert len(request.output_token_ids) == (expected_k or len(ids)), (ids, stop, min_tokens)


def test_adversarial_split_characters_in_byte_level_streams(loaded) -> None:
    ours, _ = loaded["bytelevel"]
    table = ours.token_bytes()
    single_byte_ids = {
        raw[0]: i
        for i, raw in enumerate(table)
        if len(raw) == 1 and i not in ours.special_token_ids
    }
    emoji_bytes = [single_byte_ids[b] for b in "😀".encode()]
    word = ours.encode("hi", add_special_tokens=False)
    cases = [
        emoji_bytes,
        word + emoji_bytes[:2] + word,  # truncated character followed by text
        emoji_bytes[:3] + [3] + emoji_bytes[3:],  # special token inside a character
        [single_byte_ids[0x80]] + word,
    ]
    for ids in cases:
        for skip in (True, False):
            assert "".join(_stream(ours, ids, skip=skip)) == ours.decode(
                ids, skip_special_tokens=skip
            ), ids
    deltas = _stream(ours, word + emoji_bytes + word)
    assert "".join(deltas) == "hi😀hi"
    assert all("\ufffd" not in d for d in deltas) and "😀" in deltas


def test_byte_level_streams_join_token_bytes_without_a_decode_call(loaded) -> None:
    """A byte-level BPE streams each token's bytes through a UTF-8 decoder, special tokens
    skipped or kept (a chat with tools keeps them: it decoded two windows a token, ~10 us);
    sentencepiece tokenizers decode the windows."""
    for kind in ("bytelevel", "qwen2"):
        assert loaded[kind][0].decodes_by_concatenation
        assert loaded[kind][0].decodes_specials_by_concatenation
    for kind in STRIPS_LEADING_SPACE:
        assert not loaded[kind][0].decodes_by_concatenation
        assert not loaded[kind][0].decodes_specials_by_concatenation
    ours, _ = loaded["bytelevel"]
    special = sorted(ours.special_token_ids)
    ids = ours.encode("Hello 😀 wörld, 東京!", add_special_tokens=False)
    ids = ids[:3] + special[:2] + ids[3:] + special[:1]
    for skip in (True, False):
        expected = ours.decode(ids, skip)
        with recorded_decodes(ours) as calls:
            assert "".join(_stream(ours, ids, skip=skip)) == expected
        assert not calls


def test_an_added_token_outside_the_byte_table_is_streamed_right(tmp_path) -> None:
    """A non-special added token with text the GPT-2 byte table does not hold ("¡", a space):
    whichever way the backend decodes it, the stream gives what decode gives."""
    directory = build_byte_level_bpe(tmp_path / "added")
    path = directory / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    new_id = max(token["id"] for token in data["added_tokens"]) + 1
    new_id = max(new_id, len(data["model"]["vocab"]))
    data["added_tokens"].append(
        {
            "id": new_id,
            "content": "¡hola mundo!",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": False,
        }
    )
    path.write_text(json.dumps(data), encoding="utf-8")
    tokenizer = Tokenizer.from_pretrained(directory)
    joined = tokenizer.token_bytes()[new_id].decode("utf-8", "replace")
    assert tokenizer.decodes_by_concatenation == (tokenizer.decode([new_id]) == joined)
    ids = tokenizer.encode("hi ", add_special_tokens=False) + [new_id] + [new_id]
    assert "".join(_stream(tokenizer, ids)) == tokenizer.decode(ids)


def test_a_byte_level_token_outside_the_byte_table_has_the_bytes_decode_gives(tmp_path) -> None:
    # "Ġ日": the ByteLevel decoder gives such a token its own UTF-8, whole ("Ġ" and all); the
    # byte table mapped "Ġ" to a space, so streams (and grammars) disagreed with decode.
    directory = build_byte_level_bpe(tmp_path / "odd")
    path = directory / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    new_id = max([*vocab.values(), *(t["id"] for t in data["added_tokens"])]) + 1
    vocab["Ġ日"] = new_id
    path.write_text(json.dumps(data), encoding="utf-8")
    tokenizer = Tokenizer.from_pretrained(directory)
    x = tokenizer.encode("x", add_special_tokens=False)
    ids = [new_id, *x, new_id]
    assert tokenizer.token_bytes()[new_id] == tokenizer.decode([new_id]).encode("utf-8")
    assert "".join(_stream(tokenizer, ids)) == tokenizer.decode(ids)


@pytest.mark.parametrize("kind", ["spm", "spm_legacy", "bytelevel", "llama_hub_json"])
def test_first_delta_keeps_its_leading_space_after_a_prompt(loaded, kind: str) -> None:
    ours, _ = loaded[kind]
    prompt = ours.encode("User: say hello\nAssistant:")
    output = ours.encode("Assistant: Hello world 😀 done", add_special_tokens=False)[
        len(ours.encode("Assistant:", add_special_tokens=False)) :
    ]
    deltas = _stream(ours, output, prompt=prompt)
    continuation = ours.decode(prompt + output)[len(ours.decode(prompt)) :]
    assert "".join(deltas) == continuation
    assert continuation.startswith(" Hello")
    if kind in STRIPS_LEADING_SPACE:
        assert ours.decode(output) == continuation[1:]  # decoding alone loses the space


def test_an_invalid_byte_after_a_prompt_ending_in_byte_pieces_is_one_replacement(loaded) -> None:
    # The decoder reads adjacent byte pieces as one run, and a run holding an invalid byte is all
    # U+FFFD: with the prompt's last character ("\n" as <0x0A> in Llama 2 chat prompts, "☃") in
    # the first window, an output starting with a lone lead byte was 2-4 U+FFFD instead of one.
    spm, _ = loaded["spm"]
    lead = _byte_piece_ids(spm, "🦄")[:1]
    for tail in ("\n", "☃", "ЖЖ"):
        prompt = spm.encode("Say") + _byte_piece_ids(spm, tail)
        for output in (lead, lead + spm.encode(" ok", add_special_tokens=False), lead * 3):
            assert "".join(_stream(spm, output, prompt=prompt)) == spm.decode(output)
    # A prompt of byte pieces alone keeps them as context: without, " done" lost its space.
    done = spm.encode(" done", add_special_tokens=False)
    for prompt in ([spm.bos_token_id, *_byte_piece_ids(spm, "\n")], _byte_piece_ids(spm, "☃")):
        assert "".join(_stream(spm, done, prompt=prompt)) == " done"


@pytest.mark.parametrize("kind", ["spm", "spm_legacy", "llama_hub_json", "bytelevel", "qwen2"])
def test_keep_first_space_without_prompt_text(loaded, kind: str) -> None:
    # A constrained request with no prompt text (an empty prompt, BOS alone): sentencepiece
    # decoding stripped the first token's space, which the grammar had counted (" yes" -> "yes").
    ours, _ = loaded[kind]
    output = ours.encode(" no way", add_special_tokens=False)
    for prompt in ([], [ours.bos_token_id] if ours.bos_token_id is not None else []):
        plain = "".join(_stream(ours, output, prompt=prompt))
        assert plain == ours.decode(output)
        assert "".join(_stream(ours, output, prompt=prompt, keep_first_space=True)) == " no way"


def test_output_after_a_prompt_ending_inside_a_character_is_decoded_alone(loaded) -> None:
    # A prompt of byte pieces alone was kept as context, and its dangling lead byte joined the
    # output's byte run: after [<s>, <0xC3>] "n" + "aïve" came out "� aïve", a constrained
    # choice "naïve café" came out "��ïve café". The output text is decode(output).
    spm, _ = loaded["spm"]
    ok = spm.encode(" ok", add_special_tokens=False)
    for prompt in (
        [spm.bos_token_id, *_byte_piece_ids(spm, "é")[:1]],
        [spm.bos_token_id, *_byte_piece_ids(spm, "€")[:2]],
        spm.encode("Say") + _byte_piece_ids(spm, "é")[:1],
    ):
        for output in (
            _byte_piece_ids(spm, "n") + spm.encode("aïve café", add_special_tokens=False),
            _byte_piece_ids(spm, "é") + ok,
            _byte_piece_ids(spm, "é")[1:] + ok,
        ):
            assert "".join(_stream(spm, output, prompt=prompt)) == spm.decode(output)
    # Byte-level BPE decoded in windows (special tokens kept) completed the prompt's lead byte
    # with the output's first byte: "é..." where decode(output), and the default path, give U+FFFD.
    bytelevel, _ = loaded["bytelevel"]
    table = bytelevel.token_bytes()
    single = {b[0]: i for i, b in enumerate(table) if len(b) == 1}
    prompt = bytelevel.encode("Say") + [single[0xC3]]
    output = [single[0xA9], *bytelevel.encode(" ok", add_special_tokens=False)]
    for skip in (True, False):
        assert "".join(_stream(bytelevel, output, prompt=prompt, skip=skip)) == "\ufffd ok"


def test_first_token_keeps_its_space_after_a_prompt_ending_in_byte_pieces(loaded) -> None:
    # The prompt context used to be the last 6 tokens minus a leading byte run: all of them here,
    # so it was empty and sentencepiece stripped the space of "▁done".
    spm, _ = loaded["spm"]
    for tail in ("ЖЖЖЖ", "🦄🦄", "Ж" * 40):
        prompt = spm.encode("Say") + _byte_piece_ids(spm, tail)
        output = spm.encode(" done now", add_special_tokens=False)
        expected = spm.decode(prompt + output)[len(spm.decode(prompt)) :]
        assert expected.startswith(" done")
        assert "".join(_stream(spm, output, prompt=prompt)) == expected


def test_detokenizer_decodes_a_bounded_window(loaded) -> None:
    ours, _ = loaded["spm"]
    ids = ours.encode(
        " ".join(["The quick brown fox jumps over the lazy dog 😀 日本語"] * 40),
        add_special_tokens=False,
    )
    with recorded_decodes(ours) as window_sizes:
        deltas = _stream(ours, ids)
    assert len(ids) > 400
    assert max(window_sizes) <= 16
    assert "".join(deltas) == ours.decode(ids)


def test_model_type_decides_how_a_llama_tokenizer_json_is_read(loaded) -> None:
    rebuilt, _ = loaded["llama_hub_json"]
    as_is, reference = loaded["mistral_hub_json"]
    assert type(reference).__name__ == "TokenizersBackend"
    assert type(loaded["llama_hub_json"][1]).__name__ == "LlamaTokenizer"
    # The hub file's legacy normalizer puts '▁' after special tokens; transformers 5's rebuild does not
    text = "<s>hello"
    assert as_is.encode(text, add_special_tokens=False) != rebuilt.encode(
        text, add_special_tokens=False
    )
    assert as_is.id_to_token(as_is.encode(text, add_special_tokens=False)[1]).startswith("▁")


@pytest.mark.parametrize("value", ["</s>", "41", [2, "x"], True, 2.5])
def test_token_ids_in_the_generation_config_must_be_ids(tmp_path: Path, value: Any) -> None:
    # A string was read character by character: "41" became eos ids [4, 1], "</s>" failed with
    # int()'s "invalid literal"; True was the id 1 and 2.5 "'float' object is not iterable".
    directory = build_byte_level_bpe(tmp_path / "tok")
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": value}))
    with pytest.raises(
        ValueError,
        match=r"generation_config.json: eos_token_id must be a token id or a list of token ids, "
        rf"got {re.escape(repr(value))}",
    ):
        Tokenizer.from_pretrained(directory)


def test_integral_float_token_ids_in_the_generation_config_are_ids(tmp_path: Path) -> None:
    directory = build_byte_level_bpe(tmp_path / "tok")
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [2.0, 3]}))
    assert Tokenizer.from_pretrained(directory).eos_token_ids[:2] == (2, 3)


def test_named_tokens_missing_from_the_file_get_transformers_ids(tmp_path) -> None:
    # They were appended in the config's key order (save_pretrained sorts the keys: pad before
    # unk), transformers appends bos, eos, unk, sep, pad, cls, mask: <unk> and <mask> swapped ids.
    directory = build_byte_level_bpe(tmp_path / "t")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("pad_token")
    config.update(pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")
    (directory / "tokenizer_config.json").write_text(json.dumps(dict(sorted(config.items()))))
    theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
    ours = Tokenizer.from_pretrained(directory)
    for token in ("<unk>", "<pad>", "<mask>"):
        assert ours.token_to_id(token) == theirs.convert_tokens_to_ids(token), token
    assert ours.encode("<mask> hi <unk>") == theirs.encode("<mask> hi <unk>")


def test_extra_special_tokens_of_the_config_and_the_map_are_both_kept(tmp_path) -> None:
    # Without added_tokens_decoder (the old layout), special_tokens_map.json's list replaced the
    # config's: "<extra1>" was encoded letter by letter.
    directory = build_byte_level_bpe(
        tmp_path / "t", config_overrides={"additional_special_tokens": ["<extra1>"]}
    )
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("added_tokens_decoder")
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "special_tokens_map.json").write_text(
        json.dumps({"extra_special_tokens": ["<extra2>"]})
    )
    theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
    ours = Tokenizer.from_pretrained(directory)
    text = "a <extra1> b <extra2> c"
    expected = theirs.encode(text, add_special_tokens=False)
    assert ours.encode(text, add_special_tokens=False) == expected
    assert len(expected) < len(theirs.encode("a extra1 b extra2 c", add_special_tokens=False))


@pytest.mark.parametrize(
    "config_extra, map_extra",
    [
        # transformers 5 keeps the config's list and reads the map's old key no more.
        ({"additional_special_tokens": ["<A>"]}, {"additional_special_tokens": ["<B>"]}),
        # A dict of named extras in the config, a list in the map: both.
        ({"extra_special_tokens": {"image_token": "<image>"}}, {"extra_special_tokens": ["<B>"]}),
    ],
)
def test_old_layout_extra_tokens_are_read_as_transformers_reads_them(
    tmp_path, config_extra, map_extra
) -> None:
    directory = build_byte_level_bpe(tmp_path / "t")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("added_tokens_decoder")
    config.update(config_extra)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "special_tokens_map.json").write_text(json.dumps(map_extra))
    theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
    ours = Tokenizer.from_pretrained(directory)
    for token in ("<A>", "<B>", "<image>"):
        assert ours.token_to_id(token) == theirs.get_vocab().get(token), token


@pytest.mark.parametrize("clean_up", [True, False])
def test_clean_up_tokenization_spaces_on_a_unigram_tokenizer_is_warned_of(
    tmp_path, caplog, clean_up
):
    # transformers removes spaces before punctuation on decode for tokenizers other than BPE when
    # tokenizer_config.json asks; brisklm decodes as the tokenizers library does, and says so.
    from tokenizers import Tokenizer as BackendTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = BackendTokenizer(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=60, special_tokens=["<unk>", "</s>"], unk_token="<unk>", show_progress=False
    )
    backend.train_from_iterator(["Hello , world . It 's ok ?"] * 20, trainer)
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>"}
    config["clean_up_tokenization_spaces"] = clean_up
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with caplog.at_level("WARNING", logger="brisklm.tokenizer_backend"):
        tokenizer = Tokenizer.from_pretrained(tmp_path)
    text = "Hello , world ."
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    warned = [r.getMessage() for r in caplog.records]
    assert bool(warned) == clean_up
    if clean_up:
        assert "clean_up_tokenization_spaces is true for this Unigram tokenizer" in warned[0]
