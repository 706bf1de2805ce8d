"""The Triton int4 kernel: arithmetic in Triton's CPU interpreter (subprocess), launch heuristics here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from brisklm.quant.triton_int4 import choose_blocks, triton_available

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(not triton_available(), reason="triton not installed (pip install triton)")
def test_kernel_matches_reference_in_triton_interpreter() -> None:
    # triton chooses its interpreter when first imported, so the check runs in a fresh process.
    env = dict(os.environ, TRITON_INTERPRET="1")
    src = str(HERE.parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(HERE / "triton_interpret_check.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "all triton interpreter checks passed" in proc.stdout


def test_choose_blocks_fills_the_gpu_at_decode() -> None:
    # Llama-7B q_proj at M=1 on a 132-SM H200: 64 N tiles, so K is split to get ~4 programs per SM.
    block_m, block_n, block_k, split_k = choose_blocks(1, 4096, 4096, 128, 132)
    assert (block_m, block_n, block_k) == (16, 64, 128)
    assert 4096 // block_n * split_k >= 2 * 132
    # BLOCK_K never exceeds the group (one scale row per K tile) and the split never exceeds K tiles.
    assert choose_blocks(1, 64, 64, 32, 132)[2:] == (32, 2)
    # Prefill-sized M: bigger tiles, little or no splitting.
    block_m, _, _, split_k = choose_blocks(512, 4096, 4096, 128, 132)
    assert block_m == 64 and split_k == 1
