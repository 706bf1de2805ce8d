"""training/build_all.sh's chain in miniature: generate data, train a tokenizer, train a few steps,
export; the export loads in brisklm and generates. And train.py's device choice, whose CUDA path
runs the same code on another device (its precision: tests/test_training_precision.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training import generate_data, train, train_tokenizer
from training.train import resolve_device


def run_main(monkeypatch: pytest.MonkeyPatch, main, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["prog", *args])
    main()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny data set and tokenizer (root/data, root/tokenizer), then 3 Muon steps of the draft
    preset, exported (root/draft)."""
    root = tmp_path_factory.mktemp("build")
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_main(
            monkeypatch,
            generate_data.main,
            "--out",
            str(root / "data"),
            "--seed",
            "5",
            "--num-train",
            "300",
            "--num-easy",
            "40",
            "--num-eval",
            "10",
            "--request-order",
        )
        run_main(
            monkeypatch,
            train_tokenizer.main,
            "--data",
            str(root / "data" / "train.jsonl"),
            "--out",
            str(root / "tokenizer"),
            "--vocab-size",
            "1024",
        )
        run_main(
            monkeypatch,
            train.main,
            "--preset",
            "draft",
            "--data",
            str(root / "data"),
            "--tokenizer",
            str(root / "tokenizer"),
            "--out",
            str(root / "draft"),
            "--steps",
            "3",
            "--easy-steps",
            "1",
            "--warmup",
            "1",
            "--batch-tokens",
            "1024",
            "--optimizer",
            "muon",
            "--no-compile",
            "--device",
            "cpu",
            "--eval-every",
            "2",
            "--log-every",
            "1",
            "--threads",
            str(threads),
        )
    torch.set_num_threads(threads)
    return root


def test_the_export_loads_and_generates(root: Path) -> None:
    from brisklm import LLM, SamplingParams

    built = root / "draft"
    summary = json.loads((built / "train_summary.json").read_text())
    assert summary["steps"] == 3 and summary["device"] == "cpu"
    assert summary["optimizer"] == "muon" and summary["heldout_ppl"] > 1.0
    assert not (built / "checkpoint.pt").exists()
    llm = LLM.from_pretrained(built / "model", show_progress=False)
    try:
        out = llm.generate(["Hello"], SamplingParams(max_tokens=4, temperature=0.0))[0]
        assert len(out.token_ids) >= 1
        config = json.loads((built / "model" / "config.json").read_text())
        assert config["vocab_size"] == 1024 and config["num_hidden_layers"] == 2
    finally:
        llm.close()


def test_device_auto_takes_the_cpu_where_torch_sees_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="auto, cpu or cuda"):
        resolve_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


