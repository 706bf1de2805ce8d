"""Shared pieces of the benchmarks: random Llama-shaped checkpoints, timing, bandwidth."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

# The benchmarks' timing of brisklm, as ``brisklm bench`` times it (generate returns once the
# tokens are on the host: no device sync is needed around it).
from brisklm.speed import measure, step_seconds  # noqa: F401
from brisklm.speed import time_generate as time_brisk  # noqa: F401

PRESETS = {
    # ~125M parameters: 12 layers of 768 wide, GQA 12/4, 32k vocabulary, untied head.
    "125m": dict(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
    # ~245M parameters: 16 layers of 1024, GQA 16/4, 32k vocabulary, untied head.
    "245m": dict(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
    # ~30M parameters (8M outside the embeddings), a draft for the 125M preset: its 6 layers of
    # 384 cost ~1/15 of the 125M model's per token, as Qwen2.5 0.5B does of 7B.
    "draft-30m": dict(
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=32000,
    ),
    "llama3-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    ),
}


# Presets of other families than Llama, for the benchmarks that take any preset through
# ``add_model_arguments``: the transformers classes and the config beyond the shape.
OTHER_FAMILY_PRESETS = {
    # Qwen3-0.6B's shape: 28 layers of 1024, GQA 16/8 with heads of 128 (q/k norms), a 151,936
    # vocabulary and a tied head.
    "qwen3-0.6b": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            tie_word_embeddings=True,
            rope_theta=1000000.0,
        ),
    ),
}


def write_checkpoint(
    directory: Path, preset: str, dtype: torch.dtype, full_vocab_tokenizer: bool = False
) -> None:
    """A random ``preset`` model in ``dtype`` and a byte-level BPE tokenizer, HF layout.

    The tokenizer has 291 tokens, far fewer than the model's ids (the engine then masks the
    others to -inf every step), unless ``full_vocab_tokenizer``: then it has one token per model
    id, as a trained model's tokenizer does, so a decode benchmark samples over the whole row the
    way it would with a real checkpoint (see ``full_vocab_bpe``)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    config_class, model_class, shape = OTHER_FAMILY_PRESETS.get(
        preset,
        (
            "LlamaConfig",
            "LlamaForCausalLM",
            {**PRESETS.get(preset, {}), "tie_word_embeddings": False},
        ),
    )
    config = getattr(transformers, config_class)(
        **shape, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2
    )
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = getattr(transformers, model_class)(config).to(dtype)
    model.save_pretrained(directory, safe_serialization=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer)
    if full_vocab_tokenizer:
        tok = full_vocab_bpe(config.vocab_size)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>"})
    )


