"""Run a user script in a fresh subprocess under detaudit's bootstrap.

The child is ``python -m detaudit.dynamic.bootstrap``: it reads a JSON config
from an environment variable, prepares the process (seeds, thread count,
determinism switches, step limit, tracing) and then runs the script as
``python SCRIPT ARGS`` would, in the same working directory.  Whatever the
script does (crash, ``sys.exit``, hang), the parent gets its output back and is
never blocked longer than ``timeout``: on timeout the whole process group is
killed.

This module imports neither torch nor numpy; the child does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

CONFIG_ENV = "DETAUDIT_BOOTSTRAP_CONFIG"
PAYLOAD_NAME = "payload.json"
# the repository root that holds the ``detaudit`` package, so the child can
# import it even when detaudit is not installed
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


@dataclass
class LaunchOptions:
    seed: int | None = 0  # seed random/numpy/torch(+CUDA) before the script; None = the script's own seeding
    max_steps: int = 0  # stop cleanly after N optimizer steps; 0 = run to completion
    threads: int | None = None  # torch.set_num_threads in the child
    hash_seed: str | None = None  # PYTHONHASHSEED for the child (None = inherit)
    deterministic: bool = False  # detaudit.enable_determinism() before the script
    perturb_ulp_seed: int | None = None  # move one parameter element by one ULP at the first step
    output_dir: Path | None = None  # where the child writes results; a temp dir if None
    extra_env: dict[str, str] = field(default_factory=dict)
    # what the child records (all off by default: plain runs stay plain)
    save_state: bool = False  # save params, grads, buffers, optimizer state and loss at the end
    record_environment: bool = False  # put detaudit.runtime.environment.fingerprint() in the payload
    trace: bool = False  # op-level tracing (detaudit.dynamic.tracer) written to trace.json
    capture_ops: tuple[int, ...] = ()  # traced op indices whose tensors are saved; stops after the last


@dataclass
class ScriptResult:
    returncode: int | None  # None when killed on timeout
    timed_out: bool
    stdout: str
    stderr: str
    output_dir: Path
    payload: dict  # JSON the bootstrap wrote at exit; {} if none

    @property
    def failed(self) -> bool:
        return self.timed_out or self.returncode != 0

    def describe_failure(self, max_lines: int = 40) -> str:
        """What went wrong, with the tail of the script's stderr (its traceback)."""
        if self.timed_out:
            head = "timed out and was killed"
        else:
            head = f"exited with code {self.returncode}"
        tail = (self.stderr.strip() or self.stdout.strip()).splitlines()[-max_lines:]
        return "\n".join([head, *tail])


#: scripts running now (their process groups are killed by terminate_all)
_RUNNING: set[subprocess.Popen] = set()


def run_script(
    script: str | os.PathLike,
    script_args: Sequence[str] = (),
    *,
    options: LaunchOptions | None = None,
    timeout: float | None = None,
    cwd: str | os.PathLike | None = None,
    cancel: threading.Event | None = None,
) -> ScriptResult:
    """Run ``script`` once in a fresh interpreter under the bootstrap."""
    options = options or LaunchOptions()
    script_path = Path(script)
    if not script_path.is_file():
        raise FileNotFoundError(f"no such script: {script}")
    output_dir = Path(options.output_dir) if options.output_dir else Path(tempfile.mkdtemp(prefix="detaudit-run-"))
    output_dir.mkdir(parents=True, exist_ok=True)
    payload_path = output_dir / PAYLOAD_NAME
    payload_path.unlink(missing_ok=True)

    config = asdict(options)
    config.update(
        script=str(script_path.resolve()),
        args=[str(a) for a in script_args],
        output_dir=str(output_dir.resolve()),
        capture_ops=list(options.capture_ops),
    )
    env = dict(os.environ)
    env.update(options.extra_env)
    env[CONFIG_ENV] = json.dumps(config)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
    if options.hash_seed is not None:
        env["PYTHONHASHSEED"] = str(options.hash_seed)

    process = subprocess.Popen(
        [sys.executable, "-m", "detaudit.dynamic.bootstrap"],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,  # its own process group, so a timeout kills its children too
    )
    timed_out = False
    _RUNNING.add(process)
    if cancel is not None and cancel.is_set():
        # cancelled while this run was starting: terminate_all may have missed it
        _kill_group(process)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process)
        stdout, stderr = process.communicate()
    except BaseException:  # e.g. Ctrl-C in the parent: never leave the child running
        _kill_group(process)
        process.wait()
        raise
    finally:
        _RUNNING.discard(process)
    return ScriptResult(
        returncode=None if timed_out else process.returncode,
        timed_out=timed_out,
        stdout=stdout,
        stderr=stderr,
        output_dir=output_dir,
        payload=_read_payload(payload_path),
    )


def terminate_all() -> None:
    """Kill every script still running under ``run_script``, in any thread.

    Set the ``cancel`` event given to ``run_script`` first: a run that is
    being started while this runs then kills itself.
    Ctrl-C reaches only the main thread; runs waiting in worker threads (the
    statistics runner's pool) would otherwise go on to their end."""
    for process in list(_RUNNING):
        _kill_group(process)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_payload(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
