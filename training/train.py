"""Train one brisk model on the generated data and export it in Hugging Face layout (LlamaForCausalLM).

The network is ``training/model.py`` (transformers' Llama architecture and parameter names, with
per-sample attention masks in packed rows), compiled with ``torch.compile`` and run under bfloat16
autocast over float32 master weights (``--precision``), on the CPU or a CUDA GPU (``--device``);
the export is a bfloat16 ``LlamaForCausalLM`` checkpoint.

Data: whole samples (never split) are packed into rows of two lengths (``--seq-len`` for short
samples, ``--long-seq-len`` for the rest), each sample attending only to itself from position 0,
as at inference. Every batch holds about the same number of tokens. Loss weights: prose and
assistant turns (each assistant turn's content through its ``<|im_end|>``) weigh 1; the other chat
tokens (system, tools, user, tool results) weigh ``--prompt-loss-weight``: predicting the second
occurrence of a made-up name in a prompt trains the same copying that tool calls need.

Optimizer: AdamW, or with ``--optimizer muon`` Muon for the hidden weight matrices and AdamW for the
embedding and norm gains (``training/muon.py``; the target is trained this way).

Distillation (``--teacher DIR``): the loss becomes (1 - w) x cross entropy + w x KL(teacher ||
student) on the weighted positions; the draft is distilled from the target this way. With
``--distill-where-teacher-right`` the KL term counts only where the teacher's top token is the
label (the cross entropy alone elsewhere): a fine-tune of a model with itself as the teacher then
learns what the model gets wrong while held to what it gets right.

    python -m training.train --preset target --data training/out/data --tokenizer training/out/tokenizer \\
        --out training/out/brisk-chat
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from training.chat_format import (
    ADDED_TOKENS,
    ASSISTANT_HEADER,
    IM_END,
    SPECIAL_TOKENS,
    TOOL_CALL_START,
    render,
)
from training.model import Shape, TrainLlama
from training.muon import Muon, Optimizers

# ~11M parameters.
TARGET_SHAPE = dict(
    hidden_size=320,
    intermediate_size=864,
    num_hidden_layers=8,
    num_attention_heads=5,
    num_key_value_heads=5,
)
PRESETS: dict[str, dict[str, int]] = {
    "target": TARGET_SHAPE,
    # ~1.7M parameters; two layers are enough for copying (a previous-token head then an induction
    # head) and keep each draft step cheap at batch 1.
    "draft": dict(
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=3,
    ),
    # The target's width in two layers: trained on copy drills only, then grown into the target
    # (``--grow-from``). Eight layers from scratch take far longer to learn to copy than two do.
    "seed": {**TARGET_SHAPE, "num_hidden_layers": 2},
}
# The special and added tokens take the first ids (train_tokenizer.py); text tokens follow.
FIRST_TEXT_ID = len(SPECIAL_TOKENS) + len(ADDED_TOKENS)
MAX_POSITIONS = 1024


# ---------------------------------------------------------------------------- data
def load_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


TOOL_CALL_NAME_PREFIX = TOOL_CALL_START + '\n{"name": "'


def tool_name_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Character spans of the function names in the tool calls of ``text[start:end]`` (an
    assistant turn): what follows ``<tool_call>\n{"name": "`` up to the closing quote."""
    spans = []
    while (i := text.find(TOOL_CALL_NAME_PREFIX, start, end)) >= 0:
        a = i + len(TOOL_CALL_NAME_PREFIX)
        b = text.index('"', a)
        spans.append((a, b))
        start = b
    return spans


