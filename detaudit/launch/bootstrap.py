"""Child-process entry point: ``python -m detaudit.launch.bootstrap``.

Reads the JSON config that ``launch.run_script`` put in the environment,
prepares the interpreter, runs the user's script as ``python SCRIPT ARGS``
would, and at exit writes ``payload.json`` (and, when asked, the state, trace
and capture files) into the output directory.  The script's own exit code is
kept; a crash prints its traceback as usual and exits 1; a fatal signal
(segfault, abort) prints the Python stack first (faulthandler).

Only this process is audited: in a forked child (a DataLoader worker, a
``multiprocessing`` fork, ``os.fork()``) the tracer and the watcher stand down
(see their modules), and a child that runs on to the script's end writes no
results.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import runpy
import signal
import sys
import time
import traceback
from pathlib import Path

from detaudit.launch.child_settings import apply_settings, child_setting, seed_all
from detaudit.launch.features import features_from_config
from detaudit.launch.process import CONFIG_ENV, PAYLOAD_NAME

#: written in the run's folder (above the ranks' folders) by the first rank that
#: stops at the step limit, with its rank: from then on the other ranks'
#: collectives with it fail, by detaudit's doing, not the script's
STEP_LIMIT_MARKER = "step-limit-reached"


class ChildSession:
    """Everything the bootstrap installs around the script, and what it writes after.

    What every launch has is here: the seed, the step limit and the watcher
    that counts steps, the time each step ended.  The rest is the child
    settings (``child_settings.py``) and the features (``features.py``) the
    config names, applied in their tables' order."""

    def __init__(self, config: dict):
        self.config = config
        self.pid = os.getpid()  # the audited process; forked children have another pid
        self.output_dir = Path(config["output_dir"])
        self.seed: int | None = config.get("seed")
        self.per_rank = bool(config.get("per_rank"))  # one rank of a distributed run
        self.payload: dict = {"steps": 0, "stopped_at_max_steps": False}
        self.settings: dict = config.get("settings") or {}
        self.features = features_from_config(config.get("features") or {})
        self.watcher = None
        self.tracer = None  # the tracing feature's OpTracer; what detaudit runs itself it runs untraced()
        needs_torch = (
            self.seed is not None
            or bool(config.get("max_steps"))
            or any(child_setting(name).needs_torch for name in self.settings)
            or any(feature.needs_torch for feature in self.features)
        )
        if needs_torch:
            self._prepare_torch()
        for feature in self.features:
            feature.prepare(self)

    def _prepare_torch(self) -> None:
        from detaudit.launch.watcher import TrainingWatcher

        if self.seed is not None:
            seed_all(int(self.seed))
        apply_settings(self.settings, self)
        step_ends = self.payload["step_ends"] = []  # perf_counter() after each optimizer step: step times

        def before_step(optimizer) -> None:
            for feature in self.features:
                feature.before_step(self, optimizer)

        def before_update(optimizer) -> None:
            for feature in self.features:
                feature.before_update(self, optimizer)

        def after_step() -> None:
            step_ends.append(time.perf_counter())
            for feature in self.features:
                feature.after_step(self)

        self.watcher = TrainingWatcher(
            max_steps=int(self.config.get("max_steps") or 0), on_step_start=before_step,
            on_update_start=before_update, on_step_end=after_step,
        )

    @contextlib.contextmanager
    def untraced(self):
        """Run detaudit's own torch work (reading settings, digesting state) outside the trace."""
        with self.tracer.untraced() if self.tracer else contextlib.nullcontext():
            yield

    def run(self, script: str, args: list[str]) -> int:
        stop_run: type[BaseException] | tuple = ()  # what the step limit and the tracer stop a run with
        if self.watcher:  # (without them nothing raises it, and importing it would import torch)
            from detaudit.launch.watcher import StopRun as stop_run

        sys.argv = [script, *args]
        sys.path[0] = str(Path(script).parent)  # what `python SCRIPT` puts first on the path
        exit_code = 0
        try:
            for feature in self.features:
                done = feature.run_instead(self, script)
                if done is not None:
                    self.payload.update(done)
                    break
            else:
                with contextlib.ExitStack() as modes:
                    for feature in self.features:  # in table order: a later mode sees the earlier ones' outputs
                        mode = feature.dispatch_mode(self)
                        if mode is not None:
                            modes.enter_context(mode)
                    runpy.run_path(script, run_name="__main__")
        except stop_run:
            self.payload["stopped_at_max_steps"] = True
            self._tell_other_ranks()
        except SystemExit as stop:
            exit_code = _exit_code(stop.code)
            if exit_code and self._stopped_by_other_rank(f"exit code {exit_code}"):
                exit_code = 0
            elif exit_code:
                self.payload["failed_at"] = time.time()
        except BaseException as error:  # the script crashed: show it as python would
            if not self._stopped_by_other_rank(f"{type(error).__name__}: {error}"):
                self.payload["failed_at"] = time.time()  # which rank of a distributed run failed first
                traceback.print_exc()
                self.payload["error"] = f"{type(error).__name__}: {error}"
                exit_code = 1
        self.finish(exit_code)
        return exit_code

    def _tell_other_ranks(self) -> None:
        """This rank stopped at the step limit: say so to the other ranks of
        the run (on this node), unless one said it first."""
        if not self.per_rank:
            return
        marker = self.output_dir.parent / STEP_LIMIT_MARKER
        written = self.output_dir / STEP_LIMIT_MARKER
        written.write_text(os.environ.get("RANK", "0"))
        with contextlib.suppress(FileExistsError):
            os.link(written, marker)  # whole or not at all: a rank reading it never sees it half written

    def _stopped_by_other_rank(self, ended: str) -> bool:
        """Whether this rank ended (``ended``: how) after another rank had
        stopped at the step limit: its collectives with that rank failed
        because detaudit stopped it.  Ranks that step unlike each other (only
        rank 0 trains; pipeline stages) end this way; what each did up to
        there is compared, and the end is not the script's failure."""
        if not self.per_rank:
            return False
        try:
            rank = int((self.output_dir.parent / STEP_LIMIT_MARKER).read_text())
        except (OSError, ValueError):
            return False
        if str(rank) == os.environ.get("RANK", "0"):
            return False
        self.payload["stopped_by_rank"] = rank
        print(f"detaudit: rank {rank} stopped at the step limit, and then this rank ended: {ended}", file=sys.stderr)
        return True

    def finish(self, exit_code: int) -> None:
        if os.getpid() != self.pid:  # a forked child that ran to the script's end: the parent reports
            sys.stdout.flush()
            return
        self.payload["exit_code"] = exit_code
        if self.watcher:
            self.watcher.close()
            self.payload["steps"] = self.watcher.steps
        for feature in self.features:
            feature.finish(self)
        sys.stdout.flush()
        (self.output_dir / PAYLOAD_NAME).write_text(json.dumps(self.payload))


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints the message and exits 1
    return 1


