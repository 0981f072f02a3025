"""An op's call as data, for a standalone repro (``detaudit run --repro``).

``op_call`` turns the arguments an aten op was called with into a structure
``torch.load(weights_only=True)`` reads back: tensors become ``{"tensor": i}``
(the i-th of the capture's inputs, copied before the op ran), dtypes,
devices, layouts and memory formats tagged strings, numbers, strings, None
and lists as themselves.  ``unsupported`` names the types of arguments
that could not be written (a Generator, an arbitrary object): then no repro
is written.  The repro script (``dynamic/repro.py``) rebuilds the call from it.
"""

from __future__ import annotations

import torch

_TAGGED = {torch.dtype: "dtype", torch.device: "device", torch.layout: "layout", torch.memory_format: "memory_format"}


def op_call(name: str, args: tuple, kwargs: dict, rng_state: torch.Tensor | None) -> dict:
    """The call of op ``name`` (``aten.add.Tensor``) with ``args``/``kwargs``;
    ``rng_state``: the CPU generator's state before a seeded op."""
    counter = [0]
    unsupported: list[str] = []
    devices: set[str] = set()
    encoded_args = [_encode(value, counter, unsupported, devices) for value in args]
    encoded_kwargs = {key: _encode(value, counter, unsupported, devices) for key, value in kwargs.items()}
    return {
        "op": name,
        "args": encoded_args,
        "kwargs": encoded_kwargs,
        "rng_state": rng_state,
        "devices": sorted(devices),
        "unsupported": unsupported,
    }


def _encode(value, counter: list[int], unsupported: list[str], devices: set[str]):
    if isinstance(value, torch.Tensor):
        devices.add(str(value.device))
        counter[0] += 1
        return {"tensor": counter[0] - 1}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    if isinstance(value, (list, tuple)):
        return [_encode(item, counter, unsupported, devices) for item in value]
    for kind, tag in _TAGGED.items():
        if isinstance(value, kind):
            return {tag: str(value).removeprefix("torch.")}
    unsupported.append(type(value).__name__)
    return None
