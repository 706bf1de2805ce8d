"""Train one brisk model (LlamaForCausalLM) on the generated data and export it in HF layout.

Loss: every token of prose; in chat transcripts only the assistant's tokens (each assistant
turn's content through its ``<|im_end|>``), so the model learns to answer, call tools and stop,
not to imitate users. Samples are packed whole (never split) into rows of ``--seq-len`` tokens,
each preceded by ``<|endoftext|>``. Master weights are float32; matmuls run under bfloat16
autocast (2-3x faster on this CPU); the export is bfloat16 safetensors.

Optional distillation (``--teacher DIR``): the loss adds ``--distill-weight`` x KL(teacher||student)
on the trained positions, for the draft model.

    python -m training.train --preset target --data training/out/data --tokenizer training/out/tokenizer \
        --out training/out/brisk-chat
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from training.chat_format import ASSISTANT_HEADER, IM_END, render

PRESETS: dict[str, dict[str, Any]] = {
    # ~10M parameters; ~3.5k tokens/s training on 2 cores with bf16 autocast.
    "target": dict(hidden_size=320, intermediate_size=864, num_hidden_layers=8,
                   num_attention_heads=5, num_key_value_heads=1),
    # ~1.3M parameters, ~7.5x smaller, same vocabulary.
    "draft": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                  num_attention_heads=2, num_key_value_heads=1),
}


def build_config(preset: str, vocab_size: int, max_positions: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=0,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        initializer_range=0.02,
        **PRESETS[preset],
    )


# ---------------------------------------------------------------------------- data
def encode_samples(samples: list[dict], tokenizer_dir: Path,
                   loss_on: str = "assistant") -> list[tuple[list[int], list[int]]]:
    """Tokenize samples to (ids, trained-mask) with the leading ``<|endoftext|>``.

    ``loss_on="assistant"`` trains only assistant turns of chats; ``"all"`` trains every token.
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    texts, spans_list = [], []
    for s in samples:
        if s["kind"] == "prose":
            text = s["text"] + "<|endoftext|>"
            spans = [(0, len(text))]
        elif loss_on == "all":
            text = render(s["messages"], s.get("tools"))
            spans = [(0, len(text))]
        else:
            text = render(s["messages"], s.get("tools"))
            spans = []
            start = 0
            while (i := text.find(ASSISTANT_HEADER, start)) >= 0:
                a = i + len(ASSISTANT_HEADER)
                e = text.index(IM_END, a) + len(IM_END)
                spans.append((a, e))
                start = e
        texts.append(text)
        spans_list.append(spans)
    out = []
    for enc, spans in zip(tok.encode_batch(texts, add_special_tokens=False), spans_list, strict=True):
        mask = []
        k = 0
        for s, e in enc.offsets:
            while k < len(spans) and spans[k][1] <= s:
                k += 1
            mask.append(int(k < len(spans) and spans[k][0] <= s and e <= spans[k][1]))
        out.append(([0] + enc.ids, [0] + mask))
    return out