def _die_with_parent() -> None:
    """Linux: SIGKILL this rank when torchrun dies (killed on timeout or
    Ctrl-C, it cannot stop its ranks, which run in sessions of their own)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: torchrun.py kills the ranks by pid
        pass


def enter_rank_folder(output_dir: Path) -> Path:
    """Under a distributed launcher (one bootstrap per rank): this rank's
    results, output and pid go to ``rank<LOCAL_RANK>/`` of the output directory,
    and SIGUSR1 writes every thread's Python stack to its stderr (what a hung
    rank was doing, before ``torchrun.py`` kills it)."""
    folder = output_dir / f"rank{int(os.environ.get('LOCAL_RANK', '0'))}"  # (this node's ranks)
    folder.mkdir(parents=True, exist_ok=True)
    for fd, name in ((1, "stdout.log"), (2, "stderr.log")):
        log = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, fd)
        os.close(log)
    (folder / "pid").write_text(str(os.getpid()))
    _die_with_parent()
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    return folder


def main() -> int:
    config = json.loads(os.environ.pop(CONFIG_ENV))
    if config.get("per_rank"):
        config["output_dir"] = str(enter_rank_folder(Path(config["output_dir"])))
    faulthandler.enable()  # a segfault in an extension shows where the script was
    session = ChildSession(config)
    exit_code = session.run(config["script"], config["args"])
    if session.per_rank and ("stopped_at_max_steps" in session.payload or "stopped_by_rank" in session.payload):
        # detaudit stopped this rank with its process group still up, and maybe a peer gone:
        # finalizing it then can abort the process ("terminate called without an active
        # exception") after its results are written. Nothing of the script runs after a stop.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
