"""Run a user script in a fresh subprocess under detaudit's bootstrap.

The child is ``python -m detaudit.launch.bootstrap``: it reads a JSON config
(``LaunchOptions.config``) from an environment variable, prepares the process
(seeds, child settings, step limit, features such as tracing) and then runs the script as
``python SCRIPT ARGS`` would, in the same working directory.  Whatever the
script does (crash, ``sys.exit``, ``os._exit``, a signal, a hang, endless
output, children left behind), the parent gets the tail of its output back and
is never blocked much longer than ``timeout``; the script's whole process group
is killed when it ends.

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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from detaudit.launch.options import LaunchOptions

CONFIG_ENV = "DETAUDIT_BOOTSTRAP_CONFIG"
PAYLOAD_NAME = "payload.json"
# the repository root that holds the ``detaudit`` package, so the child can
# import it even when detaudit is not installed
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


@dataclass
class ScriptResult:
    returncode: int | None  # None when killed on timeout; -N when killed by signal N
    timed_out: bool
    stdout: str  # the last OUTPUT_TAIL_BYTES of it
    stderr: str  # the same
    output_dir: Path
    payload: dict  # JSON the bootstrap wrote at exit; {} if none
    time_limit: float | None = None  # the timeout it ran under
    kept_lines: list[str] = field(default_factory=list)  # stdout lines that start with ``keep_lines_with``
    warnings: list[str] = field(default_factory=list)  # what detaudit had to do after the script ended ("left ...")

    @property
    def failed(self) -> bool:
        return self.timed_out or self.returncode != 0

    @property
    def wrote_results(self) -> bool:
        """Whether the bootstrap got to write the payload: not after
        ``os._exit()``, an ``exec``, or a kill."""
        return "exit_code" in self.payload

    @property
    def signal_name(self) -> str | None:
        """SIGSEGV, SIGKILL...: the signal that killed the script, if one did."""
        if self.timed_out or self.returncode is None or self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def describe_exit(self) -> str:
        """How the script ended, as the rest of a sentence ("run 2 of the script ...")."""
        if self.timed_out:
            limit = f" after {self.time_limit:g} s" if self.time_limit else ""
            return f"timed out{limit} and was killed"
        name = self.signal_name
        if name is not None:
            return f"was killed by {name}{_SIGNAL_HINTS.get(name, '')}"
        if self.returncode != 0:
            return f"exited with code {self.returncode}"
        if not self.wrote_results:
            return (
                "exited without writing its results (exit code 0, but detaudit's bootstrap never "
                "reached its end: the script left through os._exit() or replaced itself with exec)"
            )
        return "exited normally"

    def output_tail(self, max_lines: int = 40) -> str:
        """The end of the script's stderr (its traceback), else of its stdout."""
        return "\n".join((self.stderr.strip() or self.stdout.strip()).splitlines()[-max_lines:])

    def describe_failure(self, max_lines: int = 40) -> str:
        """What went wrong, with the tail of the script's output."""
        return "\n".join(part for part in (self.describe_exit(), self.output_tail(max_lines)) if part)


_SIGNAL_HINTS = {
    "SIGKILL": " (when detaudit did not send it, usually the kernel's out-of-memory killer)",
    "SIGSEGV": " (a crash in native code; the Python stack at the crash is printed above)",
    "SIGABRT": " (an abort in native code; the Python stack at the crash is printed above)",
    "SIGBUS": " (a crash in native code; the Python stack at the crash is printed above)",
}