def test_an_unusable_device_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        run_main(
            monkeypatch, train.main, "--preset", "draft", "--out", str(tmp_path), "--device", "cuda"
        )
    assert exit_info.value.code == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_a_run_whose_loss_stops_being_finite_stops_with_one_clear_error(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An absurd learning rate sends the weights to infinity after the first step: the second
    step's gradients are NaN, and the run stops there, naming the step, instead of training on NaN
    and exporting it."""
    threads = torch.get_num_threads()
    out = tmp_path / "blown"
    with pytest.raises(SystemExit) as exit_info:
        run_main(
            monkeypatch,
            train.main,
            *("--preset", "draft", "--data", str(root / "data")),
            *("--tokenizer", str(root / "tokenizer"), "--out", str(out)),
            *("--steps", "4", "--warmup", "1", "--lr", "1e30", "--batch-tokens", "1024"),
            *("--no-compile", "--device", "cpu", "--precision", "float32", "--log-every", "1"),
            *("--threads", str(threads)),
        )
    torch.set_num_threads(threads)
    message = str(exit_info.value.code)
    assert message.startswith("[draft] step 2: the loss ("), message
    assert "the gradient norm (nan) is not finite" in message
    assert "nothing exported" in message and "try a lower --lr." in message
    assert not (out / "model").exists() and not (out / "train_summary.json").exists()


def test_packed_data_is_kept_for_the_next_run_and_matches_a_fresh_packing(root: Path) -> None:
    data, tokenizer = root / "data" / "train.jsonl", root / "tokenizer"
    # The training run above left its packing beside the data: this call reads it.
    cached = list(data.parent.glob("train.packed-*.pt"))
    assert len(cached) == 1
    short, long, dropped, count = train.load_packed_buckets(data, tokenizer, 0.5, 384, 896, 0)
    expected = train.pack_buckets(
        train.encode_samples(train.load_jsonl(data), tokenizer, 0.5), 384, 896, 0
    )
    assert count == 300 and dropped == expected[2]
    for got, want in zip((short, long), expected[:2], strict=True):
        for name in ("ids", "weights", "pos", "doc"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
            assert getattr(got, name).dtype == getattr(want, name).dtype
    # Other arguments are another file; a damaged file is packed again and replaced.
    other = train.load_packed_buckets(data, tokenizer, 0.25, 384, 896, 0)
    assert len(list(data.parent.glob("train.packed-*.pt"))) == 2
    assert not torch.equal(other[0].weights, short.weights)
    named = train.load_packed_buckets(data, tokenizer, 0.5, 384, 896, 0, name_weight=4.0)
    assert len(list(data.parent.glob("train.packed-*.pt"))) == 3
    assert torch.equal(named[0].ids, short.ids) and (named[0].weights == 4.0).any()
    cached[0].write_bytes(b"not a torch file")
    again = train.load_packed_buckets(data, tokenizer, 0.5, 384, 896, 0)
    assert torch.equal(again[0].ids, short.ids)
    assert torch.equal(
        train.load_packed_buckets(data, tokenizer, 0.5, 384, 896, 0)[0].ids, short.ids
    )
    filled = train.load_packed_buckets(data, tokenizer, 0.5, 384, 896, 0, fill_long_rows=True)
    assert len(list(data.parent.glob("train.packed-*.pt"))) == 4
    assert int((filled[0].ids != 0).sum()) + int((filled[1].ids != 0).sum()) == int(
        (short.ids != 0).sum()
    ) + int((long.ids != 0).sum())


def sample_segments(packed: train.Packed) -> list[tuple[int, int]]:
    """(marker, length) of every sample in ``packed``'s rows, padding left out (samples made by
    ``marked_samples``: every token of sample i is i + 1, so a segment names its sample)."""
    found = []
    for ids, doc in zip(packed.ids.tolist(), packed.doc.tolist(), strict=True):
        for d in sorted(set(doc)):
            tokens = [t for t, k in zip(ids, doc, strict=True) if k == d]
            if tokens[0] != 0:
                assert len(set(tokens)) == 1  # one sample per segment, whole
                found.append((tokens[0], len(tokens)))
    return found


def marked_samples(count: int, seed: int) -> list[tuple[list[int], list[float]]]:
    rng = torch.Generator().manual_seed(seed)
    lengths = torch.randint(20, 897, (count,), generator=rng).tolist()
    return [([i + 1] * n, [1.0] * n) for i, n in enumerate(lengths)]


def test_every_sample_is_packed_once_and_filling_leaves_less_padding() -> None:
    samples = marked_samples(400, 5)
    padding = {}
    for fill in (False, True):
        short, long, dropped = train.pack_buckets(samples, 384, 896, 0, fill_long_rows=fill)
        assert dropped == 0 and short.ids.shape[1] == 385 and long.ids.shape[1] == 897
        segments = sample_segments(short) + sample_segments(long)
        # Each sample once, whole or without its first token.
        assert sorted(marker for marker, _ in segments) == list(range(1, 401))
        for marker, length in segments:
            assert length in (len(samples[marker - 1][0]), len(samples[marker - 1][0]) - 1)
        # Short rows hold short samples only, long rows every long one, and with filling some
        # short ones too.
        assert all(len(samples[m - 1][0]) <= 385 for m, _ in sample_segments(short))
        in_long = {m for m, _ in sample_segments(long)}
        assert {i + 1 for i, (ids, _) in enumerate(samples) if len(ids) > 385} <= in_long
        assert any(len(samples[m - 1][0]) <= 385 for m in in_long) == fill
        padding[fill] = float((long.ids == 0).float().mean())
    # Half the samples here are long, too few short ones to fill every gap.
    assert padding[False] > 0.15 and padding[True] < padding[False] / 2


def test_a_filler_pool_gives_the_longest_sample_that_fits() -> None:
    samples = [([7] * n, [1.0] * n) for n in (30, 50, 50, 80)]
    pool = train.FillerPool(samples, __import__("random").Random(0))
    assert len(pool.take(79)[0]) == 50 and len(pool.take(100)[0]) == 80
    assert len(pool.take(60)[0]) == 50 and pool.take(29) is None
    assert [len(ids) for ids, _ in pool.remaining()] == [30]
    assert len(pool.take(30)[0]) == 30 and pool.take(1000) is None and pool.remaining() == []


def test_an_interrupted_run_resumes_to_the_same_weights(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped right after its first checkpoint and run again with --resume, a run with data and
    drill steps ends with the weights, loss and summary of the run that was never stopped."""
    from safetensors.torch import load_file

    threads = torch.get_num_threads()

    def run(out: Path, *extra: str) -> None:
        run_main(
            monkeypatch,
            train.main,
            *("--preset", "draft", "--data", str(root / "data"), "--tokenizer"),
            *(str(root / "tokenizer"), "--out", str(out), "--steps", "6", "--warmup", "1"),
            *("--batch-tokens", "1024", "--drill-frac", "0.5", "--optimizer", "muon"),
            *("--checkpoint-every", "2", "--eval-every", "0", "--no-compile", "--device", "cpu"),
            *("--threads", str(threads), *extra),
        )

    run(tmp_path / "whole")
    save = torch.save

    class Stopped(Exception):
        pass

    def save_then_stop(obj, path, *args, **kwargs):
        save(obj, path, *args, **kwargs)
        raise Stopped

    with monkeypatch.context() as m:
        m.setattr(torch, "save", save_then_stop)
        with pytest.raises(Stopped):
            run(tmp_path / "cut", "--resume")
    assert (tmp_path / "cut" / "checkpoint.pt").exists()
    run(tmp_path / "cut", "--resume")
    torch.set_num_threads(threads)
    assert not (tmp_path / "cut" / "checkpoint.pt").exists()
    whole = load_file(str(tmp_path / "whole" / "model" / "model.safetensors"))
    cut = load_file(str(tmp_path / "cut" / "model" / "model.safetensors"))
    assert whole.keys() == cut.keys()
    for name in whole:
        assert torch.equal(whole[name], cut[name]), name
    summaries = [
        json.loads((tmp_path / d / "train_summary.json").read_text()) for d in ("whole", "cut")
    ]
    for key in ("steps", "train_loss_ema", "heldout_loss"):
        assert summaries[0][key] == summaries[1][key], key

    # A step count --max-minutes lowered stays lowered when the run resumes with the same
    # command: saved as the plan, it wins over the command line's (the schedule went back to it:
    # a jump in the learning rate, then a cliff). Here the checkpoint of a run of 4 steps is
    # edited to say its command asked for 6: 4 stands for the lowered count.
    def run_steps(out: Path, steps: str, *extra: str) -> None:
        run_main(
            monkeypatch,
            train.main,
            *("--preset", "draft", "--data", str(root / "data"), "--tokenizer"),
            *(str(root / "tokenizer"), "--out", str(out), "--steps", steps, "--warmup", "1"),
            *("--batch-tokens", "1024", "--drill-frac", "0.5", "--optimizer", "muon"),
            *("--checkpoint-every", "2", "--eval-every", "0", "--no-compile", "--device", "cpu"),
            *("--threads", str(threads), *extra),
        )

    run_steps(tmp_path / "planned", "4")
    with monkeypatch.context() as m:
        m.setattr(torch, "save", save_then_stop)
        with pytest.raises(Stopped):
            run_steps(tmp_path / "lowered", "4", "--resume")
    checkpoint_path = tmp_path / "lowered" / "checkpoint.pt"
    checkpoint = torch.load(checkpoint_path, weights_only=False)
    assert (checkpoint["steps"], checkpoint["command_steps"]) == (4, 4)
    shutil.copytree(tmp_path / "lowered", tmp_path / "raised")
    shutil.copytree(tmp_path / "lowered", tmp_path / "below")
    checkpoint["command_steps"] = 6
    torch.save(checkpoint, checkpoint_path)
    run_steps(tmp_path / "lowered", "6", "--resume")
    planned = load_file(str(tmp_path / "planned" / "model" / "model.safetensors"))
    lowered = load_file(str(tmp_path / "lowered" / "model" / "model.safetensors"))
    assert all(torch.equal(planned[name], lowered[name]) for name in planned)
    summary = json.loads((tmp_path / "lowered" / "train_summary.json").read_text())
    assert summary["steps"] == 4
    # A resume whose command asks for a different count than the checkpoint's command did
    # is a deliberate change: it trains to the new count.
    run_steps(tmp_path / "raised", "6", "--resume")
    torch.set_num_threads(threads)
    summary = json.loads((tmp_path / "raised" / "train_summary.json").read_text())
    assert summary["steps"] == 6
    # Fewer steps than the checkpoint reached: an IndexError deep in the batch plan before.
    with pytest.raises(SystemExit, match=r"--steps 1 is below the step the checkpoint in .* \(2\)"):
        run_steps(tmp_path / "below", "1", "--resume")
    torch.set_num_threads(threads)


