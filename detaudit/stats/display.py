"""The console the statistics commands print to."""

from __future__ import annotations

# wide enough for the tables when the output goes to a file or a CI log
# (rich assumes 80 columns there and would cut numbers short)
NON_TERMINAL_WIDTH = 120


def report_console(*, stderr: bool = False):
    from rich.console import Console

    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=NON_TERMINAL_WIDTH)
    return console
