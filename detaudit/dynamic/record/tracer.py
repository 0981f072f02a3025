"""Op-level tracer: one record per aten op, with on-device digests.

``OpTracer`` is a context manager holding a ``TorchDispatchMode`` that sees
every aten op (forward, backward, optimizer) and records its name, phase, user
source line, module path, output shapes/dtypes, a digest of its non-tensor
arguments, and digest ids of its tensor inputs and of its outputs: tensors, and
the Python values an op returns (``.item()``'s number is data, not shape
information).  It also maps each autograd node an op creates (by ``grad_fn``
sequence number) to that op's site, so backward ops are attributed to the
user's forward line (on CUDA, backward runs on autograd threads where no user
frame exists).

Digests (``digests.py``) are taken on the spot on CPU; on other devices they
are staged there until ``flush()``, called once per optimizer step: no per-op
host sync.  Inputs are mostly earlier outputs: they are looked up by storage,
layout and version counter instead of being hashed again
(``storage_tables.py``); only leaves are hashed.  A storage argument
(``set_(storage)``, how ``torch.load`` makes its tensors) is read as the
tensor of its bytes.  Outputs of allocation ops and of view ops are not
hashed (garbage, respectively an alias of something hashed: a view as large
as its input takes over the input's digest, a smaller one is hashed if read).
With ``allocation_fill`` set (``detaudit run`` gives each run its own number)
an allocation's memory is filled with that number, so a read of it changes
the reader's output in every run, not only when the allocator happens to hand
back different bytes.

What an op reads is the data the comparison follows from producer to
reader.  Arguments an op only uses as scratch space or only overwrites are
recorded ``UNREAD`` (``op_info.py``), equal in every run: a difference in
them counts only through the outputs it changes.  Python reads of tensor
data, calls that set the generator state and tensors received from other
processes are seen outside the dispatcher (``outside_dispatch.py``).  At the
end, ``note_final_state`` records the digest id of each tensor of the final
state, so the comparison can tell which differences reached it.

Only the process that entered the tracer is traced.  A forked child (a
DataLoader worker) inherits the modes: the tracer pauses for good there.
``OpTracer.record`` is the reference recorder; ``native/`` holds its compiled
twin for the common op (new recording semantics go into Python first, then
into the twin; ``tests/test_dynamic_native.py`` holds the two to the same
trace).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
import types
import weakref
import zlib
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from detaudit.dynamic.compare.trace_format import (
    ALLOCATED,
    BACKWARD,
    EXTERNAL,
    FORWARD,
    OPTIMIZER,
    PRODUCED,
    PYTHON_READS,
    SETUP,
    UNINIT,
    UNREAD,
    OpRecord,
    RngEvent,
    python_value_meta,
    TraceWriter,
)
from detaudit.dynamic.record import native
from detaudit.dynamic.record.collectives import EARLY_READ_FIELDS, Communications
from detaudit.dynamic.record.digests import (
    CHUNK_MULTIPLIER,
    CHUNK_WORDS,
    CRC_MAX_BYTES,
    WEIGHT_MULTIPLIER,
    DeviceDigests,
    full_capture,
    host_digest,
    inner_tensors,
    is_wrapper,
    rng_state_digest,
    sampled_capture,
)
from detaudit.dynamic.record.dynamo import never_compiled, skips_dynamo_per_call
from detaudit.dynamic.record.op_call import op_call
from detaudit.dynamic.record.op_info import (
    PLAIN_ARG_TYPES,
    OpInfo,
    flatten_args,
    is_tensor_or_none,
    mark_unread,
    plain_text,
    result_meta,
    storage_bytes,
)
from detaudit.dynamic.record.outside_dispatch import OutsideDispatch
from detaudit.dynamic.record.storage_tables import MIN_FORGET_AT, StorageTables, version_of
from detaudit.knowledge.backend_settings import backend_settings
from detaudit.launch.watcher import RESUMABLE_CODE, USER_FILES, StopRun, UserFrames, is_user_file, user_frame
from detaudit.runtime.settings import reader

_STAGE_LIMIT = 8192  # flush early when this many digests wait on the device
_TRACING_GC_THRESHOLD = 10_000  # the youngest generation's threshold while tracing (see OpTracer.__enter__)
_ENTERED_TRACERS: "weakref.WeakSet[OpTracer]" = weakref.WeakSet()
_current_autograd_node = torch._C._current_autograd_node
_is_grad_enabled = torch.is_grad_enabled


def _pause_in_forked_child() -> None:
    """A forked child's ops are not the traced process's ops, and its own op
    count must never reach a capture index (StopRun would end the child)."""
    for tracer in _ENTERED_TRACERS:
        tracer.paused = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pause_in_forked_child)


@functools.lru_cache(maxsize=1024)  # (a trace names a few source files, each many times)
def relative_path(filename: str, cwd: str) -> str:
    """A source path as reports show it: relative to the run's working directory when under it."""
    return os.path.relpath(filename, cwd) if filename.startswith(cwd + os.sep) else filename


