"""A tiny random checkpoint with a trained byte-level BPE tokenizer and a chat template, on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.hf_models import build_hf_model, save_hf_model

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! How are you today? I am fine, thank you.",
    "Zürich, São Paulo and Kraków are cities; 東京 and 北京 too. Emoji: 🙂🚀",
    "def add(a, b):\n    return a + b\n",
    '{"name": "Ada", "age": 36, "tags": ["x", "y"]}',
]

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(vocab_size: int = 400) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tokenizer


def make_tiny_checkpoint(
    directory: Path, family: str = "llama", seed: int = 0, **overrides: Any
) -> Path:
    """Write model + tokenizer files; the model's vocabulary is padded past the tokenizer's."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "unk_token": "<unk>",
        "chat_template": CHATML_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    eos = tokenizer.token_to_id("<|im_end|>")
    settings = {
        "vocab_size": tokenizer.get_vocab_size() + 16,
        "bos_token_id": tokenizer.token_to_id("<s>"),
        "eos_token_id": eos,
        "max_position_embeddings": 512,
        "initializer_range": 0.1,
        **overrides,
    }
    model = build_hf_model(family, seed=seed, **settings)
    save_hf_model(model, directory)
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": settings["bos_token_id"], "eos_token_id": [eos]})
    )
    return directory
