"""Jupyter notebooks as Python: code cells joined in order, IPython syntax blanked.

The joined text keeps one line per cell line, so a finding's line maps back to
(cell, line in cell).  Cells are numbered as the notebook file stores them
(1-based, markdown cells included), which is the order a reader scrolls through.
IPython-only lines become ``pass`` at the same indentation (a loop body made of
a magic stays valid Python): line magics ``%time f()``, shell escapes ``!ls``,
help ``obj?``, and assignments from them (``files = !ls`` becomes
``files = None``).  A cell magic (``%%bash``, ``%%timeit``) skips its whole cell.
"""

from __future__ import annotations

import json
import re

from detaudit.static.engine.sources import SourceUnit, UnreadableSource, split_lines

_MAGIC_ASSIGNMENT = re.compile(r"^(?P<indent>\s*)(?P<target>[\w.\[\], ]+?)\s*=\s*[%!]")
_IPYTHON_LINE = re.compile(r"^(?P<indent>\s*)(?:[%!]|\?\??[\w.]|[\w.]+\?\??\s*$)")


def notebook_source(data: bytes) -> SourceUnit:
    """The code cells of an ``.ipynb`` file (nbformat 4) as one SourceUnit."""
    try:
        notebook = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UnreadableSource(f"malformed notebook: not valid JSON ({_one_line(error)})") from None
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        raise UnreadableSource("malformed notebook: no 'cells' list (only nbformat 4 notebooks are checked)")
    if not _is_python(notebook):
        return SourceUnit("", ())
    lines: list[str] = []
    where: list[tuple[int, int]] = []
    for number, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(part, str) for part in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise UnreadableSource(f"malformed notebook: cell {number} has a source that is not text")
        text = source
        if text.lstrip().startswith("%%"):
            continue  # a cell magic: the cell is not Python
        for line_number, line in enumerate(_python_lines(text), start=1):
            lines.append(line)
            where.append((number, line_number))
    return SourceUnit("".join(f"{line}\n" for line in lines), tuple(where))


def _python_lines(text: str) -> list[str]:
    result = []
    continued = False  # the previous IPython line ended with a backslash
    for line in split_lines(text):
        if continued:
            result.append("")
            continued = line.endswith("\\")
            continue
        assignment = _MAGIC_ASSIGNMENT.match(line)
        if assignment is not None:
            result.append(f"{assignment['indent']}{assignment['target']} = None")
            continued = line.endswith("\\")
        elif _IPYTHON_LINE.match(line):
            result.append(f"{_IPYTHON_LINE.match(line)['indent']}pass")
            continued = line.endswith("\\")
        else:
            result.append(line)
    return result


def _is_python(notebook: dict) -> bool:
    """Notebooks of other kernels (R, Julia) have nothing to check; no language recorded means Python."""
    metadata = notebook.get("metadata") if isinstance(notebook.get("metadata"), dict) else {}
    for key, field in (("kernelspec", "language"), ("language_info", "name")):
        section = metadata.get(key)
        if isinstance(section, dict) and isinstance(section.get(field), str):
            return section[field].lower() == "python"
    return True


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())