def test_sets_packed_apart_train_together(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """--pack-only packs a second set into the file a run reads, and exits; a run given both sets
    trains on the rows of both, with easy.jsonl and eval.json from the first."""
    threads = torch.get_num_threads()
    second = tmp_path / "second"
    run_main(
        monkeypatch,
        generate_data.main,
        *("--out", str(second), "--seed", "6", "--num-train", "200", "--num-easy", "0"),
        *("--num-eval", "0", "--request-order"),
    )
    common = (
        *("--preset", "draft", "--tokenizer", str(root / "tokenizer"), "--steps", "2"),
        *("--warmup", "1", "--batch-tokens", "1024", "--no-compile", "--device", "cpu"),
        *("--threads", str(threads)),
    )
    run_main(
        monkeypatch,
        train.main,
        *common,
        *("--data", str(second), "--out", str(tmp_path / "p"), "--pack-only"),
    )
    assert "[draft] packed" in capsys.readouterr().out
    assert not (tmp_path / "p").exists()  # packing alone writes no run
    packed_files = list(second.glob("train.packed-*.pt"))
    assert len(packed_files) == 1
    run_main(
        monkeypatch,
        train.main,
        *common,
        *("--data", str(root / "data"), str(second), "--out", str(tmp_path / "both")),
    )
    torch.set_num_threads(threads)
    log = capsys.readouterr().out
    assert "[draft] 500 samples" in log  # the fixture's 300 and these 200
    assert list(second.glob("train.packed-*.pt")) == packed_files  # read, not packed again
    one = train.load_packed_buckets(
        root / "data" / "train.jsonl", root / "tokenizer", 0.5, 384, 896, 0
    )
    two = train.load_packed_buckets(second / "train.jsonl", root / "tokenizer", 0.5, 384, 896, 0)
    short, long, dropped, count = train.join_packed([one, two])
    assert count == 500 and dropped == one[2] + two[2]
    assert torch.equal(short.ids, torch.cat([one[0].ids, two[0].ids]))
    rows = sum(len(p) for p in (one[1], two[1]) if p is not None)
    assert (len(long) if long is not None else 0) == rows
    assert json.loads((tmp_path / "both" / "train_summary.json").read_text())["steps"] == 2


def test_steps_in_budget_lowers_the_steps_to_what_the_measured_rate_fits() -> None:
    # 40 steps done in 10 s, 0.2 s a step from here: 60 more fit in a 22 s budget.
    assert train.steps_in_budget(500, 40, 0.2, 10.0, 22.0) == 100
    assert train.steps_in_budget(80, 40, 0.2, 10.0, 22.0) == 80  # never more than asked for
    assert train.steps_in_budget(500, 40, 0.2, 30.0, 22.0) == 40  # over budget: stop now


def test_a_run_with_a_time_budget_ends_its_schedule_where_the_budget_does(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    threads = torch.get_num_threads()
    run_main(
        monkeypatch,
        train.main,
        *("--preset", "draft", "--data", str(root / "data"), "--tokenizer"),
        *(str(root / "tokenizer"), "--out", str(tmp_path / "run"), "--steps", "5000"),
        *("--warmup", "1", "--batch-tokens", "512", "--no-compile", "--device", "cpu"),
        *("--threads", str(threads), "--max-minutes", "0.001", "--log-every", "1000"),
    )
    torch.set_num_threads(threads)
    # 0.06 s cannot hold more than the 40 steps that measure the rate.
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["steps"] == 40
    assert "so 40 steps instead of 5000" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        run_main(monkeypatch, train.main, "--preset", "draft", "--out", "x", "--max-minutes", "0")
    assert "--max-minutes 0.0: must be positive" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--steps", "0"], "--steps 0: at least 1"),  # it exported an untrained model
        (["--drill-frac", "1.5"], "--drill-frac 1.5: a share of the steps, in [0, 1]"),
        (["--lr", "-1"], "--lr -1.0: must be positive"),  # the optimizer's traceback
        (["--data", "no-such-set"], "no such file or directory: --data no-such-set/train.jsonl"),
        (["--init", "no-such-model"], "--init no-such-model"),
    ],
)
def test_bad_training_flags_are_usage_errors(root, monkeypatch, capsys, flags, words) -> None:
    base = ["--preset", "draft", "--out", "x", "--tokenizer", str(root / "tokenizer")]
    if "--data" not in flags:
        base += ["--data", str(root / "data")]
    with pytest.raises(SystemExit) as exit_info:
        run_main(monkeypatch, train.main, *base, *flags)
    assert exit_info.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize(
    ("script", "flags", "words"),
    [
        # a traceback naming the file
        ("train_tokenizer", ["--data", "no-such.jsonl"], "no such file: no-such.jsonl"),
        # (it trained its 261-token minimum without a word)
        ("train_tokenizer", ["--vocab-size", "10"], "--vocab-size 10: at least 261"),
        ("train_tokenizer", ["--num-samples", "0"], "--num-samples 0: at least 1"),
        ("generate_data", ["--num-train", "-5"], "--num-train -5: not negative"),  # an empty set
        ("generate_data", ["--num-eval", "-1"], "--num-eval -1: not negative"),
    ],
)
def test_bad_data_and_tokenizer_flags_are_usage_errors(
    monkeypatch, capsys, tmp_path, script, flags, words
) -> None:
    main = {"train_tokenizer": train_tokenizer.main, "generate_data": generate_data.main}[script]
    with pytest.raises(SystemExit) as exit_info:
        run_main(monkeypatch, main, "--out", str(tmp_path / "out"), *flags)
    assert exit_info.value.code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_time_budget_is_checked_again_every_100_steps(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another job on the device can slow a run after its first check: the budget is checked at
    step 40 and every 100 steps after, at the rate since the last check; here the third check
    ends the run."""
    checks = []

    def budget(steps: int, done: int, per_step: float, elapsed: float, limit: float) -> int:
        checks.append((steps, done))
        assert per_step > 0 and elapsed > 0 and limit == 600.0
        return 245 if done == 240 else steps

    monkeypatch.setattr(train, "steps_in_budget", budget)
    threads = torch.get_num_threads()
    run_main(
        monkeypatch,
        train.main,
        *("--preset", "draft", "--data", str(root / "data"), "--tokenizer"),
        *(str(root / "tokenizer"), "--out", str(tmp_path / "run"), "--steps", "400"),
        *("--warmup", "1", "--batch-tokens", "256", "--no-compile", "--device", "cpu"),
        *("--threads", str(threads), "--max-minutes", "10", "--log-every", "1000"),
        *("--drill-frac", "1.0", "--seq-len", "64"),
    )
    torch.set_num_threads(threads)
    assert checks == [(400, 40), (400, 140), (400, 240)]
    assert json.loads((tmp_path / "run" / "train_summary.json").read_text())["steps"] == 245


FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for python in build_all.sh: logs the command, writes a model where --out points.
echo "$*" >> "$LOG"
out=""
prev=""
for a in "$@"; do
    [[ $prev == --out ]] && out=$a
    prev=$a
done
# training.average's --out is the model directory itself; the others' is the run's.
[[ $2 == training.average ]] || out=$out/model
mkdir -p "$out"
echo weights > "$out/model.safetensors"
if [[ -n ${FAIL_ON:-} && "$* " == *"--out $FAIL_ON "* ]]; then exit 3; fi
"""


class FakeBuild:
    """A build script of training/ run with its python replaced by FAKE_PYTHON: OUT, ASSETS and
    the log of commands under tmp_path (its own subdirectory per script)."""

    def __init__(self, tmp_path: Path, script: str) -> None:
        self.script = Path(__file__).resolve().parents[1] / "training" / script
        base = tmp_path / script.removesuffix(".sh")
        bin_dir = base / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "python").write_text(FAKE_PYTHON)
        (bin_dir / "python").chmod(0o755)
        self.out, self.assets, self.log = base / "out", base / "assets", base / "log"
        self.env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "OUT": str(self.out),
            "ASSETS": str(self.assets),
            "LOG": str(self.log),
        }

    def __call__(self, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(self.script)], env={**self.env, **extra}, capture_output=True, text=True
        )

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def built_dirs(self, lines: list[str]) -> list[str]:
        """The --out directory of each logged command, relative to OUT."""
        return [
            Path(line.split("--out ")[1].split()[0]).relative_to(self.out).as_posix()
            for line in lines
        ]


