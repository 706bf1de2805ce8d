"""Score a model on several larger held-out sets, and compare two models prompt by prompt.

The README's "N% of seven sets of 1,000" figures come from this: held-out sets written with other
seeds (``python -m training.generate_data --out DIR --seed S --num-train 0 --num-eval 1000
--request-order``), scored greedily with constrained decoding through ``evaluate.py``'s own
scoring, and two targets compared on the prompts each one misses:

    python -m training.score_sets score --model DIR --tag NAME --out-dir SCORES SET_DIR...
    python -m training.score_sets compare --out-dir SCORES NAME_A NAME_B

``score`` writes ``SCORES/NAME/<set dir name>.<task>.json`` (figures and every miss) per set and
prints one line per set and the item-weighted mean. ``compare`` pairs the misses of two tags on the
sets both scored: "fixed" are misses of A that B gets right, "new" the reverse, and
z = (fixed - new) / sqrt(fixed + new) (McNemar's statistic; |z| > 2 is about p < 0.05).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path

from training.evaluate import GRAMMAR_TASKS, Runner


def miss_key(failure: dict) -> str:
    """What identifies a prompt across two scorings of the same set: its request and answer."""
    text = failure.get("request", failure.get("text"))
    return json.dumps([text, failure["expected"]], sort_keys=True, ensure_ascii=False)


def load_items(set_dir: Path, task: str, limit: int) -> list[dict]:
    path = set_dir / "eval.json"
    if not path.is_file():
        raise SystemExit(f"score_sets: {path} does not exist (write it with generate_data)")
    data = json.loads(path.read_text())
    if task not in data:
        raise SystemExit(f"score_sets: {path} has no task {task!r} (it has {sorted(data)})")
    return data[task][:limit]


def score(args: argparse.Namespace) -> None:
    items_by_set = {d: load_items(d, args.task, args.limit) for d in args.sets}
    run = Runner(args.model, args.batch_size)
    try:
        score_with(run, args, items_by_set)
    finally:
        run.close()


def score_with(run: Runner, args: argparse.Namespace, items_by_set: dict[Path, list[dict]]) -> None:
    """Score each set's items, write its record, print its line and then the mean."""
    out = args.out_dir / args.tag
    out.mkdir(parents=True, exist_ok=True)
    total = weighted = 0.0
    for set_dir, items in items_by_set.items():
        start = time.time()
        metrics, failures = GRAMMAR_TASKS[args.task](run, items, not args.unconstrained)
        figure = next(
            name for name in ("exact_match", "field_accuracy", "text_answer") if name in metrics
        )
        record = {
            "model": str(args.model),
            "set": str(set_dir),
            "task": args.task,
            "constrained": not args.unconstrained,
            "items": len(items),
            "metrics": metrics,
            "failures": failures,
        }
        path = out / f"{set_dir.name}.{args.task}.json"
        path.write_text(json.dumps(record, indent=1, ensure_ascii=False))
        total += len(items)
        weighted += metrics[figure] * len(items)
        print(
            f"{args.tag} {set_dir.name} {args.task}: {figure} {metrics[figure]:.1%} of"
            f" {len(items)}, {len(failures)} misses ({time.time() - start:.0f} s) -> {path}",
            flush=True,
        )
    if total:
        print(f"{args.tag} {args.task}: {figure} {weighted / total:.2%} of {int(total)} (mean)")


def compare_records(a: dict, b: dict) -> tuple[int, int]:
    """(misses of a that b gets right, misses of b that a gets right), counted with repeats."""
    miss_a = Counter(miss_key(f) for f in a["failures"])
    miss_b = Counter(miss_key(f) for f in b["failures"])
    return sum((miss_a - miss_b).values()), sum((miss_b - miss_a).values())


def compare(args: argparse.Namespace) -> None:
    dir_a, dir_b = args.out_dir / args.a, args.out_dir / args.b
    names = sorted(p.name for p in dir_a.glob(f"*.{args.task}.json") if (dir_b / p.name).is_file())
    if not names:
        raise SystemExit(
            f"score_sets: no set scored for task {args.task!r} under both {dir_a} and {dir_b}"
        )
    fixed = new = 0
    for name in names:
        a = json.loads((dir_a / name).read_text())
        b = json.loads((dir_b / name).read_text())
        if a["items"] != b["items"]:
            raise SystemExit(f"score_sets: {name}: {a['items']} items against {b['items']}")
        f, n = compare_records(a, b)
        fixed, new = fixed + f, new + n
        print(f"{name}: fixed {f}, new {n}")
    z = (fixed - new) / math.sqrt(fixed + new) if fixed + new else 0.0
    print(f"{args.a} -> {args.b}: fixed {fixed}, new {new}, z = {z:.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("score", help="score a model on held-out sets")
    sp.add_argument("sets", type=Path, nargs="+", help="held-out set directories (eval.json)")
    sp.add_argument("--model", type=Path, required=True)
    sp.add_argument("--tag", required=True, help="a name for this model's scores")
    sp.add_argument("--out-dir", type=Path, required=True)
    sp.add_argument("--task", choices=sorted(GRAMMAR_TASKS), default="tool_call")
    sp.add_argument("--limit", type=int, default=1000, help="the first N items of each set")
    sp.add_argument("--batch-size", type=int, default=16)
    sp.add_argument("--unconstrained", action="store_true", help="decode without the grammar")
    cp = sub.add_parser("compare", help="compare two tags' misses prompt by prompt")
    cp.add_argument("a")
    cp.add_argument("b")
    cp.add_argument("--out-dir", type=Path, required=True)
    cp.add_argument("--task", choices=sorted(GRAMMAR_TASKS), default="tool_call")
    args = ap.parse_args(argv)
    if args.command == "score":
        if args.limit < 1:
            ap.error(f"--limit must be at least 1, got {args.limit}")
        score(args)
    else:
        compare(args)


if __name__ == "__main__":
    main(sys.argv[1:])
