"""Rebuild the ops table empirically for the installed torch on one device.

For each entry with a recipe (``calibration_recipes.py``), the op runs
(forward, then backward through ``torch.autograd.grad``) on fixed inputs with
duplicate indices or overlapping windows, so races have something to race on:

1. once under ``torch.use_deterministic_algorithms(True)`` in error mode: a
   ``RuntimeError`` names the caller (``alert_caller``) and a dispatch mode
   names the aten op that raised.  Error mode is needed because a
   ``warn_only`` warning only surfaces at the outermost Python binding;
2. ``repeats`` times in default mode, comparing outputs and gradients bitwise
   with the first run;
3. ``repeats`` times under deterministic mode for the phases that did not raise.

The result is the shipped table with this device's behaviours replaced by
what was measured, written in the same schema.  This module imports torch:
only the ``calibrate`` command imports it.
"""

from __future__ import annotations

import contextlib
import datetime
import platform
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from detaudit.knowledge.calibration_recipes import RECIPES, Inputs, Probe
from detaudit.knowledge.ops import SCHEMA_FILE, OpsTable, alert_caller, parse_ops_table
from detaudit.knowledge.versions import version_in_range
from detaudit.runtime.determinism import deterministic_algorithms_switch

DEFAULT_REPEATS = 5
CPU_THREADS = 2  # the CPU index_put race needs at least two threads (research note §8.3)


# --- measuring -----------------------------------------------------------------


@dataclass
class PhaseResult:
    """What one phase (forward or backward) of a recipe did."""

    alert: str | None  # caller name when deterministic mode raised
    aten: str | None  # the aten op that raised
    default_runs_differ: int  # repeats whose bits differed from the first, default mode
    deterministic_runs_differ: int | None  # same under deterministic mode; None when it raised
    runs: int


@dataclass
class Measurement:
    entry_id: str
    forward: PhaseResult | None = None
    backward: PhaseResult | None = None  # None: the recipe has no backward
    error: str | None = None  # the recipe could not run on this device

    def phases(self) -> dict[str, PhaseResult]:
        found = {"forward": self.forward, "backward": self.backward}
        return {name: result for name, result in found.items() if result is not None}


class _LastAtenOp(TorchDispatchMode):
    """Remembers the aten op dispatched last, to name the one that raised."""

    last: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.last = str(func)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _deterministic(enabled: bool):
    """Deterministic algorithms on (in error mode) or off, then as before."""
    switch = deterministic_algorithms_switch(torch)
    before = switch.read()
    switch.write((enabled, False))
    try:
        yield
    finally:
        switch.write(before)


