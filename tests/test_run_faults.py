"""`detaudit run` against training scripts that misbehave.

Each fault script (fixtures/dynamic/faults/) must end in a clear report and
exit code, well within its time limit, with every process of the run gone
afterwards: crashes, signals, os._exit, hangs, children that ignore SIGTERM or
outlive the script holding its output, forked DataLoader workers, endless
output, stdin, torch.compile, mp.spawn, chdir, and Ctrl-C during `run` and
`variance`.  Scripts stop after one or two steps and most audits use two runs,
so that the module stays fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

import pytest

from detaudit.cli import main
from detaudit.dynamic.record.features import SaveFinalState, Tracing
from detaudit.dynamic.runner import audit_script
from detaudit.launch.options import LaunchOptions
from detaudit.launch.process import EXIT_GRACE_SECONDS, OUTPUT_TAIL_BYTES, run_script
from interrupting import ctrl_c_not_ignored

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ROOT / "fixtures" / "dynamic" / "faults"


def _run(capsys, script: str, *args) -> tuple[int, str, str]:
    code = main(["run", str(FAULTS / script), *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state not in ("Z", "X")


def _group_members(pgid: int) -> list[int]:
    """Running processes of process group ``pgid`` (Linux /proc)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(stat.parent.name))
    return members


def _assert_gone(pids) -> None:
    deadline = time.monotonic() + 10  # SIGKILL is immediate, the kernel's cleanup nearly so
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if _alive(pid)], f"left running: {[pid for pid in pids if _alive(pid)]}"


def _kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- 10: no results ---------------------------------------------------------
def test_script_that_leaves_through_os_exit_is_a_failure_not_an_internal_error(capsys):
    code, out, err = _run(capsys, "os_exit.py", "--repeats", "2")
    assert code == 2 and out == ""
    assert "run 1 of the script exited without writing its results" in err
    assert "os._exit()" in err
    assert "trained one step, leaving at once" in err  # its output
    assert "internal error" not in err


# -- 11: forked children ------------------------------------------------------
@pytest.mark.slow
def test_dataloader_workers_are_not_traced_nor_stopped(capsys):
    # The workers fork from the traced process.  They used to trace their own
    # ops (numbered on from the parent's count), so that in the capture rerun a
    # worker "captured" the root cause's record number and raised StopRun: the
    # worker died and the rerun failed, reported as "run 1 ... exited with code 1".
    code, out, err = _run(capsys, "dataloader_workers.py", "--repeats", "2", "--steps", "2", "--format", "json")
    assert code == 1, err
    report = json.loads(out)
    assert [(c["kind"], c["op"], c["line"]) for c in report["root_causes"]] == [
        ("nondeterministic-op", "aten.index_put.default", 28)
    ]
    assert report["root_causes"][0]["max_abs_diff"] is not None  # the capture reruns ran (the race may not recur)
    assert report["steps_run"] == [2, 2]
    assert report["warnings"] == []  # the workers were gone when the script exited


def test_batches_from_workers_may_arrive_in_any_order(capsys, tmp_path):
    # torch rebuilds a tensor received from a worker when it arrives: those
    # ops, traced, made the runs' op sequences differ (a false control-flow cause)
    code, out, err = _run(
        capsys, "dataloader_arrival_order.py", "--repeats", "2", "--format", "json", "--", tmp_path
    )
    assert code == 0, out + err
    assert json.loads(out)["steps_run"] == [2, 2]


def test_a_failing_capture_rerun_is_not_mistaken_for_the_run_it_repeats(capsys, tmp_path):
    code, _, err = _run(capsys, "fails_in_capture_rerun.py", "--repeats", "2", "--steps", "3", "--", tmp_path)
    assert code == 2
    assert "the capture rerun of run 1 of the script exited with code 1" in err
    assert "RuntimeError: the third run fails" in err


def test_forked_child_counts_no_steps_and_writes_no_results(tmp_path):
    child_steps = tmp_path / "child_steps"
    result = run_script(
        FAULTS / "forked_child_keeps_training.py",
        [child_steps],
        options=LaunchOptions(max_steps=2, features=(Tracing(), SaveFinalState()), output_dir=tmp_path / "out"),
        timeout=120,
    )
    assert not result.failed, result.stderr
    assert child_steps.read_text() == "5"  # the step limit of the parent did not stop the child
    assert result.payload["steps"] == 2 and result.payload["stopped_at_max_steps"]
    trace = json.loads(Path(result.payload["trace_file"]).read_text())
    assert max(record[5] for record in trace["ops"]) == 2  # only the parent's two steps are traced


