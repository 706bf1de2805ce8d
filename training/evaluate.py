"""Evaluate the brisk models on held-out synthetic data, through brisklm (greedy decoding).

Every prompt's function names, argument names, people and places come from the held-out pools of
``training/pools.py`` (or are made up), so the models must copy them from the prompt. Reports:
- tool calls (``tool_call_grammar(tools, "auto")`` constrained, and unconstrained): exact match
  (parsed calls equal the expected names and arguments, in order), name match, parsed share, the
  misses by kind (number of calls, function name, argument names, a value) and the exact match by
  prompt length in tokens; and the same for calls with a free-text argument stated as a phrase
  ("... named X - a small bakery");
- JSON extraction (``json_schema`` constrained, and unconstrained): field accuracy (share of schema
  fields whose value equals the expected one), whole-object exact match and valid-JSON share, for
  person sentences and for labelled records;
- JSON with given keys ("Reply in JSON with keys X and Y"): compliance (a JSON object with exactly
  those keys, in order), free and in JSON mode (``json_object=True``), and values exact;
- simple chat (greetings, arithmetic, capitals, ...): exact answer; answers after a tool result
  that mention every value of the result;
- small talk and simple questions with tools offered (constrained, and unconstrained): the share
  answered in text with no tool call, for held-out phrases ("Hi there", "Cheers", ...);
- the requests the README and examples make of the target (``usage_checks.py``: "What is the
  weather in Paris?" with ``examples/agent_tools.py``'s tools, "Hello!" with tools offered, ...),
  each with its probability of a call;
- held-out perplexity of both models on trained tokens (assistant turns and prose), transformers;
- draft agreement: teacher-forced on the target's greedy outputs (all tasks above), the share of
  positions where the draft's argmax is the target's token;
- with ``--speed``: batch-1 greedy decode speed in brisklm with and without the draft (speculative).
It also checks that brisklm's and transformers' chat templates render the held-out conversations,
tools included, exactly as ``training/chat_format.py`` does.

    python -m training.evaluate --data training/out/data --out training/eval_results.json --speed
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from training import usage_checks
from training.chat_format import render
from training.train import encode_samples


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


def value_text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


class Runner:
    """Greedy generation through brisklm; keeps (prompt ids, output ids) for the draft agreement."""

    def __init__(self, model_dir: Path, batch_size: int) -> None:
        from brisklm import LLM

        self.llm = LLM.from_pretrained(
            model_dir, dtype="float32", max_batch_size=batch_size, show_progress=False
        )
        self.eos = set(self.llm.tokenizer.eos_token_ids)
        self.pairs: list[tuple[list[int], list[int]]] = []

    def prompt(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return self.llm.chat_prompt_ids(messages, tools)

    def close(self) -> None:
        """Stop the engine's thread (a thread left running into interpreter exit can abort it)."""
        self.llm.close()

    def generate(self, prompts: list[list[int]], params: list[Any]) -> list[str]:
        outs = self.llm.generate(prompts, params)
        for p, o in zip(prompts, outs, strict=True):
            self.pairs.append((p, list(o.token_ids)))
        return [o.text for o in outs]


def greedy(max_tokens: int, **constraint: Any) -> Any:
    from brisklm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **constraint)


def tool_prompts(
    run: Runner, items: list[dict], constrained: bool, max_tokens: int
) -> tuple[list[list[int]], list[Any]]:
    """The prompts of samples with tools offered, and greedy parameters for each: constrained to
    text or calls of its tools (``tool_call_grammar(tools, "auto")``), or free."""
    from brisklm.tool_calls import tool_call_grammar

    prompts = [run.prompt(s["prompt_messages"], s["tools"]) for s in items]
    params = [
        greedy(max_tokens, grammar=tool_call_grammar(s["tools"], "auto"))
        if constrained
        else greedy(max_tokens)
        for s in items
    ]
    return prompts, params


