"""Op-level tracer: one record per aten op, with on-device digests.

``OpTracer`` is a context manager holding two torch modes:

* a ``TorchDispatchMode`` that sees every aten op (forward, backward,
  optimizer) and records its name, phase, user source line, module path,
  output shapes/dtypes, a digest of its non-tensor arguments, and digest ids of
  its tensor inputs and outputs;
* a ``TorchFunctionMode`` that maps each autograd node (by ``grad_fn``
  sequence number) to the forward call site that created it, so backward ops
  are attributed to the user's forward line (on CUDA, backward runs on autograd
  threads where no user frame exists).

Digests are position-sensitive and cover every dtype.  On CPU a digest is
taken from the tensor's bytes in logical order with numpy and zlib, on the spot
(CPU ops are synchronous anyway, and one pass over the bytes without a
temporary is several times cheaper than torch arithmetic on them).  On other devices it is a sum of the
element bits times odd position weights (so any single-element change shows),
computed on the device and staged there until ``flush()``, called once per
optimizer step: no per-op host sync.  Inputs are mostly earlier outputs: they
are looked up by storage, layout and version counter instead of being hashed
again; only leaves are hashed.  Outputs of allocation ops and of view ops are
not hashed (garbage, respectively an alias of something hashed: a view as large
as its input takes over the input's digest, a smaller one is hashed if read).

Calls that change the torch generator state (``torch.seed()``,
``torch.manual_seed``, ``torch.set_rng_state``..., named by the knowledge base)
are recorded with their user line and a digest of the state they left, so an
RNG root cause can say where the state came to differ.

Only the process that entered the tracer is traced.  A forked child (a
DataLoader worker) inherits the modes: the tracer pauses for good there.  A
tensor received from another process is rebuilt whenever the data happens to
arrive, so the rebuilding runs untraced: the tensor enters the trace as an
external input where it is first read.
"""

from __future__ import annotations

import functools
import gc
import importlib
import os
import sys
import weakref
import zlib
from pathlib import Path

import numpy
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from detaudit.dynamic.trace_format import (
    ALLOCATED,
    BACKWARD,
    EXTERNAL,
    FORWARD,
    OPTIMIZER,
    PRODUCED,
    UNINIT,
    OpRecord,
    RngEvent,
    Trace,
)
from detaudit.dynamic.watch import StopRun, user_frame
from detaudit.knowledge.apis import RESEED_FROM_ENTROPY, RNG_STATE_RESTORERS, SEED_PARAMETERS

# Ops whose output is uninitialized memory by definition (every nn.Linear
# starts from one): never compared, never reported.
ALLOCATION_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"})
_UNTRACED_NAMESPACES = frozenset({"profiler"})  # record_function markers: no data
_STAGE_LIMIT = 8192  # flush early when this many digests wait on the device
_MIN_FORGET_AT = 4096  # entries in the storage tables before freed storages are first dropped
_WEIGHT_MULTIPLIER = 0x9E3779B97F4A7C15 - (1 << 64)  # golden-ratio constant as a signed int64
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_PLAIN_ARG_TYPES = (int, float, bool, str, complex, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
# the CPU digest (host_digest): CRC-32 up to this size, then weighted 64-bit words
_CRC_MAX_BYTES = 16 * 1024
_CHUNK_WORDS = 1 << 18  # 2 MiB of weights: stays in cache while the data streams past
_HOST_WEIGHTS = numpy.arange(_CHUNK_WORDS, dtype=numpy.uint64) * numpy.uint64(_WEIGHT_MULTIPLIER % (1 << 64)) | numpy.uint64(1)
_CHUNK_MULTIPLIER = 0x100000001B3  # FNV-64 prime: chunk order matters
_UINT64_MASK = (1 << 64) - 1
# dtypes Tensor.numpy() converts; the others (bfloat16, float8, unsigned ints
# wider than a byte on older torch) are read through a uint8 view
_NUMPY_DTYPES = frozenset(
    {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
     torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128}
)
# torch functions that set the global torch generators' state, as "module.function"
_RNG_STATE_SETTERS = tuple(
    sorted(
        name
        for name in {*RESEED_FROM_ENTROPY, *SEED_PARAMETERS, *RNG_STATE_RESTORERS}
        if name.startswith("torch.")
    )
)

# torch's ``rebuild_*`` functions here make the tensors received from other processes
_RECEIVING_MODULE = "torch.multiprocessing.reductions"
_ENTERED_TRACERS: "weakref.WeakSet[OpTracer]" = weakref.WeakSet()


def _pause_in_forked_child() -> None:
    """A forked child's ops are not the traced process's ops, and its own op
    count must never reach a capture index (StopRun would end the child)."""
    for tracer in _ENTERED_TRACERS:
        tracer.paused = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pause_in_forked_child)


