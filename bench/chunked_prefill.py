"""Chunked prefill against whole-prompt prefill (and transformers' prefill), in one run.

Both brisklm engines (prompts fed in chunks, the default 512 tokens per pass on CPU; each prompt
in one pass) and transformers' model are loaded side by side and run in this thread (the engines
stepped by hand), in rotating order, so that the machine's drift falls on all three alike.

Part 1, long prompts alone: tokens/s to the first token of a prompt of each length (best of
``--repeats``), and transformers' ``generate`` of one token on the same prompt.

Part 2, a long prompt arriving while another request decodes, each pass timed (medians over
``--repeats``): the decoding request's steady step time, its longest wait for a token while the
long prompt is fed (its worst inter-token gap), the tokens it gained meanwhile, and the long
prompt's time to its first token. With ``--draft-preset`` both engines decode speculatively with a
random draft model of that preset (part 2 only); the long request then generates 8 tokens, so the
steps after its prompt (where the draft model's cache holds it) count too.

    python bench/chunked_prefill.py                        # ~125M params, float32, CPU
    python bench/chunked_prefill.py --device cuda --dtype bfloat16 --chunk 1024 --preset 245m
    python bench/chunked_prefill.py --lengths 1024,2048 --arriving 2048 --repeats 2
    python bench/chunked_prefill.py --draft-preset draft-30m --lengths 1024 --no-transformers
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import PRESETS, parse_checked, write_checkpoint


def prompt(length: int, vocab: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(5, vocab, (length,), generator=generator).tolist()


def load(
    directory: Path, chunk: int, max_seq_len: int, device: str, dtype: str, draft: Path | None
):
    from brisklm import LLM

    return LLM.from_pretrained(
        directory,
        device=device,
        dtype=dtype,
        max_batch_size=2,
        max_seq_len=max_seq_len,
        prefill_chunk_size=chunk,
        draft=draft,
        show_progress=False,
        prefix_caching=False,  # repeated prompts: time their compute
    )


def first_token_seconds(llm, ids: list[int]) -> float:
    """One prompt alone, the engine stepped by hand until its first token."""
    from brisklm import SamplingParams

    request = llm.make_request(ids, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    start = time.perf_counter()
    llm.engine.add_request(request)
    while not request.is_finished:
        llm.engine.step()
    return time.perf_counter() - start


def hf_first_token_seconds(model, ids: list[int]) -> float:
    """transformers' generate of one token after the prompt."""
    tensor = torch.tensor([ids], device=model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            tensor,
            attention_mask=torch.ones_like(tensor),
            max_new_tokens=1,
            do_sample=False,
            pad_token_id=0,
        )
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)
    return time.perf_counter() - start


