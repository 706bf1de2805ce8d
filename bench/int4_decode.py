"""Decode tokens/s and weight memory of one Llama-shaped model as float32, bfloat16 and GPTQ int4, in one run.

The int4 model is the float model quantized by `brisklm quantize --method rtn --group-size 128`
(round-to-nearest: quick to make, and the same checkpoint format and kernel as GPTQ), loaded by
LLM.from_pretrained like any GPTQ checkpoint. On CPU it runs through brisklm's native kernels
(float32 arithmetic) with its embedding table and head in bfloat16 ("int4") and in float32
("int4/f32-act"), and through PyTorch's int4 kernel, which computes in bfloat16, with bfloat16
activations ("int4/torch", `int4_compute_dtype="bfloat16"`: the default before the native
kernels took int4).

    python bench/int4_decode.py                              # ~245M params, CPU
    python bench/int4_decode.py --preset 125m --new-tokens 16 --repeats 2
    python bench/int4_decode.py --profile                    # also: torch.profiler table of int4 decode

Timing: best of --repeats, one variant at a time (each closed before the next loads, so no idle
engine's thread pool slows the running one); decode time per step = (time of N new tokens - time
of 1 new token) / (N - 1).
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import PRESETS, parse_checked, step_seconds, time_brisk, write_checkpoint


def tensor_bytes(module: torch.nn.Module) -> int:
    # Keyed by storage so tied tensors count once; packed CPU weights are opaque (no data_ptr).
    tensors = {
        id(t) if t.is_mkldnn else t.data_ptr(): t for t in [*module.parameters(), *module.buffers()]
    }
    return sum(t.numel() * t.element_size() for t in tensors.values())


def weight_bytes(model: torch.nn.Module) -> tuple[int, int, int]:
    """(bytes of the decoder layers' linears, bytes a decode step reads: every weight but the
    embedding table, bytes of all weights)."""
    linears = sum(
        tensor_bytes(module)
        for name, module in model.model.layers.named_modules()
        if name.endswith("_proj")
    )
    decode = tensor_bytes(model.model.layers) + tensor_bytes(model.model.norm)
    decode += tensor_bytes(model.lm_head)
    return linears, decode, decode + tensor_bytes(model.model.embed_tokens)


def decode_rates(
    runs: dict[str, Callable[[list[list[int]], int], float]],
    prompts: list[list[int]],
    num_new: int,
    repeats: int,
) -> dict[str, float]:
    """Decode tokens/s (all rows together) for each variant in ``runs``, interleaved round-robin."""
    first = {name: float("inf") for name in runs}
    full = {name: float("inf") for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            first[name] = min(first[name], run(prompts, 1))
            full[name] = min(full[name], run(prompts, num_new))
    return {name: len(prompts) / step_seconds(first[name], full[name], num_new) for name in runs}


def profile_decode(llm, prompt: list[int], num_steps: int) -> None:
    """torch.profiler over decode steps run on this thread (the engine's own thread is not traced)."""
    from torch.profiler import ProfilerActivity, profile

    from brisklm.engine.model_runner import ForwardBatch, ModelRunner

    runner = ModelRunner(llm.engine.model, 1, len(prompt) + num_steps + 1, "sdpa")
    token = int(runner.forward(ForwardBatch([0], [0], [prompt], [1]))[0].argmax())
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(num_steps):
            logits = runner.forward(ForwardBatch([0], [len(prompt) + step], [[token]], [1]))
            token = int(logits[0].argmax())
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="245m", choices=sorted(PRESETS))
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quantize-lm-head", action="store_true", help="int4 output layer too")
    parser.add_argument("--profile", action="store_true", help="profile int4 decode at batch 1")
    args = parse_checked(parser)

    from brisklm import LLM
    from brisklm.engine.scratch_thread import call_in_scratch_thread
    from brisklm.quant import QuantizeOptions, quantize_model

    if args.threads:
        torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    variants = {  # name -> (checkpoint, dtype, int4_compute_dtype)
        "float32": ("float", "float32", None),
        "bfloat16": ("float", "bfloat16", None),
        "int4": ("int4", "bfloat16", None),
        "int4/f32-act": ("int4", "float32", None),
        "int4/torch": ("int4", "bfloat16", "bfloat16"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {"float": Path(tmp) / "float", "int4": Path(tmp) / "int4"}
        dirs["float"].mkdir()

        def make_checkpoints() -> float:
            write_checkpoint(dirs["float"], args.preset, torch.bfloat16)
            start = time.perf_counter()
            options = QuantizeOptions(
                method="rtn", group_size=128, quantize_lm_head=args.quantize_lm_head
            )
            quantize_model(dirs["float"], dirs["int4"], options, show_progress=False)
            return time.perf_counter() - start

        # In a scratch thread, so this thread keeps no OpenMP pool to slow the engines down
        # (brisklm.engine.scratch_thread).
        quantize_s = call_in_scratch_thread(make_checkpoints)
        max_seq_len = args.prompt_len + args.new_tokens + 8
        batches = {
            batch: torch.randint(3, 250, (batch, args.prompt_len), generator=generator).tolist()
            for batch in args.batch_sizes
        }
        rates: dict[int, dict[str, float]] = {batch: {} for batch in args.batch_sizes}
        memory: dict[str, tuple[int, int, int]] = {}
        # One variant at a time, closed before the next loads: a live idle engine's thread pool
        # would slow the others down.
        for name, (kind, dtype, int4_compute_dtype) in variants.items():
            llm = LLM.from_pretrained(
                dirs[kind],
                device="cpu",
                dtype=dtype,
                int4_compute_dtype=int4_compute_dtype,
                max_batch_size=max(args.batch_sizes),
                max_seq_len=max_seq_len,
                show_progress=False,
                prefix_caching=False,  # repeated prompts: time their compute
            )
            memory[name] = weight_bytes(llm.engine.model)
            if name == "float32":
                params = sum(p.numel() for p in llm.engine.model.parameters())
            runs = {name: (lambda p, n, llm=llm: time_brisk(llm, p, n))}
            with torch.inference_mode():
                runs[name](batches[args.batch_sizes[0]][:1], 4)  # warm-up
                for batch in args.batch_sizes:
                    rates[batch].update(
                        decode_rates(runs, batches[batch], args.new_tokens, args.repeats)
                    )
                if args.profile and name in ("bfloat16", "int4", "int4/torch"):
                    print(f"--- profile: {name}, batch 1 decode")
                    profile_decode(llm, batches[args.batch_sizes[0]][0], 16)
            llm.close()

    print(
        f"machine: {platform.machine()} {platform.processor() or ''} torch {torch.__version__} "
        f"threads {torch.get_num_threads()} device cpu"
    )
    print(
        f"model: {args.preset} preset, {params / 1e6:.1f}M parameters; int4 = RTN g128 "
        f"(quantized in {quantize_s:.1f}s); prompt {args.prompt_len}, {args.new_tokens} new tokens"
    )
    mb = 1e6
    header = f"{'variant':<14}" + "".join(f"{f'decode b{b} tok/s':>18}" for b in args.batch_sizes)
    header += f"{'linears MB':>12}{'decode-read MB':>16}{'all MB':>9}"
    header += "".join(f"{f'b{b} vs bf16':>12}" for b in args.batch_sizes)
    print(header)
    for name in variants:
        row = f"{name:<14}" + "".join(f"{rates[b][name]:>18.1f}" for b in args.batch_sizes)
        row += f"{memory[name][0] / mb:>12.1f}{memory[name][1] / mb:>16.1f}{memory[name][2] / mb:>9.1f}"
        row += "".join(f"{rates[b][name] / rates[b]['bfloat16']:>11.2f}x" for b in args.batch_sizes)
        print(row)
    bf16, int4 = memory["bfloat16"], memory["int4"]
    head = "int4" if args.quantize_lm_head else "bfloat16"
    print(
        f"int4 vs bfloat16 weight memory: {bf16[0] / int4[0]:.2f}x less for the decoder linears, "
        f"{bf16[1] / int4[1]:.2f}x less for what a decode step reads (head in {head}), "
        f"{bf16[2] / int4[2]:.2f}x less in all (embedding table in bfloat16)"
    )


if __name__ == "__main__":
    main()
