"""What the tracer knows of the bytes behind tensors: the storage tables.

Two tables, both keyed by storage and both forgetting a storage once it is
freed:

- for each tensor layout (its storage, offset, dtype, sizes and strides), the
  digest id of its bytes and the versions of the storage at which that digest
  holds: a reader of those bytes reads that digest, and nothing is hashed
  again;
- for each storage, where its contents came from: a traced op wrote them
  (``PRODUCED``), a traced allocation made them and nothing traced wrote them
  yet (``ALLOCATED``), or no traced op made them (``EXTERNAL``), with the
  record that did or that first read them.

``StorageTables`` here is the reference.  ``native/recorder.cpp`` has its
compiled twin, ``native_record.StorageTables``, with the same methods: it keys
storages by their C++ object and keeps no Python object per tensor, and the
compiled recorder reads it without a Python call.  A tracer has one table
object (``tables``), so the two recorders, taking turns within one trace, see
what the other remembered.

Entries of freed storages can never match again (a storage is compared by
identity, and a live weak reference keeps a dead one's identity from being
reused); they are dropped whenever the tables have doubled since the last
time, so in amortized constant time per entry.
"""

from __future__ import annotations

import weakref

import torch

from detaudit.dynamic.compare.trace_format import ALLOCATED, EXTERNAL, PRODUCED, UNINIT

# entries in the tables before freed storages are first dropped.  Small: a dead entry holds its
# storage's C++ object (not its bytes), a few hundred bytes left among the freed tensor memory, and
# thousands of them fragment the heap so that each step's tensors come from fresh pages (with 4096,
# a compiled MLP step took 1,400 page faults against 60 plain, and ran 1.8x slower instead of 1.5x).
MIN_FORGET_AT = 64


def _storage(tensor: torch.Tensor):
    """The tensor's storage; None for a layout without one (sparse, nested...)."""
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


def _layout_key(storage, tensor: torch.Tensor) -> tuple:
    """What a tensor's bytes are: its storage, offset and dtype, then its sizes
    and strides, in one flat tuple (as many strides as sizes: the dimension
    count needs no field of its own), which hashes and compares at a fraction
    of the cost of nested tuples."""
    return (id(storage), tensor.storage_offset(), tensor.dtype, *tensor.shape, *tensor.stride())


def version_of(tensor: torch.Tensor) -> int:
    """The tensor's version counter, which in-place ops bump.  An inference
    tensor (made under ``torch.inference_mode()``) has none, and raises when
    asked: it counts as version 0, changed only by ops the tracer sees (an
    inference tensor cannot be changed outside inference mode, and inside it
    every in-place op is dispatched)."""
    try:
        return tensor._version
    except RuntimeError:
        return 0


class StorageTables:
    def __init__(self):
        # layout key -> (storage ref, first version, last version, digest id)
        self._digests: dict[tuple, tuple] = {}
        self._origins: dict[int, tuple] = {}  # id(storage) -> (storage ref, (kind, record index))
        self._forget_at = MIN_FORGET_AT

    def __len__(self) -> int:
        return len(self._digests) + len(self._origins)

    def has_storage(self, tensor: torch.Tensor) -> bool:
        return _storage(tensor) is not None

    def known(self, tensor: torch.Tensor) -> int | None:
        """The digest id of the tensor's bytes at its current version; None
        when they are not known (or it has no storage)."""
        storage = _storage(tensor)
        if storage is None:
            return None
        entry = self._digests.get(_layout_key(storage, tensor))
        if entry is not None and entry[0]() is storage and entry[1] <= version_of(tensor) <= entry[2]:
            return entry[3]
        return None

    def origin(self, tensor: torch.Tensor, record_index: int) -> tuple:
        """(kind, record index) of where the storage's contents came from; a
        storage no traced op made is external from this record on."""
        storage = _storage(tensor)
        if storage is None:
            return (EXTERNAL, record_index)
        entry = self._origins.get(id(storage))
        if entry is not None and entry[0]() is storage:
            return entry[1]
        origin = (EXTERNAL, record_index)
        self._origins[id(storage)] = (weakref.ref(storage), origin)
        return origin

    def allocated(self, tensor: torch.Tensor, record_index: int) -> None:
        """An allocation op made the tensor: its bytes are uninitialized (``UNINIT``)."""
        storage = _storage(tensor)
        self._origins[id(storage)] = (weakref.ref(storage), (ALLOCATED, record_index))
        self.remember(tensor, version_of(tensor), UNINIT)

    def produced(self, tensor: torch.Tensor, record_index: int, written: bool) -> None:
        """An op wrote the tensor's bytes (``written``: in place); a write to
        part of a storage leaves the rest's known origin."""
        storage = _storage(tensor)
        if written and tensor.nbytes < storage.nbytes():
            entry = self._origins.get(id(storage))
            if entry is not None and entry[0]() is storage:
                return
        self._origins[id(storage)] = (weakref.ref(storage), (PRODUCED, record_index))

    def remember(self, tensor: torch.Tensor, version: int, digest_id: int, written: bool = False) -> None:
        """Readers of the tensor's bytes at ``version`` read ``digest_id``.  An
        in-place op's version bump happens above the tracer's mode, after it
        returns: a ``written`` tensor is current at its version or the next."""
        storage = _storage(tensor)
        if storage is None:
            return
        self._digests[_layout_key(storage, tensor)] = (weakref.ref(storage), version, version + written, digest_id)
        if len(self) > self._forget_at:
            self._forget_dead_storages()

    def forget_digests(self, tensors: list) -> None:
        """The tensors' bytes changed where no version counter saw it (inside a
        wrapper subclass's in-place op): forget every digest known for their storages."""
        written = {id(storage): storage for storage in map(_storage, tensors) if storage is not None}
        for key in [key for key, entry in self._digests.items() if written.get(key[0]) is entry[0]()]:
            del self._digests[key]

    def _forget_dead_storages(self) -> None:
        for table in (self._digests, self._origins):
            dead = [key for key, entry in table.items() if entry[0]() is None]
            for key in dead:
                del table[key]
        self._forget_at = max(MIN_FORGET_AT, 2 * len(self))
