"""Backend settings that trade reproducibility for speed: cuDNN autotuning, TF32."""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import (
    CUDNN,
    FP32_PRECISION_NAMESPACES,
    FULL_FP32_PRECISION,
    FULL_MATMUL_PRECISION,
    REDUCED_FP32_PRECISIONS,
    REDUCED_MATMUL_PRECISIONS,
    TF32_BOOLEAN_SETTINGS,
)
from detaudit.static.edits import Replace, same_quotes_string
from detaudit.static.facts import SettingWrite, StaticValue
from detaudit.static.rule import Invalid, Rule


def _replace_value(write: SettingWrite, value: StaticValue, new: cst.BaseExpression) -> Replace | None:
    """Fix a setting's value in place; unsafe when the value came from a flag default."""
    if write.value is None:
        return None
    return Replace(write.value, new, safe=value.flag is None)


class CudnnBenchmark(Rule):
    code = "DET010"
    name = "cudnn-benchmark"
    severity = Severity.WARNING
    summary = "cuDNN autotuning (`cudnn.benchmark`) is turned on."
    rationale = """
        With `torch.backends.cudnn.benchmark = True`, cuDNN times several
        convolution algorithms on the first call of each input shape and keeps
        the fastest.  Timings are noisy, so two processes on the same machine can
        pick different algorithms, and different algorithms round differently:
        the same seed then gives different weights.  It also rules out the
        deterministic algorithm selection that `cudnn.deterministic` asks for.
        """
    fix_hint = "Set `torch.backends.cudnn.benchmark = False` for runs that must reproduce (keep it for throughput runs only)."
    VALID = (
        "import torch\ntorch.backends.cudnn.benchmark = False\n",
        # the flag's default keeps autotuning off
        "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--benchmark', action='store_true')\nargs = p.parse_args()\ntorch.backends.cudnn.benchmark = args.benchmark\n",
        "from torch.backends import cudnn\nwith cudnn.flags(enabled=True, benchmark=False):\n    pass\n",
    )
    INVALID = (
        Invalid("import torch\ntorch.backends.cudnn.benchmark = True\n", line=2, fixed="import torch\ntorch.backends.cudnn.benchmark = False\n"),
        Invalid("import torch as T\nT.backends.cudnn.benchmark = True\n", line=2),
        Invalid("from torch.backends import cudnn as cb\ncb.benchmark = True\n", line=2),
        Invalid("import torch.backends.cudnn\ntorch.backends.cudnn.benchmark = 1\n", line=2),
        Invalid("import torch\nsetattr(torch.backends.cudnn, 'benchmark', True)\n", line=2),
        Invalid("import torch\ntorch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = True, False\n", line=2),
        Invalid("import torch\nwith torch.backends.cudnn.flags(enabled=True, benchmark=True):\n    pass\n", line=2),
        Invalid("import torch\ncudnn = torch.backends.cudnn\ncudnn.benchmark = True\n", line=3),
        Invalid(
            "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--no-benchmark', dest='benchmark', action='store_false')\n"
            "args = p.parse_args()\ntorch.backends.cudnn.benchmark = args.benchmark\n",
            line=5,
            message="default of --benchmark",
        ),
    )

    def finish(self) -> None:
        for write in self.facts.settings_of(f"{CUDNN}.benchmark"):
            value = self.facts.evaluate(write.value)
            if value.truthy:
                self.report(
                    write.node,
                    f"cuDNN autotuning turned on (benchmark = {value.describe()}): algorithm choice can differ between runs.",
                    fix=_replace_value(write, value, cst.Name("False")),
                )