def _torch_fill_switches() -> list[tuple]:
    """(getter, safe value) of the settings table's fill-uninitialized-memory
    and of the setting it requires: torch fills allocations itself while all
    of them hold their safe values."""
    settings = backend_settings()
    fill = settings["fill-uninitialized-memory"]
    switches = [fill] + ([settings[fill.matters.requires]] if fill.matters.requires else [])
    readers = [(reader(torch, setting), setting.safe) for setting in switches]
    # a torch without one of them never fills: the tracer always does
    return readers if all(read is not None for read, _ in readers) else [(lambda: False, True)]


def _phase_outside_autograd(watcher) -> str:
    """An op no autograd node runs: the optimizer's, the setup's (before any
    forward, backward or step: the model and data being built) or forward."""
    if watcher is None:
        return FORWARD
    if watcher.in_optimizer:
        return OPTIMIZER
    return FORWARD if watcher.training_started else SETUP


def _compiled_recorder():
    """The compiled recorder's module, configured once per process with what it
    reads of this module (``native_constants``); None where it cannot be had."""
    global _configured_recorder
    module = native.load()
    if module is not None and module is not _configured_recorder:
        module.configure(native_constants())
        _configured_recorder = module
    return module


_configured_recorder = None


def native_constants() -> dict:
    """What the compiled recorder (native/recorder.cpp) reads of this module, given once at its load."""
    return {
        "plain_types": PLAIN_ARG_TYPES, "parameter_type": torch.nn.Parameter, "crc32": zlib.crc32,
        "result_meta": result_meta, "forward": FORWARD, "backward": BACKWARD, "optimizer": OPTIMIZER, "setup": SETUP,
        "produced": PRODUCED, "allocated": ALLOCATED, "external": EXTERNAL, "uninit": UNINIT, "unread": UNREAD,
        "crc_max_bytes": CRC_MAX_BYTES, "stage_limit": _STAGE_LIMIT, "min_forget_at": MIN_FORGET_AT,
        "weight_multiplier": WEIGHT_MULTIPLIER, "chunk_words": CHUNK_WORDS, "chunk_multiplier": CHUNK_MULTIPLIER,
        "user_files": USER_FILES, "is_user_file": is_user_file, "resumable_code": RESUMABLE_CODE,
    }


class _OpRecorder(TorchDispatchMode):
    """``native_record``: the compiled recorder's module, None to record every op in Python."""

    def __init__(self, tracer: "OpTracer", native_record):
        super().__init__()
        self.tracer = tracer
        if native_record is not None:  # the compiled twin of the method below
            self._native_state = native_record.bind(tracer)
            self.__torch_dispatch__ = types.MethodType(native_record.dispatch, self)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return skips_dynamo_per_call()  # see never_compiled

    @never_compiled
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.tracer.paused:
            return func(*args, **(kwargs or {}))
        return self.tracer.record(func, args, kwargs or {}, sys._getframe().f_back)


