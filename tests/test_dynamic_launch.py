"""launch.run_script: real child interpreters, real exit codes, real timeouts."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

from detaudit.dynamic.record.features import SaveFinalState
from detaudit.launch.options import LaunchOptions
from detaudit.launch.process import run_script
from detaudit.stats.perturbation import PerturbOneUlp

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dynamic"


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_runs_the_script_as_main_with_its_argv_and_cwd(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, sys, json
        print(json.dumps({"name": __name__, "argv": sys.argv[1:], "cwd": os.getcwd()}))
        """,
    )
    result = run_script(script, ["--lr", "0.1"], options=LaunchOptions(seed=None), cwd=tmp_path, timeout=60)
    assert not result.failed, result.stderr
    seen = json.loads(result.stdout)
    assert seen == {"name": "__main__", "argv": ["--lr", "0.1"], "cwd": str(tmp_path)}
    assert result.payload["exit_code"] == 0


def test_seed_makes_unseeded_draws_equal_and_hash_seed_is_passed(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, random, torch
        print(random.random(), torch.rand(1).item(), os.environ.get("PYTHONHASHSEED"))
        """,
    )
    outputs = [
        run_script(script, options=LaunchOptions(seed=7, settings={"hash-seed": "5"}), timeout=60).stdout for _ in range(2)
    ]
    assert outputs[0] == outputs[1]
    assert outputs[0].split()[-1] == "5"


def test_stops_after_max_steps_and_saves_state(tmp_path):
    result = run_script(
        FIXTURES / "deterministic_mlp.py",
        options=LaunchOptions(max_steps=2, features=(SaveFinalState(),), output_dir=tmp_path / "out"),
        timeout=120,
    )
    assert not result.failed, result.stderr
    assert result.payload["steps"] == 2 and result.payload["stopped_at_max_steps"]
    assert result.stdout == ""  # stopped before the final print
    import torch

    state = torch.load(result.payload["state_file"], weights_only=True)
    assert {"model.0.weight", "model.0.weight.grad", "loss"} <= set(state)
    assert any(name.startswith("optimizer.state[model.0.weight].exp_avg") for name in state)


def test_perturb_moves_one_element_by_one_ulp(tmp_path):
    result = run_script(
        FIXTURES / "deterministic_mlp.py", options=LaunchOptions(max_steps=1, features=(PerturbOneUlp(3),)), timeout=120
    )
    perturbed = result.payload["perturbed"]
    assert perturbed["param"] == "model.0.weight"
    import numpy as np

    old, new = np.float32(perturbed["old"]), np.float32(perturbed["new"])
    assert new != old and new in (np.nextafter(old, np.float32(np.inf)), np.nextafter(old, np.float32(-np.inf)))


def test_crash_exit_code_and_output_are_reported():
    crashed = run_script(FIXTURES / "crash_after_step.py", timeout=120)
    assert crashed.failed and crashed.returncode == 1
    assert "ValueError: the data loader ran dry" in crashed.stderr
    assert crashed.payload["error"].startswith("ValueError")
    exited = run_script(FIXTURES / "exit_code.py", options=LaunchOptions(seed=None), timeout=60)  # no torch to load
    assert exited.returncode == 3 and exited.failed


def test_timeout_kills_a_hanging_script():
    started = time.monotonic()
    result = run_script(FIXTURES / "hang.py", options=LaunchOptions(seed=None), timeout=2)
    assert result.timed_out and result.returncode is None and result.failed
    assert time.monotonic() - started < 30
    assert "timed out" in result.describe_failure()


def test_killing_a_process_group_returns_once_none_of_it_is_alive(tmp_path):
    """``kill_process_group`` waits for the processes it killed to be gone
    (a zombie is dead), reading each one's group from /proc/PID/stat, whose
    process name may hold spaces and parentheses."""
    import shutil
    import subprocess

    from detaudit.launch.process import kill_process_group

    odd_name = tmp_path / "sl) 1 (p"
    shutil.copy(shutil.which("sleep"), odd_name)
    leader = subprocess.Popen(["sh", "-c", f"'{odd_name}' 60 & '{odd_name}' 60 & wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(_live_members(leader.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_live_members(leader.pid)) == 3  # the shell and its two sleeps
    kill_process_group(leader.pid)
    assert _live_members(leader.pid) == []
    leader.wait()


def _live_members(group: int) -> list[str]:
    """The pids of the group's processes that are not zombies, from /proc."""
    live = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        state, _parent, member_of = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(member_of) == group and state not in ("Z", "X"):
            live.append(pid)
    return live
