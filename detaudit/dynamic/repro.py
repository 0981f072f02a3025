"""``--repro DIR``: a standalone script that reruns one root cause's op.

The first root cause that an op's own kernel explains (a nondeterministic op,
an environment drift, a seeded op's draws in another environment) is rerun alone from the tensors it
read, copied before it ran (``record/op_call.py``: a capture rerun of the run
that showed it).  DIR then holds

    op.pt        the op's name, its arguments (tensors by position), the
                 tensors, the generator state before a seeded op, the devices
                 it ran on, and the digests of the outputs the runs gave
    repro.py     torch only (no detaudit): loads op.pt and calls the op

``python repro.py`` calls it N times (``--times``, default 20) and says
whether the outputs differed between calls and by how much: a run-to-run
cause.  For a drift, it calls it once and prints the output's SHA-256 beside
the reference's and the drifted run's: run on the reference's machine it
gives the first, here the second.  It is the file to attach to a bug report.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from detaudit.dynamic.compare.causes import ENVIRONMENT_DRIFT, NONDETERMINISTIC_OP

#: the kinds whose cause is the op's own kernel: rerunning the op alone on its inputs shows it (an RNG
#: cause's generator state differed between runs: the op itself repeats from one state)
REPRODUCIBLE_KINDS = frozenset({NONDETERMINISTIC_OP, ENVIRONMENT_DRIFT})

SCRIPT = '''"""Repro of {title}, written by `detaudit run --repro`.

{what}
Needs torch only: python repro.py [--times N] [--device DEVICE]
"""
import argparse
import hashlib
import os

import torch

saved = torch.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "op.pt"), weights_only=True)
parser = argparse.ArgumentParser(description="rerun " + saved["op"] + " on the tensors it read")
parser.add_argument("--times", type=int, default=20, help="calls of the op (a drift needs one)")
parser.add_argument("--device", default=None, help="where to run it (default: where it ran, {{devices}})".format(devices=saved["devices"]))
options = parser.parse_args()
device = options.device or next(iter(saved["devices"]), "cpu")
if device.startswith("cuda") and not torch.cuda.is_available():
    print("note: the op ran on", device, "and this machine has no CUDA: running it on the CPU")
    device = "cpu"
namespace, name, overload = saved["op"].split(".")
op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
TAGS = {{"dtype": lambda v: getattr(torch, v), "device": torch.device, "layout": lambda v: getattr(torch, v),
        "memory_format": lambda v: getattr(torch, v), "complex": lambda v: complex(*v)}}


def rebuild(value, tensors):
    if isinstance(value, list):
        return [rebuild(item, tensors) for item in value]
    if isinstance(value, dict):
        if "tensor" in value:
            return tensors[value["tensor"]]
        (tag, text), = value.items()
        return TAGS[tag](text)
    return value


def call():
    tensors = [tensor.clone().to(device) for tensor in saved["inputs"]]
    if saved["rng_state"] is not None:
        torch.set_rng_state(saved["rng_state"])
    result = op(*rebuild(saved["args"], tensors), **{{k: rebuild(v, tensors) for k, v in saved["kwargs"].items()}})
    outputs = [result] if isinstance(result, torch.Tensor) else [t for t in result if isinstance(t, torch.Tensor)]
    return [t.detach().cpu() for t in outputs]


def digest(outputs):
    return hashlib.sha256(b"".join(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for t in outputs)).hexdigest()


def max_abs_diff(a, b):
    return max(((x.double() - y.double()).abs().max().item() for x, y in zip(a, b) if x.numel()), default=0.0)


print(f"{{saved['op']}} on {{device}}, torch {{torch.__version__}}, CPU capability {{torch.backends.cpu.get_cpu_capability()}}")
first = call()
if saved["kind"] == "environment-drift":
    mine = digest(first)
    print("output digest here:     ", mine)
    for label, known in (("the reference's:       ", saved["reference_digest"]), ("the drifted run's:     ", saved["run_digest"])):
        if known:
            print(label, known, "(same as here)" if known == mine else "")
    raise SystemExit(0)
calls = [first] + [call() for _ in range(options.times - 1)]
differing = [index for index, outputs in enumerate(calls) if digest(outputs) != digest(first)]
if differing:
    worst = max(max_abs_diff(first, calls[index]) for index in differing)
    print(f"outputs differ: {{len(differing)}} of {{options.times}} calls gave other bits than the first, max |diff| {{worst:.3g}}")
    raise SystemExit(1)
print(f"outputs identical in all {{options.times}} calls")
'''


def repro_cause(causes):
    """The root cause a repro is written for: the first whose op's own kernel explains it, or None."""
    return next((cause for cause in causes if cause.kind in REPRODUCIBLE_KINDS and cause.record >= 0), None)


def write_repro(folder: str | Path, cause, captured: dict) -> Path:
    """Write ``op.pt`` and ``repro.py`` for ``cause`` into ``folder`` from its
    capture (``captured``: a ``full_capture`` with its ``call``, and for a
    drift the reference's outputs there as ``reference_outputs``, None when
    the reference did not keep them).  Returns the script's path.
    ``ValueError`` when the call cannot be written (an argument of a type a
    repro cannot hold)."""
    import torch

    call = captured.get("call")
    if call is None:
        raise ValueError(f"no call was captured for {cause.op}")
    if call["unsupported"]:
        raise ValueError(f"{cause.op} takes arguments a repro cannot hold ({', '.join(call['unsupported'])})")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    where = f"{cause.path}:{cause.line}" + (f" ({cause.module})" if cause.module else "")
    data = {
        "op": call["op"], "args": call["args"], "kwargs": call["kwargs"], "inputs": captured["inputs"],
        "rng_state": call["rng_state"], "devices": call["devices"], "kind": str(cause.kind), "where": where,
        "reference_digest": _digest(captured.get("reference_outputs")),
        "run_digest": _digest(captured["outputs"]) if cause.kind is ENVIRONMENT_DRIFT else None,
    }
    torch.save(data, folder / "op.pt")
    if cause.kind is ENVIRONMENT_DRIFT:
        what = (
            "A drift: this op gave other bits here than in the reference's environment from the same inputs.\n"
            "It is called once; its output's SHA-256 is printed beside the reference's and the drifted run's."
        )
    else:
        what = (
            "A run-to-run cause: this op gave other bits from the same inputs in two runs.\n"
            "It is called N times on the same inputs; the script says whether the outputs differ (exit 1) or not."
        )
    script = folder / "repro.py"
    script.write_text(SCRIPT.format(title=f"{call['op']} at {where}", what=what), encoding="utf-8")
    return script


def _digest(outputs) -> str | None:
    """SHA-256 of outputs' bytes, as repro.py takes it."""
    if not outputs:
        return None
    import torch

    return hashlib.sha256(
        b"".join(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for t in outputs)
    ).hexdigest()
