"""What the tracer knows about an aten op overload, worked out once from its schema.

Which ops allocate (their output is uninitialized memory by definition),
which arguments an op writes, which it reads only as its own scratch space
or only overwrites (recorded ``UNREAD``: their bytes are not data the op
reads), whether it returns Python values or is a view, and whether the
compiled recorder may record it or leaves it to Python; and how an op's
arguments and results are held in the trace (non-tensor values as text,
nested lists flattened).
"""

from __future__ import annotations

import torch

from detaudit.dynamic.compare.trace_format import UNREAD, python_value_meta
from detaudit.dynamic.record.collectives import Communications

# Ops whose output is uninitialized memory by definition (every nn.Linear
# starts from one): never compared, never reported.
ALLOCATION_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"})
# Arguments through which an op reads its own scratch space, by schema name:
# the buffer a forward kernel hands its backward (mkldnn_rnn_layer_backward's
# workspace, cudnn/miopen RNN and batch-norm backward's reserve).  Only the
# kernel knows which of its bytes it wrote, and some it never does.
SCRATCH_ARGUMENTS = frozenset({"workspace", "reserve", "reserveSpace"})
# In-place ops that replace all of ``self`` without reading it.
OVERWRITING_OPS = frozenset({
    "copy_", "fill_", "zero_", "set_",
    "uniform_", "normal_", "random_", "bernoulli_", "exponential_", "geometric_", "cauchy_", "log_normal_",
})
_TENSOR_RETURNS = frozenset({"Tensor", "Optional[Tensor]", "List[Tensor]"})
# schema types whose values may be lists or tuples (what flatten_args opens)
_CONTAINER_KINDS = frozenset({"ListType", "TupleType", "AnyType", "DictType", "UnionType"})
_UNTRACED_NAMESPACES = frozenset({"profiler"})  # record_function markers: no data


def mark_unread(info: "OpInfo", args, kwargs, flat_args: list, inputs: list, leaves: list) -> None:
    """Record the arguments whose bytes the op does not read (``OpInfo.unread_args``)
    as ``UNREAD`` inputs."""
    unread = {
        id(value)
        for index, name in info.unread_args
        for value in ((args[index] if index < len(args) else kwargs.get(name)),)
        if isinstance(value, torch.Tensor)
    }
    positions = [p for p, v in enumerate(v for v in flat_args if isinstance(v, torch.Tensor)) if id(v) in unread]
    for position in positions:
        inputs[position] = UNREAD
    leaves[:] = [leaf for leaf in leaves if leaf[0] not in positions]



class OpInfo:
    """What the tracer needs to know about an op overload, computed once."""

    # a compiled graph's (compiled_graphs.py): called with its arguments' list, which it empties;
    # among its outputs, some of its inputs themselves
    boxed = returns_inputs = False

    def __init__(self, func):
        schema = func._schema
        self.name = str(func)
        self.op = func  # held: its id keys this info
        # what running it calls: an OpOverload's __call__ is one more Python frame around its C++ op
        self.call = func._op if type(func) is torch._ops.OpOverload else func
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
        # scratch space by name, ``self`` of an op that overwrites it, ``out=`` tensors
        overwrites_self = func._opname in OVERWRITING_OPS
        self.unread_args = [
            (index, argument.name)
            for index, argument in enumerate(schema.arguments)
            if (argument.name in SCRATCH_ARGUMENTS and str(argument.type) == "Tensor")
            or (argument.alias_info is not None and argument.alias_info.is_write
                and (argument.kwarg_only or (index == 0 and overwrites_self)))
        ]
        self.returns_python = any(str(ret.type) not in _TENSOR_RETURNS for ret in schema.returns)
        self.communicates = Communications.handles(func)
        # a storage's bytes are data the op reads: torch.load's tensors enter through set_(storage)
        self.reads_storage = any(argument.type.kind() == "StorageType" for argument in schema.arguments)
        self.python_only = self.communicates or self.reads_storage  # what the compiled recorder leaves to record()
        self.untraced = func.namespace in _UNTRACED_NAMESPACES
        # no list argument: the arguments need no flattening; one plain
        # return: the results are the result alone
        self.flat_args = not any(_is_container(argument.type) for argument in schema.arguments)
        self.single_result = len(schema.returns) == 1 and not _is_container(schema.returns[0].type)


def _is_container(schema_type) -> bool:
    """Whether an argument or return of this schema type can be a list or tuple."""
    if schema_type.kind() == "OptionalType":
        schema_type = schema_type.getElementType()
    return schema_type.kind() in _CONTAINER_KINDS


# -- an op's arguments and results as the trace holds them ------------------

PLAIN_ARG_TYPES = (int, float, bool, str, complex, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def plain_text(value) -> str:
    """A non-tensor argument or result as text that is equal across processes
    (objects whose repr carries an address are reduced to their type)."""
    return repr(value) if isinstance(value, PLAIN_ARG_TYPES) else type(value).__name__


def flatten_args(values, into: list) -> list:
    """Append the leaves of nested lists/tuples (the only containers in aten
    arguments and results) to ``into``; much cheaper than pytree per op."""
    for value in values:
        if type(value) is list or type(value) is tuple:
            flatten_args(value, into)
        else:
            into.append(value)
    return into


def storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A storage argument as the tensor of its bytes, so that it is an input like any other."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def is_tensor_or_none(value) -> bool:
    return value is None or isinstance(value, torch.Tensor)


def result_meta(value) -> str:
    """``out_meta`` of a non-tensor result: an absent tensor, or a Python value's type."""
    return "None" if value is None else python_value_meta(type(value).__name__)