def test_build_all_resumes_after_the_step_that_failed(tmp_path: Path) -> None:
    """training/build_all.sh, its commands replaced by a stand-in: a failed step stops the chain;
    the next call skips the steps that finished, runs the rest (training with --resume) and only
    then fills ASSETS; a third call has nothing left to run."""
    build = FakeBuild(tmp_path, "build_all.sh")
    out, assets, log, built_dirs = build.out, build.assets, build.log, build.built_dirs

    first = build(FAIL_ON=f"{out}/brisk-chat2")
    assert first.returncode == 3, first.stderr
    ran = log.read_text().splitlines()
    assert built_dirs(ran) == [
        *("data", "data2", "data3", "data4", "data5", "data6", "data7", "data8", "data9"),
        *("data10", "data11", "data12", "data13", "data14", "data15", "data16", "data17"),
        *("data18", "data19", "data20", "data21", "data22", "data23", "data24", "data25"),
        "data26",
        "tokenizer",
        *("seed1", "seed2", "seed", "brisk-chat1", "brisk-chat2"),
    ]
    assert not assets.exists()
    assert not (out / "brisk-chat2" / ".built").exists()
    # the last nine sets (data12-20) write a tenth of their values in Cyrillic or Greek letters, the
    # last six of them (data15-20) give some tools a free-text argument, and the last three
    # (data18-23) two fifths of them instead of one; the last three (data21-23) describe tools by
    # docstrings, convert units and ask questions about a topic, the last two with reader tools;
    # data24-26 the same, with conversions not asked for and records named in CJK or kana
    assert ["--other-scripts 0.1" in line for line in ran[:26]] == [False] * 11 + [True] * 15
    assert ["--free-text-args" in line for line in ran[:26]] == [False] * 14 + [True] * 12
    assert ["--free-text-share 0.4" in line for line in ran[:26]] == [False] * 17 + [True] * 9
    natural = "--docstrings 0.4 --conversions 0.12 --topic-questions 1.0"
    assert [natural in line for line in ran[:26]] == [False] * 20 + [True] * 6
    assert ["--reader-tools 0.15" in line for line in ran[:26]] == [False] * 21 + [True] * 5
    distract = "--conversion-distractors 0.25 --native-names 0.04"
    assert [distract in line for line in ran[:26]] == [False] * 23 + [True] * 3

    second = build()
    assert second.returncode == 0, second.stderr
    again = log.read_text().splitlines()[len(ran) :]
    assert built_dirs(again) == [
        *("brisk-chat2", "brisk-chat3", "brisk-chat4", "brisk-chat5", "brisk-chat45/model"),
        *("brisk-chat6", "brisk-chat456/model", "brisk-chat7", "brisk-chat47/model"),
        *("brisk-chat8", "brisk-chat47-8/model", "brisk-chat9", "brisk-chat47-8-9/model"),
        *("brisk-chat10", "brisk-chat47-10/model", "brisk-chat11", "brisk-chat47-11/model"),
        *("brisk-chat12", "brisk-chat47-12/model", "brisk-chat13", "brisk-chat47-13/model"),
        *("brisk-chat14", "brisk-chat15", "brisk-chat16", "brisk-chat47-16/model"),
        *("brisk-chat17", "brisk-chat18", "brisk-chat19", "brisk-chat47-19/model"),
        *("brisk-chat20", "brisk-chat21", "brisk-chat22", "brisk-chat47-22/model"),
        *("brisk-chat23", "brisk-chat24", "brisk-chat25", "brisk-chat47-25/model"),
        *("brisk-chat26", "brisk-chat27", "brisk-chat28", "brisk-chat-x3/model"),
        *("brisk-chat-plain/model", "brisk-chat29", "brisk-chat-s44/model", "data27"),
        *("brisk-chat30", "brisk-chat/model", "brisk-draft"),
    ]
    trained = [line for line in again if "-m training.train " in line]
    assert len(trained) == 30 and all("--resume" in line for line in trained)

    # brisk-chat6 starts from the mean of brisk-chat4 and brisk-chat5; brisk-chat7 trains on the
    # fifth set from the mean of all three; each later run starts from the mean of brisk-chat47 (the
    # mean of brisk-chat456 and brisk-chat7) and the runs after it, up to the mean of brisk-chat47
    # and six runs; three runs start from that mean, then brisk-chat47-16 is the mean of it and
    # those three; the same three times more, from brisk-chat47-16 to brisk-chat47-19, from that to
    # brisk-chat47-22, from that to brisk-chat47-25 and from that to the shipped target.
    def model(name: str) -> str:
        return f"{out}/{name}/model"

    def averaged(i: int, name: str, *inputs: str) -> None:
        assert again[i].startswith(f"-m training.average --out {model(name)} "), again[i]
        assert again[i].split(f"--out {model(name)} ")[1].split() == [model(x) for x in inputs]

    def trained_from(i: int, name: str, start: str, data: str) -> None:
        assert f"--out {out}/{name} " in again[i] and f"--init {model(start)} " in again[i]
        assert f"--data {out}/{data} " in again[i]

    averaged(4, "brisk-chat45", "brisk-chat4", "brisk-chat5")
    trained_from(5, "brisk-chat6", "brisk-chat45", "data4")
    averaged(6, "brisk-chat456", "brisk-chat4", "brisk-chat5", "brisk-chat6")
    trained_from(7, "brisk-chat7", "brisk-chat456", "data5")
    averaged(8, "brisk-chat47", "brisk-chat456", "brisk-chat7")
    trained_from(9, "brisk-chat8", "brisk-chat47", "data6")
    averaged(10, "brisk-chat47-8", "brisk-chat47", "brisk-chat8")
    trained_from(11, "brisk-chat9", "brisk-chat47-8", "data7")
    averaged(12, "brisk-chat47-8-9", "brisk-chat47", "brisk-chat8", "brisk-chat9")
    trained_from(13, "brisk-chat10", "brisk-chat47-8-9", "data8")
    since_47 = ("brisk-chat47", "brisk-chat8", "brisk-chat9", "brisk-chat10")
    averaged(14, "brisk-chat47-10", *since_47)
    trained_from(15, "brisk-chat11", "brisk-chat47-10", "data9")
    averaged(16, "brisk-chat47-11", *since_47, "brisk-chat11")
    trained_from(17, "brisk-chat12", "brisk-chat47-11", "data10")
    averaged(18, "brisk-chat47-12", *since_47, "brisk-chat11", "brisk-chat12")
    trained_from(19, "brisk-chat13", "brisk-chat47-12", "data11")
    averaged(20, "brisk-chat47-13", *since_47, "brisk-chat11", "brisk-chat12", "brisk-chat13")
    # five fan-outs: three runs from a mean (on data 12-14, 15-17, 18-20, 21-23, then 24-26), then
    # the mean of it and them
    for i, start, first, mean in ((21, "brisk-chat47-13", 14, "brisk-chat47-16"),
                                  (25, "brisk-chat47-16", 17, "brisk-chat47-19"),
                                  (29, "brisk-chat47-19", 20, "brisk-chat47-22"),
                                  (33, "brisk-chat47-22", 23, "brisk-chat47-25"),
                                  (37, "brisk-chat47-25", 26, "brisk-chat-x3")):  # fmt: skip
        runs = [f"brisk-chat{first + j}" for j in range(3)]
        for j, name in enumerate(runs):
            trained_from(i + j, name, start, f"data{first - 2 + j}")
        kept = 3 if mean == "brisk-chat-x3" else 1  # the last mean counts its start three times
        averaged(i + 3, mean, *[start] * kept, *runs)
    for line in again[9:14:2]:  # three runs compute in bfloat16, eagerly
        assert "--precision bfloat16 --no-compile" in line
    compiled = [*again[15:20:2], *again[21:24], *again[25:28], *again[29:32]]
    for line in compiled:  # the next twelve: compiled
        assert "--precision bfloat16" in line and "--no-compile" not in line
        assert "--steps 700 " in line and "--drill-frac 0.2 " in line
    for line in [*again[33:36], *again[37:40]]:  # the last six: eagerly again
        assert "--precision bfloat16" in line and "--no-compile" in line
        assert "--steps 700 " in line and "--drill-frac 0.2 " in line
    # the last run of the third fan-out and every run of the fourth and fifth pack their long rows
    filled = [False] * 31 + [True, False] + [True] * 3 + [False] + [True] * 3 + [False] * 2
    filled += [True, False, False]  # brisk-chat29, then the session-44 mean and the small-talk set
    filled += [True, False, False]  # brisk-chat30, then the shipped mean and the draft
    assert ["--fill-long-rows" in line for line in again] == filled
    fanned = (*range(21, 24), *range(25, 28), *range(29, 32), *range(33, 36), *range(37, 40))
    seeds = [again[i].split("--seed ")[1].split()[0] for i in fanned]
    assert seeds == [str(seed) for seed in range(15, 30)]
    assert again[17].split("--lr ")[-1].split()[0] == "3e-4"
    assert again[19].split("--lr ")[-1].split()[0] == "6e-4"  # the last one wins in argparse
    assert second.stdout.count("was built by an earlier run, skipped") == 31
    for name in ("brisk-chat", "brisk-draft"):
        assert (assets / name / "model.safetensors").read_text() == "weights\n"

    # Sessions 43-44: the plain mean of brisk-chat47-25 and its three runs, 350 steps from it on
    # data26 at lr 1e-4, and the shipped target: the x3 mean counted three times and that run.
    averaged(
        41, "brisk-chat-plain", "brisk-chat47-25", "brisk-chat26", "brisk-chat27", "brisk-chat28"
    )
    trained_from(42, "brisk-chat29", "brisk-chat-plain", "data26")
    assert again[42].split("--lr ")[-1].split()[0] == "1e-4"
    assert again[42].split("--steps ")[-1].split()[0] == "350"
    assert again[42].split("--seed ")[-1].split()[0] == "30"
    assert "--no-compile" in again[42] and "--precision bfloat16" in again[42]
    averaged(43, "brisk-chat-s44", *["brisk-chat-x3"] * 3, "brisk-chat29")
    # Session 48: a set with the last styles and small talk, 350 steps from the session-44 target at
    # lr 1e-5 held to it where it was right, and the shipped target: the mean of the two.
    assert "--small-talk 0.3" in again[44] and "--seed 4792 " in again[44]
    assert "--more-phrasings" in again[44] and "--conversion-distractors 0.25" in again[44]
    trained_from(45, "brisk-chat30", "brisk-chat-s44", "data27")
    assert f"--teacher {model('brisk-chat-s44')} " in again[45]
    assert again[45].endswith("--distill-where-teacher-right")
    assert again[45].split("--lr ")[-1].split()[0] == "1e-5"
    assert again[45].split("--steps ")[-1].split()[0] == "350"
    averaged(46, "brisk-chat", "brisk-chat-s44", "brisk-chat30")

    third = build()
    assert third.returncode == 0 and third.stdout.count("skipped") == 79
    assert len(log.read_text().splitlines()) == len(ran) + 48

    # EAGER=1, into another OUT: every training run without torch.compile (above, only nine of
    # them ask for it).
    assert "--no-compile" not in again[0]
    eager = build(EAGER="1", OUT=str(tmp_path / "eager"), ASSETS=str(tmp_path / "eager-assets"))
    assert eager.returncode == 0, eager.stderr
    runs = [line for line in log.read_text().splitlines() if f"--out {tmp_path}/eager/" in line]
    trained = [line for line in runs if "-m training.train " in line]
    assert len(runs) == 79 and len(trained) == 34
    assert all("--no-compile" in line for line in trained)


