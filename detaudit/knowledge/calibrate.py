"""Rebuild the ops table empirically for the installed torch on one device.

For each entry with a recipe, the op runs (forward, then backward through
``torch.autograd.grad``) on fixed inputs with duplicate indices or overlapping
windows, so races have something to race on:

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
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from detaudit.knowledge.ops import OpsTable, alert_caller, parse_ops_table, version_in_range
from detaudit.runtime.determinism import deterministic_algorithms_switch

DEFAULT_REPEATS = 5
CPU_THREADS = 2  # the CPU index_put race needs at least two threads (research note §8.3)


@dataclass
class Probe:
    """One runnable instance of an op: ``run`` computes the outputs from fixed
    inputs; ``leaves`` are the inputs gradients flow to (empty: no backward)."""

    run: Callable[[], Any]
    leaves: tuple[torch.Tensor, ...] = ()


class _Inputs:
    """Seeded input factory, so every calibration sees the same tensors."""

    def __init__(self, device: str):
        self.device = device
        self.generator = torch.Generator().manual_seed(0)

    def randn(self, *shape: int, grad: bool = False, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
        values = torch.randn(*shape, generator=self.generator) * scale + offset
        return values.to(self.device).requires_grad_(grad)

    def rand(self, *shape: int, grad: bool = False) -> torch.Tensor:
        return torch.rand(*shape, generator=self.generator).to(self.device).requires_grad_(grad)

    def index(self, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=self.generator).to(self.device)

    def ties(self, *shape: int, grad: bool = False) -> torch.Tensor:
        """Floats with many equal values, for ops whose indices pick among ties."""
        values = torch.randint(0, 4, shape, generator=self.generator).float()
        return values.to(self.device).requires_grad_(grad)

    def zeros(self, *shape: int) -> torch.Tensor:
        return torch.zeros(*shape, device=self.device)


RECIPES: dict[str, Callable[[_Inputs], Probe]] = {}


def _recipe(name: str):
    def register(build: Callable[[_Inputs], Probe]):
        RECIPES[name] = build
        return build

    return register


# Shared shapes: many duplicate indices into few rows.
_ROWS, _COLS, _MANY = 64, 256, 4096


@_recipe("put")
def _put(x: _Inputs) -> Probe:
    base, source, index = x.randn(256, grad=True), x.randn(65536, grad=True), x.index(256, 65536)
    return Probe(lambda: base.clone().put_(index, source), (base, source))


@_recipe("put_accumulate")
def _put_accumulate(x: _Inputs) -> Probe:
    base, source, index = x.randn(256, grad=True), x.randn(65536, grad=True), x.index(256, 65536)
    return Probe(lambda: base.clone().put_(index, source, accumulate=True), (base, source))


@_recipe("take")
def _take(x: _Inputs) -> Probe:
    source, index = x.randn(256, grad=True), x.index(256, 65536)
    return Probe(lambda: torch.take(source, index), (source,))


@_recipe("index_put_accumulate")
def _index_put_accumulate(x: _Inputs) -> Probe:
    # forward: index_put_ itself; backward: advanced indexing W[idx]
    values, flat_index = x.randn(200000, grad=True), x.index(_ROWS, 200000)
    weight, row_index = x.randn(_ROWS, _COLS, grad=True), x.index(_ROWS, _MANY)
    return Probe(
        lambda: (x.zeros(_ROWS).index_put_((flat_index,), values, accumulate=True), weight[row_index]),
        (values, weight),
    )


@_recipe("index_put_duplicates")
def _index_put_duplicates(x: _Inputs) -> Probe:
    values, index = x.randn(_MANY, _COLS, grad=True), x.index(_ROWS, _MANY)
    return Probe(lambda: x.zeros(_ROWS, _COLS).index_put_((index,), values), (values,))


@_recipe("index_copy")
def _index_copy(x: _Inputs) -> Probe:
    source, index = x.randn(_MANY, _COLS, grad=True), x.index(_ROWS, _MANY)
    return Probe(lambda: x.zeros(_ROWS, _COLS).index_copy_(0, index, source), (source,))


@_recipe("scatter_src")
def _scatter_src(x: _Inputs) -> Probe:
    source, index = x.randn(_MANY, _COLS, grad=True), x.index(_ROWS, _MANY, _COLS)
    return Probe(lambda: x.zeros(_ROWS, _COLS).scatter_(0, index, source), (source,))


@_recipe("scatter_add")
def _scatter_add(x: _Inputs) -> Probe:
    source, index = x.randn(_MANY, _COLS, grad=True), x.index(_ROWS, _MANY, _COLS)
    return Probe(lambda: x.zeros(_ROWS, _COLS).scatter_add_(0, index, source), (source,))


@_recipe("gather")
def _gather(x: _Inputs) -> Probe:
    weight, index = x.randn(_ROWS, _COLS, grad=True), x.index(_ROWS, _MANY, _COLS)
    return Probe(lambda: torch.gather(weight, 0, index), (weight,))


@_recipe("scatter_reduce_sum")
def _scatter_reduce_sum(x: _Inputs) -> Probe:
    source, index = x.randn(_MANY, _COLS, grad=True), x.index(_ROWS, _MANY, _COLS)
    return Probe(lambda: x.zeros(_ROWS, _COLS).scatter_reduce(0, index, source, "sum"), (source,))


@_recipe("scatter_reduce_prod")
def _scatter_reduce_prod(x: _Inputs) -> Probe:
    # values near 1 keep the products finite; few columns because CPU prod is slow
    source, index = x.randn(_MANY, 32, grad=True, scale=0.01, offset=1.0), x.index(_ROWS, _MANY, 32)
    base = x.randn(_ROWS, 32, scale=0.01, offset=1.0)
    return Probe(lambda: base.scatter_reduce(0, index, source, "prod"), (source,))


@_recipe("index_add")
def _index_add(x: _Inputs) -> Probe:
    source, index = x.randn(_MANY, _COLS, grad=True), x.index(_ROWS, _MANY)
    return Probe(lambda: x.zeros(_ROWS, _COLS).index_add_(0, index, source), (source,))


@_recipe("index_select")
def _index_select(x: _Inputs) -> Probe:
    weight, index = x.randn(_ROWS, _COLS, grad=True), x.index(_ROWS, _MANY)
    return Probe(lambda: weight.index_select(0, index), (weight,))


@_recipe("repeat_interleave")
def _repeat_interleave(x: _Inputs) -> Probe:
    weight = x.randn(_ROWS, _COLS, grad=True)
    return Probe(lambda: torch.repeat_interleave(weight, 64, dim=0), (weight,))


@_recipe("embedding_bag_max")
def _embedding_bag_max(x: _Inputs) -> Probe:
    weight, index = x.randn(_ROWS, 32, grad=True), x.index(_ROWS, 8192)
    offsets = torch.arange(0, 8192, 8, device=x.device)
    return Probe(lambda: F.embedding_bag(index, weight, offsets, mode="max"), (weight,))


@_recipe("avg_pool3d")
def _avg_pool3d(x: _Inputs) -> Probe:
    volume = x.randn(2, 4, 9, 9, 9, grad=True)
    return Probe(lambda: F.avg_pool3d(volume, 3, stride=2), (volume,))


@_recipe("adaptive_avg_pool2d")
def _adaptive_avg_pool2d(x: _Inputs) -> Probe:
    image = x.randn(4, 8, 15, 15, grad=True)  # 15 -> 4 makes the windows overlap
    return Probe(lambda: F.adaptive_avg_pool2d(image, 4), (image,))


@_recipe("adaptive_avg_pool3d")
def _adaptive_avg_pool3d(x: _Inputs) -> Probe:
    volume = x.randn(2, 4, 9, 9, 9, grad=True)
    return Probe(lambda: F.adaptive_avg_pool3d(volume, 4), (volume,))


@_recipe("adaptive_max_pool2d")
def _adaptive_max_pool2d(x: _Inputs) -> Probe:
    image = x.ties(4, 8, 15, 15, grad=True)
    return Probe(lambda: F.adaptive_max_pool2d(image, 4), (image,))


@_recipe("fractional_max_pool2d")
def _fractional_max_pool2d(x: _Inputs) -> Probe:
    image, samples = x.randn(4, 8, 16, 16, grad=True), x.rand(4, 8, 2)  # fixed samples: no RNG
    return Probe(lambda: F.fractional_max_pool2d(image, 3, output_size=8, _random_samples=samples), (image,))


@_recipe("max_pool3d")
def _max_pool3d(x: _Inputs) -> Probe:
    volume = x.ties(2, 4, 9, 9, 9, grad=True)
    return Probe(lambda: F.max_pool3d(volume, 3, stride=2), (volume,))


@_recipe("max_unpool2d")
def _max_unpool2d(x: _Inputs) -> Probe:
    pooled, indices = F.max_pool2d(x.randn(4, 8, 16, 16), 3, stride=1, return_indices=True)
    pooled = pooled.detach().requires_grad_()
    return Probe(lambda: F.max_unpool2d(pooled, indices, 3, stride=1), (pooled,))


def _upsample_probe(x: _Inputs, shape: tuple[int, ...], **options: Any) -> Probe:
    signal = x.randn(*shape, grad=True)
    return Probe(lambda: F.interpolate(signal, **options), (signal,))


@_recipe("interpolate_linear")
def _interpolate_linear(x: _Inputs) -> Probe:
    return _upsample_probe(x, (4, 8, 32), scale_factor=2.5, mode="linear")


@_recipe("interpolate_bilinear")
def _interpolate_bilinear(x: _Inputs) -> Probe:
    return _upsample_probe(x, (4, 8, 16, 16), scale_factor=2.5, mode="bilinear")


@_recipe("interpolate_bicubic")
def _interpolate_bicubic(x: _Inputs) -> Probe:
    return _upsample_probe(x, (4, 8, 16, 16), scale_factor=2.5, mode="bicubic")


@_recipe("interpolate_bilinear_antialias")
def _interpolate_bilinear_antialias(x: _Inputs) -> Probe:
    return _upsample_probe(x, (4, 8, 32, 32), size=(13, 13), mode="bilinear", antialias=True)


@_recipe("reflection_pad1d")
def _reflection_pad1d(x: _Inputs) -> Probe:
    signal = x.randn(4, 8, 32, grad=True)
    return Probe(lambda: F.pad(signal, (5, 5), mode="reflect"), (signal,))


@_recipe("replication_pad2d")
def _replication_pad2d(x: _Inputs) -> Probe:
    image = x.randn(4, 8, 16, 16, grad=True)
    return Probe(lambda: F.pad(image, (5, 5, 5, 5), mode="replicate"), (image,))


@_recipe("nll_loss2d")
def _nll_loss2d(x: _Inputs) -> Probe:
    logits, target = x.randn(4, 5, 32, 32, grad=True), x.index(5, 4, 32, 32)
    return Probe(lambda: F.nll_loss(F.log_softmax(logits, 1), target), (logits,))


@_recipe("ctc_loss")
def _ctc_loss(x: _Inputs) -> Probe:
    steps, batch, classes, longest = 50, 16, 20, 30
    logits = x.randn(steps, batch, classes, grad=True)
    targets = x.index(classes - 1, batch, longest) + 1  # 0 is the blank
    input_lengths = torch.full((batch,), steps, dtype=torch.long)
    target_lengths = torch.randint(10, longest, (batch,), generator=x.generator)
    return Probe(
        lambda: F.ctc_loss(logits.log_softmax(2), targets, input_lengths, target_lengths),
        (logits,),
    )


@_recipe("histc")
def _histc(x: _Inputs) -> Probe:
    values = x.randn(200000)
    return Probe(lambda: torch.histc(values, bins=64, min=-3, max=3))


@_recipe("bincount_weights")
def _bincount_weights(x: _Inputs) -> Probe:
    index, weights = x.index(_ROWS, 200000), x.randn(200000)
    return Probe(lambda: torch.bincount(index, weights=weights))


@_recipe("median_dim")
def _median_dim(x: _Inputs) -> Probe:
    values = x.ties(256, 257, grad=True)
    return Probe(lambda: torch.median(values, dim=1), (values,))


@_recipe("nanmedian_dim")
def _nanmedian_dim(x: _Inputs) -> Probe:
    values = x.ties(256, 257, grad=True)
    return Probe(lambda: torch.nanmedian(values, dim=1), (values,))


@_recipe("grid_sample")
def _grid_sample(x: _Inputs) -> Probe:
    image = x.randn(2, 4, 16, 16, grad=True)
    grid = (x.rand(2, 24, 24, 2) * 2 - 1).requires_grad_()
    return Probe(lambda: F.grid_sample(image, grid, align_corners=False), (image, grid))


@_recipe("cumsum")
def _cumsum(x: _Inputs) -> Probe:
    values = x.randn(200000, grad=True)
    return Probe(lambda: torch.cumsum(values, 0), (values,))


@_recipe("index_reduce")
def _index_reduce(x: _Inputs) -> Probe:
    source, index = x.randn(_MANY, _COLS, grad=True), x.index(_ROWS, _MANY)
    return Probe(lambda: x.zeros(_ROWS, _COLS).index_reduce_(0, index, source, "mean"), (source,))


@_recipe("sdpa")
def _sdpa(x: _Inputs) -> Probe:
    query, key, value = (x.randn(2, 4, 64, 32, grad=True) for _ in range(3))
    return Probe(lambda: F.scaled_dot_product_attention(query, key, value), (query, key, value))


@_recipe("conv2d")
def _conv2d(x: _Inputs) -> Probe:
    image, weight = x.randn(8, 16, 32, 32, grad=True), x.randn(32, 16, 3, 3, grad=True)
    return Probe(lambda: F.conv2d(image, weight, padding=1), (image, weight))


@_recipe("bmm_sparse")
def _bmm_sparse(x: _Inputs) -> Probe:
    dense = x.randn(4, 32, 32)
    sparse = (dense * (x.rand(4, 32, 32) < 0.2)).to_sparse()
    other = x.randn(4, 32, 16, grad=True)
    return Probe(lambda: torch.bmm(sparse, other), (other,))


@_recipe("topk")
def _topk(x: _Inputs) -> Probe:
    values = x.ties(256, 1024, grad=True)
    return Probe(lambda: torch.topk(values, 64), (values,))


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
            runner = _Runner(RECIPES[recipe](_Inputs(device)))
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