def call_miss(got: list[dict], expected: list[dict]) -> str | None:
    """Why parsed calls miss the expected ones, or None when they match. The first that applies,
    in this order: ``count`` (another number of calls), ``name`` (a call to another function),
    ``keys`` (other argument names), ``value`` (an argument's value)."""
    if len(got) != len(expected):
        return "count"
    if [g["name"] for g in got] != [e["name"] for e in expected]:
        return "name"
    if any(g["arguments"].keys() != e["arguments"].keys() for g, e in zip(got, expected)):
        return "keys"
    if not all(same_value(g["arguments"], e["arguments"]) for g, e in zip(got, expected)):
        return "value"
    return None


LENGTH_BUCKET = 100  # prompt tokens per bucket of the exact match by prompt length


def by_length(lengths: list[int], ok: list[bool]) -> dict[str, dict[str, float]]:
    """Exact match by prompt length, in buckets of LENGTH_BUCKET tokens ("200-299": share, n)."""
    buckets: dict[int, list[int]] = {}
    for n_tok, good in zip(lengths, ok, strict=True):
        b = buckets.setdefault(n_tok // LENGTH_BUCKET, [0, 0])
        b[0] += good
        b[1] += 1
    return {
        f"{k * LENGTH_BUCKET}-{(k + 1) * LENGTH_BUCKET - 1}": {"exact_match": a / n, "n": n}
        for k, (a, n) in sorted(buckets.items())
    }


def eval_tool_calls(run: Runner, items: list[dict], constrained: bool) -> tuple[dict, list]:
    """Exact match, name match and parsed share; the misses counted by kind (``call_miss``) and
    the exact match by prompt length."""
    from brisklm.tool_calls import parse_tool_calls

    prompts, params = tool_prompts(run, items, constrained, 200)
    name_ok = parsed = 0
    misses = {"count": 0, "name": 0, "keys": 0, "value": 0}
    ok_list = []
    failures = []
    for s, text in zip(items, run.generate(prompts, params), strict=True):
        _, calls = parse_tool_calls(text)
        got = [{"name": c.name, "arguments": c.arguments} for c in calls]
        miss = call_miss(got, s["expected"])
        ok_list.append(miss is None)
        parsed += bool(got)
        name_ok += miss not in ("count", "name")  # the same functions, in order
        if miss is not None:
            misses[miss] += 1
            failures.append(
                {
                    "miss": miss,
                    "request": s["prompt_messages"][-1]["content"],
                    "expected": s["expected"],
                    "got": text,
                }
            )
    n = len(items)
    return {
        "exact_match": sum(ok_list) / n,
        "name_match": name_ok / n,
        "parsed": parsed / n,
        "misses": misses,
        "exact_by_prompt_tokens": by_length([len(p) for p in prompts], ok_list),
    }, failures


def brief(metrics: dict) -> dict:
    """A task's figures for the progress line: without the exact match by prompt length."""
    return {k: v for k, v in metrics.items() if k != "exact_by_prompt_tokens"}


def eval_extraction(run: Runner, items: list[dict], constrained: bool) -> tuple[dict, list]:
    prompts = [run.prompt(s["prompt_messages"]) for s in items]
    params = [greedy(160, json_schema=s["schema"]) if constrained else greedy(160) for s in items]
    fields = right = whole = valid = 0
    failures = []
    for s, text in zip(items, run.generate(prompts, params), strict=True):
        obj = parse_json_object(text)
        exp = s["expected"]
        valid += obj is not None
        fields += len(exp)
        right += sum(
            1 for k, v in exp.items() if obj is not None and k in obj and same_value(obj[k], v)
        )
        ok = obj is not None and same_value(obj, exp)
        whole += ok
        if not ok:
            failures.append(
                {"text": s["prompt_messages"][-1]["content"], "expected": exp, "got": text}
            )
    n = len(items)
    return {
        "field_accuracy": right / fields,
        "object_exact": whole / n,
        "valid_json": valid / n,
    }, failures


def eval_no_tool(run: Runner, items: list[dict], constrained: bool) -> tuple[dict, list]:
    """Small talk and simple questions with tools offered: the share answered in text, calling no
    tool (``text_answer``; for the small talk alone ``small_talk_text_answer``), and the share
    answered with exactly the reply written with the prompt (``reply_exact``)."""
    from brisklm.tool_calls import TOOL_CALL_START, parse_tool_calls

    prompts, params = tool_prompts(run, items, constrained, 60)
    text_ok = exact = talk = talk_ok = 0
    failures = []
    for s, text in zip(items, run.generate(prompts, params), strict=True):
        content, calls = parse_tool_calls(text)
        ok = not calls and TOOL_CALL_START not in text and bool(content.strip())
        text_ok += ok
        exact += ok and content.strip() == s["expected_text"]
        if s.get("small_talk"):
            talk += 1
            talk_ok += ok
        if not ok:
            failures.append(
                {
                    "request": s["prompt_messages"][-1]["content"],
                    "expected": s["expected_text"],
                    "got": text,
                }
            )
    n = len(items)
    return {
        "text_answer": text_ok / n,
        "small_talk_text_answer": talk_ok / max(1, talk),
        "small_talk_items": talk,
        "reply_exact": exact / n,
    }, failures


# The tasks scored with and without their grammar: eval.json's key -> its scoring function.
GRAMMAR_TASKS = {
    "tool_call": eval_tool_calls,
    "tool_call_free_text": eval_tool_calls,
    "tool_call_natural": eval_tool_calls,
    "tool_call_chatty": eval_tool_calls,
    "extract": eval_extraction,
    "extract_labelled": eval_extraction,
    "tool_none": eval_no_tool,
}


def eval_json_keys(run: Runner, items: list[dict], json_mode: bool) -> tuple[dict, list]:
    prompts = [run.prompt(s["prompt_messages"]) for s in items]
    params = [greedy(100, json_object=True) if json_mode else greedy(100) for _ in items]
    comply = values = 0
    failures = []
    for s, text in zip(items, run.generate(prompts, params), strict=True):
        obj = parse_json_object(text)
        ok = obj is not None and list(obj) == s["expected_keys"]
        comply += ok
        values += obj is not None and same_value(obj, s["expected"])
        if not ok:
            failures.append(
                {
                    "request": s["prompt_messages"][-1]["content"],
                    "expected_keys": s["expected_keys"],
                    "got": text,
                }
            )
    n = len(items)
    return {"compliance": comply / n, "values_exact": values / n}, failures


def eval_chat(run: Runner, ppl_samples: list[dict], limit: int) -> tuple[dict, list]:
    """First turn of held-out chats (exact answer) and answers after tool results (values used)."""
    chats = [s for s in ppl_samples if s["kind"] == "chat"][:limit]
    # The first assistant turn, after whatever precedes it (a system message only half the time:
    # taking two messages as the prompt scored a chat without one against its second question)
    firsts = [
        next(i for i, m in enumerate(s["messages"]) if m["role"] == "assistant") for s in chats
    ]
    prompts = [run.prompt(s["messages"][:first]) for s, first in zip(chats, firsts, strict=True)]
    expected = [s["messages"][first]["content"] for s, first in zip(chats, firsts, strict=True)]
    failures = []
    exact = 0
    for _p, e, text in zip(
        prompts, expected, run.generate(prompts, [greedy(60)] * len(prompts)), strict=True
    ):
        exact += text.strip() == e
        if text.strip() != e:
            failures.append({"expected": e, "got": text})
    loops = [s for s in ppl_samples if s["kind"] == "tool_loop"][:limit]
    prompts = [run.prompt(s["messages"][:-1], s["tools"]) for s in loops]
    used = 0
    for s, text in zip(loops, run.generate(prompts, [greedy(120)] * len(prompts)), strict=True):
        values = [
            value_text(v)
            for m in s["messages"]
            if m["role"] == "tool"
            for v in json.loads(m["content"]).values()
        ]
        ok = "<tool_call>" not in text and all(v in text for v in values)
        used += ok
        if not ok:
            failures.append(
                {
                    "tool_results": [m["content"] for m in s["messages"] if m["role"] == "tool"],
                    "got": text,
                }
            )
    return {
        "chat_exact": exact / max(1, len(chats)),
        "chat_items": len(chats),
        "tool_answer_uses_values": used / max(1, len(loops)),
        "tool_answer_items": len(loops),
    }, failures


def check_templates(model_dir: Path, samples: list[dict]) -> int:
    """brisklm and transformers render every conversation exactly as training did; returns the count."""
    from transformers import AutoTokenizer

    from brisklm import Tokenizer

    ours = Tokenizer.from_pretrained(model_dir)
    hf = AutoTokenizer.from_pretrained(model_dir)
    for s in samples:
        msgs, tools = s.get("prompt_messages", s.get("messages")), s.get("tools")
        want = render(msgs, tools, add_generation_prompt=True)
        a = ours.apply_chat_template(msgs, tools=tools, add_generation_prompt=True)
        b = hf.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)
        if not (a == b == want):
            raise AssertionError(f"chat template mismatch:\n{want!r}\n{a!r}\n{b!r}")
    return len(samples)


