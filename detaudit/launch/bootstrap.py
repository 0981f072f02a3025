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
import functools
import json
import os
import random
import runpy
import signal
import sys
import time
import traceback
from pathlib import Path

from detaudit.launch.process import CONFIG_ENV, PAYLOAD_NAME


def seed_all(seed: int) -> None:
    """Seed Python, numpy and torch (CPU and every CUDA device) the way users do,
    without detaudit's PYTHONHASHSEED warning: the report covers hash order."""
    import warnings

    from detaudit.runtime.seeding import seed_everything

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seed_everything(seed, workers=False)


def perturb_one_ulp(optimizer, seed: int) -> dict:
    """Move one element (chosen by ``seed``) of the optimizer's first parameter
    by one ULP, in a direction chosen by ``seed``."""
    import torch

    choose = random.Random(seed)
    param = optimizer.param_groups[0]["params"][0]
    index = choose.randrange(param.numel())
    toward = float("inf") if choose.random() < 0.5 else float("-inf")
    with torch.no_grad():
        flat = param.view(-1)
        old = flat[index].item()
        flat[index] = torch.nextafter(flat[index], torch.tensor(toward, dtype=param.dtype, device=param.device))
        return {"index": index, "old": old, "new": flat[index].item()}


class ChildSession:
    """Everything the bootstrap installs around the script, and what it writes after."""

    def __init__(self, config: dict):
        self.config = config
        self.pid = os.getpid()  # the audited process; forked children have another pid
        self.output_dir = Path(config["output_dir"])
        self.payload: dict = {"steps": 0, "stopped_at_max_steps": False}
        self.watcher = None
        self.tracer = None
        self.fault = None  # the test-only fault injector (dynamic/faults/injector.py)
        self.online_capture = None  # compares the run with a reference run as it goes (dynamic/record/online_capture.py)
        needs_torch = any(
            config.get(key)
            for key in (
                "max_steps", "threads", "deterministic", "save_state", "trace", "record_environment", "settings",
                "seed_generators", "fault", "replica_digests",
            )
        ) or config.get("seed") is not None or config.get("perturb_ulp_seed") is not None
        if needs_torch:
            self._prepare_torch()

    def _prepare_torch(self) -> None:
        import torch

        from detaudit.dynamic.record.hooks import TrainingWatcher

        config = self.config
        if config.get("threads"):
            torch.set_num_threads(int(config["threads"]))
            self._note_overrides(torch, "set_num_threads")
        if config.get("deterministic"):
            from detaudit.runtime.determinism import enable_determinism

            enable_determinism()
        if config.get("settings"):
            from detaudit.runtime.settings import write_settings

            write_settings(torch, config["settings"])
        if config.get("record_environment"):
            # the settings a run trains with: after the script's own start-up, at the end of its first step
            self._after_first_step(self._record_environment)
        if config.get("seed") is not None:
            seed_all(int(config["seed"]))
        if config.get("seed_generators"):
            from detaudit.launch.seed_generators import install

            made = self.payload["unseeded_generators"] = []
            install(config["seed_generators"], (config.get("seed") or 0) + 1, made)
        if config.get("trace"):
            from detaudit.dynamic.record.tracer import OpTracer

            self.tracer = OpTracer(
                capture_ops=config.get("capture_ops") or (),
                sampled_ops=config.get("sampled_ops") or (),
                allocation_fill=config.get("allocation_fill"),
            )
            if config.get("compare_with") or config.get("keep_first_steps"):
                from detaudit.dynamic.record.online_capture import OnlineCapture

                self.online_capture = self.tracer.observer = OnlineCapture(self.tracer, config.get("compare_with"))
        step_ends = self.payload["step_ends"] = []  # perf_counter() after each optimizer step: step times

        replicas = self.payload["replica_digests"] = [] if config.get("replica_digests") else None

        def after_step() -> None:
            step_ends.append(time.perf_counter())
            if self.tracer:
                self.tracer.flush()
            if replicas is not None:
                replicas.append(self._replica_digests())

        self.watcher = TrainingWatcher(max_steps=int(config.get("max_steps") or 0), on_step_end=after_step)
        if self.tracer:
            self.tracer.attach(self.watcher)
        if replicas is not None:  # the replicas as they start training (step 0): no gradient yet
            self._before_first_step(lambda: replicas.append(self._replica_digests(trained=False)))
        if config.get("fault"):
            from detaudit.dynamic.faults.injector import FaultInjector

            self.fault = FaultInjector(config["fault"], self.tracer)
        if config.get("perturb_ulp_seed") is not None:
            self._perturb_at_first_step(int(config["perturb_ulp_seed"]))

    def _perturb_at_first_step(self, seed: int) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        def before_first_step(optimizer, args, kwargs):
            handle.remove()
            self.payload["perturbed"] = {
                "param": self.watcher.param_names.get(id(optimizer.param_groups[0]["params"][0]), ""),
                **perturb_one_ulp(optimizer, seed),
            }

        handle = register_optimizer_step_pre_hook(before_first_step)
        os.register_at_fork(after_in_child=handle.remove)  # a forked child's step is not the run's first

    def _before_first_step(self, action) -> None:
        """Call ``action()`` once, when the first optimizer step starts."""
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        def before_first_step(optimizer, args, kwargs):
            handle.remove()
            action()  # (after the watcher's own hook, registered first, has named the parameters)

        handle = register_optimizer_step_pre_hook(before_first_step)
        os.register_at_fork(after_in_child=handle.remove)

    def _replica_digests(self, trained: bool = True) -> dict[str, int]:
        """Digest of every tensor of the state that data-parallel ranks must
        hold alike (parameters, buffers, gradients, optimizer state: all but
        the loss), for the cross-rank check (``dynamic/verdict/ranks.py``).  Before the
        first update (``trained=False``) the parameters and buffers only: the
        first step's gradients are still being averaged.  Tensors of a
        subclass are left out: sharded ones (DTensor, FSDP's FlatParameter)
        differ across ranks by design."""
        import torch

        from detaudit.dynamic.record.digests import host_digest
        from detaudit.dynamic.record.final_state import watched_state

        paused = self.tracer.paused if self.tracer else False
        if self.tracer:
            self.tracer.paused = True
        try:
            return {
                name: host_digest(tensor.detach().cpu())
                for name, tensor in watched_state(self.watcher).items()
                if name != "loss"
                and type(tensor) in (torch.Tensor, torch.nn.Parameter)
                and (trained or not (name.endswith(".grad") or name.startswith("optimizer.")))
            }
        finally:
            if self.tracer:
                self.tracer.paused = paused

    def _after_first_step(self, action) -> None:
        """Call ``action()`` once, when the first optimizer step ends (before
        the step limit can stop the run there)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook

        done = []  # (removing a hook while torch iterates over the hooks raises)

        def after_first_step(optimizer, args, kwargs):
            if not done:
                done.append(True)
                action()

        handle = register_optimizer_step_post_hook(after_first_step)
        os.register_at_fork(after_in_child=handle.remove)  # a forked child's step is not the run's first

    def _record_environment(self) -> None:
        if "environment" in self.payload:
            return
        paused = self.tracer.paused if self.tracer else False
        if self.tracer:
            self.tracer.paused = True  # reading settings is detaudit's business, not the trace's
        try:
            self.payload["environment"] = _environment()
        finally:
            if self.tracer:
                self.tracer.paused = paused

    def _note_overrides(self, module, function_name: str) -> None:
        """Record where the script calls ``module.function_name`` itself, after
        detaudit made that setting: its call wins, and a variation of the
        setting then varies nothing."""
        from detaudit.dynamic.record.hooks import user_frame

        original = getattr(module, function_name)
        overrides = self.payload.setdefault("overrides", [])

        @functools.wraps(original)
        def recording(*args, **kwargs):
            frame = user_frame(sys._getframe(1))
            shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
            overrides.append(
                {
                    "call": f"{module.__name__}.{function_name}({shown})",
                    "path": frame.f_code.co_filename if frame else "",
                    "line": frame.f_lineno if frame else 0,
                }
            )
            return original(*args, **kwargs)

        setattr(module, function_name, recording)

    def run(self, script: str, args: list[str]) -> int:
        stop_run: type[BaseException] | tuple = ()  # what the step limit and the tracer stop a run with
        if self.watcher:  # (without them nothing raises it, and importing it would import torch)
            from detaudit.dynamic.record.hooks import StopRun as stop_run

        sys.argv = [script, *args]
        sys.path[0] = str(Path(script).parent)  # what `python SCRIPT` puts first on the path
        exit_code = 0
        try:
            if self.config.get("batch_audit"):
                from detaudit.dynamic.batch.vary import audit_in_child

                self.payload.update(audit_in_child(script, self.config["batch_audit"], self.output_dir))
            else:
                with contextlib.ExitStack() as modes:
                    # the fault injector first: below the tracer, which must see the perturbed outputs
                    for mode in (self.fault, self.tracer):
                        if mode is not None:
                            modes.enter_context(mode)
                    runpy.run_path(script, run_name="__main__")
        except stop_run:
            self.payload["stopped_at_max_steps"] = True
        except SystemExit as stop:
            exit_code = _exit_code(stop.code)
            if exit_code:
                self.payload["failed_at"] = time.time()
        except BaseException as error:  # the script crashed: show it as python would
            self.payload["failed_at"] = time.time()  # which rank of a distributed run failed first
            traceback.print_exc()
            self.payload["error"] = f"{type(error).__name__}: {error}"
            exit_code = 1
        self.finish(exit_code)
        return exit_code

    def finish(self, exit_code: int) -> None:
        if os.getpid() != self.pid:  # a forked child that ran to the script's end: the parent reports
            sys.stdout.flush()
            return
        self.payload["exit_code"] = exit_code
        if self.config.get("record_environment"):
            self._record_environment()  # no step ended: the settings at the end
        state = None
        if self.watcher:
            from detaudit.dynamic.record.final_state import watched_state

            self.watcher.close()
            self.payload["steps"] = self.watcher.steps
            state = watched_state(self.watcher)
        if self.tracer:
            self.tracer.note_final_state(state or {})  # which differences reached the final state
            self.payload.update(self.tracer.save(self.output_dir))
        if self.online_capture is not None:
            self.payload.update(self.online_capture.save(self.output_dir))
        if self.fault is not None:
            self.payload["fault"] = self.fault.done
        if self.config.get("save_state") and state is not None:
            from detaudit.dynamic.record.final_state import save_state

            self.payload.update(save_state(state, self.output_dir / "state.pt"))
        sys.stdout.flush()
        (self.output_dir / PAYLOAD_NAME).write_text(json.dumps(self.payload))


def _environment() -> dict:
    try:
        from detaudit.runtime.environment import fingerprint
    except ImportError:
        return {}
    return fingerprint()


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
    from detaudit.stats.metrics import STATS_DIR_ENV

    if os.environ.get("RANK", "0") != "0" and STATS_DIR_ENV in os.environ:
        os.environ[STATS_DIR_ENV] = str(folder / "stats")  # the statistics read rank 0's metrics
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    return folder


def main() -> int:
    config = json.loads(os.environ.pop(CONFIG_ENV))
    if config.get("per_rank"):
        config["output_dir"] = str(enter_rank_folder(Path(config["output_dir"])))
    faulthandler.enable()  # a segfault in an extension shows where the script was
    session = ChildSession(config)
    return session.run(config["script"], config["args"])


if __name__ == "__main__":
    sys.exit(main())
