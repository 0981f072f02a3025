"""Batch invariance: does a sample's result depend on what it is batched with?

``audit_batch_invariance(model_or_fn, samples)`` runs every sample alone (the
reference) and inside batches of other real samples at several batch sizes
and positions, compares each sample's outputs bit for bit, and where they
differ names the first op whose per-sample slice differs while its
per-sample input slice matched.

**Batches.**  With N samples, the batch of size b at rotation k holds samples
k, k+1, ..., k+b-1 (mod N): the N rotations put every sample at every
position, surrounded by other real samples (repeated when b > N).  Batch size
1 reruns each sample alone: a control that shows plain run-to-run
nondeterminism, which is not a batch effect.

**Per-sample slices.**  A traced run goes through ``_SliceRecorder``, a small
``TorchDispatchMode`` that records each aten op with its source line and
module (the tracer's attribution helpers, ``watch.user_frame`` and the
``TrainingWatcher``) and digests of its tensors (the tracer's digests, staged
on the device).  In the alone run every tensor is the sample's own.  In a
batch run each tensor is related by shape to the alone run's tensor at the
same op: the one axis whose size is b times the alone size is the sample
axis, and the sample's slice is index p of it (size 1 alone) or, for an axis
that merges samples with another dimension (a linear layer flattens
batch × tokens), rows p*m..(p+1)*m (batch-major) or every b-th row from p
(sequence-first): both are digested and either may match.  A tensor of the
same shape in both runs (a weight, a reduction over the batch) is compared
whole; a tensor with no such relation is not compared.

**Kernel variance or sample mixing.**  The first op whose output slice
differs between the alone run and the batch is the root cause.  To tell a
kernel that reduces in a shape-dependent order from an op that mixes
samples (BatchNorm in training mode), the batch is traced once more with the
same size and position and every *other* sample replaced by a copy of the
audited one (the probe).  The shapes are the same, so every kernel takes the
same path; only the other samples' values changed.  The first op whose slice
changes between batch and probe while its input slice did not mixes samples:
when it is the root cause, the cause is sample mixing, otherwise the root
cause is a batch-variant kernel (and the mixing op, if any, is reported as
well).  The test is bitwise, with no tolerance and no float64 rerun, and holds
for any op whose reduction order depends on shapes only, not on values.

The model runs under ``torch.no_grad()``, reseeded before every run; the
buffers of every module it ran are put back after each run (BatchNorm in
training mode updates its running statistics), and the caller's RNG state is
restored at the end.  State kept outside modules (a cache in a Python
variable) is the caller's to reset.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence, Union

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from detaudit.dynamic.batch.report import BatchCause, BatchCell, BatchReport
from detaudit.dynamic.compare.causes import (
    BATCH_VARIANT_OP,
    CONTROL_FLOW,
    NONDETERMINISTIC_OP,
    RNG,
    SAMPLE_MIXING,
    CauseKind,
    OtherRunOp,
)
from detaudit.dynamic.compare.state_diff import tensor_diff
from detaudit.dynamic.record.final_state import returned_state
from detaudit.dynamic.record.op_info import ALLOCATION_OPS
from detaudit.dynamic.record.tracer import OpTracer
from detaudit.launch.watcher import TrainingWatcher, user_frame, variable_name

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 32)
Positions = Union[Sequence[int], str, None]  # None: first, middle, last; "all"; or indices (negative from the end)


class BatchInvarianceError(ValueError):
    """The audit cannot run: bad samples or options, or the model failed on a batch (one line)."""


# -- samples and batches ---------------------------------------------------------


class _SamplePool:
    """The samples, as a tensor or a tuple/list/dict of tensors that share the
    batch dimension ``dim`` (non-tensor values pass through unchanged)."""

    def __init__(self, samples: Any, dim: int):
        if isinstance(samples, torch.Tensor):
            self.kind, items = "tensor", [(None, samples)]
        elif isinstance(samples, (tuple, list)):
            self.kind, items = "args", list(enumerate(samples))
        elif isinstance(samples, dict):
            self.kind, items = "kwargs", list(samples.items())
        else:
            raise BatchInvarianceError(
                f"samples must be a tensor, or a tuple or dict of tensors, not {type(samples).__name__}"
            )
        self.items = items
        self.dim = dim
        tensors = [value for _, value in items if isinstance(value, torch.Tensor)]
        if not tensors:
            raise BatchInvarianceError("samples hold no tensor")
        try:
            sizes = {value.shape[dim] for value in tensors}
        except IndexError:
            raise BatchInvarianceError(f"a sample tensor has no dimension {dim} (the batch dimension)") from None
        if len(sizes) != 1:
            raise BatchInvarianceError(f"the sample tensors disagree on the size of dimension {dim}: {sorted(sizes)}")
        self.count = sizes.pop()
        if self.count < 2:
            raise BatchInvarianceError("need at least 2 samples: batches are filled with other real samples")

    def batch(self, indices: Sequence[int]):
        """The samples at ``indices``, in that order, as one batch of the samples' structure."""
        def take(value):
            if not isinstance(value, torch.Tensor):
                return value
            return value.index_select(self.dim, torch.tensor(list(indices), device=value.device))

        if self.kind == "tensor":
            return take(self.items[0][1])
        if self.kind == "args":
            return tuple(take(value) for _, value in self.items)
        return {key: take(value) for key, value in self.items}

    def rotation(self, start: int, batch_size: int) -> list[int]:
        return [(start + offset) % self.count for offset in range(batch_size)]


