"""brisklm vs transformers' generate on the same random Llama-shaped model, in one run.

Prints prefill tokens/s, decode tokens/s at batch 1 and 8, their ratios, and the memory roofline
(weight bytes read per decode step over the best memory bandwidth measured in this same run: F.linear
on row- and column-major weights, oneDNN's packed weights, a streaming sum on 4 KB pages and on huge
pages, each reading a weight as large as a decode step's, up to 4 GB). Then brisklm's batch-1 decode
again, each run between sustained reads of as many bytes (torch's gemv, and a streaming sum on huge
pages where the machine gives them; mean against mean), as the share of the faster one, and the
median over the runs whose reads before and after agree (the bandwidth held through the run).

    python bench/engine_vs_transformers.py                       # ~125M params, float32, CPU
    python bench/engine_vs_transformers.py --device cuda --dtype bfloat16 --preset llama3-8b
"""

from __future__ import annotations

import argparse
import platform
import tempfile
from pathlib import Path

import torch
from common import (
    add_model_arguments,
    adjacent_readers,
    measure,
    memory_bandwidth,
    parse_checked,
    reader_rows,
    step_seconds,
    sustained_bandwidth,
    time_brisk,
    time_hf,
    write_checkpoint,
)

# A decode run's roofline counts as steady when the reads before and after it are within 10%.
STEADY = 0.9


