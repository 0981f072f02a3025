"""The progress display shared by the multi-run commands: plain lines off a
terminal, a live bar with ETA on one."""

from __future__ import annotations

import io
import re
import threading

from rich.console import Console

from detaudit.report.progress import RunProgress, clock, seconds_left


def test_clock_and_estimate():
    assert [clock(7), clock(125), clock(3723)] == ["0:07", "2:05", "1:02:03"]
    # two runs that ended together after 40 s: 20 s a run, two to go
    assert seconds_left(40.0, 2, 4) == 40.0 and seconds_left(5.0, 0, 4) is None


def test_plain_lines_when_not_a_terminal():
    stream = io.StringIO()
    with RunProgress("variance", 3, console=Console(file=stream, width=60)) as progress:
        for label in ("fixed-000", "varied-000"):
            progress.started(label)
        progress.finished("fixed-000", "seed 0, ok in 1.0 s")
        progress.note("a note of its own, longer than the console is wide, which stays on one line")
        progress.finished("varied-000", "seed 0, failed", ok=False)
        progress.started("fixed-001")
        progress.finished("fixed-001", "seed 0, ok in 1.0 s")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4
    assert re.fullmatch(r"variance \[1/3\] fixed-000: seed 0, ok in 1.0 s · 0:00 elapsed, about 0:00 left", lines[0])
    assert lines[1].startswith("a note of its own") and lines[1].endswith("on one line")
    assert lines[2].startswith("variance [2/3] varied-000: seed 0, failed · ")
    assert re.fullmatch(r"variance \[3/3\] fixed-001: seed 0, ok in 1.0 s · all done in 0:00", lines[3])
    assert "\x1b[" not in stream.getvalue()


def test_live_bar_with_eta_on_a_terminal():
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, force_interactive=True, width=120)
    with RunProgress("variance", 4, console=console) as progress:
        workers = [threading.Thread(target=progress.started, args=(f"fixed-00{i}",)) for i in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        progress.finished("fixed-000", "seed 0, ok in 1.0 s")
        progress.finished("fixed-001", "seed 0, timed out", ok=False)
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())  # drop colours and cursor moves
    final = screen.splitlines()[-2:]
    assert "fixed-001: seed 0, timed out" in screen  # a failure is printed above the bar
    assert re.search(r"variance .* 2/4 runs \d:\d\d:\d\d ETA \d+:\d\d", "\n".join(final)), final
    assert "━" in screen  # the bar itself


def test_work_that_grows_does_not_say_all_done_too_early():
    # `detaudit run`: the capture reruns are known only once the first runs were compared
    stream = io.StringIO()
    with RunProgress("train.py", 2, console=Console(file=stream, width=60), more_may_follow=True) as progress:
        for label in ("run 1", "run 2"):
            progress.started(label)
            progress.finished(label, "ok in 1.0 s, 2 steps")
        progress.add(2)
        progress.started("capture rerun of run 1")
        progress.finished("capture rerun of run 1", "ok in 1.0 s")
    lines = stream.getvalue().splitlines()
    assert re.fullmatch(r"train\.py \[2/2\] run 2: ok in 1\.0 s, 2 steps · 0:00 elapsed", lines[1])
    capture = r"train\.py \[3/4\] capture rerun of run 1: ok in 1\.0 s · 0:00 elapsed, about 0:00 left"
    assert re.fullmatch(capture, lines[2])
    assert "all done" not in stream.getvalue()


def test_a_growing_total_moves_the_live_bar():
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, force_interactive=True, width=120)
    with RunProgress("train.py", 2, console=console, more_may_follow=True) as progress:
        progress.finished("run 1", "ok")
        progress.add(2)
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())
    assert re.search(r"train\.py .* 1/4 runs", screen.splitlines()[-1]), screen.splitlines()[-2:]