def batch_positions(spec: Positions, batch_size: int) -> list[int]:
    """The positions audited in a batch of ``batch_size``: first, middle and
    last by default; "all"; or the given indices (negative count from the end,
    out-of-range ones are skipped)."""
    if spec is None:
        chosen = [0, batch_size // 2, batch_size - 1]
    elif spec == "all":
        chosen = list(range(batch_size))
    elif isinstance(spec, str):
        raise BatchInvarianceError(f"positions must be None, 'all' or a sequence of indices, not {spec!r}")
    else:
        chosen = [p + batch_size if p < 0 else p for p in spec]
    return sorted({p for p in chosen if 0 <= p < batch_size})


# -- per-sample slices -------------------------------------------------------------


def sample_slices(tensor: torch.Tensor, alone_shape: tuple, batch_size: int, position: int) -> list[torch.Tensor] | None:
    """The candidate slices of ``tensor`` (from a batch run) that hold the
    sample at ``position``, given the same tensor's shape in the sample's alone
    run: the whole tensor when the shapes agree, None when the shapes relate in
    no way a batch explains (see the module docstring)."""
    shape = tuple(tensor.shape)
    if shape == alone_shape:
        return [tensor]
    if len(shape) != len(alone_shape):
        return None
    axes = [axis for axis, (alone, batched) in enumerate(zip(alone_shape, shape)) if alone != batched]
    if len(axes) != 1:
        return None
    axis = axes[0]
    rows = alone_shape[axis]
    if shape[axis] != rows * batch_size:
        return None
    if rows == 1:
        return [tensor.narrow(axis, position, 1)]
    candidates = [tensor.narrow(axis, position * rows, rows)]  # batch-major: [B*T, C]
    try:
        candidates.append(tensor.unflatten(axis, (rows, batch_size)).select(axis + 1, position))  # [T*B, C]
    except RuntimeError:
        pass
    return candidates


class _OpRecord(NamedTuple):
    op: str
    path: str
    line: int
    module: str
    device: str
    drew: bool  # it drew from a random generator
    input_shapes: tuple
    output_shapes: tuple
    # per tensor: the digests of its candidate slices (one for a whole tensor), None = not compared
    inputs: tuple
    outputs: tuple


class _SliceRecorder(TorchDispatchMode):
    """Records each aten op with digests of its tensors' per-sample slices.

    ``reference`` is the alone run's records (None for the alone run itself):
    a tensor's slice is found by relating its shape to the reference tensor's
    at the same op.  ``capture`` names record indices whose output slices are
    also kept (CPU copies) to measure a deviation."""

    def __init__(self, reference: list[_OpRecord] | None, batch_size: int, position: int, capture=frozenset()):
        super().__init__()
        self.reference = reference
        self.batch_size = batch_size
        self.position = position
        self.capture = capture
        self.digests = OpTracer()  # the tracer's digest store: staged on the device until flushed
        self.watcher: TrainingWatcher | None = None
        self.rows: list[tuple] = []
        self.captured: dict[int, list[list[torch.Tensor]]] = {}
        self.paused = False  # set while detaudit itself runs torch ops (snapshots of module buffers)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # as the tracer's recorder: never compiled, so torch need not wrap (and import) dynamo around it
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused or func.namespace == "profiler":  # record_function markers carry no data
            return func(*args, **kwargs)
        index = len(self.rows)
        name = str(func)
        reference = None
        if self.reference is not None and index < len(self.reference) and self.reference[index].op == name:
            reference = self.reference[index]
        in_tensors = [value for value in tree_leaves((args, kwargs)) if isinstance(value, torch.Tensor)]
        inputs = self._slice_digests(in_tensors, reference.input_shapes if reference else None)
        seeded = torch.Tag.nondeterministic_seeded in func.tags
        generators = _generator_states() if seeded else None

        result = func(*args, **kwargs)

        # torch tags ops that *can* draw (SDPA, for its dropout): a random op is one that did
        drew = seeded and _generator_states() != generators

        out_tensors = [value for value in tree_leaves(result) if isinstance(value, torch.Tensor)]
        makes_data = func._opname not in ALLOCATION_OPS and not _is_view(func)
        outputs = (
            self._slice_digests(out_tensors, reference.output_shapes if reference else None)
            if makes_data
            else (None,) * len(out_tensors)
        )
        if index in self.capture:
            self.captured[index] = [
                [piece.detach().to("cpu", copy=True) for piece in self._slices(tensor, shape)]
                for tensor, shape in zip(out_tensors, reference.output_shapes if reference else [None] * len(out_tensors))
            ]
        frame = user_frame(sys._getframe(1))
        device = next((t.device.type for t in (*out_tensors, *in_tensors)), "cpu")
        self.rows.append(
            (
                name,
                frame.f_code.co_filename if frame else "",
                frame.f_lineno if frame else 0,
                self.watcher.current_module if self.watcher else "",
                device,
                drew,
                tuple(tuple(t.shape) for t in in_tensors),
                tuple(tuple(t.shape) for t in out_tensors),
                inputs,
                outputs,
            )
        )
        return result

    def _slices(self, tensor: torch.Tensor, alone_shape: tuple | None) -> list[torch.Tensor]:
        if self.reference is None:
            return [tensor]
        if alone_shape is None:
            return []
        return sample_slices(tensor, alone_shape, self.batch_size, self.position) or []

    def _slice_digests(self, tensors: list[torch.Tensor], alone_shapes: tuple | None) -> tuple:
        if self.reference is not None and (alone_shapes is None or len(alone_shapes) != len(tensors)):
            return (None,) * len(tensors)  # a different op than the alone run's: nothing to relate to
        shapes = alone_shapes if alone_shapes is not None else [None] * len(tensors)
        digests = []
        for tensor, shape in zip(tensors, shapes):
            pieces = self._slices(tensor, shape)
            digests.append(tuple(self.digests.stage_digest(piece) for piece in pieces) if pieces else None)
        return tuple(digests)

    def records(self) -> list[_OpRecord]:
        """The records, with digest values in place of digest ids."""
        self.digests.flush()
        values = self.digests.digests

        def resolve(refs: tuple) -> tuple:
            return tuple(None if ids is None else tuple(values[i] for i in ids) for ids in refs)

        return [
            _OpRecord(*row[:8], inputs=resolve(row[8]), outputs=resolve(row[9]))
            for row in self.rows
        ]


def _generator_states() -> tuple:
    """Where the default generators stand: the CPU state, and each initialized CUDA generator's offset."""
    states = [bytes(torch.default_generator.get_state().numpy())]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.extend(generator.get_offset() for generator in torch.cuda.default_generators)
    return tuple(states)


def _is_view(func) -> bool:
    return any(ret.alias_info is not None and not ret.alias_info.is_write for ret in func._schema.returns)


# -- comparing two traced runs -----------------------------------------------------------

MATCH, DIFFERS, NOT_COMPARED = "match", "differs", "not compared"


def _status(a: tuple | None, b: tuple | None) -> str:
    if a is None or b is None:
        return NOT_COMPARED
    return MATCH if set(a) & set(b) else DIFFERS


@dataclass(frozen=True)
class _Divergence:
    index: int
    control_flow: bool = False
    inputs: str = MATCH  # MATCH: every tensor input's slice matched; DIFFERS: one already differed; NOT_COMPARED


def first_divergence(reference: list[_OpRecord], other: list[_OpRecord]) -> _Divergence | None:
    """The first op whose per-sample output slice differs between two traced
    runs (or where they ran different ops); None when none does."""
    for index, (a, b) in enumerate(zip(reference, other)):
        if a.op != b.op or len(a.outputs) != len(b.outputs):
            return _Divergence(index, control_flow=True)
        if any(_status(x, y) == DIFFERS for x, y in zip(a.outputs, b.outputs)):
            inputs = {_status(x, y) for x, y in zip(a.inputs, b.inputs)}
            worst = next((status for status in (DIFFERS, NOT_COMPARED) if status in inputs), MATCH)
            return _Divergence(index, inputs=worst)
    if len(reference) != len(other):
        return _Divergence(min(len(reference), len(other)), control_flow=True)
    return None


# -- running the model ---------------------------------------------------------------------


class _Runner:
    """Calls the model on a batch: no grad, reseeded, and every module it ran
    put back afterwards (a module's buffers are saved before its first
    forward: BatchNorm in training mode updates its running statistics)."""

    def __init__(self, model_or_fn: Callable, pool: _SamplePool, seed: int):
        self.fn = model_or_fn
        self.pool = pool
        self.seed = seed
        self.saved: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # id(module) -> (buffer, copy)
        self.recorder: _SliceRecorder | None = None
        # module paths start from the name the caller gave the model ("model" if none)
        self.root_name = variable_name(model_or_fn) or "model" if isinstance(model_or_fn, torch.nn.Module) else None

    def _save_buffers(self, module: torch.nn.Module, args) -> None:
        if id(module) in self.saved:
            return
        if self.recorder is not None:
            self.recorder.paused = True
        try:
            self.saved[id(module)] = [(b, b.detach().clone()) for b in module.buffers(recurse=False)]
        finally:
            if self.recorder is not None:
                self.recorder.paused = False

    def __call__(self, indices: Sequence[int], recorder: _SliceRecorder | None = None) -> dict[str, torch.Tensor]:
        batch = self.pool.batch(indices)
        torch.manual_seed(self.seed)
        self.recorder = recorder
        hook = torch.nn.modules.module.register_module_forward_pre_hook(self._save_buffers)
        try:
            if recorder is not None:
                with recorder:
                    output = self._call(batch)
            else:
                output = self._call(batch)
        except BatchInvarianceError:
            raise
        except Exception as error:
            raise BatchInvarianceError(
                f"the model failed on a batch of {len(indices)} sample(s): {type(error).__name__}: {error}"
            ) from error
        finally:
            hook.remove()
            self.recorder = None
            for buffers in self.saved.values():
                for buffer, saved in buffers:
                    buffer.copy_(saved)
        return {name: tensor.detach() for name, tensor in returned_state(output).items()}

    def _call(self, batch):
        if self.pool.kind == "args":
            return self.fn(*batch)
        if self.pool.kind == "kwargs":
            return self.fn(**batch)
        return self.fn(batch)

    def traced(self, indices: Sequence[int], reference, position: int, capture=frozenset()) -> _SliceRecorder:
        recorder = _SliceRecorder(reference, len(indices), position, capture)
        recorder.watcher = TrainingWatcher()
        if self.root_name is not None:
            recorder.watcher.add_root(self.fn, self.root_name)
        try:
            self(indices, recorder)
        finally:
            recorder.watcher.close()
        return recorder


@dataclass
class _OutputDiff:
    max_abs_diff: float
    max_ulp: int
    fraction_differing: float


def _compare_outputs(alone: dict, batched: dict, batch_size: int, position: int, skipped: set) -> _OutputDiff | None:
    """How the sample's outputs in a batch differ from its alone outputs (None: bitwise equal)."""
    worst = None
    for name, reference in alone.items():
        tensor = batched.get(name)
        slices = None
        if tensor is not None and (batch_size == 1 or tuple(tensor.shape) != tuple(reference.shape)):
            slices = sample_slices(tensor, tuple(reference.shape), batch_size, position)
        if not slices:
            skipped.add(name)
            continue
        diffs = [tensor_diff(name, reference, piece) for piece in slices]
        if any(diff is None for diff in diffs):
            continue
        best = min(diffs, key=lambda diff: diff.fraction_differing)
        if worst is None or best.max_abs_diff > worst.max_abs_diff:
            worst = _OutputDiff(best.max_abs_diff, best.max_ulp, best.fraction_differing)
    return worst


# -- the audit -----------------------------------------------------------------------------------


def audit_batch_invariance(
    model_or_fn: Callable,
    samples: Any,
    *,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    positions: Positions = None,
    dim: int = 0,
    seed: int = 0,
    localize: bool = True,
    target: str | None = None,
) -> BatchReport:
    """Does a sample's result depend on the batch it is in?

    ``model_or_fn`` is called on batches built from ``samples``: a tensor
    whose dimension ``dim`` indexes the samples (``model(batch)``), or a tuple
    (``model(*batch)``) or dict (``model(**batch)``) of tensors that share it.
    Each sample runs alone, then inside batches of ``batch_sizes`` at
    ``positions`` (first, middle and last by default; "all"; or indices),
    surrounded by other samples.  Outputs (a tensor, or a tuple/list/dict of
    them) are compared bitwise per sample; for each differing batch size and
    position, the first op whose per-sample slice differed while its input
    slice matched is named, as a batch-variant kernel or as sample mixing
    (``localize=False`` skips that and only compares outputs).
    """
    pool = _SamplePool(samples, dim)
    sizes = sorted({int(size) for size in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise BatchInvarianceError(f"batch sizes must be at least 1, got {list(batch_sizes)}")
    runner = _Runner(model_or_fn, pool, seed)
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        alone = [runner([sample]) for sample in range(pool.count)]
        cells, skipped = _compare_cells(runner, pool, alone, sizes, positions)
        causes = _localize(runner, pool, cells) if localize else []
    return _build_report(
        target or _describe(model_or_fn), pool, sizes, dim, alone, cells, causes, skipped
    )


@dataclass
class _Cell:
    batch_size: int
    position: int
    rotations: dict[int, int]  # sample -> rotation start of the batch that held it at this position
    differing: dict[int, _OutputDiff]

    def first_differing(self) -> int | None:
        return min(self.differing) if self.differing else None


def _compare_cells(runner: _Runner, pool: _SamplePool, alone: list, sizes: list[int], positions: Positions):
    cells: list[_Cell] = []
    skipped: set[str] = set()
    for size in sizes:
        chosen = batch_positions(positions, size)
        by_position = {p: _Cell(size, p, {}, {}) for p in chosen}
        for start in range(pool.count):
            order = pool.rotation(start, size)
            outputs = runner(order)
            for position, cell in by_position.items():
                sample = order[position]
                cell.rotations[sample] = start
                diff = _compare_outputs(alone[sample], outputs, size, position, skipped)
                if diff is not None:
                    cell.differing[sample] = diff
        cells.extend(by_position.values())
    return cells, skipped


@dataclass
class _CauseFound:
    kind: CauseKind
    record: _OpRecord
    cell: _Cell
    inputs: str  # the root op's input slices: MATCH, DIFFERS or NOT_COMPARED
    max_abs_diff: float | None = None
    max_ulp: int | None = None
    other: _OpRecord | None = None  # control flow: what the batch ran instead


def _localize(runner: _Runner, pool: _SamplePool, cells: list[_Cell]) -> list[_CauseFound]:
    """The root cause(s) of every differing cell, located on its first differing sample."""
    alone_traces: dict[int, list[_OpRecord]] = {}
    found: list[_CauseFound] = []
    for cell in cells:
        sample = cell.first_differing()
        if sample is None:
            continue
        if sample not in alone_traces:
            alone_traces[sample] = runner.traced([sample], None, 0).records()
        alone = alone_traces[sample]
        order = pool.rotation(cell.rotations[sample], cell.batch_size)
        if cell.batch_size == 1:  # the control: rerunning the sample alone changed it
            rerun = runner.traced(order, None, 0).records()
            root = first_divergence(alone, rerun)
            if root is not None and not root.control_flow:
                kind = RNG if alone[root.index].drew else NONDETERMINISTIC_OP
                found.append(_measured(runner, kind, alone, root, cell, [(order, None), (order, None)]))
            elif root is not None:
                found.append(_CauseFound(CONTROL_FLOW, alone[root.index], cell, MATCH, other=_at(rerun, root.index)))
            continue
        batch = runner.traced(order, alone, cell.position).records()
        root = first_divergence(alone, batch)
        if root is None:
            continue  # the outputs differ outside the traced ops (Python arithmetic on them)
        if root.control_flow:
            found.append(_CauseFound(CONTROL_FLOW, _at(alone, root.index), cell, MATCH, other=_at(batch, root.index)))
            continue
        probe_order = [sample] * cell.batch_size  # same shapes; the other samples replaced by copies of this one
        probe = runner.traced(probe_order, alone, cell.position).records()
        mixing = first_divergence(batch, probe)
        if mixing is not None and mixing.control_flow:
            mixing = None
        if mixing is not None and mixing.index == root.index:
            kind = SAMPLE_MIXING
        elif alone[root.index].drew:
            kind = RNG
        else:
            kind = BATCH_VARIANT_OP
        found.append(_measured(runner, kind, alone, root, cell, [([sample], None), (order, alone)]))
        if mixing is not None and mixing.index != root.index:  # a mixing op behind (or before) the root cause
            found.append(_measured(runner, SAMPLE_MIXING, batch, mixing, cell, [(order, alone), (probe_order, alone)]))
    return found


def _at(records: list[_OpRecord], index: int) -> _OpRecord | None:
    return records[index] if 0 <= index < len(records) else None


def _measured(runner: _Runner, kind: CauseKind, records, divergence: _Divergence, cell: _Cell, runs) -> _CauseFound:
    """The cause at ``records[divergence.index]``, with the deviation of its
    output slice between the two runs it was found in.  ``runs`` is
    ``[(order, alone records or None), ...]``: one capture rerun of each."""
    index = divergence.index
    captured = [
        runner.traced(order, reference, cell.position, frozenset({index})).captured.get(index, [])
        for order, reference in runs
    ]
    cause = _CauseFound(kind, records[index], cell, divergence.inputs)
    worst = None
    for pieces_a, pieces_b in zip(*captured):
        diffs = [tensor_diff("", a, b) for a in pieces_a for b in pieces_b if a.shape == b.shape]
        if not diffs or any(diff is None for diff in diffs):
            continue
        best = min(diffs, key=lambda diff: diff.fraction_differing)
        if worst is None or best.max_abs_diff > worst.max_abs_diff:
            worst = best
    if worst is not None:
        cause.max_abs_diff, cause.max_ulp = worst.max_abs_diff, worst.max_ulp
    return cause


# -- the report ----------------------------------------------------------------------------


def _describe(model_or_fn) -> str:
    if isinstance(model_or_fn, torch.nn.Module):
        return type(model_or_fn).__name__
    return getattr(model_or_fn, "__qualname__", None) or type(model_or_fn).__name__


def _relative(path: str) -> str:
    cwd = os.getcwd()
    return os.path.relpath(path, cwd) if path.startswith(cwd + os.sep) else path


def _explain(kind: CauseKind, op: str, device: str) -> tuple[str, list[str]]:
    """The knowledge base's reason and remedies for a batch-variant, mixing or random op."""
    if kind not in (BATCH_VARIANT_OP, SAMPLE_MIXING, RNG):
        return "", []
    from detaudit.knowledge.batch_ops import load_batch_ops_table

    return load_batch_ops_table().explain(op, device)


def _build_report(target, pool, sizes, dim, alone, cells: list[_Cell], found: list[_CauseFound], skipped) -> BatchReport:
    causes: list[BatchCause] = []
    by_site: dict[tuple, int] = {}
    cell_causes: dict[int, list[int]] = {}
    for item in found:
        record = item.record
        site = (item.kind, record.op, record.path, record.line, record.module)
        number = by_site.get(site)
        if number is None:
            number = by_site[site] = len(causes)
            other = None
            if item.other is not None:
                other = OtherRunOp(
                    reference_outputs=[f"{shape}" for shape in record.output_shapes],
                    op=item.other.op,
                    outputs=[f"{shape}" for shape in item.other.output_shapes],
                    path=_relative(item.other.path),
                    line=item.other.line,
                )
            why, remedies = _explain(item.kind, record.op, record.device)
            causes.append(
                BatchCause(
                    kind=item.kind,
                    op=record.op,
                    path=_relative(record.path),
                    line=record.line,
                    module=record.module,
                    device=record.device,
                    cells=[],
                    why=why,
                    remedies=remedies,
                    inputs=item.inputs,
                    other_side=other,
                )
            )
        cause = causes[number]
        cause.cells.append((item.cell.batch_size, item.cell.position))
        if item.max_abs_diff is not None and (cause.max_abs_diff is None or item.max_abs_diff > cause.max_abs_diff):
            cause.max_abs_diff, cause.max_ulp = item.max_abs_diff, item.max_ulp
        cell_causes.setdefault(id(item.cell), []).append(number)

    report_cells = []
    for cell in cells:
        diffs = list(cell.differing.values())
        report_cells.append(
            BatchCell(
                batch_size=cell.batch_size,
                position=cell.position,
                samples=len(cell.rotations),
                differing=sorted(cell.differing),
                max_abs_diff=max((d.max_abs_diff for d in diffs), default=0.0),
                max_ulp=max((d.max_ulp for d in diffs), default=0),
                fraction_differing=max((d.fraction_differing for d in diffs), default=0.0),
                causes=cell_causes.get(id(cell), []),
            )
        )
    notes = []
    if skipped:
        notes.append(
            "not compared (no per-sample batch dimension in the output): " + ", ".join(sorted(skipped))
        )
    control = [cell for cell in report_cells if cell.batch_size == 1 and not cell.matched]
    if control:
        notes.append(
            "running a sample alone twice gave different outputs: that is run-to-run nondeterminism, "
            "not a batch effect (detaudit run localizes it)"
        )
    unexplained = [cell for cell in report_cells if not cell.matched and not cell.causes]
    if unexplained and found:
        notes.append(f"{len(unexplained)} differing cell(s) had no traced op to blame (outputs computed outside torch ops)")
    from detaudit.runtime.environment import fingerprint

    compared = [name for name in alone[0] if name not in skipped]
    return BatchReport(
        target=target,
        samples=pool.count,
        batch_sizes=sizes,
        dim=dim,
        outputs=compared,
        cells=report_cells,
        root_causes=causes,
        environment=fingerprint(),
        notes=notes,
    )