def arrival(llm, arriving: int, vocab: int, long_tokens: int) -> dict[str, float]:
    """Step the engine by hand: one request decodes, then a long prompt arrives; timed until the
    long request has ``long_tokens`` tokens."""
    from brisklm import SamplingParams

    engine = llm.engine
    decoding = llm.make_request(
        prompt(16, vocab, 1), SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
    )
    engine.add_request(decoding)
    steady = []
    for _ in range(12):
        start = time.perf_counter()
        engine.step()
        steady.append(time.perf_counter() - start)
    long_request = llm.make_request(
        prompt(arriving, vocab, 2),
        SamplingParams(temperature=0.0, max_tokens=long_tokens, ignore_eos=True),
    )
    engine.add_request(long_request)
    before = len(decoding.output_token_ids)
    gaps, started, last, ttft = [], time.perf_counter(), time.perf_counter(), 0.0
    emitted = before
    while not long_request.is_finished:
        engine.step()
        if not ttft and long_request.output_token_ids:
            ttft = time.perf_counter() - started
        if len(decoding.output_token_ids) > emitted:  # a speculative engine skips some passes
            now = time.perf_counter()
            gaps.append(now - last)
            last, emitted = now, len(decoding.output_token_ids)
    gaps.append(time.perf_counter() - last)
    gained = len(decoding.output_token_ids) - before
    engine.abort_request(decoding.request_id)
    return {
        "steady_ms": 1000 * sorted(steady[2:])[len(steady[2:]) // 2],
        "worst_gap_ms": 1000 * max(gaps),
        "tokens_meanwhile": gained,
        "ttft_s": ttft,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="125m", choices=sorted(PRESETS))
    parser.add_argument("--lengths", default="1024,2048,4000", help="prompt lengths for part 1")
    parser.add_argument("--arriving", type=int, default=2048, help="part 2's long prompt")
    parser.add_argument("--chunk", type=int, default=512, help="brisklm's prefill_chunk_size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument(
        "--draft-preset", choices=sorted(PRESETS), help="part 2 with speculative decoding"
    )
    args = parse_checked(parser)
    lengths = [int(x) for x in args.lengths.split(",")]
    max_seq_len = max(lengths + [args.arriving]) + 16
    machine = platform.processor() or platform.machine()
    if args.device.startswith("cuda"):
        machine = torch.cuda.get_device_name(args.device)
    print(f"machine: {machine}, {torch.get_num_threads()} threads, {args.dtype}")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        torch_dtype = getattr(torch, args.dtype)
        write_checkpoint(directory / "target", args.preset, torch_dtype)
        draft = None
        if args.draft_preset:
            draft = directory / "draft"
            write_checkpoint(draft, args.draft_preset, torch_dtype)
        long_tokens = 8 if draft else 1
        modes = {"chunked": args.chunk, "whole": max_seq_len}
        part1: dict[str, dict[int, float]] = {}
        part2: dict[str, dict[str, float]] = {}
        engines = {
            mode: load(directory / "target", chunk, max_seq_len, args.device, args.dtype, None)
            for mode, chunk in modes.items()
        }
        drafted = {}
        if draft:
            drafted = {
                mode: load(directory / "target", chunk, max_seq_len, args.device, args.dtype, draft)
                for mode, chunk in modes.items()
            }
        vocab = engines[
            "chunked"
        ].engine.num_real_tokens  # the bench tokenizer's, below the model's
        runners = {
            mode: (lambda ids, llm=llm: first_token_seconds(llm, ids))
            for mode, llm in engines.items()
        }
        if not args.no_transformers:
            import transformers

            hf = transformers.AutoModelForCausalLM.from_pretrained(
                directory / "target", dtype=torch_dtype
            )
            hf.to(args.device).eval()
            runners["transformers"] = lambda ids: hf_first_token_seconds(hf, ids)
        part1: dict[str, dict[int, float]] = {name: {} for name in runners}
        runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        for repeat in range(args.repeats):
            names = list(runners)
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for n in lengths:
                ids = prompt(n, vocab, n)
                for name in order:
                    seconds = runners[name](ids)
                    part1[name][n] = min(part1[name].get(n, float("inf")), seconds)
            for mode in order:
                if mode in engines:
                    llm = drafted.get(mode, engines[mode])
                    runs[mode].append(arrival(llm, args.arriving, vocab, long_tokens))
        for llm in [*engines.values(), *drafted.values()]:
            llm.close()
        part2 = {
            mode: {key: statistics.median(r[key] for r in results) for key in results[0]}
            for mode, results in runs.items()
        }
        hf = "transformers" in part1
    print(f"\npart 1: prompt alone, tokens/s to the first token (chunk {args.chunk})")
    header = f"{'tokens':>7}{'chunked':>10}{'whole':>10}{'ratio':>8}"
    if hf:
        header += f"{'transformers':>14}{'ratio':>8}"
    print(header)
    for n in lengths:
        chunked, whole = n / part1["chunked"][n], n / part1["whole"][n]
        line = f"{n:>7}{chunked:>10.0f}{whole:>10.0f}{chunked / whole:>7.2f}x"
        if hf:
            theirs = n / part1["transformers"][n]
            line += f"{theirs:>14.0f}{chunked / theirs:>7.2f}x"
        print(line)
    what = f", speculative with a {args.draft_preset} draft" if draft else ""
    print(
        f"\npart 2: a {args.arriving}-token prompt arrives while one request decodes{what} "
        f"(medians; until the long request has {long_tokens} token{'s' * (long_tokens > 1)})"
    )
    print(f"{'':<9}{'steady step':>12}{'worst gap':>11}{'tokens meanwhile':>18}{'long TTFT':>11}")
    for mode, r in part2.items():
        print(
            f"{mode:<9}{r['steady_ms']:>10.1f}ms{r['worst_gap_ms']:>9.0f}ms"
            f"{r['tokens_meanwhile']:>18.0f}{r['ttft_s']:>10.2f}s"
        )
    gap = part2["whole"]["worst_gap_ms"] / part2["chunked"]["worst_gap_ms"]
    ttft = part2["chunked"]["ttft_s"] / part2["whole"]["ttft_s"]
    print(f"worst gap: chunked {gap:.1f}x shorter; long prompt's TTFT chunked/whole {ttft:.2f}x")


if __name__ == "__main__":
    main()
