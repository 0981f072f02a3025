"""The frameworks' checkpoints, in the child of ``detaudit resume``: where
Lightning, transformers and accelerate wrote one, and how a preset's resumed
run is made to resume from one (``presets.py``).

Each framework's class is changed when the script imports it
(``detaudit.launch.import_hooks``), never before: the framework is not
imported for a script that does not use it.  Its save method is wrapped to
note the checkpoint it wrote (a file or a folder); its resume call is given
the checkpoint, as the user would pass it.  accelerate has no resume call of
its own: the script calls ``load_state`` after ``prepare``; the preset calls
it as each ``prepare`` call returns (what was prepared is what it restores,
and the script's loop has not yet drawn from a generator it restores).
"""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass
from typing import Callable

from detaudit.launch.import_hooks import when_imported


def _lightning_written(trainer, arguments: dict, result) -> str:
    return os.fspath(arguments["filepath"])


def _transformers_written(trainer, arguments: dict, result) -> str:
    run_dir = trainer._get_output_dir(trial=arguments.get("trial")) if hasattr(trainer, "_get_output_dir") else trainer.args.output_dir
    return os.path.join(run_dir, f"checkpoint-{trainer.state.global_step}")


def _accelerate_written(accelerator, arguments: dict, result) -> str:
    return os.fspath(result if result is not None else arguments.get("output_dir") or "")


@dataclass(frozen=True)
class Framework:
    modules: tuple[str, ...]  # the modules that define the class (whichever the script imports)
    cls: str
    save_method: str  # writes a checkpoint
    written: Callable  # (instance, the save call's bound arguments, its result) -> the checkpoint's path
    resume_method: str  # is given the checkpoint as resume_argument, or (without one) loads it as it returns
    resume_argument: str = ""


FRAMEWORKS: dict[str, Framework] = {
    "lightning": Framework(
        ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer"), "Trainer",
        "save_checkpoint", _lightning_written, "fit", "ckpt_path",
    ),
    "transformers": Framework(
        ("transformers.trainer",), "Trainer", "_save_checkpoint", _transformers_written, "train", "resume_from_checkpoint"
    ),
    "accelerate": Framework(("accelerate.accelerator",), "Accelerator", "save_state", _accelerate_written, "prepare"),
}


class FrameworkCheckpoints:
    """Notes the checkpoints the frameworks write (``on_write(path)``) and,
    with ``resume_through``, makes that framework resume from ``checkpoint``."""

    def __init__(self, patch: Callable, on_write: Callable[[str], None], resume_through: str = "", checkpoint: str = ""):
        self.patch = patch  # (owner, attribute, replacement): the recorder's, which undoes it at the end
        self.on_write = on_write
        self.resume_through = resume_through
        self.checkpoint = checkpoint
        for name, framework in FRAMEWORKS.items():
            for module in framework.modules:
                when_imported(module, functools.partial(self._install, name, framework))

    def _install(self, name: str, framework: Framework, module) -> None:
        cls = getattr(module, framework.cls, None)
        if cls is None:
            return
        self.patch(cls, framework.save_method, self._noting(framework, getattr(cls, framework.save_method)))
        if name != self.resume_through:
            return
        original = getattr(cls, framework.resume_method)
        if framework.resume_argument:
            self.patch(cls, framework.resume_method, _with_argument(original, framework.resume_argument, self.checkpoint))
        else:
            self.patch(cls, framework.resume_method, _then_load_state(original, self.checkpoint))

    def _noting(self, framework: Framework, original):
        signature = inspect.signature(original)
        checkpoints = self

        @functools.wraps(original)
        def noting(instance, *args, **kwargs):
            result = original(instance, *args, **kwargs)
            arguments = signature.bind(instance, *args, **kwargs).arguments
            path = framework.written(instance, arguments, result)
            if path:
                checkpoints.on_write(os.path.abspath(path))
            return result

        return noting


def _with_argument(original, name: str, value):
    """``original`` called with argument ``name`` set to ``value``, however the caller passed it."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def with_argument(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.arguments[name] = value
        return original(*bound.args, **bound.kwargs)

    return with_argument


def _then_load_state(original, checkpoint: str):
    """``original`` (accelerate's ``prepare``), then ``load_state(checkpoint)`` on its accelerator."""

    @functools.wraps(original)
    def then_load_state(accelerator, *args, **kwargs):
        result = original(accelerator, *args, **kwargs)
        accelerator.load_state(checkpoint)
        return result

    return then_load_state