def encode_samples(
    samples: list[dict], tokenizer_dir: Path, prompt_weight: float = 0.0, name_weight: float = 1.0
) -> list[tuple[list[int], list[float]]]:
    """Tokenize samples to (ids, per-token loss weight), each led by ``<|endoftext|>``.

    A token's weight is the weight of the target it is (the next-token loss at position i uses
    the weight of token i + 1). Prose and assistant turns weigh 1, other chat text ``prompt_weight``;
    tokens of a called function's name (any part of it) ``name_weight``.
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    texts, spans_list, names_list = [], [], []
    for s in samples:
        names: list[tuple[int, int]] = []
        if s["kind"] == "prose":
            text = s["text"] + "<|endoftext|>"
            spans = [(0, len(text))]
        else:
            text = render(s["messages"], s.get("tools"))
            spans = []
            start = 0
            while (i := text.find(ASSISTANT_HEADER, start)) >= 0:
                a = i + len(ASSISTANT_HEADER)
                e = text.index(IM_END, a) + len(IM_END)
                spans.append((a, e))
                names.extend(tool_name_spans(text, a, e))
                start = e
        texts.append(text)
        spans_list.append(spans)
        names_list.append(names)
    out = []
    for enc, spans, names in zip(
        tok.encode_batch(texts, add_special_tokens=False), spans_list, names_list, strict=True
    ):
        weights = []
        k = j = 0
        for s, e in enc.offsets:
            while k < len(spans) and spans[k][1] <= s:
                k += 1
            while j < len(names) and names[j][1] <= s:
                j += 1
            inside = k < len(spans) and spans[k][0] <= s and e <= spans[k][1]
            in_name = j < len(names) and names[j][0] < e
            weights.append(name_weight if in_name else 1.0 if inside else prompt_weight)
        # The leading <|endoftext|> is never a target.
        out.append(([0] + enc.ids, [0.0] + weights))
    return out


class Packed:
    """Rows of one length: token ids, loss weights, positions and sample index per token."""

    def __init__(
        self, ids: torch.Tensor, weights: torch.Tensor, pos: torch.Tensor, doc: torch.Tensor
    ) -> None:
        self.ids, self.weights, self.pos, self.doc = ids, weights, pos, doc

    def __len__(self) -> int:
        return len(self.ids)


class FillerPool:
    """Samples to fill the room other samples leave in a row: ``take(room)`` gives the longest
    that fits (of equal lengths, in an order shuffled by ``rng``) and removes it from the pool."""

    def __init__(self, encoded: list[tuple[list[int], list[float]]], rng: random.Random) -> None:
        self.encoded = encoded
        self.taken = [False] * len(encoded)
        self.by_length: dict[int, list[int]] = {}
        for index, item in enumerate(encoded):
            self.by_length.setdefault(len(item[0]), []).append(index)
        for indices in self.by_length.values():
            rng.shuffle(indices)
        self.longest = max(self.by_length, default=0)

    def take(self, room: int) -> tuple[list[int], list[float]] | None:
        for length in range(min(room, self.longest), 0, -1):
            indices = self.by_length.get(length)
            if indices:
                index = indices.pop()
                self.taken[index] = True
                return self.encoded[index]
        return None

    def remaining(self) -> list[tuple[list[int], list[float]]]:
        """The samples not taken, in their original order."""
        return [item for item, taken in zip(self.encoded, self.taken) if not taken]


def _place(
    row: tuple[list[int], list[float], list[int], list[int]],
    doc: int,
    sample: tuple[list[int], list[float]],
    rng: random.Random,
) -> None:
    """Append ``sample`` to a row's ids, weights, positions and sample indices, keeping its leading
    ``<|endoftext|>`` half of the time (inference prompts have none)."""
    ids, wts, poss, docs = row
    skip = 1 if rng.random() < 0.5 else 0
    n = len(sample[0]) - skip
    ids.extend(sample[0][skip:])
    wts.extend(sample[1][skip:])
    poss.extend(range(n))
    docs.extend([doc] * n)


def pack(
    encoded: list[tuple[list[int], list[float]]],
    row_len: int,
    seed: int,
    window: int = 512,
    fillers: FillerPool | None = None,
) -> Packed:
    """Best-fit whole samples into rows of ``row_len`` tokens; padding (id 0) has weight 0.

    Each sample keeps its leading ``<|endoftext|>`` half of the time (inference prompts have none).
    ``fillers``: shorter samples that fill the room a row's own samples leave (longest first),
    before any padding.
    """
    rng = random.Random(seed)
    items = list(encoded)
    rng.shuffle(items)
    rows: list[tuple[list[int], list[float], list[int], list[int]]] = []
    pending: list[tuple[list[int], list[float]]] = []
    pos = 0
    while pos < len(items) or pending:
        while len(pending) < window and pos < len(items):
            pending.append(items[pos])
            pos += 1
        ids: list[int] = []
        wts: list[float] = []
        poss: list[int] = []
        docs: list[int] = []
        n_docs = 0
        row = (ids, wts, poss, docs)
        while pending:
            room = row_len - len(ids)
            best = -1
            for j, it in enumerate(pending):
                if len(it[0]) <= room and (best < 0 or len(it[0]) > len(pending[best][0])):
                    best = j
                    if len(it[0]) == room:
                        break
            if best < 0:
                break
            _place(row, n_docs, pending.pop(best), rng)
            n_docs += 1
        while fillers is not None and (filler := fillers.take(row_len - len(ids))) is not None:
            _place(row, n_docs, filler, rng)
            n_docs += 1
        pad = row_len - len(ids)
        rows.append(
            (ids + [0] * pad, wts + [0.0] * pad, poss + list(range(pad)), docs + [n_docs] * pad)
        )
    return Packed(  # (rows, row_len) also for no rows (every sample taken to fill other rows)
        torch.tensor([r[0] for r in rows], dtype=torch.long).reshape(-1, row_len),
        torch.tensor([r[1] for r in rows], dtype=torch.float32).reshape(-1, row_len),
        torch.tensor([r[2] for r in rows], dtype=torch.long).reshape(-1, row_len),
        torch.tensor([r[3] for r in rows], dtype=torch.long).reshape(-1, row_len),
    )


def pack_buckets(
    encoded: list[tuple[list[int], list[float]]],
    seq_len: int,
    long_seq_len: int,
    seed: int,
    fill_long_rows: bool = False,
) -> tuple[Packed, Packed | None, int]:
    """Short samples into rows of ``seq_len + 1``, longer ones into ``long_seq_len + 1``; drops longer.

    ``fill_long_rows``: the room the long samples leave in their rows (a quarter of the long rows'
    tokens on the tool-heavy sets) is filled with short samples, which then leave the short rows.
    """
    short = [x for x in encoded if len(x[0]) <= seq_len + 1]
    long = [x for x in encoded if seq_len + 1 < len(x[0]) <= long_seq_len + 1]
    dropped = len(encoded) - len(short) - len(long)
    pool = FillerPool(short, random.Random(seed + 2)) if long and fill_long_rows else None
    long_rows = pack(long, long_seq_len + 1, seed + 1, fillers=pool) if long else None
    if pool is not None:
        short = pool.remaining()
    return pack(short, seq_len + 1, seed), long_rows, dropped


def _compact(t: torch.Tensor) -> torch.Tensor:
    """The narrowest integer dtype that holds ``t``'s values (int16 or int32)."""
    if t.numel() == 0:
        return t.to(torch.int16)
    small = int(t.min()) >= -(2**15) and int(t.max()) < 2**15
    return t.to(torch.int16 if small else torch.int32)


