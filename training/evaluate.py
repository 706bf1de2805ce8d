"""Evaluate the brisk models on held-out synthetic data with transformers (greedy decoding).

Reports, on prompts whose function names, argument names, people and places never occur in
training (``training/pools.py``):
- tool-call exact match: the parsed calls (names and argument objects, in order) equal the expected;
- JSON extraction field accuracy: share of schema fields whose value equals the expected value
  (and the share of objects entirely right), for person sentences and for labelled records;
- JSON-with-given-keys compliance: the reply parses as a JSON object with exactly the asked keys;
- held-out perplexity of both models on trained tokens (assistant turns and prose);
- draft agreement: teacher-forced on the target's greedy outputs, the share of positions where the
  draft's argmax equals the target's token.
It also checks that transformers' ``apply_chat_template`` renders the held-out conversations exactly
as ``training/chat_format.py`` does.

    python -m training.evaluate --target src/brisklm/assets/brisk-chat --draft src/brisklm/assets/brisk-draft
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from training.chat_format import render
from training.train import encode_samples, pack

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> list[dict[str, Any]] | None:
    """Parse ``<tool_call>{json}</tool_call>`` blocks; None when any block is not valid JSON."""
    calls = []
    for body in TOOL_CALL_RE.findall(text):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict):
            return None
        calls.append({"name": obj.get("name"), "arguments": obj.get("arguments")})
    return calls


def same_value(a: Any, b: Any) -> bool:
    """Equal JSON values, where a bool never equals a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def parse_json_object(text: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(text.strip())
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


class Generator:
    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.stop_ids = [self.tok.convert_tokens_to_ids("<|im_end|>"),
                         self.tok.convert_tokens_to_ids("<|endoftext|>")]

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        text = self.tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                            tokenize=False)
        expected = render(messages, tools, add_generation_prompt=True)
        if text != expected:
            raise AssertionError(f"chat template mismatch:\n{text!r}\n!=\n{expected!r}")
        return self.tok(text, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy-decode a batch (left-padded); each output ends at its first stop token."""
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = self.model.generate(input_ids=ids, attention_mask=mask,
                                  max_new_tokens=max_new_tokens, do_sample=False,
                                  eos_token_id=self.stop_ids, pad_token_id=0)
        results = []
        for row in out[:, width:].tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in self.stop_ids), len(row))
            results.append(row[:cut])
        return results

    def text(self, ids: list[int]) -> str:
        return self.tok.decode([i for i in ids if i not in self.stop_ids], skip_special_tokens=False)


def run_tasks(gen: Generator, ev: dict[str, list[dict]], limit: int, log: bool,
              batch_size: int = 16) -> tuple[dict, list]:
    """Greedy-decode every task prompt; returns (metrics, [(prompt ids, output ids)])."""
    pairs: list[tuple[list[int], list[int]]] = []
    metrics: dict[str, Any] = {}
    examples: dict[str, list] = {}

    def decode_all(samples: list[dict], max_new: int) -> list[str]:
        prompts = [gen.prompt_ids(s["prompt_messages"], s.get("tools")) for s in samples]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # less padding
        texts = [""] * len(prompts)
        for b in range(0, len(order), batch_size):
            idx = order[b:b + batch_size]
            for i, out in zip(idx, gen.generate([prompts[i] for i in idx], max_new), strict=True):
                pairs.append((prompts[i], out))
                texts[i] = gen.text(out)
        return texts

    # Tool calls.
    exact = name_ok = parsed = 0
    items = ev["tool_call"][:limit]
    for s, text in zip(items, decode_all(items, 160), strict=True):
        calls = parse_tool_calls(text)
        ok = calls is not None and len(calls) == len(s["expected"]) and all(
            c["name"] == e["name"] and same_value(c["arguments"], e["arguments"])
            for c, e in zip(calls, s["expected"], strict=False))
        parsed += calls is not None and len(calls) > 0
        name_ok += calls is not None and [c["name"] for c in calls] == [e["name"] for e in s["expected"]]
        exact += ok
        if not ok:
            examples.setdefault("tool_call", []).append({"expected": s["expected"], "got": text})
    metrics["tool_call_exact_match"] = exact / len(items)
    metrics["tool_call_name_match"] = name_ok / len(items)
    metrics["tool_call_parsed"] = parsed / len(items)
    if log:
        print(f"  tool calls: exact {exact}/{len(items)}", flush=True)

    # Extraction.
    for task in ("extract", "extract_labelled"):
        items = ev[task][:limit]
        fields = right = whole = valid = 0
        for s, text in zip(items, decode_all(items, 120), strict=True):
            obj = parse_json_object(text)
            valid += obj is not None
            exp = s["expected"]
            got = sum(1 for k, v in exp.items() if obj is not None and k in obj and same_value(obj[k], v))
            fields += len(exp)
            right += got
            ok = obj is not None and same_value(obj, exp)
            whole += ok
            if not ok:
                examples.setdefault(task, []).append({"expected": exp, "got": text})
        metrics[f"{task}_field_accuracy"] = right / fields
        metrics[f"{task}_object_exact"] = whole / len(items)
        metrics[f"{task}_valid_json"] = valid / len(items)
        if log:
            print(f"  {task}: fields {right}/{fields}", flush=True)

    # JSON with given keys.
    items = ev["json_keys"][:limit]
    comply = values = 0
    for s, text in zip(items, decode_all(items, 80), strict=True):
        obj = parse_json_object(text)
        ok = obj is not None and list(obj) == s["expected_keys"]
        comply += ok
        values += obj is not None and same_value(obj, s["expected"])
        if not ok:
            examples.setdefault("json_keys", []).append({"expected_keys": s["expected_keys"], "got": text})
    metrics["json_keys_compliance"] = comply / len(items)
    metrics["json_keys_values_exact"] = values / len(items)
    if log:
        print(f"  json keys: compliant {comply}/{len(items)}", flush=True)
    metrics["failures"] = {k: v[:5] for k, v in examples.items()}
    return metrics, pairs


@torch.no_grad()
def heldout_ppl(model: Any, ev: dict, tokenizer_dir: Path) -> float:
    ids, mask = pack(encode_samples(ev["ppl"], tokenizer_dir), 641, 0)
    total, count = 0.0, 0
    for i in range(0, len(ids), 8):
        b, m = ids[i:i + 8], mask[i:i + 8, 1:]
        logits = model(input_ids=b[:, :-1]).logits
        total += F.cross_entropy(logits[m], b[:, 1:][m], reduction="sum").item()
        count += int(m.sum())
    return math.exp(total / count)


@torch.no_grad()
def draft_agreement(draft: Any, pairs: list[tuple[list[int], list[int]]]) -> float:
    agree = total = 0
    for prompt, out in pairs:
        if not out:
            continue
        ids = torch.tensor([prompt + out])
        logits = draft(input_ids=ids[:, :-1]).logits[0, len(prompt) - 1:]  # predicts out[0..]
        agree += int((logits.argmax(-1) == torch.tensor(out)).sum())
        total += len(out)
    return agree / max(total, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=Path("src/brisklm/assets/brisk-chat"))
    ap.add_argument("--draft", type=Path, default=Path("src/brisklm/assets/brisk-draft"))
    ap.add_argument("--data", type=Path, default=Path("training/out/data"))
    ap.add_argument("--limit", type=int, default=200, help="prompts per task")
    ap.add_argument("--draft-tasks", action="store_true", help="also score the draft on the tasks")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ev = json.load(open(args.data / "eval.json", encoding="utf-8"))
    t0 = time.time()
    results: dict[str, Any] = {"limit_per_task": args.limit}

    target = Generator(args.target)
    print("target: tasks", flush=True)
    results["target"], pairs = run_tasks(target, ev, args.limit, True)
    results["target"]["heldout_ppl"] = heldout_ppl(target.model, ev, args.target)
    draft = Generator(args.draft)
    results["draft"] = {"heldout_ppl": heldout_ppl(draft.model, ev, args.draft)}
    if args.draft_tasks:
        print("draft: tasks", flush=True)
        m, _ = run_tasks(draft, ev, args.limit, True)
        results["draft"].update(m)
    results["draft_agreement"] = draft_agreement(draft.model, pairs)
    results["draft_agreement_tokens"] = sum(len(o) for _, o in pairs)
    results["eval_minutes"] = (time.time() - t0) / 60
    summary = {k: v for k, v in results["target"].items() if k != "failures"}
    print(json.dumps({"target": summary,
                      "draft": {k: v for k, v in results["draft"].items() if k != "failures"},
                      "draft_agreement": results["draft_agreement"]}, indent=2))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, ensure_ascii=False, indent=2)


if __name__ == "__main__":
    main()