# -- 12: no optimizer step -----------------------------------------------------
def test_script_without_optimizer_step_says_what_was_compared():
    report = audit_script(str(FAULTS / "no_optimizer_step.py"), steps=2, repeats=2, timeout=120)
    assert report.deterministic and report.steps_run == [0, 0]
    assert "(no optimizer step ran)" in report.verdict_line()
    assert "2 steps each" not in report.verdict_line()
    [warning] = report.warnings
    assert warning.startswith("no optimizer step ran")
    assert f"{report.traced_ops} traced ops" in warning
    assert "warning: no optimizer step ran" in report.to_text(width=400)
    assert report.to_dict()["warnings"] == [warning]


# -- 13: children holding the output -----------------------------------------
def test_children_holding_the_output_are_killed_shortly_after_the_script_exits(capsys, tmp_path):
    # before, each run waited for its output to close: it timed out (after --timeout)
    code, out, err = _run(
        capsys, "child_holds_output.py", "--repeats", "2", "--timeout", "300", "--format", "json", "--", tmp_path
    )
    children = [int(path.name) for path in tmp_path.iterdir()]
    _kill_all([] if code == 0 else children)
    assert code == 0, err
    report = json.loads(out)
    assert report["verdict"] == "deterministic"
    assert report["warnings"] == [
        f"run {n} left child processes holding its output open after it exited; "
        f"detaudit killed them {EXIT_GRACE_SECONDS:g} s later"
        for n in (1, 2)
    ]
    assert len(children) == 2
    _assert_gone(children)


# -- 14: signals ---------------------------------------------------------------
def test_a_signal_is_named(capsys):
    code, out, err = _run(capsys, "segfault.py")
    assert code == 2
    assert "run 1 of the script was killed by SIGSEGV" in err
    assert "code -11" not in err
    assert "about to crash" in err or "Segmentation fault" in err  # its output, and the faulthandler stack
    assert "segfault.py" in err  # the faulthandler stack names the line


# -- 15: failures in the machine formats ---------------------------------------
def test_failure_is_a_json_document(capsys, tmp_path):
    junit = tmp_path / "junit.xml"
    code, out, err = _run(capsys, "../exit_code.py", "--format", "json", "--junit-xml", junit)
    assert code == 2
    document = json.loads(out)
    assert document["verdict"] == "error"
    assert document["error"]["message"] == "run 1 of the script exited with code 3"
    assert (document["error"]["run"], document["error"]["returncode"]) == ("run 1", 3)
    assert document["error"]["signal"] is None and document["error"]["timed_out"] is False
    case = ElementTree.parse(junit).getroot().find("testcase")
    assert case.find("error").get("message") == "run 1 of the script exited with code 3"


