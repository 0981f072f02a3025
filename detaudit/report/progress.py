"""Progress of work made of several runs (``variance``, ``instability``,
``run``): a live bar with the runs done, the runs going and an ETA on an
interactive terminal; one plain line per finished run otherwise (CI logs,
pipes), with the same counts and estimate.  It always writes to stderr, so a
command's stdout stays its report (pure JSON with ``--format json``).

    with RunProgress("variance", total=10) as progress:
        progress.started("fixed-000")
        ...
        progress.finished("fixed-000", "ok in 2.3 s")

Work that may grow once the first runs are seen (``run``'s capture reruns,
needed only when the runs differed) starts with ``more_may_follow=True`` and
calls ``add(count)``; until then its last line does not claim "all done".
Library code that takes a progress and is called without one uses
``NoProgress``.
"""

from __future__ import annotations

import time

_SHOWN_RUNNING = 3  # run labels named in the live description


def clock(seconds: float) -> str:
    """1:02:03, 2:05, 0:07."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def seconds_left(elapsed: float, done: int, total: int) -> float | None:
    """The average time per finished run so far, times the runs to go (runs
    in parallel finish in bursts: a speed over the last few seconds, as rich's
    own estimate uses, would say "one second left" after each burst)."""
    if not done:
        return None
    return elapsed / done * (total - done)


def _eta_column():
    from rich.progress import ProgressColumn
    from rich.text import Text

    class EtaColumn(ProgressColumn):
        def render(self, task):
            left = seconds_left(task.elapsed or 0.0, int(task.completed), int(task.total or 0))
            return Text(f"ETA {'-:--' if left is None else clock(left)}", style="progress.remaining")

    return EtaColumn()


class RunProgress:
    """A context manager; ``started``/``finished`` may be called from worker threads."""

    def __init__(self, title: str, total: int, *, console=None, more_may_follow: bool = False):
        if console is None:
            from rich.console import Console

            console = Console(stderr=True)
        self.title = title
        self.total = total
        self.more_may_follow = more_may_follow
        self.console = console
        self.live = console.is_interactive
        self.done = 0
        self.running: list[str] = []
        self._started_at = time.monotonic()
        self._bar = None
        self._task = None

    def __enter__(self) -> "RunProgress":
        self._started_at = time.monotonic()
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                SpinnerColumn(),
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("runs"),
                TimeElapsedColumn(),
                _eta_column(),
                TextColumn("{task.fields[running]}"),
                console=self.console,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.title, total=self.total, running="")
        return self

    def __exit__(self, *exc_info) -> None:
        if self._bar is not None:
            self._bar.stop()

    def started(self, label: str) -> None:
        self.running.append(label)
        self._refresh()

    def add(self, count: int) -> None:
        """``count`` more runs to do than planned."""
        self.total += count
        if self._bar is not None:
            self._bar.update(self._task, total=self.total)

    def finished(self, label: str, outcome: str, *, ok: bool = True) -> None:
        """``label`` ended with ``outcome`` ("ok in 2.3 s", "failed"): advance, and say so."""
        if label in self.running:
            self.running.remove(label)
        self.done += 1
        if self._bar is not None:
            self._bar.advance(self._task)
            self._refresh()
            if not ok:
                self._bar.console.print(f"[red]{label}: {outcome}[/]", highlight=False, soft_wrap=True)
            return
        elapsed = time.monotonic() - self._started_at
        if self.done < self.total:
            timing = f"{clock(elapsed)} elapsed, about {clock(seconds_left(elapsed, self.done, self.total))} left"
        elif self.more_may_follow:
            timing = f"{clock(elapsed)} elapsed"
        else:
            timing = f"all done in {clock(elapsed)}"
        self.console.print(
            f"{self.title} [{self.done}/{self.total}] {label}: {outcome} · {timing}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    def note(self, message: str) -> None:
        """A line of its own (above the bar on a terminal); rich markup allowed."""
        console = self._bar.console if self._bar is not None else self.console
        console.print(message, highlight=False, soft_wrap=True)

    def _refresh(self) -> None:
        if self._bar is None:
            return
        shown = ", ".join(self.running[:_SHOWN_RUNNING])
        more = len(self.running) - _SHOWN_RUNNING
        running = f"running {shown}" + (f" +{more}" if more > 0 else "") if self.running else ""
        self._bar.update(self._task, running=running)


class NoProgress:
    """``RunProgress``'s interface, saying nothing."""

    def __enter__(self) -> "NoProgress":
        return self

    def __exit__(self, *exc_info) -> None:
        pass

    def started(self, label: str) -> None:
        pass

    def add(self, count: int) -> None:
        pass

    def finished(self, label: str, outcome: str, *, ok: bool = True) -> None:
        pass

    def note(self, message: str) -> None:
        pass
