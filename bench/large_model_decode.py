"""Decode of a large random Llama-shaped model (default: llama3-8b's shape) on a GPU: brisklm with
CUDA graphs and without, and transformers' generate, against the roofline measured in this run.

The checkpoint is random (std 0.02, norms 1), made on the device and written as one safetensors
file with a full-vocabulary byte-level BPE tokenizer (``common.full_vocab_bpe``). The roofline is
the bytes a decode step reads (every weight but the embedding table) over the bandwidth of torch's
gemv (F.linear of one row) over a 4 GB weight. Decode time per step is (time for 1 + N new tokens
minus time for 1) / N, best of ``--repeats``, after a prompt of ``--prompt-len`` tokens (128; a
long one shows what attention over the cache costs).

    python bench/large_model_decode.py                       # llama3-8b shape, bfloat16, CUDA
    python bench/large_model_decode.py --prompt-len 4000 --no-transformers   # decode at 4k positions
    python bench/large_model_decode.py --preset 125m --device cpu --no-transformers   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from common import (
    PRESETS,
    add_model_arguments,
    full_vocab_bpe,
    gemv_reader,
    measure,
    parse_checked,
    sustained_bandwidth,
    time_brisk,
    time_hf,
)


def write_random_checkpoint(
    directory: Path, preset: str, dtype: torch.dtype, device: torch.device
) -> int:
    """A random ``preset`` model in ``dtype``, made on ``device``; returns the bytes a decode step
    reads (all weights but the embedding table)."""
    shape = PRESETS[preset]
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    vocab, layers = shape["vocab_size"], shape["num_hidden_layers"]
    head_dim = hidden // heads
    config = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        **shape,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        hidden_act="silu",
        torch_dtype=str(dtype).removeprefix("torch."),
    )
    (directory / "config.json").write_text(json.dumps(config))
    generator = torch.Generator(device=device).manual_seed(0)

    def weight(*size: int) -> torch.Tensor:
        return (torch.randn(*size, device=device, generator=generator, dtype=dtype) * 0.02).cpu()

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, dtype=dtype)

    tensors = {
        "model.embed_tokens.weight": weight(vocab, hidden),
        "lm_head.weight": weight(vocab, hidden),
        "model.norm.weight": ones(hidden),
    }
    for i in range(layers):
        prefix = f"model.layers.{i}."
        tensors[prefix + "self_attn.q_proj.weight"] = weight(heads * head_dim, hidden)
        tensors[prefix + "self_attn.k_proj.weight"] = weight(kv_heads * head_dim, hidden)
        tensors[prefix + "self_attn.v_proj.weight"] = weight(kv_heads * head_dim, hidden)
        tensors[prefix + "self_attn.o_proj.weight"] = weight(hidden, heads * head_dim)
        tensors[prefix + "mlp.gate_proj.weight"] = weight(inter, hidden)
        tensors[prefix + "mlp.up_proj.weight"] = weight(inter, hidden)
        tensors[prefix + "mlp.down_proj.weight"] = weight(hidden, inter)
        tensors[prefix + "input_layernorm.weight"] = ones(hidden)
        tensors[prefix + "post_attention_layernorm.weight"] = ones(hidden)
    step_bytes = sum(t.numel() * t.element_size() for n, t in tensors.items() if "embed" not in n)
    from safetensors.torch import save_file

    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    full_vocab_bpe(vocab).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>"})
    )
    return step_bytes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_arguments(
        parser, preset="llama3-8b", device="cuda", dtype="bfloat16", llama_only=True
    )
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-transformers", action="store_true")
    args = parse_checked(parser)

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    prompt = [list(range(3, 3 + args.prompt_len))]
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        step_bytes = write_random_checkpoint(directory, args.preset, dtype, device)
        print(f"checkpoint written in {time.time() - started:.0f} s", flush=True)
        read, nbytes = gemv_reader(step_bytes, device, dtype)  # at most 4 GB
        bandwidth = sustained_bandwidth(read, nbytes, 20, device)
        del read
        roofline = bandwidth / step_bytes
        print(
            f"{args.preset}, {args.dtype} on {args.device}: {step_bytes / 1e9:.2f} GB read per "
            f"decode step; gemv bandwidth {bandwidth / 1e9:.0f} GB/s -> roofline "
            f"{roofline:.1f} tokens/s at batch 1",
            flush=True,
        )
        for mode, batch, step_s in brisklm_steps(directory, args, prompt):
            print(
                f"brisklm, {mode}, batch {batch}: {step_s * 1e3:.2f} ms/step, {batch / step_s:.1f} "
                f"tokens/s ({100 / step_s / roofline:.0f}% of the batch-1 roofline)",
                flush=True,
            )
        if args.no_transformers:
            return
        import transformers

        if device.type == "cuda":
            torch.cuda.empty_cache()
        hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
        hf = hf.to(device).eval()
        with torch.inference_mode():
            for batch in (1, 8):
                time_hf(hf, prompt * batch, 4, device)  # warm-up
                _, step_s = measure(
                    lambda p, n: time_hf(hf, p, n, device),
                    prompt * batch,
                    1 + args.new_tokens // 2,
                    args.repeats,
                )
                print(
                    f"transformers, batch {batch}: {step_s * 1e3:.2f} ms/step, "
                    f"{batch / step_s:.1f} tokens/s ({100 / step_s / roofline:.0f}% of the batch-1 "
                    "roofline)",
                    flush=True,
                )


def brisklm_steps(directory: Path, args: argparse.Namespace, prompt: list[list[int]]):
    """(mode, batch, seconds per decode step) for batches 1 and 8, with the CUDA graphs (where the
    engine has them) and without; the engine is closed before this returns."""
    from brisklm import LLM

    llm = LLM.from_pretrained(
        directory,
        device=args.device,
        dtype=args.dtype,
        max_batch_size=8,
        max_seq_len=len(prompt[0]) + args.new_tokens + 8,
        show_progress=False,
        prefix_caching=False,  # repeated prompts: time their compute
    )
    runner = llm.engine.runner
    graphs = runner.graphs
    results = []
    try:
        modes = [("with CUDA graphs", graphs)] if graphs is not None else []
        for mode, value in modes + [("without graphs", None)]:
            runner.graphs = value
            for batch in (1, 8):
                time_brisk(llm, prompt * batch, 4)  # warm-up (and graph capture)
                time_brisk(llm, prompt * batch, 1 + args.new_tokens)
                _, step_s = measure(
                    lambda p, n: time_brisk(llm, p, n),
                    prompt * batch,
                    1 + args.new_tokens,
                    args.repeats,
                )
                results.append((mode, batch, step_s))
    finally:
        runner.graphs = graphs
        llm.close()
    return results


if __name__ == "__main__":
    main()
