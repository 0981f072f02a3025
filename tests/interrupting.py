"""Pressing Ctrl-C on a detaudit started by a test, as a terminal would."""

from __future__ import annotations

import signal


def ctrl_c_not_ignored() -> None:
    """``preexec_fn`` of the process a test will interrupt: SIGINT's default
    action, as Ctrl-C at a terminal meets a program.  A suite started in the
    background by a shell without job control (``pytest &`` in a script)
    ignores SIGINT, every process it starts inherits that, and Python then
    installs no KeyboardInterrupt: the Ctrl-C would stop nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
