"""Train brisk's byte-level BPE tokenizer (``tokenizers`` library) on the generated training text.

Writes ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat template, bos/eos/pad) into
``--out``. Ids 0..2 are ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` (special); 3..4 are
``<tool_call>``, ``</tool_call>`` (added, not special, so decoding keeps them).

    python -m training.train_tokenizer --data training/out/data/train.jsonl --out training/out/tokenizer
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from training.chat_format import (
    ADDED_TOKENS,
    CHAT_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    SPECIAL_TOKENS,
    render,
)

# Split into letter runs (never glued to a space or a quote), single digits, punctuation runs (with
# one leading space), newlines and spaces; then byte-level, so any unicode string round-trips.
# A word is the same tokens wherever it stands: ` Zürich` in a request and `"Zürich` in JSON share
# the tokens of `Zürich`, and `hive id` / `hive_id` share those of `hive` and `id`, so copying a
# value from the prompt is a token-for-token copy (GPT-2/Qwen2 splits glue the space or quote to
# the word, which a small model must learn to translate). Digits are single tokens for the same reason.
SPLIT_PATTERN = r"\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def sample_text(sample: dict) -> str:
    if sample["kind"] == "prose":
        return sample["text"]
    return render(sample["messages"], sample.get("tools"))


def iter_texts(path: Path, limit: int) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= limit:
                break
            yield sample_text(json.loads(line))


def build_tokenizer(vocab_size: int, texts: Iterator[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Special tokens are matched before pre-tokenization, so they never take part in merges.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def tokenizer_config() -> dict:
    added = {}
    for i, t in enumerate(SPECIAL_TOKENS + ADDED_TOKENS):
        added[str(i)] = {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in SPECIAL_TOKENS,
        }
    return {
        "added_tokens_decoder": added,
        "additional_special_tokens": [],
        "bos_token": ENDOFTEXT,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1024,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", type=Path, default=Path("training/out/data/train.jsonl"))
    ap.add_argument("--out", type=Path, default=Path("training/out/tokenizer"))
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--num-samples", type=int, default=30_000)
    args = ap.parse_args()
    # (the trainer keeps the byte alphabet and the tags whatever it is asked for)
    smallest = len(pre_tokenizers.ByteLevel.alphabet()) + len(SPECIAL_TOKENS + ADDED_TOKENS)
    if args.vocab_size < smallest:
        ap.error(f"--vocab-size {args.vocab_size}: at least {smallest} (bytes and tags)")
    if args.num_samples < 1:
        ap.error(f"--num-samples {args.num_samples}: at least 1")
    if not args.data.is_file():
        ap.error(f"no such file: {args.data} (--data names a training.generate_data train.jsonl)")
    tok = build_tokenizer(args.vocab_size, iter_texts(args.data, args.num_samples))
    ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS + ADDED_TOKENS]
    assert ids == list(range(len(ids))), ids
    args.out.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out / "tokenizer.json"))
    with open(args.out / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(), f, ensure_ascii=False, indent=2)
    with open(args.out / "special_tokens_map.json", "w", encoding="utf-8") as f:
        json.dump(
            {"bos_token": ENDOFTEXT, "eos_token": IM_END, "pad_token": ENDOFTEXT}, f, indent=2
        )
    print(f"tokenizer: vocab {tok.get_vocab_size()} -> {args.out}")


if __name__ == "__main__":
    main()