def load_packed_buckets(
    path: Path,
    tokenizer_dir: Path,
    prompt_weight: float,
    seq_len: int,
    long_seq_len: int,
    seed: int,
    name_weight: float = 1.0,
    fill_long_rows: bool = False,
) -> tuple[Packed, Packed | None, int, int]:
    """``pack_buckets(encode_samples(load_jsonl(path), ...))`` and the number of samples, kept in a
    file beside ``path`` for the next run with the same inputs.

    Encoding and packing 150,000 samples takes ~2 minutes on the CPU, and build_all.sh trains five
    models on the same set. The file's name is a hash of everything the result depends on: the
    data and tokenizer files, the arguments, and the source of the functions that compute it (and
    of the chat format), so a changed input or a changed packer never reads an old file."""
    key = hashlib.sha256()
    for file in (path, tokenizer_dir / "tokenizer.json"):
        key.update(hashlib.sha256(file.read_bytes()).digest())
    functions = (encode_samples, FillerPool, _place, pack, pack_buckets, load_jsonl)
    code = [inspect.getsource(f) for f in functions]
    code.append(Path(render.__code__.co_filename).read_text(encoding="utf-8"))
    settings = [prompt_weight, seq_len, long_seq_len, seed, name_weight, fill_long_rows]
    key.update(json.dumps([code, *settings]).encode())
    cache = path.with_name(f"{path.stem}.packed-{key.hexdigest()[:20]}.pt")
    if cache.exists():
        try:
            saved = torch.load(cache, weights_only=True)
            buckets = [
                None
                if b is None
                else Packed(
                    b["ids"].long(),
                    b["weight_values"][b["weight_codes"].long()],
                    b["pos"].long(),
                    b["doc"].long(),
                )
                for b in saved["buckets"]
            ]
            return buckets[0], buckets[1], saved["dropped"], saved["samples"]
        except Exception as error:  # a damaged file: packed again and rewritten below
            print(f"ignoring {cache} ({error}); packing again", flush=True)
    samples = load_jsonl(path)
    short, long, dropped = pack_buckets(
        encode_samples(samples, tokenizer_dir, prompt_weight, name_weight),
        seq_len,
        long_seq_len,
        seed,
        fill_long_rows,
    )
    stored = []
    for b in (short, long):
        if b is None:
            stored.append(None)
            continue
        values, codes = torch.unique(b.weights, return_inverse=True)
        stored.append(
            {
                "ids": _compact(b.ids),
                "weight_values": values,
                "weight_codes": _compact(codes),
                "pos": _compact(b.pos),
                "doc": _compact(b.doc),
            }
        )
    partial = cache.with_name(f"{cache.name}.{os.getpid()}.partial")
    torch.save({"buckets": stored, "dropped": dropped, "samples": len(samples)}, partial)
    partial.replace(cache)  # whole or not at all, also with two runs at once
    return short, long, dropped, len(samples)


class DrillTokens:
    """Token ids the drills are drawn from: every text token, digits and separators."""

    def __init__(self, tokenizer_dir: Path) -> None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        self.vocab_size = tok.get_vocab_size()

        def one(text: str) -> int:
            ids = tok.encode(text, add_special_tokens=False).ids
            if len(ids) != 1:
                raise ValueError(f"drills: {text!r} is not one token in {tokenizer_dir}")
            return ids[0]

        self.digits = [one(c) for c in "0123456789"]
        self.number_marks = [one(c) for c in ".- "]
        self.colon, self.comma = one(":"), one(",")


DRILL_KINDS = ("copy", "digits", "recall")


def copy_drills(
    n_rows: int,
    row_len: int,
    toks: DrillTokens,
    rng: random.Random,
    kinds: tuple[str, ...] = ("copy",),
) -> Packed:
    """Rows of synthetic copying segments, the loss only where the answer is in the context.

    ``copy``: ``A A`` (A: 6-40 random text tokens), the loss on the repeat. Predicting it needs an
    induction circuit (a previous-token head, then a head that attends to the token after the last
    occurrence of the current one), the mechanism every copying task (tool arguments, extracted
    fields) builds on; on natural data it forms late.
    ``digits``: ``A A`` where A (3-24 tokens) comes from a small alphabet (digits and number marks,
    or 2-8 random tokens), so tokens repeat inside A and the previous token alone does not say
    what comes next: this is where a one-token induction head drops or doubles digits.
    ``recall``: ``k1:v1,k2:v2,...`` then the same pairs in another order; the loss on the values,
    which are found by their key (extracting a named field, filling a named argument).
    With one kind the random draws are exactly those of the original copy-only drills.
    """
    vocab = toks.vocab_size

    def text_tokens(n: int) -> list[int]:
        return [rng.randrange(FIRST_TEXT_ID, vocab) for _ in range(n)]

    def plain_tokens(n: int) -> list[int]:  # text tokens other than the recall separators
        out: list[int] = []
        while len(out) < n:
            out += [t for t in text_tokens(n - len(out)) if t not in (toks.colon, toks.comma)]
        return out

    def small_alphabet(n: int) -> list[int]:
        if rng.random() < 0.5:
            alphabet = toks.digits + toks.number_marks[: rng.randrange(0, 4)]
        else:
            alphabet = plain_tokens(rng.randint(2, 8))
        return [rng.choice(alphabet) for _ in range(n)]

    def segment(kind: str) -> tuple[list[int], list[float]]:
        if kind == "copy":
            a = text_tokens(rng.randint(6, 40))
        elif kind == "digits":
            a = small_alphabet(rng.randint(3, 24))
        else:
            pairs = []
            for _ in range(rng.randint(2, 6)):
                key = plain_tokens(rng.randint(1, 2))
                value = (
                    small_alphabet(rng.randint(1, 10))
                    if rng.random() < 0.5
                    else plain_tokens(rng.randint(1, 6))
                )
                pairs.append((key, value))
            seq = [t for key, value in pairs for t in key + [toks.colon] + value + [toks.comma]]
            weights = [0.0] * len(seq)
            order = list(range(len(pairs)))
            while len(pairs) > 1 and order == sorted(order):
                rng.shuffle(order)
            for i in order:
                key, value = pairs[i]
                seq += key + [toks.colon] + value + [toks.comma]
                # the key's first token is a free choice; the rest of the pair is in the context
                weights += [0.0] + [1.0] * (len(key) + len(value) + 1)
            return seq, weights
        return a + a, [0.0] * (len(a) + 1) + [1.0] * (len(a) - 1)

    ids = torch.zeros(n_rows, row_len, dtype=torch.long)
    w = torch.zeros(n_rows, row_len)
    pos = torch.zeros(n_rows, row_len, dtype=torch.long)
    doc = torch.zeros(n_rows, row_len, dtype=torch.long)
    for r in range(n_rows):
        t = d = 0
        while t < row_len:
            kind = kinds[0] if len(kinds) == 1 else rng.choice(kinds)
            seq, weights = segment(kind)
            # the weight of the token predicted at position i sits at i (targets are shifted)
            seq, weights = seq[: row_len - t], weights[: row_len - t]
            n = len(seq)
            ids[r, t : t + n] = torch.tensor(seq)
            w[r, t : t + n] = torch.tensor(weights)
            pos[r, t : t + n] = torch.arange(n)
            doc[r, t : t + n] = d
            t += n
            d += 1
    return Packed(ids, w, pos, doc)


