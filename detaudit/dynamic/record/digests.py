"""How the tracer turns a tensor's bytes into a digest, and what it keeps of a tensor.

Digests are position-sensitive and cover every dtype.  On CPU a digest is
taken from the tensor's bytes in logical order with numpy and zlib, on the
spot (``host_digest``: CPU ops are synchronous anyway, and one pass over the
bytes without a temporary is several times cheaper than torch arithmetic on
them).  On other devices it is a sum of the element bits times odd position
weights (``DeviceDigests``: any single-element change shows), computed on the
device and left there for the tracer to stage until its next flush.  The
final state's digests (``final_state.py``) and the replicas' digests of a
distributed run are taken by ``host_digest`` too.  ``full_capture`` and
``sampled_capture`` are what the tracer keeps of a record whose tensors a
comparison needs.
"""

from __future__ import annotations

import ctypes
import zlib

import numpy
import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from detaudit.dynamic.record import native

# elements kept of each output of a sampled capture (the divergence chart's
# deviations): up to 32 KiB a tensor, whatever the model's size
SAMPLE_ELEMENTS = 4096
_WEIGHT_MULTIPLIER = 0x9E3779B97F4A7C15 - (1 << 64)  # golden-ratio constant as a signed int64
_DEVICE_WEIGHT_STEP = (2 * _WEIGHT_MULTIPLIER + (1 << 63)) % (1 << 64) - (1 << 63)  # as int64; weight(i) = i * step + 1
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# the CPU digest (host_digest): CRC-32 up to this size, then weighted 64-bit words, in chunks;
# word i of a chunk weighs i * WEIGHT_MULTIPLIER | 1 (odd: every word counts).  The compiled
# recorder computes the same (native/recorder.cpp's chunked_words_digest, given these constants)
CRC_MAX_BYTES = 16 * 1024
CHUNK_WORDS = 1 << 18  # 2 MiB of weights: stays in cache while the data streams past
WEIGHT_MULTIPLIER = _WEIGHT_MULTIPLIER % (1 << 64)
CHUNK_MULTIPLIER = 0x100000001B3  # FNV-64 prime: chunk order matters
_HOST_WEIGHTS = numpy.arange(CHUNK_WORDS, dtype=numpy.uint64) * numpy.uint64(WEIGHT_MULTIPLIER) | numpy.uint64(1)
_BYTE_ARRAYS: dict[int, type] = {}  # size -> ctypes.c_char * size, made once (more than a small CRC's cost)
_UINT64_MASK = (1 << 64) - 1
# Tensor.numpy as torch defines it (the tracer records the user's calls: PYTHON_READS)
_TENSOR_NUMPY = torch.Tensor.numpy
# dtypes Tensor.numpy() converts; the others (bfloat16, float8, unsigned ints
# wider than a byte on older torch) are read through a uint8 view
_NUMPY_DTYPES = frozenset(
    {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
     torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128}
)


def inner_tensors(wrapper: torch.Tensor) -> list[torch.Tensor]:
    """The tensors a wrapper subclass (DTensor ...) holds its data in."""
    names, _ = wrapper.__tensor_flatten__()
    inner = [getattr(wrapper, name) for name in names]  # (newer torch also lists a DeviceMesh here)
    return [t for t in inner if isinstance(t, torch.Tensor)]


def is_wrapper(tensor: torch.Tensor) -> bool:
    """Whether a tensor is a wrapper subclass (DTensor ...): its data are tensors inside it."""
    return type(tensor) is not torch.Tensor and type(tensor) is not torch.nn.Parameter and is_traceable_wrapper_subclass(tensor)


def host_digest(tensor: torch.Tensor) -> int:
    """Digest of a CPU tensor's bytes in logical (row-major) order: position-
    sensitive, any dtype, equal across processes.  Small tensors get a CRC-32;
    larger ones a sum of their 64-bit words times odd position weights (one
    pass, no temporary, about 3x faster than CRC-32 in numpy and 4x more
    compiled), taken in chunks so the weights stay small and cached.

    A contiguous tensor's bytes are read in place, at their address: through a
    ctypes view for a CRC, by the compiled recorder's ``words_digest`` for the
    weighted sum once this process has loaded it.  They are the bytes
    ``Tensor.numpy`` would show (conj and neg bits aside, which go the long
    way), without its several microseconds of checks and array building.

    A wrapper subclass (DTensor, the tensors FSDP2 and others make) holds no
    bytes of its own: its digest is that of the tensors inside it (a DTensor's
    is this rank's shard)."""
    if is_wrapper(tensor):
        return zlib.crc32(b"".join(host_digest(t).to_bytes(8, "little") for t in inner_tensors(tensor)))
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if not (tensor.is_conj() or tensor.is_neg()):
        size = tensor.nbytes
        if size < CRC_MAX_BYTES:
            array_type = _BYTE_ARRAYS.get(size) or _BYTE_ARRAYS.setdefault(size, ctypes.c_char * size)
            return zlib.crc32(array_type.from_address(tensor.data_ptr()))
        compiled = native.loaded()
        if compiled is not None:  # the same digest, about 4x faster where the CPU has AVX-512
            address, words = tensor.data_ptr(), size // 8
            # the CRC-32 of the last 0-7 bytes (0 for none, as zlib.crc32(b"") is)
            tail = zlib.crc32(ctypes.string_at(address + 8 * words, size % 8)) if size % 8 else 0
            return compiled.words_digest(address, words, tail, WEIGHT_MULTIPLIER, CHUNK_WORDS, CHUNK_MULTIPLIER)
    if tensor.dtype not in _NUMPY_DTYPES:
        tensor = tensor.resolve_conj().reshape(-1).view(torch.uint8)
    data = host_array(tensor, force=True)  # force: detach, resolve conj/neg bits
    if data.nbytes < CRC_MAX_BYTES:
        return zlib.crc32(data)
    return _words_digest(data)


