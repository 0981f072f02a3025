"""The child's side of ``detaudit resume`` (imports torch): the digest of
every component (``components.py``) at each optimizer step's start and end,
and the lines where the script saved and loaded its checkpoint.

Components that live in no object the training watcher knows are found as
they are made: LR schedulers and GradScalers by their constructors, the batch
as the inputs of the first module forward since the last step ended.  A
value that is not a tensor (a scheduler's state, a generator's state, a
hyperparameter) is digested through a canonical encoding of its numbers,
strings and arrays: a function held in it counts by its type only, as its
address differs between runs.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from pathlib import Path

import torch
from torch.utils._pytree import tree_leaves

from detaudit.dynamic.record.digests import host_digest
from detaudit.dynamic.record.final_state import optimizer_state
from detaudit.launch.watcher import user_frame
from detaudit.resume.compare import differing_names
from detaudit.resume.components import COMPONENTS
from detaudit.resume.first_reader import FirstReaders
from detaudit.resume.frameworks import FrameworkCheckpoints

#: the calls that write or read a checkpoint: (owner, attribute, name in the report)
CHECKPOINT_CALLS = (
    (torch, "save", "torch.save"),
    (torch, "load", "torch.load"),
    (torch.nn.Module, "load_state_dict", "load_state_dict"),
    (torch.optim.Optimizer, "load_state_dict", "load_state_dict"),
    (torch.optim.lr_scheduler.LRScheduler, "load_state_dict", "load_state_dict"),
)
#: the classes whose instances are components of their own: (class, the list they go to)
TRACKED_CLASSES = (
    (torch.optim.lr_scheduler.LRScheduler, "schedulers"),
    (torch.amp.GradScaler, "scalers"),
    (torch.utils.data.DataLoader, "loaders"),  # their generators, their samplers' and their datasets'
)


def value_digest(value) -> int:
    """A 64-bit digest of a Python value, the same in every process for equal values."""
    hasher = hashlib.blake2b(digest_size=8)
    _feed(hasher, value)
    return int.from_bytes(hasher.digest(), "little")


def _feed(hasher, value) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().to("cpu")
        hasher.update(f"T{tensor.dtype}{list(tensor.shape)}{host_digest(tensor)};".encode())
    elif isinstance(value, dict):
        hasher.update(b"{")
        for key in sorted(value, key=repr):
            hasher.update(repr(key).encode() + b":")
            _feed(hasher, value[key])
        hasher.update(b"}")
    elif isinstance(value, (list, tuple)):
        hasher.update(b"[")
        for item in value:
            _feed(hasher, item)
        hasher.update(b"]")
    elif isinstance(value, (bool, int, float, complex, str, bytes, type(None))):
        hasher.update(repr(value).encode() + b";")
    elif hasattr(value, "tobytes") and hasattr(value, "dtype"):  # a NumPy array (NumPy's RNG state holds one)
        hasher.update(f"A{value.dtype}{getattr(value, 'shape', ())}".encode() + value.tobytes() + b";")
    else:  # a function, a module ...: its type (its address differs between runs)
        hasher.update(f"<{type(value).__qualname__}>;".encode())


def _caller() -> tuple[str, int]:
    """The script's line that made the call: the innermost user frame outside
    installed packages (a framework's checkpoint code is not the script's), else the innermost user frame."""
    first = frame = user_frame(sys._getframe(2))
    while frame is not None and "site-packages" in frame.f_code.co_filename:
        frame = user_frame(frame.f_back)
    frame = frame or first
    return (frame.f_code.co_filename, frame.f_lineno) if frame else ("", 0)


class BoundaryRecorder:
    def __init__(
        self, session, keep_step: int, state_file: Path, measure_against: str | None = None,
        resume_through: str = "", checkpoint: str = "", point_step: int = 0, point_expected: dict | None = None,
    ):
        self.session = session
        self.keep_step = keep_step
        self.state_file = state_file  # where the keep_step's tensors go
        self.measure_against = measure_against
        self.deviations: dict[str, float] = {}  # "component:name" -> max |diff| against measure_against
        self.busy = False  # recording: a torch.load or torch.save now is detaudit's, not the checkpoint's
        self.boundaries: list[dict] = []
        self.checkpoint_calls: dict[tuple, None] = {}  # (call, path, line), in order, once each
        self.checkpoint_writes: list[dict] = []  # {"path", "after_step"}: where the script's checkpoints went, in order
        self.schedulers: list = []
        self.scalers: list = []
        self.loaders: list = []
        self.batch: dict[str, torch.Tensor] = {}  # the inputs of the first forward since the last step ended
        self.kept: dict[str, torch.Tensor] = {}
        self.point_step = point_step  # digest the state at this step's first forward, the point it continues from
        self.point_expected = point_expected  # the straight run's digests there: watch what differs from them
        self.point_digests: dict = {}
        self.first_readers: FirstReaders | None = None  # watching the step after the point
        self.first_read: dict[str, dict] = {}  # component -> the first op that read it
        self._undo: list[tuple] = []
        for owner, attribute, name in CHECKPOINT_CALLS:
            self._patch(owner, attribute, self._noting(name, getattr(owner, attribute)))
        for cls, into in TRACKED_CLASSES:
            self._patch(cls, "__init__", self._tracking(getattr(self, into), cls.__init__))
        self._forward_hook = torch.nn.modules.module.register_module_forward_pre_hook(self._first_forward)
        self.frameworks = FrameworkCheckpoints(self._patch, self._wrote, resume_through, checkpoint)

    def _patch(self, owner, attribute: str, replacement) -> None:
        self._undo.append((owner, attribute, owner.__dict__[attribute]))
        setattr(owner, attribute, replacement)

    def _noting(self, name: str, original):
        recorder = self

        def noting(*args, **kwargs):
            path, line = _caller() if not recorder.busy else ("", 0)
            if path:  # (not detaudit's own loads and saves)
                recorder.checkpoint_calls[(name, path, line)] = None
                written = args[1] if len(args) > 1 else kwargs.get("f")
                if name == "torch.save" and isinstance(written, (str, os.PathLike)):
                    recorder._wrote(os.path.abspath(written))
            return original(*args, **kwargs)

        noting.__wrapped__ = original
        return noting

    def _wrote(self, path: str) -> None:
        self.checkpoint_writes.append({"path": path, "after_step": self.session.watcher.steps})

    @staticmethod
    def _tracking(instances: list, original):
        def tracking(self, *args, **kwargs):
            original(self, *args, **kwargs)
            if not any(known is self for known in instances):
                instances.append(self)

        return tracking

    def _first_forward(self, module, args) -> None:
        if self.batch:
            return
        inputs = {f"input[{index}]": value for index, value in enumerate(
            leaf for leaf in tree_leaves(args) if isinstance(leaf, torch.Tensor)
        )}
        self.batch = {name: tensor.detach().to("cpu", copy=True) for name, tensor in inputs.items()}
        if self.batch and self.session.watcher.steps + 1 == self.point_step:
            self.busy = True
            try:
                self._at_point(inputs)
            finally:
                self.busy = False

    def _at_point(self, inputs: dict) -> None:
        """The point the step continues from (its first forward): digest it; in
        the resumed run, watch what differs from the straight run's for its first reader."""
        with self.session.untraced():
            tensors, values = self._components("point")
            self.point_digests = _digests(tensors, values)
        if self.point_expected is None:
            return
        differing = {
            component: names
            for component in COMPONENTS
            if (names := differing_names(self.point_expected.get(component, {}), self.point_digests.get(component, {})))
        }
        if differing:
            self.first_readers = FirstReaders(self.session.watcher, differing, {**tensors, "batch": inputs}, os.getcwd())
            self.first_readers.__enter__()

    # -- the components ---------------------------------------------------
    def record(self, at: str) -> None:
        """Digest every component as a step starts (``at="start"``) or ends."""
        watcher = self.session.watcher
        step = watcher.steps + 1 if at == "start" else watcher.steps
        self.busy = True
        try:
            self._record(at, step)
        finally:
            self.busy = False

    def _record(self, at: str, step: int) -> None:
        with self.session.untraced():
            tensors, values = self._components(at)
            digests = _digests(tensors, values)
            if at == "start" and step == self.keep_step:
                self.kept = {f"{component}:{name}": t.detach().to("cpu", copy=True)
                             for component, named in tensors.items() for name, t in named.items()}
                if self.measure_against and Path(self.measure_against).is_file():
                    self.deviations = _deviations(torch.load(self.measure_against, weights_only=True), self.kept)
        self.boundaries.append({"at": at, "step": step, "digests": digests})
        if at == "end" and self.first_readers is not None:  # one step is watched
            self._stop_watching()
        if at == "end":
            self.batch = {}

    def _components(self, at: str) -> tuple[dict, dict]:
        """(tensors, other values), each {component: {name: value}}."""
        watcher = self.session.watcher
        tensors: dict[str, dict] = {"parameters": {}, "buffers": {}, "gradients": {}, "optimizer-state": {}}
        seen: set[int] = set()
        for root, module in watcher.roots:
            for name, param in module.named_parameters():
                if id(param) not in seen:
                    seen.add(id(param))
                    tensors["parameters"][f"{root}.{name}"] = param
                    if at == "start" and param.grad is not None:
                        tensors["gradients"][f"{root}.{name}.grad"] = param.grad
            for name, buffer in module.named_buffers():
                if id(buffer) not in seen:
                    seen.add(id(buffer))
                    tensors["buffers"][f"{root}.{name}"] = buffer
        values: dict[str, dict] = {"lr": {}, "optimizer-state": {}}
        for index, optimizer in enumerate(watcher.optimizers):
            prefix = "optimizer" if index == 0 else f"optimizer{index + 1}"
            for name, value in optimizer_state(optimizer, watcher.param_names).items():
                tensors["optimizer-state"][prefix + name.removeprefix("optimizer")] = value
            for group_index, group in enumerate(optimizer.param_groups):
                for key, value in group.items():
                    if key != "params":
                        component = "lr" if key == "lr" else "optimizer-state"
                        values[component][f"{prefix}.param_groups[{group_index}].{key}"] = value
        if at in ("start", "point"):
            tensors["batch"] = self.batch
        values["scheduler"] = {f"scheduler[{i}] ({type(s).__name__})": s.state_dict() for i, s in enumerate(self.schedulers)}
        values["grad-scaler"] = {f"scaler[{i}]": s.state_dict() for i, s in enumerate(self.scalers)}
        values["torch-rng"] = {"torch.get_rng_state()": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            values["cuda-rng"] = {"torch.cuda.get_rng_state_all()": torch.cuda.get_rng_state_all()}
        if "numpy" in sys.modules:
            values["numpy-rng"] = {"np.random.get_state()": sys.modules["numpy"].random.get_state()}
        values["python-rng"] = {"random.getstate()": random.getstate()}
        values["generator"] = self._generators()
        return tensors, values

    def _generators(self) -> dict[str, object]:
        """The state of each generator the script holds: in its globals, and
        in its DataLoaders, their samplers and datasets (each once, by its first name)."""
        states: dict[str, object] = {}
        seen: set[int] = set()

        def add(name: str, value) -> None:
            state = _generator_state(value)
            if state is not None and id(value) not in seen:
                seen.add(id(value))
                states[name] = state

        script_globals = vars(sys.modules["__main__"])
        for name, value in list(script_globals.items()):
            if not name.startswith("_"):
                add(name, value)
        for index, loader in enumerate(self.loaders):
            loader_name = next((n for n, v in script_globals.items() if v is loader), f"DataLoader[{index}]")
            add(f"{loader_name}.generator", loader.generator)
            for holder in ("sampler", "batch_sampler", "dataset"):
                owner = getattr(loader, holder, None)
                for attribute, value in list(getattr(owner, "__dict__", {}).items()):
                    add(f"{loader_name}.{holder}.{attribute}", value)
        return states

    def _stop_watching(self) -> None:
        self.first_readers.__exit__(None, None, None)
        self.first_read = self.first_readers.found
        self.first_readers = None

    def close(self) -> dict:
        """Undo the patches; the payload entries."""
        if self.first_readers is not None:
            self._stop_watching()
        self._forward_hook.remove()
        for owner, attribute, original in reversed(self._undo):
            setattr(owner, attribute, original)
        payload = {
            "resume_boundaries": self.boundaries,
            "resume_deviations": self.deviations,
            "checkpoint_calls": [{"call": c, "path": p, "line": n} for c, p, n in self.checkpoint_calls],
            "checkpoint_writes": self.checkpoint_writes,
            "resume_point": self.point_digests,
            "first_readers": self.first_read,
        }
        if self.kept:
            torch.save(self.kept, self.state_file)
            payload["resume_state_file"] = str(self.state_file)
        return payload


def _digests(tensors: dict, values: dict) -> dict[str, dict[str, int]]:
    digests = {
        component: {name: host_digest(t.detach().to("cpu")) for name, t in named.items()}
        for component, named in tensors.items()
    }
    for component, named in values.items():
        digests.setdefault(component, {}).update({name: value_digest(v) for name, v in named.items()})
    return digests


def _generator_state(value):
    """A generator's state (None for what is not one): torch, NumPy (new and legacy) and Python's."""
    if isinstance(value, torch.Generator):
        return value.get_state()
    if isinstance(value, random.Random):
        return value.getstate()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(value, numpy.random.Generator):
            return value.bit_generator.state
        if isinstance(value, numpy.random.RandomState):
            return value.get_state()
    return None


def _deviations(expected: dict, got: dict) -> dict[str, float]:
    """max |diff| of each numeric tensor of ``got`` that differs from ``expected``'s of that name and shape."""
    deviations = {}
    for key, tensor in got.items():
        other = expected.get(key)
        if other is None or other.shape != tensor.shape or tensor.dtype == torch.bool or tensor.is_complex():
            continue
        if not torch.equal(other, tensor):
            deviations[key] = (other.double() - tensor.double()).abs().max().item() if tensor.numel() else 0.0
    return deviations
