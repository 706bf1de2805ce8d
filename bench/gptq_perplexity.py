"""Held-out perplexity of one model as float32, bfloat16, GPTQ int4 and RTN int4, in one run.

    python bench/gptq_perplexity.py --model src/brisklm/assets/brisk-chat --text held_out.txt
    python bench/gptq_perplexity.py --model DIR --text held_out.txt --calibration calib.txt \\
        --group-size 128 --act-order --num-samples 128 --seq-len 512

The model is quantized here with `brisklm quantize` (GPTQ and RTN, same group size and symmetry);
calibration comes from --calibration or the built-in text, and must not overlap --text. The text is
encoded once, cut into windows of --eval-seq-len tokens (each after a BOS when the tokenizer has
one), and every token after the first of each window is scored. The int4 models run as loaded by
default (bfloat16 kernel under float32 activations); --int4-compute-dtype float32 isolates the
quantization error from the kernel's bfloat16 rounding.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F


def eval_windows(tokenizer, text: str, window: int, max_tokens: int | None) -> list[list[int]]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if max_tokens is not None:
        ids = ids[:max_tokens]
    bos = tokenizer.bos_token_id
    body = window - 1 if bos is not None else window
    windows = []
    for start in range(0, len(ids), body):
        chunk = ids[start : start + body]
        if len(chunk) >= 2 or (bos is not None and chunk):
            windows.append(([bos] if bos is not None else []) + chunk)
    if not windows:
        raise ValueError("the evaluation text is too short: it encodes to fewer than 2 tokens")
    return windows


@torch.inference_mode()
def perplexity(model, windows: list[list[int]]) -> tuple[float, int]:
    """exp(mean negative log-likelihood) over every predicted token, and the number of them."""
    from brisklm.engine.model_runner import ForwardBatch, ModelRunner

    runner = ModelRunner(
        model, num_slots=1, max_seq_len=max(len(w) for w in windows), attention_backend="sdpa"
    )
    total, count = 0.0, 0
    for ids in windows:
        logits = runner.forward(ForwardBatch([0], [0], [ids], [len(ids)]))  # (T, V) float32
        targets = torch.tensor(ids[1:], device=logits.device)
        total += float(F.cross_entropy(logits[:-1], targets, reduction="sum"))
        count += len(ids) - 1
    return math.exp(total / count), count


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="float checkpoint directory")
    parser.add_argument("--text", required=True, help="held-out evaluation text file (UTF-8)")
    parser.add_argument("--calibration", default=None, help="calibration text (default: built-in)")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--act-order", action="store_true")
    parser.add_argument("--asym", action="store_true", help="asymmetric zero points")
    parser.add_argument("--num-samples", type=int, default=128, help="calibration sequences")
    parser.add_argument("--seq-len", type=int, default=512, help="calibration sequence length")
    parser.add_argument("--eval-seq-len", type=int, default=512, help="evaluation window length")
    parser.add_argument("--max-eval-tokens", type=int, default=None)
    parser.add_argument(
        "--int4-compute-dtype", default=None, choices=["float32", "bfloat16", "float16"]
    )
    parser.add_argument("--keep", default=None, help="write the quantized checkpoints here")
    args = parser.parse_args(argv)

    from brisklm.loader import load_model
    from brisklm.quant import GPTQConfig, QuantizeOptions, gptq_linear_factory, quantize_model
    from brisklm.tokenizer import Tokenizer

    model_dir = Path(args.model)
    tokenizer = Tokenizer.from_pretrained(model_dir)
    windows = eval_windows(
        tokenizer,
        Path(args.text).read_text(encoding="utf-8"),
        args.eval_seq_len,
        args.max_eval_tokens,
    )
    compute_dtype = getattr(torch, args.int4_compute_dtype) if args.int4_compute_dtype else None
    results: dict[str, float] = {}
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out_root = Path(args.keep) if args.keep else Path(tmp)
        for dtype in ("float32", "bfloat16"):
            model = load_model(model_dir, device="cpu", dtype=dtype, show_progress=False)
            results[dtype], num_tokens = perplexity(model, windows)
            del model
        for method in ("gptq", "rtn"):
            options = QuantizeOptions(
                method=method,
                group_size=args.group_size,
                sym=not args.asym,
                act_order=args.act_order and method == "gptq",
                num_samples=args.num_samples,
                seq_len=args.seq_len,
            )
            out = out_root / f"{model_dir.name}-{method}-g{args.group_size}"
            start = time.perf_counter()
            quantize_model(model_dir, out, options, calibration=args.calibration)
            seconds[method] = time.perf_counter() - start
            factory = gptq_linear_factory(
                GPTQConfig.from_pretrained(out), "cpu", compute_dtype=compute_dtype
            )
            model = load_model(
                out, device="cpu", dtype="float32", make_linear=factory, show_progress=False
            )
            results[method], _ = perplexity(model, windows)
            del model

    base = results["float32"]
    kernel = args.int4_compute_dtype or "bfloat16 (default)"
    print(
        f"model {model_dir}; {num_tokens} scored tokens in {len(windows)} windows of up to "
        f"{args.eval_seq_len}; int4 g{args.group_size} {'asym' if args.asym else 'sym'}"
        f"{' act-order (GPTQ)' if args.act_order else ''}, int4 kernel dtype {kernel}"
    )
    print(f"{'variant':<10}{'perplexity':>12}{'vs float32':>12}{'quantize s':>12}")
    for name, value in results.items():
        quantize_s = f"{seconds[name]:.1f}" if name in seconds else "-"
        print(f"{name:<10}{value:>12.4f}{value / base - 1:>+11.2%}{quantize_s:>12}")
    return results


if __name__ == "__main__":
    main()