def generator_flags(line: str) -> set[str]:
    """A logged generate_data command's flags and values, less its output, seed and sizes."""
    words = line.split()[2:]
    dropped = {"--out", "--seed", "--num-train", "--num-easy", "--num-eval"}
    return {
        f"{a} {b}" if not b.startswith("--") else a
        for a, b in zip(words, [*words[1:], "--"])
        if a.startswith("--") and a not in dropped
    }


def test_build_fast_trains_once_on_the_chains_last_styles_and_resumes(tmp_path: Path) -> None:
    """training/build_fast.sh (the 90-minute build, not the shipped models), its commands replaced
    by a stand-in: data, tokenizer, the seed, one target run grown from it, two short runs from
    that on two more sets, their mean, the draft; its sets are written with every flag of
    build_all.sh's last set; a failed step stops it and the next call goes on from there."""
    build = FakeBuild(tmp_path, "build_fast.sh")
    out = build.out
    first = build(FAIL_ON=f"{out}/target2")
    assert first.returncode == 3, first.stderr
    ran = build.lines()
    assert build.built_dirs(ran) == [
        *("data", "mix", "mix2", "mix3", "tokenizer", "seed1", "seed2", "seed"),
        *("target", "target2"),
    ]
    assert not build.assets.exists()
    second = build()
    assert second.returncode == 0, second.stderr
    again = build.lines()[len(ran) :]
    assert build.built_dirs(again) == ["target2", "target3", "brisk-chat/model", "brisk-draft"]
    assert second.stdout.count("was built by an earlier run, skipped") == 9
    for name in ("brisk-chat", "brisk-draft"):
        assert (build.assets / name / "model.safetensors").read_text() == "weights\n"
    trained = [line for line in ran + again if "-m training.train " in line]
    # seed1, seed2, seed, target, target2 twice (cut, then resumed), target3, the draft
    assert len(trained) == 8 and all("--resume" in line for line in trained)

    def model(name: str) -> str:
        return f"{out}/{name}/model"

    target, target2, target3 = ran[8], again[0], again[1]
    assert f"--grow-from {model('seed')} " in target and f"--data {out}/mix " in target
    assert f"--init {model('target')} " in target2 and f"--data {out}/mix2 " in target2
    assert f"--init {model('target')} " in target3 and f"--data {out}/mix3 " in target3
    assert again[2].split(f"--out {model('brisk-chat')} ")[1].split() == [
        model("target"),
        model("target2"),
        model("target3"),
    ]
    assert f"--data {out}/data " in again[3] and "--preset draft" in again[3]

    # The three sets of the target carry every request style of build_all.sh's last set, data26.
    chain = FakeBuild(tmp_path, "build_all.sh")
    assert chain(FAIL_ON=f"{chain.out}/tokenizer").returncode == 3
    last_set = generator_flags(chain.lines()[25])
    assert f"--out {chain.out}/data26 " in chain.lines()[25]
    assert {"--native-names 0.04", "--reader-tools 0.15", "--more-phrasings"} <= last_set
    for line in ran[1:4]:
        assert generator_flags(line) == last_set
    assert generator_flags(ran[0]) == generator_flags(chain.lines()[0])  # the canonical first set

    # Not told where, it leaves the shipped models alone: the models go to OUT/assets.
    other = tmp_path / "other"
    assert build(OUT=str(other), ASSETS="").returncode == 0
    assert (other / "assets" / "brisk-chat" / "model.safetensors").read_text() == "weights\n"


