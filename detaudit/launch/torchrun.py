"""Run a user script once under torchrun: one bootstrap per rank.

``python -m torch.distributed.run --standalone --nproc-per-node N ... -m
detaudit.launch.bootstrap`` starts every rank with the environment that
``init_process_group()`` (env://) reads, so the script runs unchanged.  Each
rank's bootstrap writes its results, its output and its pid into
``rank<R>/`` of the run's output directory (``bootstrap.enter_rank_folder``).
``launch.run_script`` runs torchrun itself, so the whole process tree is
killed when it ends, on success, failure, timeout or Ctrl-C alike.

When a run fails, one rank is blamed, with its own output:

* a crash: the rank that failed first (the bootstrap notes when), not the
  ranks that failed after it (a peer closed the connection) or that torchrun
  killed;
* a hang: on timeout every rank is asked for its Python stacks (SIGUSR1,
  faulthandler) before the kill; a rank that is not waiting inside
  ``torch.distributed`` is the one that hung (its peers wait for it in a
  collective).

This module imports neither torch nor numpy.
"""

from __future__ import annotations

import os
import re
import signal
import sysconfig
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from detaudit.launch.options import LaunchOptions
from detaudit.launch.process import ScriptResult, group_has_live_process, kill_process_group, run_script

#: how long the ranks get to write their stacks after SIGUSR1
_STACK_DUMP_SECONDS = 1.0
#: the path of torch.distributed's files in a stack dump
_DISTRIBUTED_FRAME = re.compile(r"[/\\]torch[/\\]distributed[/\\]")
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<function>.+)$')
#: torchrun's summary of the failure it saw first
_ROOT_CAUSE_RANK = re.compile(r"Root Cause.*?rank\s*:\s*(\d+)", re.S)


@dataclass(frozen=True)
class Distributed:
    """How ``detaudit run`` launches each run: ``--nproc-per-node`` and the
    other torchrun options as given (``--nnodes``, ``--master-port`` ...)."""

    nproc_per_node: int
    torchrun_options: tuple[str, ...] = ()

    def launcher(self) -> list[str]:
        multi_node = any(option.split("=")[0] in _RENDEZVOUS_OPTIONS for option in self.torchrun_options)
        standalone = [] if multi_node else ["--standalone"]
        return [
            "torch.distributed.run", *standalone, "--nproc-per-node", str(self.nproc_per_node),
            *self.torchrun_options, "-m",
        ]


# torchrun options that say where the rendezvous is: then --standalone is not added
_RENDEZVOUS_OPTIONS = frozenset(
    {"--rdzv-endpoint", "--rdzv_endpoint", "--master-addr", "--master_addr", "--master-port", "--master_port",
     "--rdzv-backend", "--rdzv_backend", "--nnodes"}
)


@dataclass
class DistributedResult:
    """One run under torchrun: torchrun's own result, and one per rank on this node."""

    launcher: ScriptResult
    ranks: list[ScriptResult]  # by local rank; a rank that never started has an empty payload
    stuck: dict[int, str] = field(default_factory=dict)  # on timeout: rank -> where its user code was

    @property
    def failed(self) -> bool:
        return self.launcher.failed or any(not rank.wrote_results or rank.failed for rank in self.ranks)

    def blamed_rank(self) -> int:
        """The rank whose output explains the failure (see the module's doc)."""
        if self.launcher.timed_out:
            hung = [rank for rank, where in self.stuck.items() if not where.startswith(_WAITING)]
            return min(hung or self.stuck or [0])
        failed_at = [
            (rank.payload["failed_at"], index) for index, rank in enumerate(self.ranks) if "failed_at" in rank.payload
        ]
        if failed_at:
            return min(failed_at)[1]
        found = _ROOT_CAUSE_RANK.search(self.launcher.stderr)
        if found and int(found.group(1)) < len(self.ranks):
            return int(found.group(1))
        silent = [index for index, rank in enumerate(self.ranks) if not rank.wrote_results]
        return silent[0] if silent else 0

    def describe_hang(self) -> str:
        """Where each rank was when the run timed out: one line a rank."""
        return "\n".join(f"rank {rank}: {where}" for rank, where in sorted(self.stuck.items()))


_WAITING = "waiting in torch.distributed"


