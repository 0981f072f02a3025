"""Writing small projects of several files for the static tests."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_project(root: Path, files: dict[str, str]) -> None:
    """Write each ``{relative path: dedented text}`` under ``root``, folders included."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