class TF32(Rule):
    code = "DET011"
    name = "tf32"
    severity = Severity.WARNING
    summary = "TF32 / reduced-precision float32 math is turned on."
    rationale = """
        TF32 rounds float32 matmul and convolution inputs to a 10-bit mantissa on
        Ampere and newer GPUs.  Results then differ in the low bits from IEEE
        float32 and from any machine without TF32, so a run is not comparable
        across GPUs or settings.  Few users know that cuDNN convolutions already
        default to TF32 (`torch.backends.cudnn.allow_tf32` and
        `torch.backends.cudnn.conv.fp32_precision` default to on): turning it on
        for matmuls as well (`torch.backends.cuda.matmul.allow_tf32 = True`,
        `torch.set_float32_matmul_precision("high")`, `fp32_precision = "tf32"`)
        widens the gap.  For bit-exact comparisons turn it off everywhere.
        """
    fix_hint = (
        "Turn it off in the same API: `allow_tf32 = False`, `fp32_precision = \"ieee\"`, "
        "`torch.set_float32_matmul_precision(\"highest\")`."
    )
    VALID = (
        "import torch\ntorch.backends.cuda.matmul.allow_tf32 = False\ntorch.backends.cudnn.allow_tf32 = False\n",
        "import torch\ntorch.set_float32_matmul_precision('highest')\n",
        "import torch\ntorch.backends.cuda.matmul.fp32_precision = 'ieee'\n",
        "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--tf32', action='store_true')\nargs = p.parse_args()\n"
        "torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)\n",
    )
    INVALID = (
        Invalid(
            "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n",
            line=2,
            fixed="import torch\ntorch.backends.cuda.matmul.allow_tf32 = False\n",
        ),
        Invalid("import torch\ntorch.backends.cudnn.allow_tf32 = True\n", line=2),
        Invalid(
            "import torch\ntorch.set_float32_matmul_precision('high')\n",
            line=2,
            fixed="import torch\ntorch.set_float32_matmul_precision('highest')\n",
        ),
        Invalid("import torch\ntorch.set_float32_matmul_precision(precision=\"medium\")\n", line=2),
        Invalid(
            "import torch\ntorch.backends.fp32_precision = 'tf32'\n",
            line=2,
            fixed="import torch\ntorch.backends.fp32_precision = 'ieee'\n",
        ),
        Invalid("import torch.backends.cuda as tbc\ntbc.matmul.fp32_precision = \"tf32\"\n", line=2),
        Invalid("from torch import backends\nbackends.cudnn.conv.fp32_precision = 'tf32'\n", line=2),
        Invalid("import torch\ntorch.backends.mkldnn.fp32_precision = 'bf16'\n", line=2),
        Invalid("import torch\nwith torch.backends.cudnn.flags(enabled=True, allow_tf32=True):\n    pass\n", line=2),
        Invalid(
            "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--tf32', type=int, default=1)\nargs = p.parse_args()\n"
            "torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)\n",
            line=5,
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        for write in facts.settings:
            value = facts.evaluate(write.value)
            if write.target in TF32_BOOLEAN_SETTINGS and value.truthy:
                self.report(
                    write.node,
                    f"TF32 turned on: {write.target} = {value.describe()}.",
                    fix=_replace_value(write, value, cst.Name("False")),
                )
            namespace, _, attribute = write.target.rpartition(".")
            if attribute == "fp32_precision" and namespace in FP32_PRECISION_NAMESPACES and value.is_(*REDUCED_FP32_PRECISIONS):
                self.report(
                    write.node,
                    f"reduced float32 precision: {write.target} = {value.describe()}.",
                    fix=_replace_value(write, value, same_quotes_string(write.value, FULL_FP32_PRECISION)),
                )
        for call in facts.calls_to("torch.set_float32_matmul_precision"):
            argument = call.value_node("precision", 0)
            value = facts.evaluate(argument)
            if value.is_(*REDUCED_MATMUL_PRECISIONS):
                self.report(
                    call.node,
                    f"float32 matmuls may use TF32/bf16: set_float32_matmul_precision({value.describe()}).",
                    fix=Replace(argument, same_quotes_string(argument, FULL_MATMUL_PRECISION), safe=value.flag is None),
                )