def test_build_gpu_packs_its_sets_beside_the_seed_and_trains_the_target_beside_the_draft(
    tmp_path: Path,
) -> None:
    """training/build_gpu.sh (session 46's GPU recipe, not the shipped weights), its commands
    replaced by a stand-in: six sets written with the chain's last styles and packed with the target's own
    packing flags while the seed trains; a set that failed stops the build after the seed, and the
    next call writes it and goes on: the target grown from the seed on all six sets (in the time
    MAX_MINUTES gives it), the draft. The sets hold small talk with tools offered."""
    build = FakeBuild(tmp_path, "build_gpu.sh")
    out = build.out
    first = build(FAIL_ON=f"{out}/s3")
    assert first.returncode == 3, first.stderr
    ran = build.lines()
    assert build.built_dirs(ran[:2]) == ["data", "tokenizer"]
    made = build.built_dirs(ran[2:])
    assert made.count("s3") == 1 and "brisk-chat" in made  # the other sets were packed
    assert [d for d in made if d.startswith("seed")] == ["seed1", "seed2", "seed"]
    assert not (out / "s3" / ".built").exists() and not build.assets.exists()
    second = build(MAX_MINUTES="6.5")
    assert second.returncode == 0, second.stderr
    again = build.lines()[len(ran) :]
    trains = [line for line in again if "-m training.train " in line]
    packs = [line for line in trains if "--pack-only" in line]
    assert sorted(line.split("--data ")[-1].split()[0] for line in packs) == [
        f"{out}/s{i}" for i in range(6)
    ]
    assert sum("--easy-steps 1 " in line for line in packs) == 1  # s0's easy samples too
    assert second.stdout.count("was built by an earlier run, skipped") == 10
    target = next(line for line in trains if "--grow-from" in line)
    draft = next(line for line in trains if "--preset draft" in line)
    assert f"--grow-from {out}/seed/model " in target
    assert target.split("--data ")[-1].split(" --out")[0].split() == [
        f"{out}/s{i}" for i in range(6)
    ]
    for flags in ("--batch-tokens 61440 ", "--steps 1917 ", "--lr 5e-3 ", "--max-minutes 6.5"):
        assert flags in target, flags
    assert sum("--max-minutes" in line for line in ran + again) == 1  # the target's alone
    assert f"--data {out}/data " in draft and "--data" not in draft.split(f"{out}/data ")[1]
    for line in trains + [line for line in ran if "-m training.train " in line]:
        assert "--device cuda " in line and "--no-compile" in line and "--resume" in line

    def packing(line: str) -> list[str]:
        """What a packed file's name depends on, besides the data and tokenizer."""
        words = line.split()
        keys = ("--seq-len", "--long-seq-len", "--seed", "--prompt-loss-weight")
        kept = [f"{a} {b}" for a, b in zip(words, words[1:]) if a in keys]
        return kept + [w for w in words if w in ("--fill-long-rows", "--name-loss-weight")]

    assert all(packing(line) == packing(target) for line in packs)
    assert "--fill-long-rows" in packing(target)
    for name in ("brisk-chat", "brisk-draft"):
        assert (build.assets / name / "model.safetensors").read_text() == "weights\n"
    # The sets carry every request style of build_all.sh's last set, data26.
    chain = FakeBuild(tmp_path, "build_all.sh")
    assert chain(FAIL_ON=f"{chain.out}/tokenizer").returncode == 3
    last_set = generator_flags(chain.lines()[25])
    writes = [line for line in ran + again if "-m training.generate_data " in line]
    assert len(writes) == 1 + 6 + 1  # the first set, six sets, s3 again
    assert all(generator_flags(line) == last_set | {"--small-talk 0.1"} for line in writes[1:])
    assert generator_flags(writes[0]) == generator_flags(chain.lines()[0])