def pack(encoded: list[tuple[list[int], list[int]]], seq_len: int, seed: int,
         window: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack whole samples into rows (best fit from a lookahead window); pad with id 0, no loss."""
    rng = random.Random(seed)
    items = [x for x in encoded if len(x[0]) <= seq_len]
    rng.shuffle(items)
    rows_ids, rows_mask = [], []
    pending: list[tuple[list[int], list[int]]] = []
    pos = 0
    while pos < len(items) or pending:
        while len(pending) < window and pos < len(items):
            pending.append(items[pos])
            pos += 1
        ids: list[int] = []
        mask: list[int] = []
        while True:
            room = seq_len - len(ids)
            best = -1
            for j, it in enumerate(pending):
                if len(it[0]) <= room and (best < 0 or len(it[0]) > len(pending[best][0])):
                    best = j
                    if len(it[0]) == room:
                        break
            if best < 0:
                break
            it = pending.pop(best)
            # Inference prompts start without <|endoftext|>: so do half the rows in training.
            skip = 1 if not ids and rng.random() < 0.5 else 0
            ids += it[0][skip:]
            mask += it[1][skip:]
            if not pending:
                break
        pad = seq_len - len(ids)
        rows_ids.append(ids + [0] * pad)
        rows_mask.append(mask + [0] * pad)
    return torch.tensor(rows_ids, dtype=torch.long), torch.tensor(rows_mask, dtype=torch.bool)


def load_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# ---------------------------------------------------------------------------- training
def lm_loss(model: Any, ids: torch.Tensor, mask: torch.Tensor, teacher: Any = None,
            distill_weight: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean next-token cross entropy over trained positions (+ distillation); returns (loss, ce)."""
    inp, tgt, m = ids[:, :-1], ids[:, 1:], mask[:, 1:]
    hidden = model.model(input_ids=inp).last_hidden_state  # (B, T, D)
    # The LM head only on trained positions (about a quarter of them in chat data).
    sel = model.lm_head(hidden[m]).float()  # (N, V)
    ce = F.cross_entropy(sel, tgt[m])
    if teacher is None or distill_weight == 0.0:
        return ce, ce.detach()
    with torch.no_grad():
        t_logits = teacher(input_ids=inp).logits[m].float()
    kl = F.kl_div(F.log_softmax(sel, -1), F.log_softmax(t_logits, -1), log_target=True,
                  reduction="batchmean")
    return (1 - distill_weight) * ce + distill_weight * kl, ce.detach()


@torch.no_grad()
def evaluate_loss(model: Any, ids: torch.Tensor, mask: torch.Tensor, batch_size: int) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(ids), batch_size):
        b_ids, b_mask = ids[i:i + batch_size], mask[i:i + batch_size]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=b_ids[:, :-1]).logits
        m = b_mask[:, 1:]
        total += F.cross_entropy(logits[m].float(), b_ids[:, 1:][m], reduction="sum").item()
        count += int(m.sum())
    model.train()
    return total / max(count, 1)