def test_failure_in_sarif_and_github_formats(capsys):
    import jsonschema

    code, out, _ = _run(capsys, "../crash_after_step.py", "--format", "sarif")
    assert code == 2
    sarif = json.loads(out)
    jsonschema.validate(sarif, json.loads((ROOT / "tests" / "sarif-schema-2.1.0.json").read_text()))
    [invocation] = sarif["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False
    [notification] = invocation["toolExecutionNotifications"]
    assert notification["level"] == "error"
    assert notification["message"]["text"].startswith("run 1 of the script exited with code 1")
    assert "ValueError: the data loader ran dry" in notification["message"]["text"]

    code, out, _ = _run(capsys, "../crash_after_step.py", "--format", "github")
    assert code == 2
    assert out.startswith("::error file=") and "title=detaudit run failed::run 1 of the script exited with code 1" in out
    assert "ValueError: the data loader ran dry" in out and out.count("\n") == 1  # one annotation


# -- the other faults ----------------------------------------------------------
def test_hang_with_a_child_ignoring_sigterm_is_killed_at_the_timeout(tmp_path):
    # no seed, no tracing: the bootstrap imports no torch, so the script is up long before the timeout
    result = run_script(FAULTS / "hang_with_child.py", [tmp_path], options=LaunchOptions(seed=None), timeout=5)
    [started] = [path.name for path in tmp_path.iterdir()]
    pids = [int(pid) for pid in started.split()]
    _assert_gone(pids)
    assert result.timed_out and result.failed
    assert result.describe_exit() == "timed out after 5 s and was killed"


def test_an_exception_in_one_run_only_names_that_run(capsys, tmp_path):
    code, _, err = _run(capsys, "fails_in_second_run.py", "--repeats", "3", "--", tmp_path / "first_run_was_here")
    assert code == 2
    assert "run 2 of the script exited with code 1" in err
    assert "RuntimeError: this run found a file an earlier run left behind" in err


def test_huge_output_keeps_only_its_tail_and_every_metric_line(tmp_path):
    result = run_script(
        FAULTS / "huge_output.py",
        ["48"],
        options=LaunchOptions(seed=None),
        timeout=120,
        keep_lines_with="detaudit-metric:",
    )
    assert result.returncode == 5
    assert len(result.stdout) < OUTPUT_TAIL_BYTES + 200  # 48 MiB printed
    assert result.stdout.startswith("[detaudit: the first ")
    assert result.stdout.rstrip().endswith("the last line of stdout")
    assert result.kept_lines == ['detaudit-metric: {"accuracy": 0.5}']
    assert result.describe_failure().endswith("the last line of stderr")


def test_reading_stdin_does_not_wait_for_input(capsys):
    code, _, err = _run(capsys, "reads_stdin.py", "--repeats", "2", "--timeout", "300")
    assert code == 0, err


def test_chdir_and_write_still_delivers_the_results(capsys, tmp_path):
    code, out, err = _run(capsys, "chdir_and_write.py", "--repeats", "2", "--format", "json", "--", tmp_path)
    assert code == 0, err
    assert json.loads(out)["steps_run"] == [2, 2]
    assert (tmp_path / "checkpoint.pt").is_file()


@pytest.mark.slow
def test_mp_spawn_workers_run_and_the_main_process_is_audited(capsys):
    code, out, err = _run(capsys, "mp_spawn.py", "--repeats", "2", "--timeout", "300", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["steps_run"] == [2, 2]


@pytest.mark.slow
def test_torch_compile_is_audited(capsys):
    code, out, err = _run(capsys, "compiled_model.py", "--repeats", "2", "--timeout", "300", "--format", "json")
    if code == 2 and any(name in err for name in ("InvalidCxxCompiler", "CppCompileError", "BackendCompilerFailed")):
        pytest.skip(f"inductor cannot compile here: {err.strip().splitlines()[-1]}")
    assert code == 0, err
    report = json.loads(out)
    assert report["verdict"] == "deterministic" and report["steps_run"] == [2, 2]
    assert report["traced_ops"] > 0


# -- Ctrl-C ------------------------------------------------------------------------
def _run_pids(pid_dir: Path) -> list[int]:
    """The pids hang_with_child.py wrote: each run's main process (its group's leader), then its child."""
    return [int(pid) for path in pid_dir.iterdir() if path.name[0].isdigit() for pid in path.name.split()]


def _interrupt_when_started(command: list[str], pid_dir: Path, runs: int) -> tuple[subprocess.Popen, str]:
    """Start detaudit, wait until ``runs`` runs of hang_with_child.py are up,
    press Ctrl-C; returns the finished process and its output.  The caller
    kills what the runs wrote in ``pid_dir``, whether the test passes or not."""
    process = subprocess.Popen(
        [sys.executable, "-m", "detaudit", *command],
        cwd=pid_dir,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ctrl_c_not_ignored,
    )
    try:
        deadline = time.monotonic() + 180  # starting torch is slow on a loaded machine
        while len(_run_pids(pid_dir)) < 2 * runs and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_run_pids(pid_dir)) == 2 * runs, "the runs never started"
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    finally:  # never leave detaudit running, even when the test fails
        process.kill()
        process.wait()
    return process, output


@pytest.mark.parametrize(
    "command, runs",
    [
        (["run", str(FAULTS / "hang_with_child.py"), "--", "."], 1),
        (["variance", str(FAULTS / "hang_with_child.py"), "--runs", "2", "--jobs", "2", "--out", "study", "--", "."], 2),
        (["instability", str(FAULTS / "hang_with_child.py"), "--jobs", "2", "--out", "study", "--", "."], 2),
        (["run", str(FAULTS / "hang_with_child.py"), "--remedy", "--", "."], 1),
        (["run", "--nproc-per-node", "2", str(FAULTS / "hang_with_child.py"), "--", "."], 2),
    ],
    ids=["run", "variance", "instability", "remedy", "nproc-per-node"],
)
def test_ctrl_c_leaves_no_process_of_the_run(tmp_path, command, runs):
    try:
        process, output = _interrupt_when_started(command, tmp_path, runs)
        pids = _run_pids(tmp_path)
        groups = pids[::2]  # each run's main process leads its process group
        assert process.returncode == 130, output
        assert "interrupted" in output
        _assert_gone(pids)
        assert not [pid for group in groups for pid in _group_members(group)]
    finally:  # whatever failed, nothing the runs started outlives the test
        _kill_all(_run_pids(tmp_path))
