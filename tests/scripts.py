"""Running a test's script in a fresh interpreter (exit, fork and shutdown behaviour)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_script(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``source`` run as a script in a fresh interpreter with ``args``; it must exit with 0."""
    script = tmp_path / "script.py"
    script.write_text(source)
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done