def grow(model: TrainLlama, seed_state: dict[str, torch.Tensor], seed_layers: int) -> None:
    """Put a shallower model of the same width in ``model``'s first layers, function preserved.

    The remaining layers keep their random init except their output projections (``o_proj``,
    ``down_proj``), zeroed so each starts as the identity on the residual stream and learns from there.
    """
    state = model.state_dict()
    for k, v in seed_state.items():
        if k not in state or state[k].shape != v.shape:
            raise ValueError(f"--grow-from: {k} {tuple(v.shape)} does not fit the target")
        state[k] = v
    model.load_state_dict(state)
    with torch.no_grad():
        for layer in model.model.layers[seed_layers:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()


def grown_layer_groups(
    model: TrainLlama, params: list[torch.Tensor], grown_from: int, lr_mult: float
) -> list[dict[str, Any]]:
    """``params`` as optimizer groups: those of the layers ``grow`` added learn at ``lr_mult`` times
    the rate (the group's ``lr_mult``). Their output projections start at zero, and at a
    continuation's rate they barely move: 250 steps at 3e-4 left the loss within 1e-3 of the run
    without them."""
    new = {id(p) for layer in model.model.layers[grown_from:] for p in layer.parameters()}
    groups = [
        {"params": [p for p in params if id(p) not in new]},
        {"params": [p for p in params if id(p) in new], "lr_mult": lr_mult},
    ]
    return [g for g in groups if g["params"]]


# ---------------------------------------------------------------------------- model
def shape_for(preset: str, vocab_size: int, layers: int | None = None) -> Shape:
    """The preset's shape; ``layers`` replaces its number of layers (a deeper model to grow)."""
    dims = dict(PRESETS[preset])
    if layers is not None:
        dims["num_hidden_layers"] = layers
    return Shape(vocab_size=vocab_size, max_position_embeddings=MAX_POSITIONS, **dims)


def hf_config(shape: Shape) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        rms_norm_eps=shape.rms_norm_eps,
        rope_theta=shape.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=0,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        initializer_range=0.02,
    )


def load_hf_weights(model_dir: Path) -> tuple[Shape, dict[str, torch.Tensor]]:
    """Shape and float32 state dict of an exported checkpoint (for --init and --teacher)."""
    from safetensors.torch import load_file

    cfg = json.load(open(model_dir / "config.json"))
    shape = Shape(
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        vocab_size=cfg["vocab_size"],
        max_position_embeddings=cfg["max_position_embeddings"],
    )
    state = {k: v.float() for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    return shape, state


def export(model: TrainLlama, tokenizer_dir: Path, out: Path) -> None:
    """Write the HF layout: bf16 safetensors, config, generation config, tokenizer files."""
    from transformers import GenerationConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    config = hf_config(model.shape)
    hf = LlamaForCausalLM(config)
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"export: missing {missing}, unexpected {unexpected}")
    hf.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=0, eos_token_id=[2, 0], pad_token_id=0, do_sample=False, max_new_tokens=256
    ).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_dir / name, out / name)


# ---------------------------------------------------------------------------- training
def make_loss_fn(
    model: TrainLlama,
    teacher: TrainLlama | None,
    distill_weight: float,
    distill_where_teacher_right: bool = False,
):
    """The training loss: weighted cross entropy, and with a teacher (1 - w) x that + w x KL(teacher
    || student). With ``distill_where_teacher_right`` the KL term counts only at positions where the
    teacher's most likely token is the label; elsewhere the loss is the cross entropy alone, so a
    fine-tune from the teacher keeps what the teacher gets right and still learns what it gets
    wrong (small talk the teacher answers with a tool call)."""

    def loss_fn(
        ids: torch.Tensor, weights: torch.Tensor, pos: torch.Tensor, doc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inp, tgt, w = ids[:, :-1], ids[:, 1:], weights[:, 1:]
        p, d = pos[:, :-1], doc[:, :-1]
        logits = model.lm_head(model.hidden(inp, p, d)).float()  # (B, T, V)
        ce_tok = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), reduction="none")
        denom = w.sum().clamp_min(1.0)
        ce = (ce_tok * w.flatten()).sum() / denom
        if teacher is None:
            return ce, ce.detach()
        with torch.no_grad():
            t_logp = F.log_softmax(teacher.lm_head(teacher.hidden(inp, p, d)).float(), -1)
        logp = F.log_softmax(logits, -1)
        kl_tok = (t_logp.exp() * (t_logp - logp)).sum(-1)  # (B, T)
        # The KL term's weight per position: w everywhere, or only where the teacher is right.
        mix = torch.full_like(kl_tok, distill_weight)
        if distill_where_teacher_right:
            mix = mix * (t_logp.argmax(-1) == tgt)
        ce_tok = ce_tok.view_as(kl_tok)
        return ((ce_tok + mix * (kl_tok - ce_tok)) * w).sum() / denom, ce.detach()

    return loss_fn