class _CompiledRegionsRecorder(_OpRecorder):
    """The recorder when compiled graphs are traced at their boundary
    (``compiled_graphs.py``): dynamo compiles while it is active, and turns it
    off while compiling."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


class OpTracer:
    """``device_digests=True`` takes every digest the way a GPU does (a
    position-weighted sum on the tensor's device, staged until ``flush()``),
    also for CPU tensors: the CUDA digest path, testable without a GPU.
    ``compiled=False`` records every op in Python (``record``) even where the
    compiled recorder (``native``) can be loaded.  ``trace_compiled=True`` lets
    ``torch.compile``'d regions run compiled, one record per graph call
    (``compiled_graphs.py``; ``keep_graphs`` and ``on_graph_capture`` are its
    bisection's); otherwise they run eagerly, op by op."""

    # The containers this tracer makes in __init__ (records, digests, the
    # staged digests, the storage tables, ...) are mutated in place, never
    # replaced: the compiled recorder holds them from the start.
    def __init__(
        self, capture_ops=(), sampled_ops=(), device_digests: bool = False, allocation_fill: int | None = None,
        compiled: bool = True, call_of: int | None = None,
        trace_compiled: bool = False, keep_graphs: bool = False, on_graph_capture=None,
    ):
        self._host_digests = not device_digests  # CPU tensors get host_digest()
        self.records: list[tuple] = []  # OpRecord fields as plain tuples (see record()); None once written
        self._writer: TraceWriter | None = None  # the trace file records go to as the run goes (stream_to)
        self._written = 0  # records written to it
        self._cwd = os.getcwd()  # the run's working directory, which trace.json's source paths are relative to
        self.digests: list[int] = []  # host digests; a digest id indexes this list once flushed
        self._staged: list[torch.Tensor | int] = []
        self._staged_on_device: list[int] = []  # positions in _staged of the digests that wait on a device
        native_record = _compiled_recorder() if compiled else None
        # which recorder records the common op, as the run report says it
        self.recorder = "compiled" if native_record is not None else (
            f"python ({native.unavailable_reason() if compiled else 'compiled=False'})"
        )
        # what is known of the bytes behind tensors; the compiled twin where the compiled recorder runs
        self.tables = native_record.StorageTables() if native_record is not None else StorageTables()
        self._froze_gc = False
        self._forward_sites: dict[int, tuple] = {}  # grad_fn sequence nr -> (file, line, module)
        # (weak references to the output tensors, (file, line, module)) of the last op run with grad mode on
        self._last_outputs: tuple | None = None
        self._user_frames = UserFrames()  # the user frame above the frame that dispatches an op
        self._op_info: dict[int, OpInfo] = {}  # id(op overload) -> what is known of it (an OpOverload hashes in Python)
        self._out_meta: dict[tuple, str] = {}  # (dtype, shape) -> "float32[2, 3]"
        self._device_digests = DeviceDigests()
        self.rng_events: list[RngEvent] = []  # calls that set the generator state
        self.compile_calls: dict[tuple, None] = {}  # (call, file, line) of torch.compile calls, in order, once each
        self._outside_dispatch = OutsideDispatch(self)  # RNG setters, receivers, Python reads
        self.capture_ops = set(capture_ops)
        self.call_of = call_of  # of capture_ops: also keep how this record's op was called (op_call)
        self.sampled_ops = set(sampled_ops)  # of capture_ops: keep only a sample of the outputs (output_sample)
        self.final: dict[str, int] = {}  # final-state tensor name -> digest id (note_final_state)
        # what allocation ops' memory is filled with (a number per run), so a
        # read of uninitialized memory differs between runs every time instead
        # of when the allocator happens to hand back different bytes; None
        # leaves the bytes as they are
        self.allocation_fill = allocation_fill
        # (read, safe value) of the settings under which torch fills allocations itself
        self._torch_fill_switches = _torch_fill_switches() if allocation_fill is not None else []
        self.captured: dict[int, dict] = {}
        self.watcher = None
        # set while detaudit itself runs torch ops (flush, state capture) or
        # rebuilds received tensors, and for good in a forked child: a pause
        # must restore, not clear, it
        self.paused = False
        # (phase, file, line, module) of the op this tracer is handing to the
        # modes below it, None while it runs ops of its own (digests,
        # captures): a mode below (the test-only fault injector) acts on the
        # user's ops only
        self.dispatching: tuple | None = None
        # told of each record as it is traced and of each flush (online_capture.OnlineCapture); None: nobody
        self.observer = None
        self.communications = Communications(self)  # torch.distributed's ops, completed when waited on
        self.compiled_graphs = None  # CompiledGraphs: the graphs torch.compile made, when they run compiled
        recorder = _OpRecorder
        if trace_compiled:
            from detaudit.dynamic.record.compiled_graphs import CompiledGraphs

            self.compiled_graphs = CompiledGraphs(self, keep_graphs=keep_graphs, on_capture=on_graph_capture)
            recorder = _CompiledRegionsRecorder
        self._modes = [recorder(self, native_record)]  # last: the compiled recorder binds the state above

    def attach(self, watcher) -> None:
        self.watcher = watcher

    @contextlib.contextmanager
    def untraced(self):
        """Run detaudit's own torch work (digests, copies, reading state) outside
        the trace; restores, not clears, a pause already on (a forked child's is for good)."""
        paused, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = paused

    def __enter__(self):
        # A full garbage collection walks every object torch and dynamo
        # created (80-150 ms here), and the objects the tracer keeps per op
        # trigger one every few thousand ops: freeze what exists now so
        # collections only walk what was made while tracing.  (Unless the
        # program froze objects itself: then its choice stands.)
        self._froze_gc = gc.get_freeze_count() == 0
        if self._froze_gc:
            gc.freeze()
        # The trace keeps a few tracked objects per op (its storage tables'
        # weak references, the storages' Python objects): at the default
        # threshold the youngest generation is collected every ~100 ops and
        # a full collection follows every ~10,000.  Collect less often while
        # tracing (cyclic garbage waits for up to this many new objects).
        self._gc_threshold = gc.get_threshold()
        gc.set_threshold(max(self._gc_threshold[0], _TRACING_GC_THRESHOLD), *self._gc_threshold[1:])
        self._outside_dispatch.install()
        if self.compiled_graphs is not None:
            self.compiled_graphs.install()
        self.communications.patch_wait(self._outside_dispatch.patched)
        for mode in self._modes:
            mode.__enter__()
        _ENTERED_TRACERS.add(self)
        return self

    def __exit__(self, *exc_info):
        _ENTERED_TRACERS.discard(self)
        for mode in reversed(self._modes):
            mode.__exit__(*exc_info)
        self._user_frames.forget()
        self._last_outputs = None
        self._outside_dispatch.remove()
        if self.compiled_graphs is not None:
            self.compiled_graphs.remove()
        gc.set_threshold(*self._gc_threshold)
        if self._froze_gc:
            gc.unfreeze()
        self.flush()

    # -- generator state changes -------------------------------------------

    def note_rng_state_change(self, name: str, caller) -> None:
        frame = user_frame(caller)
        with self.untraced():  # reading the state is detaudit's business, not the trace's
            state = rng_state_digest()
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

    def note_compile(self, call: str, caller) -> None:
        frame = user_frame(caller)
        self.compile_calls[(call, frame.f_code.co_filename if frame else "", frame.f_lineno if frame else 0)] = None

    # -- reads outside the dispatcher ----------------------------------------
    def note_python_read(self, call: str, tensors: list) -> None:
        """One record per tensor whose data Python reads without an aten op:
        its input is the tensor, and so is its output (the value Python got is
        a function of the tensor alone)."""
        phase, filename, line, module = self._site(sys._getframe(2))  # the frame that called the read
        for tensor in tensors:
            record_index = len(self.records)
            with self.untraced():  # a digest taken here is detaudit's own work
                digest_id, origin = self._input_ref(tensor, record_index)
            self.records.append(
                (
                    call,
                    phase,
                    filename,
                    line,
                    module,
                    self.watcher.steps + 1 if self.watcher else 1,
                    (python_value_meta(PYTHON_READS[call]),),
                    0,
                    (digest_id,),
                    (digest_id,),
                    ((0, *origin),) if origin is not None else (),
                    False,
                )
            )
            if self.observer is not None:
                self.observer.python_read(record_index, tensor)
            if record_index in self.capture_ops:
                with self.untraced():  # (outside the dispatcher: the copy is not the run's)
                    copy = tensor.detach().to("cpu", copy=True)
                self.captured[record_index] = {"inputs": [copy], "outputs": [copy]}
                if len(self.captured) == len(self.capture_ops):
                    raise StopRun()

    def note_final_state(self, state: dict) -> None:
        """The digest id of each tensor of the run's final state (name -> tensor)."""
        with self.untraced():
            self.final = {name: self._input_ref(tensor, len(self.records))[0] for name, tensor in state.items()}

    # -- attribution -------------------------------------------------------
    def note_forward_sites(self) -> None:
        """Map the autograd nodes of the last op's outputs to its site.

        Autograd gives an op's outputs their ``grad_fn`` above this mode,
        after the op returns: they are read when the next op is dispatched
        (before its own autograd node changes them, which happens after it
        returns too).  Only for an op run with grad mode on: the outputs of a
        custom ``autograd.Function``'s forward, which runs with it off, get
        the Function's node, which stays unattributed (its backward's ops are
        the user's own lines)."""
        if self._last_outputs is None:
            return
        outputs, site = self._last_outputs
        self._last_outputs = None
        for output in outputs:
            tensor = output()
            grad_fn = None if tensor is None else tensor.grad_fn
            if grad_fn is not None:
                # an existing node (an in-place op's input passed through) keeps its site
                self._forward_sites.setdefault(grad_fn._sequence_nr(), site)

    def site_of(self, caller) -> tuple[str, str, int, str]:
        return self._site(caller)

    def _site(self, caller) -> tuple[str, str, int, str]:
        """(phase, file, line, module) of the op being dispatched; ``caller``:
        the frame that dispatched it (None: no Python frame did)."""
        node = _current_autograd_node()
        if node is not None:
            site = self._forward_sites.get(node._sequence_nr())
            if site is not None:
                return (BACKWARD, *site)
            phase = BACKWARD
        else:
            phase = _phase_outside_autograd(self.watcher)
        frame = self._user_frames.find(caller)
        module = self.watcher.current_module if self.watcher else ""
        if frame is None:
            return phase, "", 0, module
        return phase, frame.f_code.co_filename, frame.f_lineno, module

    # -- digests -----------------------------------------------------------
    def _stage_value_digest(self, value) -> int:
        """Digest id of a Python value an op returned (a number is exact in its repr)."""
        digest_id = len(self.digests) + len(self._staged)
        self._staged.append(zlib.crc32(plain_text(value).encode()))
        return digest_id

    def _stage_digest(self, tensor: torch.Tensor) -> int:
        digest_id = len(self.digests) + len(self._staged)
        try:
            if tensor.is_meta:  # a shape without data (a model built on the meta device)
                raise NotImplementedError
            if tensor.is_cpu and self._host_digests:
                self._staged.append(host_digest(tensor))
            else:
                digest = self._device_digests.digest(tensor)
                self._staged_on_device.append(len(self._staged))
                self._staged.append(digest)
        except (RuntimeError, TypeError, KeyError, NotImplementedError):  # sparse, meta, exotic: shape only
            self._staged.append(zlib.crc32(f"{tensor.dtype}{list(tensor.shape)}".encode()))
        return digest_id

    def stage_digest(self, tensor: torch.Tensor) -> int:
        """Digest id of ``tensor``, staged as an op output's is (on its device
        until ``flush()``; then ``digests[id]``).  For recorders that digest
        other tensors than the trace's, such as the per-sample slices of
        ``detaudit.dynamic.batch.audit``."""
        return self._stage_digest(tensor)

    def digest(self, tensor: torch.Tensor) -> int:
        """The digest this tracer takes of ``tensor``, staged and flushed as on its hot path."""
        digest_id = self._stage_digest(tensor)
        self.flush()
        return self.digests[digest_id]

    def flush(self) -> None:
        """Copy the staged digests to the host: one transfer per device."""
        if not self._staged:
            return
        values = self._staged[:]
        on_device = self._staged_on_device[:]
        # in place: the compiled recorder holds these lists
        self._staged.clear()
        self._staged_on_device.clear()
        by_device: dict[torch.device, list[int]] = {}
        for position in on_device:
            by_device.setdefault(values[position].device, []).append(position)
        with self.untraced():
            for positions in by_device.values():
                host = torch.stack([values[p] for p in positions]).cpu().tolist()
                for position, value in zip(positions, host):
                    values[position] = value
            self.digests.extend(values)
            if self.observer is not None:
                self.observer.flushed()

    def known_digest(self, digest_id: int) -> int | None:
        """The digest with id ``digest_id`` (>= 0) once it is on the host; None
        while it waits on its device for ``flush()``."""
        flushed = len(self.digests)
        if digest_id < flushed:
            return self.digests[digest_id]
        value = self._staged[digest_id - flushed]
        return None if isinstance(value, torch.Tensor) else value

    def _input_ref(self, tensor: torch.Tensor, record_index: int) -> tuple[int, tuple | None]:
        """(digest id, leaf origin or None) of an input, hashing it only if no
        traced op produced it in its current version."""
        tables = self.tables
        digest_id = tables.known(tensor)
        if digest_id is not None:
            # an untouched allocation is reported with its origin: reading it is a bug
            return digest_id, (tables.origin(tensor, record_index) if digest_id == UNINIT else None)
        origin = tables.origin(tensor, record_index)
        digest_id = self._stage_digest(tensor)
        tables.remember(tensor, version_of(tensor), digest_id)
        return digest_id, origin

    def _output_ref(
        self, tensor: torch.Tensor, info: OpInfo, record_index: int, written: bool, view_of: tuple | None
    ) -> int | None:
        """Digest id of an output; None for a view, which is no new data.
        ``view_of`` is (tensor, digest id) of a view op's first input."""
        tables = self.tables
        if not tables.has_storage(tensor):
            return self._stage_digest(tensor)
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
                tables.remember(tensor, version_of(view_of[0]), view_of[1])
            return None
        if info.is_allocation:
            tables.allocated(tensor, record_index)
            return UNINIT
        if info.returns_inputs and not written:
            # an input handed back as it was (a compiled forward returns the parameters and
            # inputs its backward reads): the same bytes, with the digest they already have
            known = tables.known(tensor)
            if known is not None:
                return known
        tables.produced(tensor, record_index, written)
        digest_id = self._stage_digest(tensor)
        tables.remember(tensor, version_of(tensor), digest_id, written)
        return digest_id

    # -- the record --------------------------------------------------------
    def _fill_allocation(self, tensor) -> None:
        """Fill an allocation op's output with this run's number, unless torch
        fills it itself (deterministic algorithms with fill_uninitialized_memory:
        then what it reads is the same in every run, and so is the audit's verdict)."""
        if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
            return
        if all(read() == safe for read, safe in self._torch_fill_switches):
            return
        value = self.allocation_fill % 2 if tensor.dtype == torch.bool else self.allocation_fill
        try:
            with torch.no_grad():
                tensor.fill_(value)
        except (RuntimeError, NotImplementedError):  # quantized and other exotic dtypes keep their bytes
            pass

    def _meta(self, tensor: torch.Tensor) -> str:
        key = (tensor.dtype, tensor.shape)
        meta = self._out_meta.get(key)
        if meta is None:
            meta = self._out_meta[key] = f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"
        return meta

    def register_op_info(self, info) -> None:
        """Record calls of ``info`` (an ``OpInfo`` look-alike passed to ``record`` as the op: a compiled graph's)."""
        self._op_info[id(info)] = info

    def _info(self, func) -> OpInfo:
        info = self._op_info.get(id(func))
        if info is None:
            info = self._op_info[id(func)] = OpInfo(func)
        return info

    @never_compiled  # (also called from the compiled recorder, outside __torch_dispatch__)
    def record(self, func, args, kwargs, caller, site: tuple | None = None):
        """Run and record one op; ``caller``: the frame that dispatched it (None: no Python frame did);
        ``site``: its (phase, file, line, module) when the caller knows better (a compiled graph's call)."""
        info = self._op_info.get(id(func)) or self._info(func)
        if info.untraced:
            return info.call(*args, **kwargs)
        if info.communicates:
            return self.communications.record(func, info, args, kwargs, caller)
        record_index = len(self.records)
        if self._last_outputs is not None:
            self.note_forward_sites()
        if site is None:
            site = self._site(caller)
        if info.flat_args:
            flat_args = (*args, *kwargs.values()) if kwargs else args
        else:
            flat_args = flatten_args(kwargs.values(), flatten_args(args, [])) if kwargs else flatten_args(args, [])
        if info.reads_storage:
            flat_args = [storage_bytes(value) if isinstance(value, torch.UntypedStorage) else value for value in flat_args]
        if self.communications.pending:
            self.communications.before_op(func, flat_args, caller)
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
                plain.append(plain_text(value))
        if info.unread_args:
            mark_unread(info, args, kwargs, flat_args, inputs, leaves)
        capture = record_index in self.capture_ops
        sample = capture and record_index in self.sampled_ops
        if capture and not sample:
            captured_inputs = [v.detach().to("cpu", copy=True) for v in flat_args if isinstance(v, torch.Tensor)]
            if record_index == self.call_of:  # a repro's op: how it was called, and the generator it drew from
                with self.untraced():
                    rng_state = torch.get_rng_state() if info.is_seeded else None
                    call = op_call(info.name, args, kwargs, rng_state)
        if self.observer is not None:
            self.observer.before_op(record_index, flat_args, inputs, leaves)
        if info.boxed:
            # A compiled graph frees each input after its last use, from the list it is handed
            # (the boxed convention): holding them here would keep every saved activation alive
            # through the whole backward, a memory peak the plain run does not have.
            kept_inputs = [args[index] for index, _ in info.written_args]  # read again after the call
            value = flat_args = view_of = None

        self.dispatching = site
        try:
            result = info.call(args) if info.boxed else info.call(*args, **kwargs)
        finally:
            self.dispatching = None

        if info.is_allocation and self.allocation_fill is not None:
            self._fill_allocation(result)
        flat_result = (result,) if info.single_result else flatten_args((result,), [])
        if info.written_args:
            if info.boxed:
                written = kept_inputs
            else:
                written = [args[index] if index < len(args) else kwargs.get(name) for index, name in info.written_args]
            if not info.flat_args:  # a written list of tensors (the _foreach_ ops')
                written = flatten_args(written, [])
            written = [item for item in written if isinstance(item, torch.Tensor)]
            inside_wrappers = [t for item in written if is_wrapper(item) for t in inner_tensors(item)]
            if inside_wrappers:
                # a wrapper's in-place op (DTensor's: FSDP2's init and optimizer) writes the
                # tensors inside it below autograd, with no version bump: their digests are stale
                self.tables.forget_digests(inside_wrappers)
            out_tensors = list({id(t): t for t in [*flat_result, *written] if isinstance(t, torch.Tensor)}.values())
            written_ids = {id(t) for t in written}
        else:
            out_tensors = [t for t in flat_result if isinstance(t, torch.Tensor)]
            if len(out_tensors) > 1:
                out_tensors = list({id(t): t for t in out_tensors}.values())
            written_ids = ()
        if site[1] and _is_grad_enabled():  # from a user line: its nodes' backward ops are attributed to it
            # weakly: an output this mode still holds when it returns is detached by torch (a factory's)
            self._last_outputs = ([weakref.ref(tensor) for tensor in out_tensors], site[1:])
        outputs = []
        for tensor in out_tensors:
            digest_id = self._output_ref(tensor, info, record_index, id(tensor) in written_ids, view_of)
            if digest_id is not None:
                outputs.append(digest_id)
        if info.single_result:
            out_meta = (self._meta(result) if isinstance(result, torch.Tensor) else result_meta(result),)
        else:
            out_meta = tuple(self._meta(v) if isinstance(v, torch.Tensor) else result_meta(v) for v in flat_result)
        if info.returns_python:
            outputs += [self._stage_value_digest(v) for v in flat_result if not is_tensor_or_none(v)]
        # OpRecord's fields as a plain tuple of atomic values and tuples: the
        # garbage collector stops tracking it, so full collections do not walk
        # the whole trace (with lists they cost more than the tracing itself
        # on small ops).  It keeps tracking a tuple subclass such as OpRecord:
        # trace_data() makes those, once, at the end.
        self.records.append(
            (
                info.name,
                *site,
                self.watcher.steps + 1 if self.watcher else 1,
                out_meta,
                zlib.crc32("\x1f".join(plain).encode()) if plain else 0,
                tuple(inputs),
                tuple(outputs),
                tuple(leaves),
                info.is_seeded,
            )
        )
        if self.observer is not None:
            self.observer.after_op(record_index, out_tensors, flat_result)
        if capture:
            if sample:
                self.captured[record_index] = sampled_capture(out_tensors)
            else:
                self.captured[record_index] = full_capture(captured_inputs, out_tensors, flat_result)
                if record_index == self.call_of:
                    self.captured[record_index]["call"] = call
                if self.compiled_graphs is not None:
                    self.captured[record_index].update(self.compiled_graphs.captured(info, captured_inputs))
            if len(self.captured) == len(self.capture_ops):
                raise StopRun()  # everything asked for is captured: the rest of the run is not needed
        if len(self._staged) >= _STAGE_LIMIT:
            self.flush()
        return result

    # -- output ------------------------------------------------------------
    def trace_data(self) -> dict:
        """The fields of the ``Trace``, with source paths relative to the working directory."""
        assert self._writer is None, "the records went to the trace file (stream_to)"
        self.flush()
        return {
            "ops": [OpRecord._make(self._relative(record)) for record in self.records],
            "digests": self.digests,
            "rng_events": [event._replace(path=relative_path(event.path, self._cwd)) for event in self.rng_events],
            "final": self.final,
        }

    def stream_to(self, trace_file: Path) -> None:
        """Write the records to ``trace_file`` as the run goes (``write_settled``)
        instead of holding them all until ``save``."""
        self._writer = TraceWriter(trace_file)

    def write_settled(self) -> None:
        """Write the records that nothing can change any more to the trace file,
        and let go of them: a long run holds its last step's records, not all.
        A record stays until its digests are on the host (``flush``) and, for
        a communication, until it has arrived (its received digests go into
        its record).  Their slots stay, as None: a record's index is its position."""
        if self._writer is None:
            return
        self.flush()
        settled = self.communications.first_waiting(default=len(self.records))
        if settled > self._written:
            self._writer.write_ops(self._relative(self.records[i]) for i in range(self._written, settled))
            self.records[self._written : settled] = [None] * (settled - self._written)  # in place: C++ holds the list
            self._written = settled

    def _relative(self, record: tuple) -> tuple:
        """A record with its source path relative to the working directory the run started in."""
        return (*record[:2], relative_path(record[2], self._cwd), *record[3:])

    def compile_payload(self) -> dict:
        """What the report's compiled section and warnings read (``verdict/compiled.py``): the
        torch.compile calls seen, and the graphs that ran compiled."""
        cwd = self._cwd + os.sep
        payload = {}
        if self.compile_calls:
            payload["compile_calls"] = [
                {"call": call, "path": path.removeprefix(cwd), "line": line} for call, path, line in self.compile_calls
            ]
        if self.compiled_graphs is not None:
            payload["compiled"] = self.compiled_graphs.payload(cwd)
        return payload

    def save(self, output_dir: Path) -> dict:
        """Write trace.json (and capture.pt); returns their paths for the payload."""
        if self._writer is None:
            self.stream_to(Path(output_dir) / "trace.json")
        self.write_settled()
        self._writer.write_ops(self._relative(record) for record in self.records[self._written :])
        rng_events = [event._replace(path=relative_path(event.path, self._cwd)) for event in self.rng_events]
        self._writer.close(self.digests, rng_events, self.final)
        files = {"trace_file": str(self._writer.path)}
        cwd = self._cwd + os.sep
        if self.communications.early_reads:
            files["early_reads"] = [
                {**dict(zip(EARLY_READ_FIELDS, read)), "path": read[2].removeprefix(cwd)}
                for read in self.communications.early_reads
            ]
        files.update(self.compile_payload())
        if self.captured:
            capture_file = Path(output_dir) / "capture.pt"
            torch.save(self.captured, capture_file)
            files["capture_file"] = str(capture_file)
        return files
