"""The README's Python examples, read from the README itself, so that the tests run what it shows."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

# What the examples leave to the reader, and what the tests put there: a checkpoint directory.
MODEL_PLACEHOLDER = '"/path/to/model"'


def python_blocks(section: str) -> list[str]:
    """The ```python blocks of the README section headed ``## {section}``."""
    text = README.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"```python\n(.*?)```", text[start : end if end > 0 else None], re.S)
    assert blocks, f"the README's section {section!r} has no Python example"
    return blocks


def run_blocks(section: str, model: str, names: dict | None = None) -> dict:
    """Run a section's examples in turn in one namespace (``names`` first), with ``model`` where
    they say "/path/to/model"; returns the namespace."""
    namespace = dict(names or {})
    for number, block in enumerate(python_blocks(section)):
        code = block.replace(MODEL_PLACEHOLDER, repr(model))
        exec(compile(code, f"README.md, {section}, example {number + 1}", "exec"), namespace)
    return namespace
