"""Calibration data for GPTQ: a text file of samples -> N token sequences of L tokens.

A calibration file holds one sample per paragraph (blank-line separated) or, when it has no blank
lines, one per line. Each sample is tokenized with the model's tokenizer (with its BOS), the samples
are joined into one token stream, and N windows of L tokens are taken from it, spread evenly and
never overlapping. Without a file, brisklm uses a small built-in English text (``data/calibration.txt``,
written for brisklm: prose, dialogue in a User/Assistant form, code, JSON, SQL, numbers, a few
lines of French, German and Spanish). It is a few thousand tokens: enough for small models and
for trying things out; for the best quality pass text like what the model will be used on.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from brisklm.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

DEFAULT_CALIBRATION_FILE = Path(__file__).parent / "data" / "calibration.txt"
_BLANK_LINE = re.compile(r"\n[ \t]*\n")


def read_calibration_samples(path: str | Path | None = None) -> list[str]:
    """The samples of a calibration text file (default: the built-in text)."""
    source = Path(path) if path is not None else DEFAULT_CALIBRATION_FILE
    if source.is_dir():
        raise IsADirectoryError(
            f"calibration file {str(source)!r} is a directory: pass a text file (samples "
            "separated by blank lines)"
        )
    if not source.exists():  # not is_file(): a pipe (<(...), /dev/stdin) is read too
        raise FileNotFoundError(f"calibration file {str(source)!r} does not exist")
    try:
        text = source.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"calibration file {source} is not UTF-8 text ({exc})") from None
    text = text.replace("\r\n", "\n")
    pieces = _BLANK_LINE.split(text) if _BLANK_LINE.search(text) else text.split("\n")
    samples = [piece.strip() for piece in pieces if piece.strip()]
    if not samples:
        raise ValueError(f"calibration file {source} holds no text")
    return samples


def calibration_token_ids(
    tokenizer: Tokenizer, samples: list[str], num_samples: int, seq_len: int
) -> torch.Tensor:
    """int64 [n, L]: up to ``num_samples`` non-overlapping windows of ``seq_len`` tokens.

    Fewer windows (logged) when the text is short; a text shorter than ``seq_len`` gives one
    window of all its tokens.
    """
    if num_samples < 1 or seq_len < 1:
        raise ValueError(f"num_samples and seq_len must be >= 1, got {num_samples} and {seq_len}")
    stream: list[int] = []
    for sample in samples:
        stream.extend(tokenizer.encode(sample, add_special_tokens=True))
    if len(stream) < 2:
        raise ValueError("the calibration text encodes to fewer than 2 tokens")
    if len(stream) < seq_len:
        logger.warning(
            "calibration text has %d tokens, fewer than seq_len=%d: using one sequence of %d",
            len(stream),
            seq_len,
            len(stream),
        )
        seq_len = len(stream)
    available = len(stream) // seq_len
    count = min(num_samples, available)
    if count < num_samples:
        logger.warning(
            "calibration text has %d tokens: %d sequences of %d instead of %d "
            "(pass a longer text with --calibration for better quality)",
            len(stream),
            count,
            seq_len,
            num_samples,
        )
    # Evenly spread starts: consecutive starts are at least seq_len apart since count <= available.
    span = len(stream) - seq_len
    starts = [round(i * span / (count - 1)) if count > 1 else 0 for i in range(count)]
    return torch.tensor([stream[s : s + seq_len] for s in starts], dtype=torch.int64)