def join_packed(
    sets: list[tuple[Packed, Packed | None, int, int]],
) -> tuple[Packed, Packed | None, int, int]:
    """One training set from several packed ones: their short rows, their long rows, the samples
    dropped and the samples in all."""

    def cat(parts: list[Packed | None]) -> Packed | None:
        kept = [p for p in parts if p is not None]
        if not kept:
            return None
        if len(kept) == 1:
            return kept[0]
        return Packed(
            *(torch.cat(ts) for ts in zip(*((p.ids, p.weights, p.pos, p.doc) for p in kept)))
        )

    short = cat([s[0] for s in sets])
    assert short is not None  # every set has short rows (load_packed_buckets)
    return short, cat([s[1] for s in sets]), sum(s[2] for s in sets), sum(s[3] for s in sets)


def steps_in_budget(
    steps: int, done: int, seconds_per_step: float, elapsed: float, budget: float
) -> int:
    """``--max-minutes``: the step count that fits ``budget`` seconds of training, ``elapsed`` of
    them spent on the ``done`` steps so far, the rest at ``seconds_per_step`` (at least ``done``,
    at most ``steps``); printed when it is lower than ``steps``."""
    fits = max(done, min(steps, done + int((budget - elapsed) / seconds_per_step)))
    if fits < steps:
        print(
            f"--max-minutes {budget / 60:g}: {seconds_per_step * 1000:.0f} ms a step, so {fits} "
            f"steps instead of {steps} (the schedule now ends there)",
            flush=True,
        )
    return fits


CPU = torch.device("cpu")


