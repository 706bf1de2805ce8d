"""Decoding a step a native call against several steps a call
(``EngineConfig.max_decode_steps``), in one run, at batch 1 and 8: greedy, or sampled with
``--temperature`` (and ``--top-p``), each row with a seed of its own.

Two engines on the same model, ``max_decode_steps=1`` and the default 8, alternating in each
round: a 64-token prompt, then ``--new-tokens`` tokens (the time of a one-token call subtracted,
so prefill is left out), median of ``--rounds`` rounds. The tokens are the same either way
(checked; a seed draws the same tokens).

    python bench/greedy_steps.py                     # the bundled model, greedy
    python bench/greedy_steps.py --temperature 0.7   # sampled
    python bench/greedy_steps.py --preset 125m       # a random 125M Llama (float32)
    python bench/greedy_steps.py --frequency-penalty 0.5 --logit-bias 7:2   # with penalties
    python bench/greedy_steps.py --logprobs 5        # each token's logprob and top 5 (the same)
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_rounds_arguments(parser, new_tokens=256)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--presence-penalty", type=float, default=0.0)
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument(
        "--logit-bias", nargs="*", default=[], metavar="ID:BIAS", help="e.g. 7:2.5 11:-1"
    )
    parser.add_argument("--logprobs", type=int, default=None, help="top-N logprobs a token")
    args = parse_checked(parser)
    with tempfile.TemporaryDirectory() as tmp:
        path = None
        if args.preset:
            path = Path(tmp) / args.preset
            write_checkpoint(path, args.preset, torch.float32)
        run(args, path)


def run(args: argparse.Namespace, path: Path | None) -> None:
    """The rounds on the bundled model (``path`` None) or the checkpoint at ``path``."""
    from brisklm import LLM, SamplingParams

    engines = {
        steps: LLM.from_pretrained(
            path, max_decode_steps=steps, max_batch_size=8, show_progress=False
        )
        for steps in (1, 8)
    }
    prompt = torch.randint(3, 250, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    one = SamplingParams(temperature=0, max_tokens=1)
    sampling = dict(
        temperature=args.temperature,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        logit_bias={int(i): float(b) for i, b in (item.split(":") for item in args.logit_bias)},
        logprobs=args.logprobs,
    )
    print(
        f"machine: {platform.machine()} torch {torch.__version__} threads "
        f"{torch.get_num_threads()}; model: {args.preset or 'bundled brisk-chat'}, "
        f"{args.new_tokens} new tokens, {sampling}, median of {args.rounds} rounds"
    )
    print(f"{'batch':<6}{'a step a call':>16}{'up to 8 a call':>16}{'speed-up':>10}")
    for batch in (1, 8):
        prompts = [prompt] * batch
        many = [
            SamplingParams(max_tokens=args.new_tokens, ignore_eos=True, seed=row, **sampling)
            for row in range(batch)
        ]
        times: dict[int, list[float]] = {steps: [] for steps in engines}
        outputs: dict[int, list] = {}
        for _ in range(args.rounds):
            for steps, llm in engines.items():
                llm.generate(prompts, one)  # warm
                start = time.perf_counter()
                outs = llm.generate(prompts, many)
                elapsed = time.perf_counter() - start
                start = time.perf_counter()
                llm.generate(prompts, one)
                prefill = time.perf_counter() - start
                times[steps].append((elapsed - prefill) / (args.new_tokens - 1))
                outputs[steps] = [(out.token_ids, out.logprobs) for out in outs]
        assert outputs[1] == outputs[8], "several steps a call changed the tokens or logprobs"
        a, b = statistics.median(times[1]), statistics.median(times[8])
        print(f"{batch:<6}{a * 1e3:>13.3f} ms{b * 1e3:>13.3f} ms{a / b:>9.2f}x")
    for llm in engines.values():
        llm.close()


if __name__ == "__main__":
    main()
