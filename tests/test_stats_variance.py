"""``detaudit variance`` end to end on a tiny real CPU training (a few
seconds per run), plus a crashing script, a script that logs no metric or
seeds itself, progress output and the '-- ARGS' split."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pytest

from detaudit.cli import build_parser, main
from interrupting import ctrl_c_not_ignored

FIXTURE = str(Path(__file__).resolve().parents[1] / "fixtures" / "stats" / "train_tiny.py")


def parse(argv: list[str]):
    return build_parser(argv).parse_args(argv)


def test_script_arguments_go_after_double_dash():
    args = parse(["variance", "train.py", "--runs", "3", "--", "--lr", "0.1", "--runs", "9"])
    assert (args.script, args.runs, args.script_args) == ("train.py", 3, ["--lr", "0.1", "--runs", "9"])
    args = parse(["instability", "--steps", "4", "train.py"])
    assert (args.script, args.steps, args.script_args) == ("train.py", 4, [])


@pytest.mark.slow
def test_deterministic_mode_collapses_the_fixed_arm_over_shards(tmp_path, capsys):
    # --scatter: an embedding backward that is nondeterministic on CPU with 2 threads;
    # deterministic mode must make every fixed-seed run bitwise identical.
    # The study runs as two shards (as on two machines), then --merge reports it.
    out = tmp_path / "study"
    command = ["variance", FIXTURE, "--runs", "2", "--threads", "2", "--jobs", "2", "--deterministic",
               "--out", str(out), "--", "--scatter", "--steps", "12"]
    assert main(command[:1] + ["--shard", "1/2"] + command[1:]) == 0
    assert "shard 1/2: 2 run(s) finished now, 0 still to go" in capsys.readouterr().out
    assert not (out / "summary.json").exists()  # a shard adds runs; the merge reports
    assert main(command[:1] + ["--shard", "2/2"] + command[1:]) == 0
    assert main(["variance", "--merge", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "collapsed to a single value for every metric" in printed

    summary = json.loads((out / "summary.json").read_text())
    assert summary["determinism_proven"] is True
    by_name = {metric["name"]: metric for metric in summary["metrics"]}
    assert set(by_name) == {"test_acc", "test_loss", "train_loss"}
    for metric in by_name.values():
        assert metric["fixed"]["std"] == 0.0  # exactly
        assert len(set(metric["fixed"]["values"])) == 1
    assert by_name["train_loss"]["varied"]["std"] > 0  # two seeds, two trainings
    assert set(summary["pairwise_disagreement"]["test"]) == {"fixed", "varied"}
    assert summary["pairwise_disagreement"]["test"]["fixed"] == 0.0

    rows = list(csv.DictReader(open(out / "runs.csv")))
    assert sorted((r["arm"], r["seed"], r["status"]) for r in rows) == [
        ("fixed", "0", "ok"), ("fixed", "0", "ok"), ("varied", "0", "ok"), ("varied", "1", "ok"),
    ]
    assert {r["environment.torch.are_deterministic_algorithms_enabled"] for r in rows} == {"true"}
    assert "<svg" in (out / "report.html").read_text()
    assert (out / "variance.png").stat().st_size > 0  # matplotlib is installed in the test environment

    # everything finished: the unsharded command resumes the study and starts nothing
    records_before = sorted(path.read_text() for path in out.glob("runs*.jsonl"))
    assert main(command) == 0
    assert "run(s) to go" not in capsys.readouterr().out
    assert sorted(path.read_text() for path in out.glob("runs*.jsonl")) == records_before


def test_crashing_script_is_reported_with_its_output(tmp_path, capsys):
    script = tmp_path / "crash.py"
    script.write_text("print('loading data')\nraise RuntimeError('CUDA out of memory (pretend)')\n")
    assert main(["variance", str(script), "--runs", "2", "--jobs", "2", "--out", str(tmp_path / "s")]) == 2
    captured = capsys.readouterr()
    assert "stopped after 2 run(s): no run succeeded" in captured.err  # no point in running the other two
    printed = captured.out
    assert "2 run(s) failed" in printed
    assert "RuntimeError: CUDA out of memory (pretend)" in printed
    records = [json.loads(line) for line in (tmp_path / "s" / "runs.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["failed"] * 2


def test_bad_input_is_one_line_error(tmp_path, capsys):
    assert main(["variance", str(tmp_path / "missing.py")]) == 2
    assert "no such script" in capsys.readouterr().err
    assert main(["variance", FIXTURE, "--runs", "1", "--out", str(tmp_path / "x")]) == 2
    assert "at least 2" in capsys.readouterr().err
    assert main(["variance", FIXTURE, "--shard", "5/4", "--out", str(tmp_path / "x")]) == 2
    assert "1 <= i <= n" in capsys.readouterr().err


def test_ctrl_c_stops_running_scripts_at_once(tmp_path):
    """Ctrl-C reaches only the main thread; the runs in worker threads must be killed too."""
    import signal
    import subprocess
    import sys
    import time

    repo = Path(__file__).resolve().parent.parent
    hang = repo / "fixtures" / "dynamic" / "hang.py"
    process = subprocess.Popen(
        [sys.executable, "-m", "detaudit", "variance", str(hang), "--runs", "2", "--jobs", "2", "--out", str(tmp_path / "s")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(repo)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=ctrl_c_not_ignored,
    )
    children: list[int] = []
    deadline = time.monotonic() + 120
    while len(children) < 2 and time.monotonic() < deadline:  # both runs started (slow on a loaded machine)
        time.sleep(0.2)
        listed = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout
        children = [int(pid) for pid in listed.split()]
    assert len(children) == 2, "the two runs never started"
    time.sleep(1)  # let them reach the hang
    process.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    try:
        output, _ = process.communicate(timeout=60)
    finally:  # never leave hanging processes behind, even when the test fails
        process.kill()
        for pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert process.returncode == 130, output
    assert time.monotonic() - interrupted < 20, "the hanging runs were waited for instead of killed"
    for pid in children:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"run process {pid} survived Ctrl-C")


NO_METRIC = str(Path(__file__).resolve().parents[1] / "fixtures" / "stats" / "no_metric.py")
SELF_SEEDED = str(Path(__file__).resolve().parents[1] / "fixtures" / "stats" / "self_seeded.py")


def test_a_script_that_logs_no_metric_stops_the_study_after_its_first_run(tmp_path):
    """The first run to end logged nothing: the other run going (asleep for five
    minutes) is killed and nothing else starts; only that first record stays."""
    import subprocess
    import sys

    out = tmp_path / "s"
    command = [sys.executable, "-m", "detaudit", "variance", NO_METRIC, "--runs", "3", "--jobs", "2",
               "--out", str(out), "--", "--marker", str(tmp_path / "first")]
    repo = Path(__file__).resolve().parent.parent
    # a study that waited for its runs would sleep 300 s: the timeout makes that a failure, not a hang
    result = subprocess.run(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(repo)},
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 2, result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"detaudit: error: stopped after the first run \((fixed|varied)-000\): the script logged no metric .*", last_line
    ), last_line
    assert "test accuracy: 91.2" in result.stdout  # its output is shown
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["status"] == "failed"


def test_a_missing_metric_stops_the_study_after_its_first_run(tmp_path, capsys):
    out = tmp_path / "s"
    command = ["variance", FIXTURE, "--runs", "2", "--jobs", "1", "--threads", "1", "--metric", "accuracy",
               "--out", str(out), "--", "--steps", "2"]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert (
        "detaudit: error: stopped after the first run (fixed-000): it logged test_acc, test_loss, train_loss "
        "but not accuracy (asked for with --metric)"
    ) in err
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [(r["arm"], r["status"]) for r in records] == [("fixed", "ok")]  # kept: a rerun reuses it


@pytest.mark.slow
def test_a_self_seeded_script_is_named_and_seed_placeholder_fixes_it(tmp_path, capsys):
    # like the MNIST example: torch.manual_seed(args.seed) with --seed defaulting to 1
    base = ["variance", SELF_SEEDED, "--runs", "2", "--jobs", "2", "--threads", "1", "--format", "json"]
    assert main([*base, "--out", str(tmp_path / "own")]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    message = summary["seed_not_varied"]
    assert message.startswith("The varied-seed runs did not vary: all 2 varied-seed runs gave exactly the same value")
    assert "every varied-seed run ran at torch seed 1 although detaudit started them at seeds 0, 1" in message
    assert "torch.manual_seed(args.seed)" in message and "'-- --seed {seed}'" in message
    assert "DETAUDIT_SEED" in message
    for metric in summary["metrics"]:
        assert metric["varied_collapsed"] and "comes from the seed" not in metric["in_words"]
    assert "but the script set torch's seed to 1 itself" in captured.err  # said as soon as a run showed it
    runs = json.loads((tmp_path / "own" / "runs.json").read_text())["runs"]
    assert {run["torch_seed"] for run in runs} == {1}

    assert main([*base, "--out", str(tmp_path / "passed"), "--", "--seed", "{seed}"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["seed_not_varied"] is None
    assert all(not metric["varied_collapsed"] for metric in summary["metrics"])
    runs = json.loads((tmp_path / "passed" / "runs.json").read_text())["runs"]
    assert all(run["torch_seed"] == run["seed"] for run in runs)


def test_json_goes_alone_to_stdout_and_progress_to_stderr_as_plain_lines(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["variance", FIXTURE, "--runs", "2", "--jobs", "2", "--threads", "1", "--json",
                 "--out", str(out), "--", "--steps", "2"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["metrics"]  # nothing but the JSON document on stdout
    lines = [line for line in captured.err.splitlines() if line.startswith("variance [")]
    assert len(lines) == 4
    assert re.fullmatch(r"variance \[1/4\] (fixed|varied)-00\d: seed \d, ok in [\d.]+ s · \d+:\d\d elapsed, about \d+:\d\d left", lines[0])
    assert re.fullmatch(r"variance \[4/4\] .* · all done in \d+:\d\d", lines[-1])
    assert "\x1b[" not in captured.err  # no live display, no colours: not a terminal


def test_seed_placeholder_in_script_arguments():
    from detaudit.stats.runner import script_arguments

    assert script_arguments(["--seed", "{seed}", "--name=run{seed}", "x"], 7) == ["--seed", "7", "--name=run7", "x"]
    assert script_arguments(["--seed", "{seed}"], None) == ["--seed", "{seed}"]