def _plain(value) -> str:
    """A non-tensor argument or result as text that is equal across processes
    (objects whose repr carries an address are reduced to their type)."""
    return repr(value) if isinstance(value, _PLAIN_ARG_TYPES) else type(value).__name__


def _flatten(values, into: list) -> list:
    """Append the leaves of nested lists/tuples (the only containers in aten
    arguments and results) to ``into``; much cheaper than pytree per op."""
    for value in values:
        if type(value) is list or type(value) is tuple:
            _flatten(value, into)
        else:
            into.append(value)
    return into


def host_digest(tensor: torch.Tensor) -> int:
    """Digest of a CPU tensor's bytes in logical (row-major) order: position-
    sensitive, any dtype, equal across processes.  Small tensors get a CRC-32;
    larger ones a sum of their 64-bit words times odd position weights (a
    numpy integer dot product: one pass, no temporary, about 3x faster than
    CRC-32), taken in chunks so the weights stay small and cached."""
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if tensor.dtype not in _NUMPY_DTYPES:
        tensor = tensor.resolve_conj().reshape(-1).view(torch.uint8)
    data = tensor.numpy(force=True)  # force: detach, resolve conj/neg bits
    if data.nbytes < _CRC_MAX_BYTES:
        return zlib.crc32(data)
    data = data.reshape(-1).view(numpy.uint8)
    words = data[: data.size // 8 * 8].view(numpy.uint64)
    digest = zlib.crc32(data[words.size * 8 :])  # the last 0-7 bytes
    for start in range(0, words.size, _CHUNK_WORDS):
        chunk = words[start : start + _CHUNK_WORDS]
        digest = (digest * _CHUNK_MULTIPLIER + int(numpy.dot(chunk, _HOST_WEIGHTS[: chunk.size]))) & _UINT64_MASK
    return digest


def _rng_state_digest() -> int:
    """Digest of the global generators' state (CPU, and CUDA once initialized)."""
    states = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.extend(torch.cuda.get_rng_state_all())
    digest = 0
    for state in states:
        digest = zlib.crc32(state.numpy(), digest)
    return digest


class _OpInfo:
    """What the tracer needs to know about an op overload, computed once."""

    def __init__(self, func):
        schema = func._schema
        self.name = str(func)
        self.is_allocation = func._opname in ALLOCATION_OPS
        self.is_seeded = torch.Tag.nondeterministic_seeded in func.tags
        self.written_args = [
            (index, argument.name)
            for index, argument in enumerate(schema.arguments)
            if argument.alias_info is not None and argument.alias_info.is_write
        ]
        self.is_view = any(
            ret.alias_info is not None and not ret.alias_info.is_write for ret in schema.returns
        )


class _ForwardSites(TorchFunctionMode):
    def __init__(self, tracer: "OpTracer"):
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if self.tracer.paused:
            return result
        if isinstance(result, torch.Tensor) and result.grad_fn is not None:
            self.tracer.note_forward_site(result.grad_fn)
        elif isinstance(result, (tuple, list)):
            for item in result:
                if isinstance(item, torch.Tensor) and item.grad_fn is not None:
                    self.tracer.note_forward_site(item.grad_fn)
        return result


class _OpRecorder(TorchDispatchMode):
    def __init__(self, tracer: "OpTracer"):
        super().__init__()
        self.tracer = tracer

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # By default torch wraps __torch_dispatch__ in torch._dynamo.disable,
        # which costs about 0.5 us on every op; this handler is never
        # compiled, and torch.compile'd code still runs under the mode without it.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.tracer.paused or func.namespace in _UNTRACED_NAMESPACES:
            return func(*args, **(kwargs or {}))
        return self.tracer.record(func, args, kwargs or {})


class OpTracer:
    def __init__(self, capture_ops=()):
        self.records: list[tuple] = []  # OpRecord fields as plain tuples (see record())
        self.digests: list[int] = []  # host digests; a digest id indexes this list once flushed
        self._staged: list[torch.Tensor | int] = []
        self._tensor_digest: dict[tuple, tuple] = {}  # layout key -> (storage ref, version, digest id)
        # id(storage) -> (storage ref, (PRODUCED, ALLOCATED or EXTERNAL, record index))
        self._storage_origin: dict[int, tuple] = {}
        self._forget_at = _MIN_FORGET_AT  # table size at which entries of freed storages are dropped
        self._froze_gc = False
        self._forward_sites: dict[int, tuple] = {}  # grad_fn sequence nr -> (file, line, module)
        self._op_info: dict = {}
        self._out_meta: dict[tuple, str] = {}  # (dtype, shape) -> "float32[2, 3]"
        self._weights: dict[tuple, torch.Tensor] = {}  # (device, int dtype) -> position weights
        self.rng_events: list[RngEvent] = []  # calls that set the generator state
        self._in_rng_setter = False  # torch.manual_seed calls torch.cuda.manual_seed_all: record the outer call
        self._patched: list[tuple] = []  # (module, attribute, original function): RNG setters, receivers
        self.capture_ops = set(capture_ops)
        self.captured: dict[int, dict] = {}
        self.watcher = None
        # set while detaudit itself runs torch ops (flush, state capture) or
        # rebuilds received tensors, and for good in a forked child: a pause
        # must restore, not clear, it
        self.paused = False
        self._modes = [_ForwardSites(self), _OpRecorder(self)]

    def attach(self, watcher) -> None:
        self.watcher = watcher

    def __enter__(self):
        # A full garbage collection walks every object torch and dynamo
        # created (80-150 ms here), and the objects the tracer keeps per op
        # trigger one every few thousand ops: freeze what exists now so
        # collections only walk what was made while tracing.  (Unless the
        # program froze objects itself: then its choice stands.)
        self._froze_gc = gc.get_freeze_count() == 0
        if self._froze_gc:
            gc.freeze()
        self._patch_rng_setters()
        self._patch_receivers()
        for mode in self._modes:
            mode.__enter__()
        _ENTERED_TRACERS.add(self)
        return self

    def __exit__(self, *exc_info):
        _ENTERED_TRACERS.discard(self)
        for mode in reversed(self._modes):
            mode.__exit__(*exc_info)
        self._unpatch()
        if self._froze_gc:
            gc.unfreeze()
        self.flush()

    # -- generator state changes -------------------------------------------
    def _patch_rng_setters(self) -> None:
        for name in _RNG_STATE_SETTERS:
            module_name, attribute = name.rsplit(".", 1)
            module = importlib.import_module(module_name)
            original = getattr(module, attribute, None)
            if original is not None:
                self._patched.append((module, attribute, original))
                setattr(module, attribute, self._recording_setter(name, original))

    def _patch_receivers(self) -> None:
        module = importlib.import_module(_RECEIVING_MODULE)
        for attribute, original in list(vars(module).items()):
            if attribute.startswith("rebuild_") and callable(original):
                self._patched.append((module, attribute, original))
                setattr(module, attribute, self._untraced(original))

    def _unpatch(self) -> None:
        while self._patched:
            module, attribute, original = self._patched.pop()
            setattr(module, attribute, original)

    def _untraced(self, function):
        tracer = self

        @functools.wraps(function)  # keeps its name: pickle refers to it by name
        def untraced(*args, **kwargs):
            paused, tracer.paused = tracer.paused, True
            try:
                return function(*args, **kwargs)
            finally:
                tracer.paused = paused

        return untraced

    def _recording_setter(self, name: str, setter):
        tracer = self

        @functools.wraps(setter)
        def recording_setter(*args, **kwargs):
            if tracer._in_rng_setter or tracer.paused:
                return setter(*args, **kwargs)
            tracer._in_rng_setter = True
            try:
                result = setter(*args, **kwargs)
            finally:
                tracer._in_rng_setter = False
            tracer.note_rng_state_change(name, sys._getframe(1))
            return result

        return recording_setter

    def note_rng_state_change(self, name: str, caller) -> None:
        frame = user_frame(caller)
        paused, self.paused = self.paused, True  # reading the state is detaudit's business, not the trace's
        try:
            state = _rng_state_digest()
        finally:
            self.paused = paused
        self.rng_events.append(
            RngEvent(
                call=name,
                path=frame.f_code.co_filename if frame else "",
                line=frame.f_lineno if frame else 0,
                step=self.watcher.steps + 1 if self.watcher else 1,
                before_op=len(self.records),
                state=state,
            )
        )

    # -- attribution -------------------------------------------------------
    def _module(self) -> str:
        return self.watcher.current_module if self.watcher else ""

    def note_forward_site(self, grad_fn) -> None:
        sequence_nr = grad_fn._sequence_nr()
        if sequence_nr in self._forward_sites:  # an existing tensor passed through (dropout in eval mode)
            return
        frame = user_frame(sys._getframe(1))
        if frame is not None:
            self._forward_sites[sequence_nr] = (frame.f_code.co_filename, frame.f_lineno, self._module())

    def _site(self) -> tuple[str, str, int, str]:
        """(phase, file, line, module) of the op being dispatched."""
        node = torch._C._current_autograd_node()
        if node is not None:
            site = self._forward_sites.get(node._sequence_nr())
            if site is not None:
                return (BACKWARD, *site)
            phase = BACKWARD
        else:
            phase = OPTIMIZER if self.watcher and self.watcher.in_optimizer else FORWARD
        frame = user_frame(sys._getframe(1))
        if frame is None:
            return phase, "", 0, self._module()
        return phase, frame.f_code.co_filename, frame.f_lineno, self._module()

    # -- digests -----------------------------------------------------------
    def _position_weights(self, count: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Odd weights 0..count-1 in the bits' own integer type: the products
        wrap in that type, which keeps every single-element change visible
        (an odd weight is invertible modulo any power of two) without first
        widening the bits to int64."""
        weights = self._weights.get((device, dtype))
        if weights is None or weights.numel() < count:
            size = max(count, 2 * (0 if weights is None else weights.numel()), 1024)
            weights = (torch.arange(size, dtype=torch.int64, device=device) * _WEIGHT_MULTIPLIER | 1).to(dtype)
            self._weights[(device, dtype)] = weights
        return weights[:count]

    def _device_digest(self, tensor: torch.Tensor) -> torch.Tensor:
        """Position-weighted sum of the element bits, left on the tensor's device."""
        flat = tensor.reshape(-1)
        if flat.is_complex():
            flat = torch.view_as_real(flat).reshape(-1)
        bits = flat.view(_INT_OF_SIZE[flat.element_size()])
        return (bits * self._position_weights(bits.numel(), bits.device, bits.dtype)).sum(dtype=torch.int64)

    def _stage_digest(self, tensor: torch.Tensor) -> int:
        digest_id = len(self.digests) + len(self._staged)
        try:
            self._staged.append(host_digest(tensor) if tensor.is_cpu else self._device_digest(tensor))
        except (RuntimeError, TypeError, KeyError, NotImplementedError):  # sparse, meta, exotic: shape only
            self._staged.append(zlib.crc32(f"{tensor.dtype}{list(tensor.shape)}".encode()))
        return digest_id

    def flush(self) -> None:
        """Copy the staged digests to the host: one transfer per device."""
        if not self._staged:
            return
        staged, self._staged = self._staged, []
        values: list = list(staged)
        by_device: dict[torch.device, list[int]] = {}
        for position, digest in enumerate(staged):
            if isinstance(digest, torch.Tensor):
                by_device.setdefault(digest.device, []).append(position)
        paused, self.paused = self.paused, True
        try:
            for positions in by_device.values():
                host = torch.stack([staged[p] for p in positions]).cpu().tolist()
                for position, value in zip(positions, host):
                    values[position] = value
        finally:
            self.paused = paused
        self.digests.extend(values)

    @staticmethod
    def _layout_key(tensor: torch.Tensor, storage) -> tuple:
        return (id(storage), tensor.storage_offset(), tensor.shape, tensor.stride(), tensor.dtype)

    def _input_ref(self, tensor: torch.Tensor, record_index: int) -> tuple[int, tuple | None]:
        """(digest id, leaf origin or None) of an input, hashing it only if no
        traced op produced it in its current version."""
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return self._stage_digest(tensor), (EXTERNAL, record_index)
        known = self._tensor_digest.get(self._layout_key(tensor, storage))
        if known is not None and known[0]() is storage and tensor._version in known[1]:
            # an untouched allocation is reported with its origin: reading it is a bug
            return known[2], (self._origin(storage, record_index) if known[2] == UNINIT else None)
        origin = self._origin(storage, record_index)
        digest_id = self._stage_digest(tensor)
        self._remember(tensor, storage, digest_id)
        return digest_id, origin

    def _origin(self, storage, record_index: int) -> tuple:
        """Where a storage's contents came from; a storage no traced op made is external."""
        entry = self._storage_origin.get(id(storage))
        if entry is not None and entry[0]() is storage:
            return entry[1]
        origin = (EXTERNAL, record_index)
        self._storage_origin[id(storage)] = (weakref.ref(storage), origin)
        return origin

    def _forget_dead_storages(self) -> None:
        """Drop what is known about storages that were freed (they can never
        match again); called when the tables have doubled, so amortized O(1)."""
        self._tensor_digest = {key: entry for key, entry in self._tensor_digest.items() if entry[0]() is not None}
        self._storage_origin = {key: entry for key, entry in self._storage_origin.items() if entry[0]() is not None}
        self._forget_at = max(_MIN_FORGET_AT, 2 * (len(self._tensor_digest) + len(self._storage_origin)))

    def _remember(
        self, tensor: torch.Tensor, storage, digest_id: int, written: bool = False, version: int | None = None
    ) -> None:
        # An in-place op's version bump happens above this mode, after it
        # returns: a written tensor is current at its version or the next.
        version = tensor._version if version is None else version
        versions = (version, version + 1) if written else (version,)
        self._tensor_digest[self._layout_key(tensor, storage)] = (weakref.ref(storage), versions, digest_id)
        if len(self._tensor_digest) + len(self._storage_origin) > self._forget_at:
            self._forget_dead_storages()

    def _output_ref(
        self, tensor: torch.Tensor, info: _OpInfo, record_index: int, written: bool, view_of: tuple | None
    ) -> int | None:
        """Digest id of an output; None for a view, which is no new data.
        ``view_of`` is (tensor, digest id) of a view op's first input."""
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return self._stage_digest(tensor)
        if info.is_allocation:
            self._storage_origin[id(storage)] = (weakref.ref(storage), (ALLOCATED, record_index))
            self._remember(tensor, storage, UNINIT)
            return UNINIT
        if info.is_view and not written:
            # A view is a function of its input and of the view op's
            # arguments, which are compared in this record: when it is at
            # least as large as its input (t, permute, view, expand, detach:
            # it reads all of it), its readers use the input's digest instead
            # of copying a strided view to hash it.  A smaller view (slice,
            # select) is hashed when read, so that a reader is not blamed for
            # a difference elsewhere in the input.
            # (A view gets its input's version counter above this mode, after
            # it returns: here it still has a fresh one.)
            if view_of is not None and tensor.numel() >= view_of[0].numel():
                self._remember(tensor, storage, view_of[1], version=view_of[0]._version)
            return None
        covers_storage = tensor.numel() * tensor.element_size() >= storage.nbytes()
        origin_entry = self._storage_origin.get(id(storage))
        if not written or covers_storage or origin_entry is None or origin_entry[0]() is not storage:
            self._storage_origin[id(storage)] = (weakref.ref(storage), (PRODUCED, record_index))
        digest_id = self._stage_digest(tensor)
        self._remember(tensor, storage, digest_id, written)
        return digest_id

    # -- the record --------------------------------------------------------
    def _meta(self, tensor: torch.Tensor) -> str:
        key = (tensor.dtype, tensor.shape)
        meta = self._out_meta.get(key)
        if meta is None:
            meta = self._out_meta[key] = f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"
        return meta

    def record(self, func, args, kwargs):
        info = self._op_info.get(func)
        if info is None:
            info = self._op_info[func] = _OpInfo(func)
        record_index = len(self.records)
        phase, filename, line, module = self._site()
        flat_args = _flatten(kwargs.values(), _flatten(args, [])) if kwargs else _flatten(args, [])
        inputs, leaves, plain = [], [], []
        view_of = None
        for value in flat_args:
            if isinstance(value, torch.Tensor):
                digest_id, origin = self._input_ref(value, record_index)
                if origin is not None:
                    leaves.append((len(inputs), *origin))
                if not inputs and info.is_view:
                    view_of = (value, digest_id)
                inputs.append(digest_id)
            else:
                plain.append(_plain(value))
        capture = record_index in self.capture_ops
        if capture:
            captured_inputs = [v.detach().to("cpu", copy=True) for v in flat_args if isinstance(v, torch.Tensor)]

        result = func(*args, **kwargs)

        written = [
            item
            for index, name in info.written_args
            for item in _flatten((args[index] if index < len(args) else kwargs.get(name),), [])
            if isinstance(item, torch.Tensor)
        ]
        flat_result = _flatten((result,), [])
        out_tensors = list({id(t): t for t in [*flat_result, *written] if isinstance(t, torch.Tensor)}.values())
        written_ids = {id(t) for t in written}
        outputs = [self._output_ref(t, info, record_index, id(t) in written_ids, view_of) for t in out_tensors]
        out_meta = tuple(self._meta(v) if isinstance(v, torch.Tensor) else _plain(v) for v in flat_result)
        # OpRecord's fields as a plain tuple of atomic values and tuples: the
        # garbage collector stops tracking it, so full collections do not walk
        # the whole trace (with lists they cost more than the tracing itself
        # on small ops).  It keeps tracking a tuple subclass such as OpRecord:
        # trace_data() makes those, once, at the end.
        self.records.append(
            (
                info.name,
                phase,
                filename,
                line,
                module,
                self.watcher.steps + 1 if self.watcher else 1,
                out_meta,
                zlib.crc32("\x1f".join(plain).encode()),
                tuple(inputs),
                tuple(o for o in outputs if o is not None),
                tuple(leaves),
                info.is_seeded,
            )
        )
        if capture:
            self.captured[record_index] = {
                "inputs": captured_inputs,
                "outputs": [t.detach().to("cpu", copy=True) for t in out_tensors],
            }
            if len(self.captured) == len(self.capture_ops):
                raise StopRun()  # everything asked for is captured: the rest of the run is not needed
        if len(self._staged) >= _STAGE_LIMIT:
            self.flush()
        return result

    # -- output ------------------------------------------------------------
    def trace_data(self) -> dict:
        """The fields of the ``Trace``, with source paths relative to the working directory."""
        self.flush()
        cwd = os.getcwd()

        @functools.lru_cache(maxsize=None)
        def relative(filename: str) -> str:
            return os.path.relpath(filename, cwd) if filename.startswith(cwd + os.sep) else filename

        return {
            "ops": [OpRecord(op, phase, relative(path), *rest) for op, phase, path, *rest in self.records],
            "digests": self.digests,
            "rng_events": [event._replace(path=relative(event.path)) for event in self.rng_events],
        }

    def save(self, output_dir: Path) -> dict:
        """Write trace.json (and capture.pt); returns their paths for the payload."""
        trace_file = Path(output_dir) / "trace.json"
        Trace(**self.trace_data()).save(trace_file)
        files = {"trace_file": str(trace_file)}
        if self.captured:
            capture_file = Path(output_dir) / "capture.pt"
            torch.save(self.captured, capture_file)
            files["capture_file"] = str(capture_file)
        return files