#: bytes of each output stream kept in memory (a script may print gigabytes)
OUTPUT_TAIL_BYTES = 1 << 20
#: once the script has exited, how long its children may keep its output open
#: (a DataLoader worker shutting down) before the process group is killed
EXIT_GRACE_SECONDS = 2.0
#: after the group is killed, how long to wait for the pipes to close (a
#: process that left the group with setsid() may hold them forever)
_DRAIN_SECONDS = 5.0

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
    keep_lines_with: str | None = None,
    launcher: Sequence[str] = (),
    before_kill: Callable[[], None] | None = None,
) -> ScriptResult:
    """Run ``script`` once in a fresh interpreter under the bootstrap.

    stdin is /dev/null.  Only the tail of each output stream is kept, plus
    every stdout line that starts with ``keep_lines_with`` (after leading
    blanks).  When the script exits, its children get ``EXIT_GRACE_SECONDS``
    to close its output; then the whole process group is killed: no process
    of the run outlives ``run_script``, on success, failure, timeout or
    Ctrl-C alike.

    ``launcher``: a module and its options that start the bootstrap instead
    of the interpreter itself (``torch.distributed.run ... -m``: one bootstrap
    per rank).  ``before_kill``: called on timeout before the process group is
    killed (to make hung processes show where they are)."""
    options = options or LaunchOptions()
    script_path = Path(script)
    if not script_path.is_file():
        raise FileNotFoundError(f"no such script: {script}")
    output_dir = Path(options.output_dir) if options.output_dir else Path(tempfile.mkdtemp(prefix="detaudit-run-"))
    output_dir.mkdir(parents=True, exist_ok=True)
    payload_path = output_dir / PAYLOAD_NAME
    payload_path.unlink(missing_ok=True)

    config = options.config(str(script_path.resolve()), [str(a) for a in script_args], output_dir.resolve())
    env = options.environment(os.environ)
    env[CONFIG_ENV] = json.dumps(config)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p)

    process = subprocess.Popen(
        [sys.executable, "-m", *launcher, "detaudit.launch.bootstrap"],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, so that its children are killed with it
    )
    _RUNNING.add(process)
    stdout = _OutputTail(process.stdout, keep_lines_with)
    stderr = _OutputTail(process.stderr)
    warnings = []
    try:
        if cancel is not None and cancel.is_set():
            # cancelled while this run was starting: terminate_all may have missed it
            _kill_group(process)
        timed_out = not _wait_for_exit(process, timeout)
        if timed_out and before_kill is not None:
            before_kill()
        if not timed_out and not _wait_for_end_of_output((stdout, stderr), EXIT_GRACE_SECONDS):
            warnings.append(
                f"left child processes holding its output open after it exited; "
                f"detaudit killed them {EXIT_GRACE_SECONDS:g} s later"
            )
        _kill_group(process)  # children still running, or the whole run on timeout
        process.wait()
    except BaseException:  # e.g. Ctrl-C in the parent: never leave the child running
        _kill_group(process)
        process.wait()
        raise
    finally:
        _RUNNING.discard(process)
    _wait_for_end_of_output((stdout, stderr), _DRAIN_SECONDS)
    return ScriptResult(
        returncode=None if timed_out else process.returncode,
        timed_out=timed_out,
        stdout=stdout.text(),
        stderr=stderr.text(),
        output_dir=output_dir,
        payload=_read_payload(payload_path),
        time_limit=timeout,
        kept_lines=stdout.kept_lines,
        warnings=warnings,
    )


def terminate_all() -> None:
    """Kill every script still running under ``run_script``, in any thread.

    Set the ``cancel`` event given to ``run_script`` first: a run that is
    being started while this runs then kills itself.
    Ctrl-C reaches only the main thread; runs waiting in worker threads (the
    statistics runner's pool) would otherwise go on to their end."""
    for process in list(_RUNNING):
        _kill_group(process)


