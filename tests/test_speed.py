"""``brisklm bench`` and ``brisklm.speed``: what they time, and their one-line errors."""

from __future__ import annotations

import json
import time

import pytest

from brisklm import LLM
from brisklm.cli import main
from brisklm.speed import check_speed_options, measure_speed, prompt_ids
from tests.tiny import make_tiny_checkpoint


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("speed-model"))


def test_measure_speed_times_the_runs_it_says(model_dir, monkeypatch) -> None:
    with LLM.from_pretrained(
        model_dir, show_progress=False, prefix_caching=False, max_batch_size=3
    ) as llm:
        calls = []
        generate = llm.generate

        def recorded(prompts, params):
            calls.append(([len(p) for p in prompts], params.max_tokens, params.ignore_eos))
            outputs = generate(prompts, params)
            assert all(len(o.token_ids) == params.max_tokens for o in outputs)
            time.sleep(0.005 * params.max_tokens)  # (longer runs take longer, whatever the noise)
            return outputs

        monkeypatch.setattr(llm, "generate", recorded)
        report = measure_speed(llm, prompt_tokens=40, new_tokens=5, batch_sizes=(1, 3), repeats=2)
    # Each shape once untimed (its first run pays for its KV cache pages: a 1-token run at
    # batch 8 took twice as long as the 33-token runs after it), then each run twice: the
    # prompt alone, then each batch with 1 and 6 tokens.
    assert (
        calls
        == [([40], 1, True)] * 3
        + [([32], 6, True)]
        + [([32], 1, True)] * 2
        + [([32], 6, True)] * 2
        + [([32] * 3, 6, True)]
        + [([32] * 3, 1, True)] * 2
        + [([32] * 3, 6, True)] * 2
    )
    assert report.prompt_tokens == 40 and report.new_tokens == 5
    assert report.prefill_tokens_per_second == pytest.approx(40 / report.prefill_seconds)
    assert [d.batch_size for d in report.decode] == [1, 3]
    for row in report.decode:
        assert row.tokens_per_second == pytest.approx(row.batch_size / row.seconds_per_step)
        assert row.seconds_per_step > 0


def test_rows_of_a_batch_differ_and_have_the_length_asked(model_dir) -> None:
    with LLM.from_pretrained(model_dir, show_progress=False, prefix_caching=False) as llm:
        rows = [prompt_ids(llm, 50, row) for row in range(4)]
        assert all(len(r) == 50 for r in rows) and len({tuple(r) for r in rows}) == 4
        with pytest.raises(ValueError, match="need a context of"):
            measure_speed(llm, prompt_tokens=llm.max_seq_len, repeats=1)
        with pytest.raises(ValueError, match="past the engine's max_batch_size=8"):
            measure_speed(llm, prompt_tokens=8, new_tokens=2, batch_sizes=[9], repeats=1)
    with LLM.from_pretrained(model_dir, show_progress=False) as cached:
        with pytest.raises(ValueError, match="prefix_caching=False"):
            measure_speed(cached, prompt_tokens=8, new_tokens=2, repeats=1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ((0, 4, [1], 1), "prompt_tokens must be an int >= 1, got 0"),
        ((8, 4, [], 1), "batch_sizes must be ints >= 1, got []"),
        ((8, 4, [1, True], 1), "batch_sizes must be ints >= 1"),
        ((8, 4, [1], 0), "repeats must be an int >= 1, got 0"),
    ],
)
def test_bad_options_name_themselves(options, message) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_speed_options(*options)


def test_brisklm_bench_prints_its_figures(model_dir, capsys, monkeypatch) -> None:
    import brisklm.speed

    timed = brisklm.speed.time_generate

    def timing(llm, prompts, num_new):  # (the runs happen; their timings are made up)
        timed(llm, prompts, num_new)
        return 0.001 * (1 + 2 * num_new) * len(prompts)

    monkeypatch.setattr(brisklm.speed, "time_generate", timing)
    flags = ["--prompt-tokens", "24", "--new-tokens", "3", "--batch-sizes", "1,2", "--repeats", "1"]
    assert main(["bench", "--model", str(model_dir), *flags, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == model_dir.name and report["prompt_tokens"] == 24
    assert [d["batch_size"] for d in report["decode"]] == [1, 2]
    assert report["prefill_tokens_per_second"] == pytest.approx(24 / 0.003)
    # A step 2 ms a row: 500 tokens/s at batch 1 and at batch 2.
    assert [d["tokens_per_second"] for d in report["decode"]] == pytest.approx([500, 500])
    assert main(["bench", "--model", str(model_dir), *flags]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("prefill 24 tokens:") and "tokens/s" in lines[1]
    assert [line.split(":")[0] for line in lines[2:]] == ["decode batch 1", "decode batch 2"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batch-sizes", "1,x"], "--batch-sizes must be integers separated by commas"),
        (["--new-tokens", "0"], "--new-tokens must be an int >= 1, got 0"),
        (["--prompt-tokens", "5000"], "--prompt-tokens 5000 and --new-tokens 64 need a context"),
    ],
)
def test_brisklm_bench_errors_are_one_line(model_dir, capsys, flags, message) -> None:
    assert main(["bench", "--model", str(model_dir), *flags]) == 1
    err = capsys.readouterr().err
    assert err.startswith("brisklm: error: ") and message in err and len(err.splitlines()) == 1


def test_a_decode_run_no_longer_than_one_token_is_an_error_not_a_speed(
    model_dir, capsys, monkeypatch
) -> None:
    """Timing noise, or too few steps, made a run of several tokens no slower than a run of one:
    bench printed a step of a nanosecond, a billion tokens/s."""
    import brisklm.speed

    monkeypatch.setattr(brisklm.speed, "time_generate", lambda llm, prompts, num_new: 0.002)
    flags = ["--prompt-tokens", "24", "--new-tokens", "1", "--batch-sizes", "1", "--repeats", "1"]
    assert main(["bench", "--model", str(model_dir), *flags]) == 1
    err = capsys.readouterr().err
    assert err == (
        "brisklm: error: a run of 2 tokens took no longer than a run of 1 (2.00 ms against 2.00 "
        "ms): too few decode steps (1) to time against the noise; decode more new tokens\n"
    )
