"""A load beside other busy processes takes the CPUs left (brisklm.kernels.omp.BusyCpus)."""

from __future__ import annotations

import os

import pytest
import torch

import brisklm.llm
from brisklm import LLM, SamplingParams
from brisklm.kernels import omp


def stat_lines(busy_ticks: int, idle_ticks: int) -> str:
    """/proc/stat with the first CPU this process may run on at ``busy_ticks`` of user time and
    ``idle_ticks`` idle, the others all idle (``idle_ticks + busy_ticks``)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    for i, cpu in enumerate(cpus):
        user, idle = (busy_ticks, idle_ticks) if i == 0 else (0, idle_ticks + busy_ticks)
        # user nice system idle iowait irq softirq steal guest guest_nice
        lines.append(f"cpu{cpu} {user} 0 0 {idle} 0 0 0 0 0 0")
    lines.append("intr 12345")
    return "\n".join(lines) + "\n"


def test_busy_cpus_counts_the_cpus_other_work_takes(monkeypatch):
    samples = iter([stat_lines(1000, 500), stat_lines(1100, 500)])  # one CPU busy throughout
    monkeypatch.setattr(omp, "available_cpus", lambda: len(os.sched_getaffinity(0)))
    busy = omp.BusyCpus(window_s=0.05, read=lambda: next(samples)).measure()
    # (less this process's own CPU time in the window, asleep: a little)
    assert busy is not None and 0.8 < busy <= 1.0
    idle = iter([stat_lines(1000, 500), stat_lines(1000, 600)])
    assert omp.BusyCpus(window_s=0.0, read=lambda: next(idle)).measure() == 0.0


def test_busy_cpus_is_none_without_proc_stat():
    def unreadable() -> str:
        raise OSError("no /proc here")

    assert omp.BusyCpus(window_s=0.0, read=unreadable).measure() is None


@pytest.mark.parametrize(
    ("busy", "wanted", "threads"),
    [(None, 2, 2), (0.0, 2, 2), (0.4, 2, 2), (0.6, 2, 1), (1.0, 2, 1), (2.0, 2, 1), (0.0, 1, 1)],
)
def test_threads_beside_busy_cpus(monkeypatch, busy, wanted, threads):
    monkeypatch.setattr(omp, "available_cpus", lambda: 2)
    assert omp.threads_beside(busy, wanted) == threads


def test_a_load_beside_busy_cpus_runs_on_the_cpus_left(tiny_dir, monkeypatch):
    """The load's torch ops run on one thread where all but one CPU are busy; the engine's
    threads, and the process's count, stay torch's."""
    if not omp.one_thread_works() or torch.get_num_threads() < 2:
        pytest.skip("needs torch's OpenMP runtime and two threads")
    monkeypatch.setattr(omp.BusyCpus, "measure", lambda self: omp.available_cpus() - 1.0)
    seen = []
    load_model = brisklm.llm.load_model

    def spying(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return load_model(*args, **kwargs)

    monkeypatch.setattr(brisklm.llm, "load_model", spying)
    before = torch.get_num_threads()
    with LLM.from_pretrained(tiny_dir, show_progress=False) as llm:
        out = llm.generate("Hi", SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
        assert len(out.token_ids) == 3
    assert seen == [1] and torch.get_num_threads() == before
