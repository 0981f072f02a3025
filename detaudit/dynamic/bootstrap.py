"""Child-process entry point: ``python -m detaudit.dynamic.bootstrap``.

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

import faulthandler
import json
import os
import random
import runpy
import sys
import traceback
from pathlib import Path

from detaudit.dynamic.launch import CONFIG_ENV, PAYLOAD_NAME


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
        needs_torch = any(
            config.get(key)
            for key in ("max_steps", "threads", "deterministic", "save_state", "trace", "record_environment")
        ) or config.get("seed") is not None or config.get("perturb_ulp_seed") is not None
        if needs_torch:
            self._prepare_torch()

    def _prepare_torch(self) -> None:
        import torch

        from detaudit.dynamic.watch import TrainingWatcher

        config = self.config
        if config.get("threads"):
            torch.set_num_threads(int(config["threads"]))
        if config.get("deterministic"):
            from detaudit.runtime.determinism import enable_determinism

            enable_determinism()
        if config.get("record_environment"):
            self.payload["environment"] = _environment()
        if config.get("seed") is not None:
            seed_all(int(config["seed"]))
        if config.get("trace"):
            from detaudit.dynamic.tracer import OpTracer

            self.tracer = OpTracer(capture_ops=config.get("capture_ops") or ())
        self.watcher = TrainingWatcher(
            max_steps=int(config.get("max_steps") or 0),
            on_step_end=self.tracer.flush if self.tracer else None,
        )
        if self.tracer:
            self.tracer.attach(self.watcher)
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

    def run(self, script: str, args: list[str]) -> int:
        stop_run: type[BaseException] | tuple = ()  # what the step limit and the tracer stop a run with
        if self.watcher:  # (without them nothing raises it, and importing it would import torch)
            from detaudit.dynamic.watch import StopRun as stop_run

        sys.argv = [script, *args]
        sys.path[0] = str(Path(script).parent)  # what `python SCRIPT` puts first on the path
        exit_code = 0
        try:
            if self.tracer:
                with self.tracer:
                    runpy.run_path(script, run_name="__main__")
            else:
                runpy.run_path(script, run_name="__main__")
        except stop_run:
            self.payload["stopped_at_max_steps"] = True
        except SystemExit as stop:
            exit_code = _exit_code(stop.code)
        except BaseException as error:  # the script crashed: show it as python would
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
        if self.watcher:
            self.watcher.close()
            self.payload["steps"] = self.watcher.steps
        if self.tracer:
            self.payload.update(self.tracer.save(self.output_dir))
        if self.config.get("save_state") and self.watcher:
            from detaudit.dynamic.state import save_state

            self.payload["state_file"] = save_state(self.watcher, self.output_dir / "state.pt")
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


def main() -> int:
    config = json.loads(os.environ.pop(CONFIG_ENV))
    faulthandler.enable()  # a segfault in an extension shows where the script was
    session = ChildSession(config)
    return session.run(config["script"], config["args"])


if __name__ == "__main__":
    sys.exit(main())
