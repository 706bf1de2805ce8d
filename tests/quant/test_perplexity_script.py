"""bench/gptq_perplexity.py runs end to end on a tiny model."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from tests.tiny import make_tiny_checkpoint

pytest.importorskip("transformers")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """Requested first so the module's other fixtures run single-threaded too."""


SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gptq_perplexity.py"


def test_perplexity_script_on_tiny_model(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("gptq_perplexity", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    model = make_tiny_checkpoint(tmp_path / "tiny", hidden_size=64, intermediate_size=128)
    text = tmp_path / "held_out.txt"
    text.write_text("A small boat drifted past the harbour wall while gulls circled overhead. " * 6)
    results = script.main(
        ["--model", str(model), "--text", str(text), "--group-size", "32", "--num-samples", "4"]
        + ["--seq-len", "32", "--eval-seq-len", "48", "--keep", str(tmp_path / "q")]
    )
    assert set(results) == {"float32", "bfloat16", "gptq", "rtn"}
    assert all(math.isfinite(v) and v > 1.0 for v in results.values())
    out = capsys.readouterr().out
    assert "perplexity" in out and "gptq" in out and "rtn" in out
    assert (tmp_path / "q" / "tiny-gptq-g32" / "quantize_config.json").is_file()