def export(model: Any, tokenizer_dir: Path, out: Path) -> None:
    """Write the HF layout: bf16 safetensors, config, generation config, tokenizer files."""
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    model.config.torch_dtype = "bfloat16"
    export_model = type(model)(model.config)
    export_model.load_state_dict(model.state_dict())
    export_model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=0, eos_token_id=[2, 0], pad_token_id=0, do_sample=False,
                     max_new_tokens=256).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_dir / name, out / name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("--data", type=Path, default=Path("training/out/data"))
    ap.add_argument("--tokenizer", type=Path, default=Path("training/out/tokenizer"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--init", type=Path, default=None, help="HF dir to start from (continued training)")
    ap.add_argument("--teacher", type=Path, default=None, help="HF dir of a teacher for distillation")
    ap.add_argument("--distill-weight", type=float, default=0.5)
    ap.add_argument("--checkpoint-every", type=int, default=200)
    ap.add_argument("--resume", action="store_true", help="continue from --out/checkpoint.pt")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--loss-on", choices=["assistant", "all"], default="assistant",
                    help="chat tokens that carry loss (prose always trains on all tokens)")
    ap.add_argument("--time-budget-min", type=float, default=None,
                    help="also decay the lr by wall time and stop when this many training minutes "
                         "are spent (for a busy machine; makes the result depend on its speed)")
    args = ap.parse_args()

    from transformers import LlamaForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.time()
    samples = load_jsonl(args.data / "train.jsonl")
    encoded = encode_samples(samples, args.tokenizer, args.loss_on)
    ids, mask = pack(encoded, args.seq_len + 1, args.seed)
    eval_samples = json.load(open(args.data / "eval.json", encoding="utf-8"))["ppl"]
    e_ids, e_mask = pack(encode_samples(eval_samples, args.tokenizer), args.seq_len + 1, 0)
    n_rows = len(ids)
    n_samples = len(samples)
    del samples, encoded
    gc.collect()
    gc.freeze()  # the training loop allocates few Python objects; keep GC passes short
    print(f"[{args.preset}] {n_samples} samples -> {n_rows} rows of {args.seq_len + 1} tokens "
          f"({int(mask.sum())} trained tokens, {(ids != 0).sum().item() / ids.numel():.1%} non-pad); "
          f"{args.steps} steps x {args.batch_size} rows = {args.steps * args.batch_size / n_rows:.2f} epochs; "
          f"data {time.time() - t0:.0f}s", flush=True)

    from tokenizers import Tokenizer

    vocab_size = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json")).get_vocab_size()
    config = build_config(args.preset, vocab_size, 1024)
    model = LlamaForCausalLM(config)
    if args.init is not None:
        model.load_state_dict(LlamaForCausalLM.from_pretrained(args.init, dtype=torch.float32).state_dict())
        print(f"[{args.preset}] initialised from {args.init}", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[{args.preset}] {n_params / 1e6:.2f}M parameters: {PRESETS[args.preset]}", flush=True)

    teacher = None
    if args.teacher is not None:
        teacher = LlamaForCausalLM.from_pretrained(args.teacher, dtype=torch.bfloat16).eval()
        print(f"[{args.preset}] distilling from {args.teacher} (weight {args.distill_weight})", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    def progress(step: int, elapsed_s: float) -> float:
        """Fraction of the decay schedule done: by steps, or by wall time when a budget binds."""
        frac = (step - args.warmup) / max(1, args.steps - args.warmup)
        if args.time_budget_min:
            frac = max(frac, elapsed_s / (60 * args.time_budget_min))
        return min(frac, 1.0)

    def lr_at(step: int, elapsed_s: float = 0.0) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = progress(step, elapsed_s)
        return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))

    args.out.mkdir(parents=True, exist_ok=True)
    ckpt_path = args.out / "checkpoint.pt"
    start_step = 0
    elapsed_before = 0.0  # training seconds spent before a resume
    if args.resume and ckpt_path.exists():
        ck = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        start_step = ck["step"]
        elapsed_before = ck.get("elapsed_s", 0.0)
        print(f"[{args.preset}] resumed at step {start_step} ({elapsed_before / 60:.1f} min in)", flush=True)

    order = torch.randperm(n_rows, generator=torch.Generator().manual_seed(args.seed))
    model.train()
    t_train = time.time()
    tokens_seen = 0
    ema = None
    steps_done = start_step
    for step in range(start_step, args.steps):
        elapsed_s = elapsed_before + time.time() - t_train
        if step >= args.warmup and progress(step, elapsed_s) >= 1.0:
            print(f"[{args.preset}] time budget of {args.time_budget_min} min spent at step {step}",
                  flush=True)
            break
        idx = [order[(step * args.batch_size + j) % n_rows].item() for j in range(args.batch_size)]
        b_ids, b_mask = ids[idx], mask[idx]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, elapsed_s)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, ce = lm_loss(model, b_ids, b_mask, teacher, args.distill_weight)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens_seen += b_ids.numel()
        steps_done = step + 1
        ema = ce.item() if ema is None else 0.9 * ema + 0.1 * ce.item()
        if (step + 1) % args.log_every == 0 or step == start_step:
            el = time.time() - t_train
            rate = tokens_seen / el
            eta = (args.steps - step - 1) * args.batch_size * (args.seq_len + 1) / rate
            print(f"[{args.preset}] step {step + 1}/{args.steps} loss {ce.item():.4f} (ema {ema:.4f}) "
                  f"lr {lr_at(step, elapsed_s):.2e} gnorm {gnorm:.2f} {rate:.0f} tok/s elapsed {el / 60:.1f}m "
                  f"eta {eta / 60:.1f}m", flush=True)
        if (step + 1) % args.checkpoint_every == 0 and step + 1 < args.steps:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1,
                        "elapsed_s": elapsed_before + time.time() - t_train}, ckpt_path)

    held = evaluate_loss(model, e_ids, e_mask, args.batch_size)
    final = {"preset": args.preset, "parameters": n_params, "steps": steps_done,
             "batch_size": args.batch_size, "seq_len": args.seq_len,
             "train_loss_ema": ema, "heldout_loss": held, "heldout_ppl": math.exp(held),
             "train_minutes": (elapsed_before + time.time() - t_train) / 60, "total_minutes": (time.time() - t0) / 60}
    print(f"[{args.preset}] done: {json.dumps(final)}", flush=True)
    model_dir = args.out / "model"
    export(model, args.tokenizer, model_dir)
    with open(args.out / "train_summary.json", "w") as f:
        json.dump(final, f, indent=2)
    if ckpt_path.exists():
        ckpt_path.unlink()
    print(f"[{args.preset}] exported to {model_dir}", flush=True)


if __name__ == "__main__":
    main()