def add_model_or_preset_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model DIR`` or ``--preset NAME`` (a random model of PRESETS' shapes); see
    ``model_directory``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--model", default=None, help="checkpoint directory (default: bundled)")
    group.add_argument(
        "--preset",
        default=None,
        choices=sorted({*PRESETS, *OTHER_FAMILY_PRESETS}),
        help="a random model of bench/common.py",
    )


def model_directory(args: argparse.Namespace, scratch: str) -> str:
    """The checkpoint ``add_model_or_preset_arguments``' flags name: ``--preset``'s random model
    (float32, a tokenizer of the model's whole vocabulary) written under ``scratch``, else
    ``--model``, else the bundled model."""
    if args.preset:
        directory = Path(scratch) / args.preset
        write_checkpoint(directory, args.preset, torch.float32, full_vocab_tokenizer=True)
        return str(directory)
    from brisklm.llm import default_model_path

    return args.model or str(default_model_path())


def full_vocab_bpe(vocab_size: int):
    """A byte-level BPE tokenizer of exactly ``vocab_size`` tokens (at least 259): three special
    tokens, the 256 byte symbols, then two-symbol tokens and, past 65,795, three-symbol ones, each
    with its merge."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for symbol in alphabet:
        vocab[symbol] = len(vocab)
    merges = []
    parts = list(alphabet)
    while len(vocab) < vocab_size:
        longer = []
        for first in parts:
            for second in alphabet:
                if len(vocab) >= vocab_size:
                    break
                vocab[first + second] = len(vocab)
                merges.append((first, second))
                longer.append(first + second)
        parts = longer
    if len(vocab) != vocab_size:
        raise ValueError(f"a byte-level BPE needs at least {len(vocab)} tokens, not {vocab_size}")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tok


# The most bytes a bandwidth reader's weight takes: past the last-level cache a larger one reads
# no slower (and a 16 GB model's copies would not fit a GPU several times over).
MAX_READER_BYTES = 4 << 30


def reader_rows(nbytes: int, dtype: torch.dtype) -> int:
    """Rows of 4,096 ``dtype`` elements that make a weight of about ``nbytes`` (at most
    ``MAX_READER_BYTES``; a multiple of 256 rows, at least 256)."""
    rows = min(nbytes, MAX_READER_BYTES) // (4096 * dtype.itemsize)
    return max(256, rows // 256 * 256)


def memory_bandwidth(device: torch.device, dtype: torch.dtype, nbytes: int) -> dict[str, float]:
    """Bytes/s that each way of reading a weight of about ``nbytes`` reaches on ``device``.

    The weight is as large as what it is compared with (a decode step's weights): how fast a read
    goes depends on how much of it the caches hold. On this project's 2-vCPU Xeon, whose last-level
    cache is 480 MB, the native kernels' single-token product read 58 GB/s from a 67 MB weight, 43
    from 268 MB, 38 from 419 MB and 34 from 1,074 MB (``bench/bandwidth_by_size.py``); sessions up
    to 42 read a 268 MB weight whatever the model, which for the 125M model's 400 MB step measured
    a roofline a DRAM-bound step cannot reach.

    Five readers of the same (rows, 4096) weight: F.linear with a (1, 4096) row on the row-major
    weight (transformers' layout) and on its column-major copy, oneDNN's packed-weight product
    (brisklm's CPU layout, where this machine supports it), a plain streaming ``sum``, and the
    same ``sum`` of a copy on huge pages where the machine gives them (where brisklm's native
    kernels keep their weights: ``brisklm.kernels.huge_pages``; 4 KB pages read 5-10% slower on
    this project's VMs). The sums read float32 of the same bytes whatever ``dtype`` is: torch's
    bfloat16 sum on an AVX2 CPU reads at three quarters of its float32 sum's rate, and the
    machine's bandwidth does not depend on the dtype. The roofline of a decode step is its weight
    bytes over the fastest.
    """
    from brisklm.kernels import huge_pages
    from brisklm.models import packed_weights

    weight = torch.randn(reader_rows(nbytes, dtype), 4096, device=device, dtype=dtype)
    x = torch.randn(1, 4096, device=device, dtype=dtype)
    stream = weight if dtype == torch.float32 else float32_stream(weight.nbytes, device)
    readers = {
        "F.linear, row-major weight": lambda: torch.nn.functional.linear(x, weight),
        "streaming sum": lambda: stream.sum(),
    }
    results: dict[str, float] = {}
    if device.type == "cpu":
        column_major = weight.t().contiguous().t()
        readers["F.linear, column-major weight"] = lambda: torch.nn.functional.linear(
            x, column_major
        )
        if packed_weights.packing_supported(dtype):
            packed = packed_weights.pack(weight)
            readers["oneDNN packed weight"] = lambda: packed_weights.packed_linear(x, packed, None)
        if huge_pages.available():
            on_huge_pages = float32_stream(weight.nbytes, device, on_huge_pages=True)
            readers["streaming sum, huge pages"] = lambda: on_huge_pages.sum()
    for name, read in readers.items():
        best = float("inf")
        for _ in range(15):
            start = now(device)
            for _ in range(5):
                read()
            best = min(best, (now(device) - start) / 5)
        results[name] = weight.numel() * weight.element_size() / best
    return results


def float32_stream(nbytes: int, device: torch.device, on_huge_pages: bool = False) -> torch.Tensor:
    """A float32 tensor of ``nbytes`` bytes to time streaming reads with (see ``memory_bandwidth``)."""
    from brisklm.kernels import huge_pages

    shape = (nbytes // 4 // 4096, 4096)
    if on_huge_pages:
        return huge_pages.empty(shape, torch.float32, device).normal_()
    return torch.randn(shape, device=device)


def sustained_bandwidth(
    read: Callable[[], object], nbytes: int, reads: int, device: torch.device
) -> float:
    """Bytes/s of ``reads`` calls of ``read`` (each reading ``nbytes``) back to back: a mean over a
    stretch as long as a decode run, the same statistic a decode run's tokens/s is
    (``memory_bandwidth`` keeps the fastest of many short samples instead)."""
    read()  # warm-up
    start = now(device)
    for _ in range(reads):
        read()
    return reads * nbytes / (now(device) - start)


def gemv_reader(
    nbytes: int, device: torch.device, dtype: torch.dtype
) -> tuple[Callable[[], object], int]:
    """torch's gemv of one row over a weight of about ``nbytes`` (``reader_rows``), the fastest of
    ``memory_bandwidth``'s readers here: F.linear on the column-major weight on CPU, on the
    row-major one elsewhere. On CPU the weight is float32 whatever ``dtype`` is: torch's half
    precision gemv there is bound by its arithmetic (0.4 GB/s in bfloat16 on an AVX2 CPU), not by
    the memory it reads. Returns the read and its bytes."""
    if device.type == "cpu":
        dtype = torch.float32
    weight = torch.randn(reader_rows(nbytes, dtype), 4096, device=device, dtype=dtype)
    if device.type == "cpu":
        weight = weight.t().contiguous().t()
    x = torch.randn(1, 4096, device=device, dtype=dtype)
    return (lambda: torch.nn.functional.linear(x, weight)), weight.numel() * weight.element_size()


def adjacent_readers(
    nbytes: int, device: torch.device, dtype: torch.dtype
) -> dict[str, tuple[Callable[[], object], int]]:
    """The reads a decode run is compared with right before it: torch's gemv (``gemv_reader``) and,
    on a CPU that gives huge pages, a streaming float32 ``sum`` of the same bytes on huge pages.
    Which one reads faster depends on the machine: the gemv on this project's AMX Xeon (the sum
    reads slower there), the sum on its Zen 4 (where torch's gemv reaches 23-26 GB/s of a
    ~37 GB/s sum). Returns each read and its bytes, by name."""
    from brisklm.kernels import huge_pages

    gemv, gemv_bytes = gemv_reader(nbytes, device, dtype)
    readers = {"gemv": (gemv, gemv_bytes)}
    if device.type == "cpu" and huge_pages.available():
        stream = float32_stream(gemv_bytes, device, on_huge_pages=True)
        readers["sum, huge pages"] = (lambda: stream.sum(), stream.numel() * 4)
    return readers


def now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def time_hf(model, prompts: list[list[int]], num_new: int, device: torch.device) -> float:
    ids = torch.tensor(prompts, device=device)
    start = now(device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=num_new,
        min_new_tokens=num_new,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
    )
    elapsed = now(device) - start
    assert out.shape[1] == ids.shape[1] + num_new
    return elapsed


def parse_checked(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """``parser.parse_args()``, with the mistakes a run would only crash on refused by argparse:
    a CUDA device where torch sees none, ``--new-tokens`` under 2 (a decode step is timed as the
    time of N new tokens less that of 1, over N - 1), and counts under 1 (``--rounds``,
    ``--repeats``, ``--batch``, ``--calls``, ``--steps``, ``--positions``)."""
    args = parser.parse_args()
    for name in ("rounds", "repeats", "batch", "calls", "steps", "positions"):
        count = getattr(args, name, None)
        if isinstance(count, int) and count < 1:
            parser.error(f"--{name} {count}: at least 1")
    device = str(getattr(args, "device", "cpu"))
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {device} needs a CUDA GPU, and torch sees none here")
    if getattr(args, "new_tokens", 2) < 2:
        parser.error(f"--new-tokens {args.new_tokens}: at least 2 (a step is timed between them)")
    return args


def add_rounds_arguments(parser: argparse.ArgumentParser, new_tokens: int) -> None:
    """``--preset`` (a random model of PRESETS' shapes; default: the bundled model),
    ``--new-tokens`` and ``--rounds``: the options of a benchmark that alternates its ways of
    decoding in rounds on one model."""
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), help="a random model (default: bundled)"
    )
    parser.add_argument("--new-tokens", type=int, default=new_tokens)
    parser.add_argument("--rounds", type=int, default=5)


def add_model_arguments(
    parser, preset: str, device: str, dtype: str, llama_only: bool = False
) -> None:
    """``--preset`` (a random model of PRESETS' shapes, and OTHER_FAMILY_PRESETS' unless
    ``llama_only``: a script that writes Llama checkpoints only), ``--device`` and ``--dtype``."""
    presets = PRESETS if llama_only else {**PRESETS, **OTHER_FAMILY_PRESETS}
    parser.add_argument("--preset", default=preset, choices=sorted(presets))
    parser.add_argument("--device", default=device)
    parser.add_argument("--dtype", default=dtype, choices=["float32", "bfloat16", "float16"])
