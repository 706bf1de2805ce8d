"""Builds tiny tokenizers in Hugging Face layout (byte-level BPE, Qwen2-style, sentencepiece) for tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CORPUS_LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! Hello, World. hello there, how are you today?",
    "She sells sea shells by the sea shore; the shells she sells are surely sea shells.",
    "Ça va ? Très bien, merci. Une naïve café au lait, résumé de la journée.",
    "Die Straße ist über dem Fluss. Grüße aus München und Köln.",
    "日本語のテキストです。東京は日本の首都です。",
    "中文文本测试。我们正在测试分词器。",
    "한국어 텍스트입니다. 안녕하세요.",
    "Emoji: 😀 🎉 👍 and more 😀😀 party 🎉",
    "def add(x, y):\n    return x + y\n\nprint(add(1, 2))",
    "  leading spaces, trailing spaces   and\ttabs\tbetween words",
    "numbers 12345 67890 3.14159 2024-01-31 and symbols !@#$%^&*()",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "The assistant calls tools and the user reads the answer.",
]

TRICKY_STRINGS = [
    "",
    " ",
    "   ",
    "hello",
    " hello",
    "hello ",
    "  two  spaces  inside  ",
    "Hello, World!",
    "\n",
    "line one\nline two\r\nline three\n\n",
    "\ttabbed\ttext",
    "naïve café résumé",
    "cafe\u0301 decomposed, digits 12345 and 2024",  # NFC and one-digit pieces in Qwen2's pipeline
    "Ça va? Straße über Köln",
    "日本語のテキスト",
    "中文测试 mixed with English",
    "한국어",
    "emoji 😀🎉 👍🏽 family 👨‍👩‍👧 end",
    "rare letters Ωψж and 🦀 ☃ ⅞",
    "<s>bos written in the text",
    "text that ends with eos</s>",
    "<|im_start|>user\nhi there<|im_end|>\n",
    "a<s> b</s>c",
    '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
    "numbers 1234567 and 3.14159",
    "def f(x):\n    return x + 1\n",
    "▁literal metaspace ▁ chars",
    "<0x41> looks like a byte piece",
    "mixed 日本 and English 😀 with trailing space ",
]


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")


def _added_tokens_decoder(tokenizer: Any) -> dict[str, dict[str, Any]]:
    return {
        str(token_id): {
            "content": token.content,
            "lstrip": token.lstrip,
            "normalized": token.normalized,
            "rstrip": token.rstrip,
            "single_word": token.single_word,
            "special": token.special,
        }
        for token_id, token in tokenizer.get_added_tokens_decoder().items()
    }


def build_byte_level_bpe(
    directory: Path,
    *,
    qwen_style: bool = False,
    config_overrides: dict[str, Any] | None = None,
    generation_config: dict[str, Any] | None = None,
) -> Path:
    """Llama-3-style byte-level BPE (bos added by a TemplateProcessing), or Qwen2-style (NFC, no bos)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    directory.mkdir(parents=True, exist_ok=True)
    specials = (
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        if qwen_style
        else ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    )
    tokenizer = Tokenizer(models.BPE())
    if qwen_style:
        tokenizer.normalizer = normalizers.NFC()
    pattern = QWEN2_PATTERN if qwen_style else LLAMA3_PATTERN
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=520,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS_LINES * 3, trainer)
    # Qwen2.5 keeps its tool-call tags as added but not special, so they survive skip_special_tokens
    tokenizer.add_tokens(
        [AddedToken("<tool_call>", normalized=False), AddedToken("</tool_call>", normalized=False)]
    )
    if qwen_style:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        bos_id = tokenizer.token_to_id("<s>")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
        )
    tokenizer.save(str(directory / "tokenizer.json"))
    if qwen_style:
        config: dict[str, Any] = {
            "tokenizer_class": "Qwen2Tokenizer",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        }
    else:
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "pad_token": "<pad>",  # not in tokenizer.json: added at the end, as transformers does
        }
    config["added_tokens_decoder"] = _added_tokens_decoder(tokenizer)
    config.update(config_overrides or {})
    _write_json(directory / "tokenizer_config.json", config)
    if generation_config is not None:
        _write_json(directory / "generation_config.json", generation_config)
    return directory


def build_sentencepiece(
    directory: Path,
    *,
    config_overrides: dict[str, Any] | None = None,
    generation_config: dict[str, Any] | None = None,
) -> Path:
    """Llama-2-style sentencepiece BPE with byte fallback: tokenizer.model + LlamaTokenizer config."""
    import sentencepiece

    directory.mkdir(parents=True, exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS_LINES * 3),
        model_prefix=str(directory / "tokenizer"),
        vocab_size=700,
        model_type="bpe",
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        byte_fallback=True,
        character_coverage=0.995,
        hard_vocab_limit=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    (directory / "tokenizer.vocab").unlink()
    config: dict[str, Any] = {
        "tokenizer_class": "LlamaTokenizer",
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": {
            "__type": "AddedToken",
            "content": "<s>",
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
        },
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "legacy": False,
    }
    config.update(config_overrides or {})
    _write_json(directory / "tokenizer_config.json", config)
    _write_json(
        directory / "generation_config.json",
        generation_config or {"bos_token_id": 1, "eos_token_id": 2},
    )
    return directory


def build_llama_hub_json(directory: Path, sentencepiece_dir: Path) -> Path:
    """A Llama-2 hub-style tokenizer.json (legacy Prepend/Replace normalizer) with a LlamaTokenizer config
    that leaves `legacy` unset: transformers 5 rebuilds it with the non-legacy Metaspace."""
    from tokenizers import normalizers
    from transformers import AutoTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    backend = AutoTokenizer.from_pretrained(sentencepiece_dir, legacy=True).backend_tokenizer
    backend.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    backend.pre_tokenizer = None
    backend.save(str(directory / "tokenizer.json"))
    _write_json(
        directory / "tokenizer_config.json",
        {
            "tokenizer_class": "LlamaTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "add_bos_token": True,
            "add_eos_token": False,
        },
    )
    _write_json(directory / "generation_config.json", {"bos_token_id": 1, "eos_token_id": [2]})
    return directory
