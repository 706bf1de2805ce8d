"""A checkpoint's generation_config.json sampling settings: read, checked, and used where a call
gives no SamplingParams (API, CLI, LangChain)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from brisklm import LLM, SamplingParams
from brisklm.cli import main
from brisklm.sampling.generation_config import sampling_defaults
from tests.tiny import make_tiny_checkpoint

QWEN_LIKE = {
    "bos_token_id": 1,
    "do_sample": True,
    "eos_token_id": [4],
    "repetition_penalty": 1.05,
    "temperature": 0.7,
    "top_k": 20,
    "top_p": 0.8,
    "max_new_tokens": 7,
}


def _write(directory: Path, config: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "generation_config.json").write_text(json.dumps(config))
    return directory


def test_reads_the_sampling_fields(tmp_path: Path) -> None:
    defaults = sampling_defaults(_write(tmp_path, QWEN_LIKE))
    assert defaults == {
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.8,
        "repetition_penalty": 1.05,
        "max_tokens": 7,
    }
    assert sampling_defaults(tmp_path / "missing") == {}


def test_do_sample_false_means_greedy(tmp_path: Path) -> None:
    # As transformers' generate decodes such a checkpoint (the bundled models say so); the file's
    # sampling fields do not apply then, its repetition penalty and length do.
    greedy = {**QWEN_LIKE, "do_sample": False}
    assert sampling_defaults(_write(tmp_path, greedy)) == {
        "temperature": 0.0,
        "repetition_penalty": 1.05,
        "max_tokens": 7,
    }
    assert sampling_defaults(_write(tmp_path, {"do_sample": False})) == {"temperature": 0.0}
    unsaid = {k: v for k, v in QWEN_LIKE.items() if k != "do_sample"}
    assert sampling_defaults(_write(tmp_path, unsaid))["temperature"] == 0.7


def test_bad_values_are_skipped_with_a_warning(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        defaults = sampling_defaults(_write(tmp_path, {"top_p": 1.5, "temperature": 0.6}))
    assert defaults == {"temperature": 0.6}
    assert "top_p=1.5 is not used" in caplog.text
    (tmp_path / "generation_config.json").write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert sampling_defaults(tmp_path) == {}
    assert "unreadable" in caplog.text


@pytest.fixture(scope="module")
def qwen_like_dir(tmp_path_factory) -> Path:
    directory = make_tiny_checkpoint(tmp_path_factory.mktemp("gen-config"))
    eos = json.loads((directory / "generation_config.json").read_text())["eos_token_id"]
    return _write(directory, {**QWEN_LIKE, "eos_token_id": eos})


def test_llm_uses_them_when_no_params_are_given(qwen_like_dir: Path) -> None:
    with LLM.from_pretrained(qwen_like_dir, show_progress=False) as llm:
        params = llm.default_sampling_params()
        assert (params.temperature, params.top_k, params.top_p) == (0.7, 20, 0.8)
        assert (params.repetition_penalty, params.max_tokens) == (1.05, 7)
        assert llm.default_sampling_params(temperature=0).temperature == 0
        assert len(llm.generate("Hello").token_ids) <= 7
        # Explicit params are the caller's, whole: brisklm's defaults fill what they leave out.
        explicit = llm.generate("Hello", SamplingParams(max_tokens=9, ignore_eos=True, seed=1))
        assert len(explicit.token_ids) == 9


def test_cli_unset_flags_take_them(qwen_like_dir: Path, capsys) -> None:
    args = ["generate", "--model", str(qwen_like_dir), "--ignore-eos", "--usage", "Hi"]
    assert main(args) == 0
    assert '"completion_tokens": 7' in capsys.readouterr().err  # max_new_tokens
    assert main([*args[:-1], "--max-tokens", "3", "Hi"]) == 0
    assert '"completion_tokens": 3' in capsys.readouterr().err  # a flag wins


def test_langchain_unset_fields_take_them(qwen_like_dir: Path) -> None:
    pytest.importorskip("langchain_brisklm")
    from langchain_brisklm import BriskLLM

    model = BriskLLM(model=str(qwen_like_dir), top_k=5)
    llm = LLM.from_pretrained(qwen_like_dir, show_progress=False)
    try:
        params = model._sampling_params(llm, 3, None, {})
    finally:
        llm.close()
    assert (params.temperature, params.top_p, params.top_k) == (0.7, 0.8, 5)
    assert params.max_tokens != 7  # LangChain calls run until the model stops, as before