def _words_digest(data: numpy.ndarray) -> int:
    """``host_digest`` of the bytes of ``data`` (``CRC_MAX_BYTES`` or more), in
    numpy: the compiled recorder's ``words_digest`` computes the same."""
    data = data.reshape(-1).view(numpy.uint8)
    words = data[: data.size // 8 * 8].view(numpy.uint64)
    digest = zlib.crc32(data[words.size * 8 :])  # the last 0-7 bytes
    for start in range(0, words.size, CHUNK_WORDS):
        chunk = words[start : start + CHUNK_WORDS]
        digest = (digest * CHUNK_MULTIPLIER + int(numpy.dot(chunk, _HOST_WEIGHTS[: chunk.size]))) & _UINT64_MASK
    return digest


def output_sample(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU copy of up to ``SAMPLE_ELEMENTS`` elements of ``tensor``, at
    evenly spaced positions of its logical order that depend only on its size
    (so two runs sample the same elements); all of a smaller tensor."""
    try:
        flat = tensor.detach().reshape(-1)
    except (RuntimeError, NotImplementedError):  # sparse and other layouts without a flat view: nothing
        return torch.empty(0)
    stride = -(-flat.numel() // SAMPLE_ELEMENTS)
    return (flat[::stride] if stride > 1 else flat).to("cpu", copy=True)


def full_capture(inputs: list, outputs: list, results: list) -> dict:
    """A capture of one record: CPU copies of its tensor inputs (as they were
    before the op) and outputs, then its Python number results as tensors."""
    return {
        "inputs": inputs,
        "outputs": [t.detach().to("cpu", copy=True) for t in outputs]
        + [torch.tensor(v) for v in results if isinstance(v, (bool, int, float, complex))],
    }


def sampled_capture(outputs: list) -> dict:
    """A sampled capture of one record: ``output_sample`` of each tensor output, with its size."""
    return {"outputs": [output_sample(t) for t in outputs], "sampled_from": [t.numel() for t in outputs]}


def host_array(tensor: torch.Tensor, **kwargs) -> numpy.ndarray:
    """``tensor.numpy()`` for detaudit's own use: torch function modes would
    hand the call to whatever ``Tensor.numpy`` is now, the tracer's record of
    a user's read (``PYTHON_READS``)."""
    with torch._C.DisableTorchFunction():
        return _TENSOR_NUMPY(tensor, **kwargs)



def rng_state_digest() -> int:
    """Digest of the global generators' state (CPU, and CUDA once initialized)."""
    states = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.extend(torch.cuda.get_rng_state_all())
    digest = 0
    for state in states:
        digest = zlib.crc32(host_array(state), digest)
    return digest


class DeviceDigests:
    """Digests of tensors on any device, taken there: no host sync per op.
    The position weights are made once per device and integer type."""

    def __init__(self):
        self._weights: dict[tuple, torch.Tensor] = {}  # (device, int dtype) -> position weights

    def position_weights(self, count: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Weights ``i * step + 1`` (step = twice an odd constant) for
        positions 0..count-1, in the bits' own integer type: the products
        wrap in that type, and odd weights keep every single-element change
        visible (an odd number is invertible modulo any power of two); modulo
        2^k these weights are distinct for any two positions below 2^(k-1),
        so that swapping two elements shows too."""
        weights = self._weights.get((device, dtype))
        if weights is None or weights.numel() < count:
            size = max(count, 2 * (0 if weights is None else weights.numel()), 1024)
            weights = (torch.arange(size, dtype=torch.int64, device=device) * _DEVICE_WEIGHT_STEP + 1).to(dtype)
            self._weights[(device, dtype)] = weights
        return weights[:count]

    def digest(self, tensor: torch.Tensor) -> torch.Tensor:
        """Position-weighted sum of the element bits, left on the tensor's device."""
        flat = tensor.resolve_conj().resolve_neg().reshape(-1)
        if flat.is_complex():
            flat = torch.view_as_real(flat).reshape(-1)
        bits = flat.view(_INT_OF_SIZE[flat.element_size()])
        if bits.element_size() < 4:
            # modulo 2^8 or 2^16 weights repeat every 128 or 32,768 positions:
            # two swapped bytes (a uint8 image batch in another order) would cancel
            bits = bits.to(torch.int32)
        return (bits * self.position_weights(bits.numel(), bits.device, bits.dtype)).sum(dtype=torch.int64)