def test_growing_a_trained_model_deeper_gives_its_new_layers_their_own_rate(
    root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--grow-from with --layers: the trained two-layer draft in a three-layer model; one step with
    --new-layer-lr-mult 1 and one with 10. The first step is the same in both (the new layer is the
    identity), so the old layers end equal and the new layer's output projection, zero before the
    step, ten times as far from zero (Muon's orthogonalised step scales with the rate alone)."""
    from safetensors.torch import load_file

    threads = torch.get_num_threads()
    common = [
        *("--preset", "draft", "--layers", "3", "--grow-from", str(root / "draft" / "model")),
        *("--data", str(root / "data"), "--tokenizer", str(root / "tokenizer")),
        *("--steps", "1", "--warmup", "1", "--batch-tokens", "1024", "--optimizer", "muon"),
        *("--no-compile", "--device", "cpu", "--threads", str(threads)),
    ]
    weights = {}
    for mult in ("1", "10"):
        run_main(
            monkeypatch, train.main, *common, "--out", str(tmp_path / mult),
            "--new-layer-lr-mult", mult,
        )  # fmt: skip
        weights[mult] = load_file(tmp_path / mult / "model" / "model.safetensors")
    torch.set_num_threads(threads)
    config = json.loads((tmp_path / "10" / "model" / "config.json").read_text())
    assert config["num_hidden_layers"] == 3
    old = "model.layers.1.self_attn.o_proj.weight"
    assert torch.equal(weights["1"][old], weights["10"][old])
    new = "model.layers.2.self_attn.o_proj.weight"
    norms = [weights[m][new].float().norm().item() for m in ("1", "10")]
    assert norms[0] > 0 and norms[1] / norms[0] == pytest.approx(10, rel=0.02)
    with pytest.raises(SystemExit):  # the rate of new layers means nothing without --grow-from
        run_main(monkeypatch, train.main, "--preset", "draft", "--out", str(tmp_path / "x"),
                 "--new-layer-lr-mult", "3")  # fmt: skip
    assert "--new-layer-lr-mult needs --grow-from" in capsys.readouterr().err


def test_name_loss_weight_falls_on_the_called_functions_names_only() -> None:
    """``--name-loss-weight``: the tokens of each called function's name (and nothing else) take
    the weight; the ids and every other weight are those of the default encoding."""
    from tokenizers import Tokenizer

    tokenizer = Path(__file__).resolve().parents[1] / "src" / "brisklm" / "assets" / "brisk-chat"
    tool = {"type": "function", "function": {"name": "calculateMeteorShower", "parameters": {}}}
    calls = [
        {"type": "function", "function": {"name": "calculateMeteorShower", "arguments": {"n": 3}}},
        {"type": "function", "function": {"name": "do_x_2", "arguments": {}}},
    ]
    samples = [
        {
            "kind": "chat",
            "tools": [tool],
            "messages": [
                {"role": "user", "content": 'name "calculateMeteorShower" twice, n 3'},
                {"role": "assistant", "tool_calls": calls},
                {"role": "tool", "content": '{"name": "not_a_call"}'},
                {"role": "assistant", "content": "Done: calculateMeteorShower."},
            ],
        },
        {"kind": "prose", "text": '<tool_call>\n{"name": "prose_only"} text'},
    ]
    plain = train.encode_samples(samples, tokenizer, 0.5)
    weighted = train.encode_samples(samples, tokenizer, 0.5, name_weight=4.0)
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    (ids, weights), (prose_ids, prose_weights) = weighted
    assert ids == plain[0][0] and prose_ids == plain[1][0] and prose_weights == plain[1][1]
    named = [i for i, w in enumerate(weights) if w == 4.0]
    assert tok.decode([ids[i] for i in named]) == "calculateMeteorShowerdo_x_2"
    assert all(weights[i] == plain[0][1][i] for i in range(len(ids)) if i not in named)
    assert all(plain[0][1][i] == 1.0 for i in named)  # assistant tokens before
