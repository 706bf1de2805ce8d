"""brisklm's sampler vs transformers' sampling step, on the same logits, in one run.

transformers' ``generate`` samples a step by running its logits warpers (temperature, top-k, top-p)
and then ``torch.multinomial`` on the softmax; brisklm runs ``brisklm.sampling.sample`` (the same
filters, then an inverse-CDF draw), on the CPU through the native kernels' one pass a row
(``sampler.native_draws``) where they build, and again through the torch ops that pass replaced
(``native_draws`` returning None, as where the kernels do not build). All are timed per decode
step (best of several runs) for vocabularies of 32k and 128k tokens, one and eight rows, on two
kinds of logits:

- "peaked": standard normal logits times 4, the shape of a trained model's next-token
  distribution (the top-p nucleus fits in a few hundred tokens);
- "flat": standard normal logits, a random model's (the nucleus spans most of the vocabulary).
The entropy and the top-p 0.9 nucleus size of each are printed.

    python bench/sampling.py
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from brisklm.sampling import SamplingMetadata, SamplingParams, make_generator, sample, sampler

CONFIGS = {
    "temperature 0.8": dict(temperature=0.8),
    "top-k 50": dict(temperature=0.8, top_k=50),
    "top-p 0.9": dict(temperature=0.8, top_p=0.9),
    "top-k 50 + top-p 0.95": dict(temperature=0.7, top_k=50, top_p=0.95),
}


def best_time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(5):
            fn()
        best = min(best, (time.perf_counter() - start) / 5)
    return best


def hf_step(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    scores = TemperatureLogitsWarper(params.temperature)(None, logits)
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(None, scores)
    if params.top_p < 1.0:
        scores = TopPLogitsWarper(params.top_p)(None, scores)
    return torch.multinomial(scores.softmax(dim=-1), num_samples=1).squeeze(1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"machine: {platform.machine()} torch {torch.__version__} threads {torch.get_num_threads()}"
    )
    print(f"{'logits':<8}{'vocab':>7}{'rows':>5}  {'config':<24}{'brisklm us':>11}"
          f"{'torch ops us':>13}{'transformers us':>16}{'ratio':>8}")  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    for kind, scale in (("peaked", 4.0), ("flat", 1.0)):
        for vocab in (32000, 128256):
            for rows in (1, 8):
                logits = torch.randn(rows, vocab, generator=generator) * scale
                probs = (logits[0] / 0.8).softmax(-1)
                entropy = -(probs * probs.clamp_min(1e-30).log()).sum().item()
                nucleus = int((probs.sort(descending=True).values.cumsum(-1) < 0.9).sum()) + 1
                print(
                    f"{kind} logits, vocab {vocab}, {rows} rows: entropy at temperature 0.8 "
                    f"{entropy:.2f} nats, top-p 0.9 nucleus {nucleus} tokens"
                )
                for name, fields in CONFIGS.items():
                    params = SamplingParams(**fields)
                    md = SamplingMetadata.build(
                        [params] * rows,
                        [[] for _ in range(rows)],
                        [[] for _ in range(rows)],
                        [make_generator(params, "cpu")] * rows,
                        vocab,
                        "cpu",
                    )
                    ours = best_time(lambda x=logits, m=md: sample(x, m), args.repeats)
                    native_draws = sampler.native_draws
                    sampler.native_draws = lambda *a, **k: None
                    try:
                        ops = best_time(lambda x=logits, m=md: sample(x, m), args.repeats)
                    finally:
                        sampler.native_draws = native_draws
                    theirs = best_time(lambda x=logits, p=params: hf_step(x, p), args.repeats)
                    print(
                        f"{kind:<8}{vocab:>7}{rows:>5}  {name:<24}{ours * 1e6:>11.0f}"
                        f"{ops * 1e6:>13.0f}{theirs * 1e6:>16.0f}{theirs / ours:>7.1f}x"
                    )


if __name__ == "__main__":
    main()