def decode_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every weight a decode step reads: all but the embedding table (one row of it is read)."""
    total = 0
    for name, param in model.named_parameters():
        if "embed_tokens" in name:
            continue
        total += param.numel() * param.element_size()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_arguments(parser, preset="125m", device="cpu", dtype="float32")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--prefill-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--adjacent-runs",
        type=int,
        default=8,
        help="batch-1 decode runs each between two sustained reads (the last part of the output)",
    )
    parser.add_argument(
        "--no-cuda-graphs", action="store_true", help="run brisklm's CUDA decode steps eagerly"
    )
    args = parse_checked(parser)

    import transformers

    from brisklm import LLM
    from brisklm.engine.scratch_thread import call_in_scratch_thread

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(0)

    def prompts(batch: int, length: int) -> list[list[int]]:
        return torch.randint(3, 250, (batch, length), generator=generator).tolist()

    def measure_all(run) -> dict[str, float]:
        with torch.inference_mode():
            run(prompts(1, 16), 4)  # warm-up
            prefill_s = min(run(prompts(1, args.prefill_len), 1) for _ in range(args.repeats))
            _, step1 = measure(run, prompts(1, args.prompt_len), args.new_tokens, args.repeats)
            _, step8 = measure(run, prompts(8, args.prompt_len), args.new_tokens, args.repeats)
        return {
            "prefill_tok_s": args.prefill_len / prefill_s,
            "decode_b1_tok_s": 1 / step1,
            "decode_b8_tok_s": 8 / step8,
        }

    def adjacent_roofline_ratios(
        run, prompt: list[list[int]], step_bytes: int
    ) -> list[tuple[float, str, bool, float, float]]:
        """Batch-1 decode against a roofline measured right before and right after each decode run,
        each read over a stretch about as long (this VM's bandwidth flips between regimes within
        seconds, so a roofline sampled elsewhere in the run can belong to another regime); all are
        means over their stretch. The roofline is the faster of ``adjacent_readers``' reads
        (torch's gemv, a streaming sum on huge pages), each sustained over as many bytes as the
        decode run reads, averaged over the reads before and after the run (the read after a run is
        the read before the next). Returns (ratio, the faster reader's name, steady, decode
        tokens/s, the reader's bytes/s) per run, steady when the faster reader's two reads are
        within ``STEADY`` of each other: the regime held through the run."""
        readers = call_in_scratch_thread(lambda: adjacent_readers(step_bytes, device, dtype))

        def read_rates() -> dict[str, float]:
            return call_in_scratch_thread(
                lambda: {
                    name: sustained_bandwidth(
                        read, nbytes, max(8, int(args.new_tokens * step_bytes / nbytes)), device
                    )
                    for name, (read, nbytes) in readers.items()
                }
            )

        ratios = []
        with torch.inference_mode():
            before = read_rates()
            for _ in range(args.adjacent_runs):
                first = run(prompt, 1)
                step = step_seconds(first, run(prompt, args.new_tokens), args.new_tokens)
                after = read_rates()
                mean = {name: (before[name] + after[name]) / 2 for name in before}
                fastest = max(mean, key=mean.__getitem__)
                pair = sorted((before[fastest], after[fastest]))
                steady = pair[0] >= STEADY * pair[1]
                ratios.append(
                    (step_bytes / step / mean[fastest], fastest, steady, 1 / step, mean[fastest])
                )
                before = after
        return ratios

    # One engine at a time, each as its users run it: brisklm computes on its engine thread,
    # transformers on this one. brisklm is closed first, so its thread's OpenMP pool is gone when
    # transformers runs (two live pools make libgomp put idle workers to sleep: see
    # brisklm.engine.scratch_thread); the checkpoint is written in a scratch thread for the same reason.
    # This VM's memory bandwidth swings (47-90 GB/s between runs seen here): it is measured before,
    # between and after the two engines (in scratch threads, like the checkpoint), best kept.
    bandwidths: dict[str, float] = {}

    def sample_bandwidth(step_bytes: int) -> None:
        for reader, value in call_in_scratch_thread(
            lambda: memory_bandwidth(device, dtype, step_bytes)
        ).items():
            bandwidths[reader] = max(value, bandwidths.get(reader, 0.0))

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        call_in_scratch_thread(
            lambda: write_checkpoint(directory, args.preset, dtype, full_vocab_tokenizer=True)
        )
        llm = LLM.from_pretrained(
            directory,
            device=args.device,
            dtype=args.dtype,
            max_batch_size=8,
            max_seq_len=max(args.prefill_len, args.prompt_len) + args.new_tokens + 8,
            show_progress=False,
            cuda_graphs=not args.no_cuda_graphs,
            prefix_caching=False,  # repeated prompts: time their compute, as transformers'
        )
        step_bytes = decode_weight_bytes(llm.engine.model)
        sample_bandwidth(step_bytes)
        results["brisklm"] = measure_all(lambda p, n: time_brisk(llm, p, n))
        adjacent = adjacent_roofline_ratios(
            lambda p, n: time_brisk(llm, p, n), prompts(1, args.prompt_len), step_bytes
        )
        llm.close()
        sample_bandwidth(step_bytes)
        hf = (
            transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
            .to(device)
            .eval()
        )
        results["transformers"] = measure_all(lambda p, n: time_hf(hf, p, n, device))
    sample_bandwidth(step_bytes)
    bandwidth = max(bandwidths.values())
    roofline = bandwidth / step_bytes

    params = sum(p.numel() for p in hf.parameters())
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} torch {torch.__version__} "
        f"threads {torch.get_num_threads()} device {args.device} dtype {args.dtype}"
    )
    print(
        f"model: {args.preset} preset, {params / 1e6:.1f}M parameters, {step_bytes / 1e6:.0f} MB read per decode step"
    )
    reader_mb = reader_rows(step_bytes, dtype) * 4096 * dtype.itemsize / 1e6
    for reader, value in bandwidths.items():
        print(f"bandwidth, {reader} ({reader_mb:.0f} MB): {value / 1e9:.1f} GB/s")
    print(
        f"best bandwidth {bandwidth / 1e9:.1f} GB/s -> roofline {roofline:.1f} decode tokens/s at batch 1"
    )
    print(f"{'metric':<18}{'brisklm':>12}{'transformers':>14}{'ratio':>8}")
    for metric in ("prefill_tok_s", "decode_b1_tok_s", "decode_b8_tok_s"):
        ours, theirs = results["brisklm"][metric], results["transformers"][metric]
        print(f"{metric:<18}{ours:>12.1f}{theirs:>14.1f}{ours / theirs:>7.2f}x")
    b1 = results["brisklm"]["decode_b1_tok_s"]
    print(
        f"brisklm batch-1 decode = {100 * b1 / roofline:.0f}% of roofline; "
        f"transformers = {100 * results['transformers']['decode_b1_tok_s'] / roofline:.0f}%"
    )
    shown = ", ".join(
        f"{100 * r:.0f}%{'' if steady else '*'} ({tok_s:.1f} tokens/s, {name} {rate / 1e9:.1f} GB/s)"
        for r, name, steady, tok_s, rate in adjacent
    )
    print(
        "brisklm batch-1 decode against the faster of torch's gemv and a streaming sum on huge "
        f"pages, sustained just before and just after each run (* the two reads differ by more "
        f"than {100 * (1 - STEADY):.0f}%: the bandwidth changed during the run): {shown}"
    )
    steady = sorted(r for r, _, ok, _, _ in adjacent if ok)
    if steady:
        print(
            f"runs in a steady bandwidth regime: {len(steady)} of {len(adjacent)}, median "
            f"{100 * steady[len(steady) // 2]:.0f}%, lowest {100 * steady[0]:.0f}%"
        )
    else:
        print(f"runs in a steady bandwidth regime: none of {len(adjacent)}")


if __name__ == "__main__":
    main()