def _tensors(result: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(result, torch.Tensor):
        return (result,)
    return tuple(t for t in result if isinstance(t, torch.Tensor))


def _fingerprint(tensors: tuple[torch.Tensor, ...]) -> tuple[bytes, ...]:
    """Raw bytes, so -0.0 vs 0.0 and NaN payloads count as differences."""
    return tuple(bytes(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()) for t in tensors)


class _Runner:
    def __init__(self, probe: Probe):
        self.probe = probe
        self.cotangents: list[torch.Tensor] | None = None

    def forward(self) -> tuple[torch.Tensor, ...]:
        return _tensors(self.probe.run())

    def backward(self, outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        differentiable = [o for o in outputs if o.requires_grad]
        if self.cotangents is None:
            # fixed random cotangents: all-ones would hide order effects in symmetric sums
            generator = torch.Generator().manual_seed(1)
            self.cotangents = [torch.randn(o.shape, generator=generator).to(o.device) for o in differentiable]
        grads = torch.autograd.grad(differentiable, self.probe.leaves, self.cotangents, allow_unused=True)
        return tuple(g for g in grads if g is not None)


def _alert_probe(action: Callable[[], Any]) -> tuple[Any, str | None, str | None]:
    """Run under deterministic mode: (result, caller, aten op) - the caller is
    None when nothing raised.  Other RuntimeErrors propagate."""
    tracker = _LastAtenOp()
    try:
        with _deterministic(True), tracker:
            return action(), None, None
    except RuntimeError as error:
        caller = alert_caller(str(error))
        if caller is None:
            raise
        return None, caller, tracker.last


def _repeat(runner: _Runner, repeats: int, forward_mode: bool, backward_mode: bool | None) -> tuple[int, int]:
    """Run ``repeats`` times and count runs differing from the first, per phase;
    ``backward_mode`` None skips the backward."""
    forward_prints, backward_prints = [], []
    for _ in range(repeats):
        with _deterministic(forward_mode):
            outputs = runner.forward()
        forward_prints.append(_fingerprint(outputs))
        if backward_mode is not None:
            with _deterministic(backward_mode):
                backward_prints.append(_fingerprint(runner.backward(outputs)))
    differ = lambda prints: sum(p != prints[0] for p in prints[1:])  # noqa: E731
    return differ(forward_prints), differ(backward_prints)


def measure(entry_id: str, recipe: str, device: str, repeats: int = DEFAULT_REPEATS) -> Measurement:
    """Measure one entry's recipe on ``device``."""
    measurement = Measurement(entry_id)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # beta-API and deprecation notices are not findings
            runner = _Runner(RECIPES[recipe](Inputs(device)))
            has_backward = bool(runner.probe.leaves)
            outputs, forward_alert, forward_aten = _alert_probe(runner.forward)
            if forward_alert:
                with _deterministic(False):
                    outputs = runner.forward()
            backward_alert = backward_aten = None
            if has_backward:
                _, backward_alert, backward_aten = _alert_probe(lambda: runner.backward(outputs))
            default_forward, default_backward = _repeat(runner, repeats, False, False if has_backward else None)
            # under deterministic mode, a phase that raised runs in default mode so the other can be measured
            stable_forward, stable_backward = _repeat(
                runner, repeats, not forward_alert, (not backward_alert) if has_backward else None
            )
    except Exception as error:  # a recipe that cannot run here is reported, not fatal
        first_line = (str(error).strip().splitlines() or [""])[0]
        measurement.error = f"{type(error).__name__}: {first_line}"
        return measurement
    measurement.forward = PhaseResult(
        forward_alert, forward_aten, default_forward, None if forward_alert else stable_forward, repeats
    )
    if has_backward:
        measurement.backward = PhaseResult(
            backward_alert, backward_aten, default_backward, None if backward_alert else stable_backward, repeats
        )
    return measurement


# --- writing the calibrated table ------------------------------------------------


def _measured_behaviour(shipped: list[dict], device: str, phase: str, result: PhaseResult, version: str) -> dict | None:
    """The behaviour one measured phase implies, or None when nothing showed and
    the shipped table claims nothing for it either."""
    claimed = [b for b in shipped if device in b["devices"] and phase in b["phases"]]
    if result.alert:
        mode = "raises"
    elif result.deterministic_runs_differ:
        mode = "nothing"
    elif result.default_runs_differ or claimed:
        # also a claimed hazard that did not show: deterministic mode neither
        # raised nor left a difference, which is what "switches" promises
        mode = "switches"
    else:
        return None
    if claimed:
        mechanism = claimed[0]["mechanism"]
    elif result.alert:
        mechanism = f"alert {result.alert!r}"
    else:
        mechanism = "outputs differ between identical runs"
    evidence = {
        "alert": result.alert,
        "aten": result.aten,
        "default_runs_differ": f"{result.default_runs_differ}/{result.runs - 1}",
        "deterministic_runs_differ": None
        if result.deterministic_runs_differ is None
        else f"{result.deterministic_runs_differ}/{result.runs - 1}",
        "observed": bool(result.alert or result.default_runs_differ),
    }
    return {
        "devices": [device],
        "phases": [phase],
        "mechanism": mechanism,
        "deterministic_mode": mode,
        "torch": f"=={version}",
        "evidence": evidence,
    }


def _recalibrated_entry(raw: dict, measurement: Measurement, device: str, version: str, date: str) -> dict:
    entry = dict(raw)
    measured = measurement.phases()
    current = [
        b for b in raw["behaviours"] if "torch" not in b or version_in_range(version, b["torch"])
    ]
    kept = [b for b in raw["behaviours"] if b not in current]
    for behaviour in current:
        others = [d for d in behaviour["devices"] if d != device]
        if others:
            kept.append({**behaviour, "devices": others})
        unmeasured = [p for p in behaviour["phases"] if p not in measured]
        if device in behaviour["devices"] and unmeasured:
            kept.append({**behaviour, "devices": [device], "phases": unmeasured})
    for phase, result in measured.items():
        behaviour = _measured_behaviour(current, device, phase, result, version)
        if behaviour:
            kept.append(behaviour)
        if result.alert and result.alert not in entry.get("alerts", []):
            entry["alerts"] = [*entry.get("alerts", []), result.alert]
        if result.aten and result.aten not in entry["aten"]:
            entry["aten"] = [*entry["aten"], result.aten]
    entry["behaviours"] = kept or raw["behaviours"]
    entry["sources"] = [
        *raw["sources"],
        {"kind": "measurement", "ref": f"detaudit calibrate on {device}, torch {version}, {date}"},
    ]
    record = {"torch": version, "device": device, "date": date, **{k: asdict(v) for k, v in measured.items()}}
    entry["measurements"] = [*raw.get("measurements", []), record]
    return entry


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return platform.processor() or platform.machine() or "cpu"


def calibrated_table(base: OpsTable, measurements: list[Measurement], device: str) -> OpsTable:
    """``base`` with this device's behaviours replaced by the measurements;
    entries that errored or were not measured keep their shipped facts."""
    version = torch.__version__.split("+", 1)[0]
    date = datetime.date.today().isoformat()
    by_id = {m.entry_id: m for m in measurements if m.error is None}
    document = base.to_document()
    document.pop("$schema", None)
    # the table is written elsewhere, so point editors at this installation's schema
    document = {"$schema": SCHEMA_FILE.as_uri(), **document}
    document["ops"] = [
        _recalibrated_entry(raw, by_id[raw["id"]], device, version, date) if raw["id"] in by_id else raw
        for raw in document["ops"]
    ]
    document["torch_versions"] = f"=={version}"
    document["provenance"] = {
        "kind": "calibrated",
        "date": date,
        "torch": torch.__version__,
        "device": device,
        "device_name": device_name(device),
        "cuda": torch.version.cuda,
        "threads": torch.get_num_threads(),
        "measured": sorted(by_id),
        "failed": {m.entry_id: m.error for m in measurements if m.error},
        "base": base.origin,
    }
    return parse_ops_table(document, origin="<calibrated>")


@contextlib.contextmanager
def _threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_device(device: str) -> str | None:
    """Why ``device`` cannot be calibrated here, or None."""
    if device == "cuda" and not torch.cuda.is_available():
        return f"--device cuda needs a CUDA GPU, and this torch ({torch.__version__}) sees none"
    return None


def run_calibration(
    base: OpsTable,
    device: str,
    entry_ids: list[str],
    repeats: int = DEFAULT_REPEATS,
    on_measured: Callable[[Measurement], None] | None = None,
) -> tuple[list[Measurement], OpsTable]:
    """Measure the listed entries (CPU with ``CPU_THREADS`` threads) and build
    the calibrated table."""
    measurements = []
    with _threads(CPU_THREADS if device == "cpu" else torch.get_num_threads()):
        for entry_id in entry_ids:
            entry = base.entry(entry_id)
            measurement = measure(entry.id, entry.recipe, device, repeats)
            measurements.append(measurement)
            if on_measured:
                on_measured(measurement)
        return measurements, calibrated_table(base, measurements, device)