def _wait_for_exit(process: subprocess.Popen, timeout: float | None) -> bool:
    """Wait until the script's main process has exited (False on timeout),
    without reaping it: while it is an unreaped zombie its pid, which is
    also its process group's id, cannot be reused, so killing the group
    afterwards cannot hit an unrelated process."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.005
    while not _has_exited(process):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
        pause = min(pause * 2, 0.1)
    return True


def _has_exited(process: subprocess.Popen) -> bool:
    if not hasattr(os, "waitid"):
        return process.poll() is not None  # reaps: the group id may be reused (very unlikely) before the kill
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already reaped (SIGCHLD ignored in this process)
        return True


def _wait_for_end_of_output(streams, seconds: float) -> bool:
    """Wait up to ``seconds`` in all for every stream to end; True if they did."""
    deadline = time.monotonic() + seconds
    return all(stream.wait(max(0.0, deadline - time.monotonic())) for stream in streams)


def _kill_group(process: subprocess.Popen) -> None:
    kill_process_group(process.pid)


def kill_process_group(group: int) -> None:
    """SIGKILL every process of a process group, then wait (at most
    ``_KILL_WAIT_SECONDS``) until none of them is alive.  A killed process
    takes a while to exit (a training process unmaps gigabytes, on a loaded
    machine for a good part of a second), and callers promise that no process
    of the run outlives them."""
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone (macOS says EPERM for a zombie-only group)
        return
    deadline = time.monotonic() + _KILL_WAIT_SECONDS
    pause = 0.002
    while group_has_live_process(group) and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


#: how long kill_process_group waits for the killed processes to be gone
_KILL_WAIT_SECONDS = 10.0


def group_has_live_process(group: int) -> bool:
    """Whether a process of the group is still running or exiting (zombies
    are dead: they wait only for their parent to read their status).  Reads
    /proc; without it (macOS) the kill is taken as done."""
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stream:
                stat = stream.read()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
        state, _parent, process_group = stat[stat.rfind(b")") + 2 :].split(b" ", 3)[:3]
        if int(process_group) == group and state not in (b"Z", b"X"):
            return True
    return False


class _OutputTail:
    """Reads one output stream of the script to its end, in a thread.

    Keeps the last ``OUTPUT_TAIL_BYTES`` (the output can be far larger than
    memory) and, when given a prefix, every line that starts with it after
    leading blanks (the statistics read metric lines from stdout)."""

    _MAX_LINE = 1 << 16  # a longer line is never a kept line

    def __init__(self, stream, keep_lines_with: str | None = None):
        self._tail = bytearray()
        self._dropped = 0
        self._prefix = keep_lines_with.encode() if keep_lines_with else None
        self._line = bytearray()  # the line being read, while it may still be a kept one
        self._line_too_long = False
        self.kept_lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        with stream:
            while chunk := os.read(stream.fileno(), 1 << 16):
                self._tail += chunk
                if len(self._tail) > 2 * OUTPUT_TAIL_BYTES:
                    cut = len(self._tail) - OUTPUT_TAIL_BYTES
                    del self._tail[:cut]
                    self._dropped += cut
                if self._prefix:
                    self._scan_lines(chunk)
            if self._prefix:
                self._scan_lines(b"\n")

    def _scan_lines(self, chunk: bytes) -> None:
        *complete, rest = chunk.split(b"\n")
        for piece in complete:
            if not self._line_too_long:  # a carriage return ends a line too (progress bars)
                for line in (bytes(self._line) + piece).split(b"\r"):
                    if line.strip().startswith(self._prefix):
                        self.kept_lines.append(line.strip().decode("utf-8", errors="replace"))
            self._line.clear()
            self._line_too_long = False
        if not self._line_too_long:
            self._line += rest
            if len(self._line) > self._MAX_LINE:
                self._line.clear()
                self._line_too_long = True

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the end of the stream; True if it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def text(self) -> str:
        data = bytes(self._tail[-OUTPUT_TAIL_BYTES:])  # the buffer is trimmed only when it doubles
        dropped = self._dropped + len(self._tail) - len(data)
        if not dropped:
            return data.decode("utf-8", errors="replace")
        newline = data.find(b"\n")
        if 0 <= newline < 4096:  # start at a line boundary
            data, dropped = data[newline + 1 :], dropped + newline + 1
        note = f"[detaudit: the first {dropped} bytes of this output were left out]\n"
        return note + data.decode("utf-8", errors="replace")


def _read_payload(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