@torch.no_grad()
def heldout_ppl(model_dir: Path, samples: list[dict]) -> float:
    """Perplexity on the trained tokens (assistant turns and prose) of held-out samples, one at a time."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total, count = 0.0, 0.0
    for ids, weights in encode_samples(samples, model_dir, prompt_weight=0.0):
        x = torch.tensor([ids[1:]])  # no leading <|endoftext|>, as at inference
        w = torch.tensor(weights[2:])
        ce = F.cross_entropy(model(input_ids=x[:, :-1]).logits[0], x[0, 1:], reduction="none")
        total += float((ce * w).sum())
        count += float(w.sum())
    return math.exp(total / count)


@torch.no_grad()
def draft_agreement(draft_dir: Path, pairs: list[tuple[list[int], list[int]]]) -> tuple[float, int]:
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    agree = total = 0
    for prompt, out in pairs:
        if not out:
            continue
        ids = torch.tensor([prompt + out])
        pred = draft(input_ids=ids[:, :-1]).logits[0, len(prompt) - 1 :].argmax(-1)  # predicts out
        agree += int((pred == torch.tensor(out)).sum())
        total += len(out)
    return agree / max(total, 1), total


def decode_speed(target: Path, draft: Path, prompts: list[list[int]], k: int) -> dict[str, Any]:
    """Batch-1 greedy decoding in brisklm, plain and with the draft proposing k tokens a step."""
    from brisklm import LLM

    result: dict[str, Any] = {"prompts": len(prompts), "num_speculative_tokens": k}
    for name, kwargs in (
        ("plain", {}),
        ("speculative", {"draft": draft, "num_speculative_tokens": k}),
    ):
        llm = LLM.from_pretrained(
            target, dtype="float32", max_batch_size=1, show_progress=False, **kwargs
        )
        llm.generate(prompts[0], greedy(32))  # warm-up
        tokens, t0 = 0, time.perf_counter()
        texts = []
        accepted = proposed = 0
        for p in prompts:
            out = llm.generate(p, greedy(128))
            tokens += len(out.token_ids)
            texts.append(out.text)
            if out.speculative is not None:
                accepted += out.speculative.num_accepted
                proposed += out.speculative.num_proposed
        dt = time.perf_counter() - t0
        result[name] = {
            "tokens": tokens,
            "seconds": round(dt, 2),
            "tokens_per_s": round(tokens / dt, 1),
            "texts": texts,
        }
        if proposed:
            result[name]["acceptance_rate"] = accepted / proposed
        llm.close()
    result["same_output"] = result["plain"].pop("texts") == result["speculative"].pop("texts")
    result["speedup"] = result["speculative"]["tokens_per_s"] / result["plain"]["tokens_per_s"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--target", type=Path, default=Path("src/brisklm/assets/brisk-chat"))
    ap.add_argument("--draft", type=Path, default=Path("src/brisklm/assets/brisk-draft"))
    ap.add_argument("--data", type=Path, default=Path("training/out/data"))
    ap.add_argument(
        "--limit",
        type=int,
        default=200,
        help="prompts per task (and twice as many perplexity samples)",
    )
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-draft", action="store_true", help="evaluate the target only")
    ap.add_argument("--speed", action="store_true", help="also time batch-1 speculative decoding")
    ap.add_argument("--speed-prompts", type=int, default=24)
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    if args.limit < 1:
        ap.error(f"--limit {args.limit}: at least 1")
    if not (args.data / "eval.json").exists():
        ap.error(f"no {args.data / 'eval.json'}: --data names a set training.generate_data wrote")
    torch.set_num_threads(args.threads)
    ev = json.load(open(args.data / "eval.json", encoding="utf-8"))
    t0 = time.time()
    lim = args.limit
    res: dict[str, Any] = {
        "limit_per_task": lim,
        "target_dir": str(args.target),
        "draft_dir": str(args.draft),
    }
    failures: dict[str, list] = {}

    res["templates_checked"] = check_templates(
        args.target, ev["tool_call"][:lim] + ev["extract"][:lim] + ev["json_keys"][:lim]
    )
    run = Runner(args.target, args.batch_size)
    t: dict[str, Any] = {}
    for constrained in (True, False):
        tag = "constrained" if constrained else "unconstrained"
        for task, scorer in GRAMMAR_TASKS.items():
            if task not in ev:  # eval.json written before the free-text set existed
                continue
            m, f = scorer(run, ev[task][:lim], constrained)
            t[f"{task}_{tag}"] = m
            failures[f"{task}_{tag}"] = f[:8]
        print(
            f"target {tag}: " + json.dumps({k: brief(v) for k, v in t.items() if k.endswith(tag)}),
            flush=True,
        )
    for json_mode in (False, True):
        tag = "json_mode" if json_mode else "free"
        m, f = eval_json_keys(run, ev["json_keys"][:lim], json_mode)
        t[f"json_keys_{tag}"] = m
        failures[f"json_keys_{tag}"] = f[:8]
    m, f = eval_chat(run, ev["ppl"], lim)
    t["chat"] = m
    failures["chat"] = f[:8]
    print(
        "target: "
        + json.dumps({k: t[k] for k in ("json_keys_free", "json_keys_json_mode", "chat")}),
        flush=True,
    )
    t["usage_checks"] = usage_checks.score(run.llm)
    print(
        "target: usage checks "
        + json.dumps({k: v for k, v in t["usage_checks"].items() if k != "checks"}),
        flush=True,
    )
    run.llm.close()
    ppl_samples = ev["ppl"][: 2 * lim]  # (as many as eval.json holds for --num-eval lim)
    t["heldout_ppl"] = heldout_ppl(args.target, ppl_samples)
    res["target"] = t
    if not args.no_draft:
        res["draft"] = {"heldout_ppl": heldout_ppl(args.draft, ppl_samples)}
        res["draft_agreement"], res["draft_agreement_tokens"] = draft_agreement(
            args.draft, run.pairs
        )
        print(
            f"ppl target {t['heldout_ppl']:.3f} draft {res['draft']['heldout_ppl']:.3f}; "
            f"draft agreement {res['draft_agreement']:.3f}",
            flush=True,
        )
        if args.speed:
            items = (
                ev["tool_call"][: args.speed_prompts // 2]
                + ev["extract"][: args.speed_prompts // 2]
            )
            from brisklm import LLM

            llm = LLM.from_pretrained(
                args.target, dtype="float32", max_batch_size=1, show_progress=False
            )
            prompts = [llm.chat_prompt_ids(s["prompt_messages"], s.get("tools")) for s in items]
            llm.close()
            res["speed_batch1"] = decode_speed(
                args.target, args.draft, prompts, args.num_speculative_tokens
            )
            print("speed: " + json.dumps(res["speed_batch1"]), flush=True)
    res["eval_minutes"] = (time.time() - t0) / 60
    res["failures"] = failures
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(res, f, ensure_ascii=False, indent=2)


if __name__ == "__main__":
    main()