def autocast(dtype: torch.dtype, device: torch.device = CPU) -> torch.autocast:
    """Autocast to the compute dtype over float32 master weights (off for float32)."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)


def resolve_device(choice: str) -> torch.device:
    """``--device``: ``auto`` takes the first CUDA device where torch sees one, else the CPU."""
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice not in ("cpu", "cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda, got {choice!r}")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device here (use cpu or auto)")
    return torch.device(choice)


def non_finite_message(
    args: argparse.Namespace, step: int, loss: float, gnorm: float, checkpointed: bool
) -> str:
    """The error that stops a run whose loss or gradients stopped being finite, before the optimizer
    step could write NaN into the weights."""
    kept = "its last checkpoint is kept" if checkpointed else "no checkpoint was written yet"
    hint = "a lower --lr"
    if args.precision != "float32":
        hint += " or --precision float32"
        if not args.no_compile:
            # Seen 2026-12-02: torch 2.13's compiled bfloat16 backward on an AMX Xeon gave NaN
            # gradients from the first step; the same step in eager mode was finite.
            hint = "--no-compile (a compiled bfloat16 backward has given NaN gradients), " + hint
    return (
        f"[{args.preset}] step {step}: the loss ({loss}) or the gradient norm ({gnorm}) is not "
        f"finite; stopped before the optimizer step ({kept}, nothing exported). Computing in "
        f"{args.precision}{'' if args.no_compile else ' under torch.compile'}: try {hint}."
    )


def resolve_precision(choice: str, device: torch.device = CPU) -> str:
    """``--precision auto``: bfloat16 where the device multiplies it natively: a GPU that supports
    it, a CPU where oneDNN does (AVX-512 and newer); an AVX2-only CPU emulates bfloat16 matmuls
    (measured 46x slower than float32 on a Zen 3)."""
    if choice != "auto":
        return choice
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "float32"


@torch.no_grad()
def evaluate_loss(
    model: TrainLlama, data: list[Packed], rows: int, dtype: torch.dtype = torch.bfloat16
) -> float:
    """Mean cross entropy on the weight-1 targets of held-out rows (computed in ``dtype`` on the
    model's device)."""
    model.eval()
    device = model.inv_freq.device
    total, count = 0.0, 0.0
    for packed in data:
        for i in range(0, len(packed), rows):
            ids, pos, doc, w = (
                t[i : i + rows].to(device)
                for t in (packed.ids, packed.pos, packed.doc, packed.weights)
            )
            w = (w[:, 1:] >= 1.0).float()
            with autocast(dtype, device):
                logits = model.lm_head(model.hidden(ids[:, :-1], pos[:, :-1], doc[:, :-1])).float()
            ce = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
            total += float((ce * w.flatten()).sum())
            count += float(w.sum())
    model.train()
    return total / max(count, 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument(
        "--data",
        type=Path,
        nargs="+",
        default=[Path("training/out/data")],
        help="generated set(s): each one's train.jsonl is packed on its own (and cached) and all "
        "train together; easy.jsonl and eval.json come from the first",
    )
    ap.add_argument("--tokenizer", type=Path, default=Path("training/out/tokenizer"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seq-len", type=int, default=384, help="row length for short samples")
    ap.add_argument("--long-seq-len", type=int, default=896, help="row length for long samples")
    ap.add_argument(
        "--fill-long-rows",
        action="store_true",
        help="fill the room long samples leave in their rows with short samples (less padding)",
    )
    ap.add_argument(
        "--batch-tokens", type=int, default=7680, help="tokens per batch (both row kinds)"
    )
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="a time budget for the training steps (a resumed run's earlier steps count): after 40 "
        "steps, and every 100 steps after that, the run lowers --steps (its schedule then ends "
        "there) to what fits at the rate of the steps since the last check",
    )
    ap.add_argument(
        "--pack-only",
        action="store_true",
        help="encode and pack --data's train.jsonl (and with --easy-steps the first set's "
        "easy.jsonl) into the files later runs read, and exit; sets can be packed in parallel "
        "this way, one process each",
    )
    ap.add_argument(
        "--easy-steps",
        type=int,
        default=0,
        help="first steps on --data/easy.jsonl (copy drills, simple calls), then train.jsonl",
    )
    ap.add_argument(
        "--drill-frac",
        type=float,
        default=0.0,
        help="share of steps on synthetic copy drills (1 = drills only)",
    )
    ap.add_argument(
        "--drill-steps",
        type=int,
        default=0,
        help="first steps on copy drills only (before --easy-steps)",
    )
    ap.add_argument(
        "--drill-kinds",
        default="copy",
        help=f"comma list of drill kinds, drawn uniformly per segment: {', '.join(DRILL_KINDS)}",
    )
    ap.add_argument(
        "--grow-from",
        type=Path,
        default=None,
        help="HF dir of a shallower model of the same width: its layers start the model",
    )
    ap.add_argument(
        "--layers",
        type=int,
        default=None,
        help="number of layers instead of the preset's (with --grow-from: a deeper model)",
    )
    ap.add_argument(
        "--new-layer-lr-mult",
        type=float,
        default=1.0,
        help="with --grow-from and --optimizer muon: the new layers' weight matrices learn at "
        "this multiple of --lr",
    )
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument(
        "--optimizer",
        choices=("adamw", "muon"),
        default="adamw",
        help="muon: Muon for the hidden weight matrices, AdamW for the rest (training/muon.py)",
    )
    ap.add_argument(
        "--prompt-loss-weight",
        type=float,
        default=0.5,
        help="loss weight of non-assistant chat tokens (assistant turns and prose: 1)",
    )
    ap.add_argument(
        "--name-loss-weight",
        type=float,
        default=1.0,
        help="loss weight of the tokens of a called function's name in assistant tool calls",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (compute on a CPU, data)")
    ap.add_argument(
        "--device",
        default="auto",
        help="auto (the first CUDA device where torch sees one, else the CPU), cpu or cuda",
    )
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument(
        "--precision",
        choices=["auto", "bfloat16", "float32"],
        default="auto",
        help="compute dtype over float32 master weights (autocast and Muon's Newton-Schulz); auto: "
        "bfloat16 where the CPU multiplies it natively (AVX-512), else float32 (an AVX2 CPU "
        "emulates bfloat16 matmuls ~40x slower than float32 ones)",
    )
    ap.add_argument(
        "--init", type=Path, default=None, help="HF dir to start from (continued training)"
    )
    ap.add_argument(
        "--teacher", type=Path, default=None, help="HF dir of a teacher for distillation"
    )
    ap.add_argument("--distill-weight", type=float, default=0.7)
    ap.add_argument(
        "--distill-where-teacher-right",
        action="store_true",
        help="with --teacher: the KL term only where the teacher's top token is the label, the "
        "cross entropy alone elsewhere (fine-tuning a model from itself without forgetting)",
    )
    ap.add_argument("--checkpoint-every", type=int, default=500)
    ap.add_argument("--resume", action="store_true", help="continue from --out/checkpoint.pt")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="print the held-out loss (assistant turns and prose) every this many steps",
    )
    args = ap.parse_args()
    if args.steps < 1:
        ap.error(f"--steps {args.steps}: at least 1")
    if not 0 <= args.drill_frac <= 1:
        ap.error(f"--drill-frac {args.drill_frac}: a share of the steps, in [0, 1]")
    if args.lr <= 0:
        ap.error(f"--lr {args.lr}: must be positive")
    if args.layers is not None and args.layers < 1:
        ap.error(f"--layers {args.layers}: at least 1")
    if args.max_minutes is not None and args.max_minutes <= 0:
        ap.error(f"--max-minutes {args.max_minutes}: must be positive")
    if args.distill_where_teacher_right and args.teacher is None:
        ap.error("--distill-where-teacher-right needs --teacher")
    if args.new_layer_lr_mult != 1.0 and (args.grow_from is None or args.optimizer != "muon"):
        ap.error("--new-layer-lr-mult needs --grow-from and --optimizer muon")
    try:
        device = resolve_device(args.device)
    except ValueError as error:
        ap.error(str(error))
    args.precision = resolve_precision(args.precision, device)
    inputs = [("--tokenizer", args.tokenizer), *(("--data", d / "train.jsonl") for d in args.data)]
    inputs += [("--init", args.init), ("--teacher", args.teacher), ("--grow-from", args.grow_from)]
    missing = [f"{flag} {path}" for flag, path in inputs if path is not None and not path.exists()]
    if missing:
        ap.error(f"no such file or directory: {', '.join(missing)}")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.time()
    packed_sets = [
        load_packed_buckets(
            data / "train.jsonl",
            args.tokenizer,
            args.prompt_loss_weight,
            args.seq_len,
            args.long_seq_len,
            args.seed,
            args.name_loss_weight,
            args.fill_long_rows,
        )
        for data in args.data
    ]
    easy: list[Packed] = []
    if args.easy_steps:
        e1, e2, _, _ = load_packed_buckets(
            args.data[0] / "easy.jsonl",
            args.tokenizer,
            args.prompt_loss_weight,
            args.seq_len,
            args.long_seq_len,
            args.seed + 7,
            args.name_loss_weight,
        )
        easy = [p for p in (e1, e2) if p is not None]
        print(
            f"[{args.preset}] first {args.easy_steps} steps on easy.jsonl: "
            f"{' + '.join(f'{len(p)} rows of {p.ids.shape[1]}' for p in easy)}",
            flush=True,
        )
    if args.pack_only:
        print(f"[{args.preset}] packed {', '.join(map(str, args.data))} in {time.time() - t0:.0f}s")
        return
    short, long, dropped, num_samples = join_packed(packed_sets)
    del packed_sets
    eval_samples = json.load(open(args.data[0] / "eval.json", encoding="utf-8"))["ppl"]
    e_short, e_long, _ = pack_buckets(
        encode_samples(eval_samples, args.tokenizer), args.seq_len, args.long_seq_len, 0
    )
    eval_data = [p for p in (e_short, e_long) if p is not None]
    main_buckets = [p for p in (short, long) if p is not None]
    buckets = main_buckets + easy
    rows_per_batch = [max(1, args.batch_tokens // (p.ids.shape[1] - 1)) for p in buckets]
    tokens = [int((p.ids != 0).sum()) for p in buckets]
    n_tok = sum(tokens[: len(main_buckets)])
    print(
        f"[{args.preset}] {num_samples} samples ({dropped} too long, dropped) -> "
        f"{' + '.join(f'{len(p)} rows of {p.ids.shape[1]}' for p in buckets)}; {n_tok / 1e6:.2f}M tokens, "
        f"{float(sum((p.weights >= 1).sum() for p in buckets)) / 1e6:.2f}M at weight 1; "
        f"{args.steps} steps x ~{args.batch_tokens} tokens = {args.steps * args.batch_tokens / n_tok:.2f} epochs; "
        f"data {time.time() - t0:.0f}s",
        flush=True,
    )

    drill_toks = DrillTokens(args.tokenizer)
    vocab_size = drill_toks.vocab_size
    drill_kinds = tuple(args.drill_kinds.split(","))
    if not drill_kinds or any(k not in DRILL_KINDS for k in drill_kinds):
        ap.error(f"--drill-kinds {args.drill_kinds!r}: a comma list of {', '.join(DRILL_KINDS)}")
    shape = shape_for(args.preset, vocab_size, args.layers)
    model = TrainLlama(shape)
    if args.init is not None:
        _, state = load_hf_weights(args.init)
        model.load_state_dict(state)
        print(f"[{args.preset}] initialised from {args.init}", flush=True)
    if args.grow_from is not None:
        seed_shape, state = load_hf_weights(args.grow_from)
        grown_from = seed_shape.num_hidden_layers
        grow(model, state, grown_from)
        print(
            f"[{args.preset}] layers 1-{grown_from} from {args.grow_from}, "
            f"{shape.num_hidden_layers - grown_from} new",
            flush=True,
        )
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"[{args.preset}] {n_params / 1e6:.2f}M parameters, {shape.num_hidden_layers} layers",
        flush=True,
    )
    compute_dtype = getattr(torch, args.precision)
    print(f"[{args.preset}] computing in {args.precision} on {device}", flush=True)

    teacher = None
    if args.teacher is not None:
        t_shape, t_state = load_hf_weights(args.teacher)
        teacher = TrainLlama(t_shape)
        teacher.load_state_dict(t_state)
        teacher.to(device).eval().requires_grad_(False)
        print(
            f"[{args.preset}] distilling from {args.teacher} (weight {args.distill_weight}"
            + (", where the teacher is right)" if args.distill_where_teacher_right else ")"),
            flush=True,
        )

    # Muon takes the hidden weight matrices; the tied embedding/output head and the norm gains stay
    # with AdamW (muon.py).
    hidden = (
        [p for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n]
        if args.optimizer == "muon"
        else []
    )
    in_muon = {id(p) for p in hidden}
    muon_groups = (  # a multiplier other than 1 comes with --grow-from (checked above)
        grown_layer_groups(model, hidden, grown_from, args.new_layer_lr_mult)
        if args.new_layer_lr_mult != 1.0
        else [{"params": hidden}]
    )
    decay = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in in_muon]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    adamw = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    opt = Optimizers(
        *(
            [
                Muon(
                    muon_groups,
                    lr=args.lr,
                    weight_decay=args.weight_decay,
                    ns_dtype=compute_dtype,
                    stacked=device.type == "cuda",
                )
            ]
            if hidden
            else []
        ),
        adamw,
    )

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
        return args.lr * (
            args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))
        )

    args.out.mkdir(parents=True, exist_ok=True)
    ckpt_path = args.out / "checkpoint.pt"
    start_step = 0
    elapsed_before = 0.0
    command_steps = args.steps
    resumed: dict[str, Any] = {}
    if args.resume and ckpt_path.exists():
        resumed = torch.load(ckpt_path, map_location=device, weights_only=False)
        model.load_state_dict(resumed["model"])
        opt.load_state_dict(resumed["opt"])
        start_step = resumed["step"]
        elapsed_before = resumed.get("elapsed_s", 0.0)
        # A count --max-minutes lowered stays lowered when the command gives the count it gave
        # before: the schedule resumes where it was (from the command line's count the learning
        # rate jumped back up, then fell off a cliff). A different count is a deliberate change.
        if args.steps == resumed.get("command_steps", args.steps):
            args.steps = min(args.steps, resumed.get("steps", args.steps))
        if args.steps < start_step:
            raise SystemExit(
                f"[{args.preset}] --steps {args.steps} is below the step the checkpoint in "
                f"{args.out} reached ({start_step}): give at least {start_step}, or start afresh "
                "(another --out, or without --resume)"
            )
        print(
            f"[{args.preset}] resumed at step {start_step} ({elapsed_before / 60:.1f} min in)",
            flush=True,
        )

    loss_fn = make_loss_fn(model, teacher, args.distill_weight, args.distill_where_teacher_right)
    if not args.no_compile:
        loss_fn = torch.compile(loss_fn, dynamic=False)
    # The batch plan is a pure function of the seed, and the drill generator's state is in the
    # checkpoint: a resumed run sees the same batches and drills, and ends with the same weights.
    g = torch.Generator().manual_seed(args.seed)
    orders = [torch.randperm(len(p), generator=g) for p in buckets]
    cursors = [0] * len(buckets)
    # Each batch's bucket is drawn with probability proportional to its tokens, so one pass over
    # the data visits every row about equally often: the easy buckets first, then the main ones.
    plan_rng = random.Random(args.seed)
    main_ids = list(range(len(main_buckets)))
    easy_ids = list(range(len(main_buckets), len(buckets)))
    plan = [
        plan_rng.choices(easy_ids, weights=[tokens[i] for i in easy_ids])[0]
        if step < args.drill_steps + args.easy_steps
        else plan_rng.choices(main_ids, weights=[tokens[i] for i in main_ids])[0]
        for step in range(args.steps)
    ]
    drill_rng = random.Random(args.seed + 99)
    drill_plan = [
        step < args.drill_steps or drill_rng.random() < args.drill_frac
        for step in range(args.steps)
    ]
    drill_rows = max(1, args.batch_tokens // args.seq_len)
    for step in range(start_step):  # advance the cursors past finished steps
        if not drill_plan[step]:
            cursors[plan[step]] += rows_per_batch[plan[step]]
    if "drill_rng" in resumed:
        drill_rng.setstate(resumed["drill_rng"])

    model.train()
    t_train = time.time()
    tokens_seen = 0
    ema = resumed.get("ema")
    del resumed
    steps_done = start_step
    t_mark, mark = t_train, start_step
    for step in range(start_step, args.steps):
        if step >= args.steps:  # --max-minutes lowered it
            break
        b = plan[step]
        if drill_plan[step]:
            packed, n_rows = (
                copy_drills(drill_rows, args.seq_len + 1, drill_toks, drill_rng, drill_kinds),
                drill_rows,
            )
            idx = torch.arange(n_rows)
        else:
            packed, n_rows = buckets[b], rows_per_batch[b]
            idx = torch.stack([orders[b][(cursors[b] + j) % len(packed)] for j in range(n_rows)])
            cursors[b] += n_rows
        for group in opt.param_groups:
            group["lr"] = lr_at(step) * group.get("lr_mult", 1.0)
        batch = [
            t[idx].to(device, non_blocking=True)
            for t in (packed.ids, packed.weights, packed.pos, packed.doc)
        ]
        with autocast(compute_dtype, device):
            loss, ce = loss_fn(*batch)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        loss_value, gnorm_value = loss.item(), gnorm.item()
        if not (math.isfinite(loss_value) and math.isfinite(gnorm_value)):
            raise SystemExit(
                non_finite_message(args, step + 1, loss_value, gnorm_value, ckpt_path.exists())
            )
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens_seen += batch[0].numel()
        steps_done = step + 1
        # --max-minutes: after step 40 at the rate of steps 11-40 (the first ones warm caches and
        # kernels up), then every 100 steps at the rate of the last 100 (other work on the device
        # can start or stop meanwhile).
        if args.max_minutes is not None and steps_done == start_step + 10:
            t_mark, mark = time.time(), steps_done
        elif args.max_minutes is not None and (steps_done - start_step) % 100 == 40:
            now = time.time()
            args.steps = steps_in_budget(
                args.steps,
                steps_done,
                (now - t_mark) / (steps_done - mark),
                elapsed_before + now - t_train,
                args.max_minutes * 60,
            )
            t_mark, mark = now, steps_done
        ce_value = ce.item()
        ema = ce_value if ema is None else 0.95 * ema + 0.05 * ce_value
        if (step + 1) % args.log_every == 0 or step == start_step:
            el = time.time() - t_train
            rate = tokens_seen / el
            eta = (args.steps - step - 1) * args.batch_tokens / rate
            print(
                f"[{args.preset}] step {step + 1}/{args.steps} loss {ce_value:.4f} (ema {ema:.4f}) "
                f"lr {lr_at(step):.2e} gnorm {gnorm_value:.2f} {rate:.0f} tok/s elapsed {el / 60:.1f}m "
                f"eta {eta / 60:.1f}m",
                flush=True,
            )
        if args.eval_every and (step + 1) % args.eval_every == 0:
            held = evaluate_loss(
                model, eval_data, max(1, args.batch_tokens // args.seq_len), compute_dtype
            )
            print(f"[{args.preset}] step {step + 1} held-out loss {held:.4f}", flush=True)
        if (step + 1) % args.checkpoint_every == 0 and step + 1 < args.steps:
            torch.save(
                {
                    "model": model.state_dict(),
                    "opt": opt.state_dict(),
                    "step": step + 1,
                    "steps": args.steps,  # the planned count, as --max-minutes may have set it
                    "command_steps": command_steps,
                    "elapsed_s": elapsed_before + time.time() - t_train,
                    "drill_rng": drill_rng.getstate(),
                    "ema": ema,
                },
                ckpt_path,
            )

    held = evaluate_loss(model, eval_data, max(1, args.batch_tokens // args.seq_len), compute_dtype)
    final = {
        "preset": args.preset,
        "parameters": n_params,
        "steps": steps_done,
        "batch_tokens": args.batch_tokens,
        "seq_len": args.seq_len,
        "long_seq_len": args.long_seq_len,
        "fill_long_rows": args.fill_long_rows,
        "lr": args.lr,
        "optimizer": args.optimizer,
        "precision": args.precision,
        "device": str(device),
        "prompt_loss_weight": args.prompt_loss_weight,
        "name_loss_weight": args.name_loss_weight,
        "teacher": str(args.teacher) if args.teacher else None,
        "distill_weight": args.distill_weight if args.teacher else None,
        "distill_where_teacher_right": args.distill_where_teacher_right,
        "train_loss_ema": ema,
        "heldout_loss": held,
        "heldout_ppl": math.exp(held),
        "train_minutes": (elapsed_before + time.time() - t_train) / 60,
        "total_minutes": (time.time() - t0) / 60,
    }
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
