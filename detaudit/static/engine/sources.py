"""Reading checked files: bytes to text, with every way that can fail named.

A ``SourceUnit`` is the Python text the engine parses.  For notebooks it is the
code cells joined in order, with a map back to (cell, line in cell): that is
``notebooks.py``, which builds on this module.  The engine's ``read_source``
chooses between the two by the file's suffix.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import warnings
from dataclasses import dataclass

#: Larger files are skipped with a message: they are generated, not training code,
#: and parsing them would dominate a check.
MAX_FILE_BYTES = 2 * 1024 * 1024


#: A line break as Python's tokenizer and libcst read one.  ``str.splitlines``
#: also breaks at form feeds, vertical tabs and Unicode separators, which are
#: not line breaks in Python source, so lines are always split with this.
LINE_BREAK = re.compile(r"\r\n|\r|\n")


def split_lines(text: str, keepends: bool = False) -> list[str]:
    """``text``'s lines as Python numbers them (a final line break starts no new line)."""
    if keepends:
        return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", text)
    lines = LINE_BREAK.split(text)
    return lines[:-1] if lines and lines[-1] == "" else lines


class UnreadableSource(Exception):
    """The file cannot be checked; the message is one line for the user."""


@dataclass(frozen=True)
class SourceUnit:
    text: str
    #: for notebooks: joined-text line (1-based) -> (cell number, line in cell), else None
    cell_lines: tuple[tuple[int, int], ...] | None = None

    def locate(self, line: int) -> tuple[int | None, int]:
        """(cell, line) for a line of ``text``: cell is None for plain files."""
        if self.cell_lines is None or not 1 <= line <= len(self.cell_lines):
            return None, line
        return self.cell_lines[line - 1]


def python_parse_error(text: str) -> Exception | None:
    """What Python's own parser says against ``text`` (None when it parses),
    without printing its SyntaxWarnings about the user's code."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, "<checked file>", "exec", dont_inherit=True, flags=ast.PyCF_ONLY_AST)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        return error
    return None


def decode_python(data: bytes) -> str:
    if b"\x00" in data:
        raise UnreadableSource("binary file (contains NUL bytes), not Python source")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError) as error:
        raise UnreadableSource(f"cannot decode: {error}") from None
    except UnicodeDecodeError as error:
        raise UnreadableSource(
            f"not valid {error.encoding} (byte {error.start}); save it as UTF-8 or declare its encoding"
        ) from None