def run_distributed(
    script: str | os.PathLike,
    script_args: Sequence[str],
    *,
    options: LaunchOptions,
    distributed: Distributed,
    timeout: float | None = None,
    cwd: str | os.PathLike | None = None,
    cancel=None,  # a threading.Event, as run_script takes
) -> DistributedResult:
    """Run ``script`` once under torchrun, each rank under the bootstrap."""
    options = replace(options, per_rank=True)
    output_dir = Path(options.output_dir)
    ranks = range(distributed.nproc_per_node)

    def dump_stacks() -> None:
        for rank in ranks:
            try:
                os.kill(int((output_dir / f"rank{rank}" / "pid").read_text()), signal.SIGUSR1)
            except (OSError, ValueError):  # not started, or already gone
                pass
        time.sleep(_STACK_DUMP_SECONDS)

    try:
        launcher = run_script(
            script, script_args, options=options, timeout=timeout, cwd=cwd, cancel=cancel,
            launcher=distributed.launcher(), before_kill=dump_stacks,
        )
    finally:
        _kill_rank_groups(output_dir, ranks)
    results = [_rank_result(output_dir / f"rank{rank}", launcher) for rank in ranks]
    stuck = {rank: _where_stuck(result.stderr) for rank, result in enumerate(results)} if launcher.timed_out else {}
    return DistributedResult(launcher, results, stuck)


def _kill_rank_groups(output_dir: Path, ranks: range) -> None:
    """torchrun starts each rank in a session of its own, out of reach of
    the kill of torchrun's group: kill each rank's group (its own children
    with it).  The group is the run's while its leader is a bootstrap of
    this run, or, once the leader is gone (killed with its torchrun: the
    bootstrap asks Linux for that in ``enter_rank_folder``), while any process
    is left in it: a group's id is not given to a new process while the
    group has members, so those are the rank's children."""
    for rank in ranks:
        try:
            pid = int((output_dir / f"rank{rank}" / "pid").read_text())
        except (OSError, ValueError):  # never started: nothing known to kill
            continue
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            command = b""
        # gone (or a zombie): what is left in its group is its children; alive: ours if a bootstrap
        ours = b"detaudit.launch.bootstrap" in command if command else group_has_live_process(pid)
        if ours:
            kill_process_group(pid)


def _rank_result(folder: Path, launcher: ScriptResult) -> ScriptResult:
    """One rank's result, read from its folder; a rank that wrote no
    payload ended as torchrun did (killed, or timed out with it)."""
    from detaudit.launch.process import PAYLOAD_NAME, _read_payload

    payload = _read_payload(folder / PAYLOAD_NAME)
    returncode = payload.get("exit_code", None if launcher.timed_out else (launcher.returncode or 1))
    return ScriptResult(
        returncode=returncode,
        timed_out=launcher.timed_out and "exit_code" not in payload,
        stdout=_tail(folder / "stdout.log"),
        stderr=_tail(folder / "stderr.log"),
        output_dir=folder,
        payload=payload,
        time_limit=launcher.time_limit,
    )


def _tail(path: Path, size: int = 1 << 16) -> str:
    try:
        with open(path, "rb") as stream:
            stream.seek(max(0, stream.seek(0, os.SEEK_END) - size))
            return stream.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _where_stuck(stderr: str) -> str:
    """From the last stack dump in a rank's stderr: its innermost user frame,
    and whether it was waiting inside torch.distributed there."""
    start = stderr.rfind("Current thread")
    if start < 0:
        return "no stack (the rank had not started, or had exited)"
    frames = []
    for line in stderr[start:].splitlines()[1:]:
        found = _FRAME.match(line)
        if not found:
            break
        frames.append(found)
    waiting = False
    for frame in frames:  # most recent call first
        path = frame["path"]
        if _DISTRIBUTED_FRAME.search(path):
            waiting = True
        elif _is_user_path(path):
            shown = os.path.relpath(path) if path.startswith(os.getcwd() + os.sep) else path
            where = f"{shown}:{frame['line']} in {frame['function']}"
            return f"{_WAITING} at {where}" if waiting else f"running at {where}"
    return "no frame of the script on its stack"


def _is_user_path(path: str) -> bool:
    """Not the standard library, installed packages (torch) or detaudit."""
    return not (path.startswith("<") or path.startswith(_NOT_USER_DIRS))


_NOT_USER_DIRS = tuple(
    {*(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")),
     str(Path(__file__).resolve().parents[1])}
)
