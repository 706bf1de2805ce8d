"""Sampled decoding end to end: brisklm with its native sampler (``sampler.native_draws``, one C
pass a step), brisklm with the torch ops it replaced, and transformers' ``generate(do_sample=True)``
on the same model, in one run.

A sampled token's time is the forward pass plus the sampling step, and on a small model the step
weighs: the bundled model's pass takes ~0.4 ms on 2 vCPUs. Each round times every sampling setting
three ways, in alternating order: a 128-token prompt, then ``--new-tokens`` tokens (the time of a
one-token call subtracted, so prefill is left out), median of ``--rounds`` rounds; greedy decoding
is the floor. brisklm's torch-ops way is the same engine with ``native_draws`` returning None (what
it does where the kernels do not build).

    python bench/sampled_decode.py                        # the bundled model
    python bench/sampled_decode.py --preset 125m          # a random 125M Llama, 32k vocabulary
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import add_rounds_arguments, parse_checked, write_checkpoint

SETTINGS = {
    "greedy": dict(temperature=0.0),
    "temperature 0.7": dict(temperature=0.7),
    "top-p 0.9": dict(temperature=0.7, top_p=0.9),
    "top-k 40": dict(temperature=1.0, top_k=40),
    "min-p 0.05": dict(temperature=0.8, min_p=0.05),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_rounds_arguments(parser, new_tokens=96)
    args = parse_checked(parser)

    import transformers

    from brisklm import LLM, SamplingParams
    from brisklm.engine.scratch_thread import call_in_scratch_thread
    from brisklm.llm import default_model_path
    from brisklm.sampling import sampler

    native_draws = sampler.native_draws
    prompt = torch.randint(3, 250, (128,), generator=torch.Generator().manual_seed(0)).tolist()

    def brisk_decode(llm, fields: dict) -> float:
        one = SamplingParams(max_tokens=1, ignore_eos=True, seed=1, **fields)
        many = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True, seed=1, **fields)
        start = time.perf_counter()
        llm.generate([prompt], one)
        first = time.perf_counter() - start
        start = time.perf_counter()
        llm.generate([prompt], many)
        return (time.perf_counter() - start - first) / (args.new_tokens - 1)

    def hf_decode(model, fields: dict) -> float:
        ids = torch.tensor([prompt])
        sampling = fields["temperature"] > 0
        options = dict(do_sample=sampling, pad_token_id=0, eos_token_id=None)
        if sampling:
            options.update(temperature=fields["temperature"], top_k=fields.get("top_k", 0))
            options.update(top_p=fields.get("top_p", 1.0), min_p=fields.get("min_p"))
        times = []
        for new in (1, args.new_tokens):
            start = time.perf_counter()
            with torch.inference_mode():
                model.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                    min_new_tokens=new, **options,
                )  # fmt: skip
            times.append(time.perf_counter() - start)
        return (times[1] - times[0]) / (args.new_tokens - 1)

    with tempfile.TemporaryDirectory() as tmp:
        if args.preset:
            directory = Path(tmp)
            call_in_scratch_thread(
                lambda: write_checkpoint(directory, args.preset, torch.float32, full_vocab_tokenizer=True)
            )  # fmt: skip
        else:
            directory = default_model_path()
        llm = LLM.from_pretrained(directory, show_progress=False)  # as users load it
        dtype = llm.engine.model.model.embed_tokens.weight.dtype
        # transformers loads and runs in scratch threads, brisklm on its engine thread: two live
        # OpenMP pools make libgomp put idle workers to sleep (see brisklm.engine.scratch_thread;
        # brisklm's greedy steps took 2.8x as long with transformers run on this thread).
        hf = call_in_scratch_thread(
            lambda: transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
        ).eval()
        ways = ("native sampler", "torch ops", "transformers")
        times: dict[tuple[str, str], list[float]] = {}
        try:
            for round_index in range(args.rounds):
                order = ways if round_index % 2 == 0 else ways[::-1]
                for name, fields in SETTINGS.items():
                    for way in order:
                        if way == "transformers":
                            value = call_in_scratch_thread(lambda f=fields: hf_decode(hf, f))
                        else:
                            sampler.native_draws = (
                                native_draws if way == "native sampler" else lambda *a, **k: None
                            )
                            value = brisk_decode(llm, fields)
                        times.setdefault((name, way), []).append(value)
        finally:
            sampler.native_draws = native_draws
            llm.close()
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} torch {torch.__version__} "
        f"threads {torch.get_num_threads()}; model: {args.preset or 'bundled brisk-chat'}, "
        f"{str(dtype).removeprefix('torch.')} (its default), {args.new_tokens} new tokens after "
        f"128, median of {args.rounds} rounds"
    )
    print(
        f"{'setting':<18}{'native ms/tok':>14}{'torch ops':>11}{'transformers':>14}"
        f"{'torch/native':>14}{'transformers/native':>21}"
    )
    for name in SETTINGS:
        ours, ops, theirs = (statistics.median(times[(name, way)]) * 1e3 for way in ways)
        print(
            f"{name:<18}{ours:>14.3f}{ops:>11.3f}{theirs:>14.3f}{ops / ours:>13.2f}x"
            f"{theirs / ours:>20.2f}x"
        )


if __name__ == "__main__":
    main()
