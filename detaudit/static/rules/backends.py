"""Backend settings that trade reproducibility for speed: cuDNN autotuning, TF32.

Which settings, their spellings on every torch version and their risky and
safe values come from the settings table (``knowledge/backend_settings.json``).
"""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.backend_settings import Setting, backend_settings
from detaudit.static.analyses.op_sites import decided_by_settings_here
from detaudit.static.engine.facts import SettingWrite, StaticValue
from detaudit.static.fixes.edits import Replace, same_quotes_string, setting_comment_words
from detaudit.static.rule import Invalid, Rule

_SETTINGS = backend_settings()
_CUDNN_BENCHMARK = _SETTINGS["cudnn-benchmark"]
_REDUCED_PRECISION = _SETTINGS.in_hazard("reduced-precision")
#: attribute path -> setting, and setter function -> (setting, its spelling)
_REDUCED_PRECISION_ATTRIBUTES = {attribute: s for s in _REDUCED_PRECISION for attribute in s.attributes}
_REDUCED_PRECISION_SETTERS = {w.write: (s, w) for s in _REDUCED_PRECISION for w in s.writers}


def _safe_value(setting: Setting, like: cst.BaseExpression) -> cst.BaseExpression:
    """The setting's safe value as code (a string keeps the quotes of ``like``)."""
    if isinstance(setting.safe, str):
        return same_quotes_string(like, setting.safe)
    return cst.Name(repr(setting.safe))


def _replace_value(write: SettingWrite, value: StaticValue, setting: Setting) -> Replace | None:
    """Fix a setting's value in place (dropping a comment about the old value);
    unsafe when the value came from a flag default."""
    if write.value is None:
        return None
    return _replace(write.value, setting, write.target, value)


def _replace(old: cst.BaseExpression, setting: Setting, name: str, value: StaticValue) -> Replace:
    return Replace(
        old, _safe_value(setting, old), safe=not value.from_default, stale_comment=setting_comment_words(name, value.describe())
    )


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
        # a parameter whose default the only caller overrides
        "import torch\ndef setup(cudnn_benchmark=True):\n    torch.backends.cudnn.benchmark = cudnn_benchmark\nsetup(cudnn_benchmark=False)\n",
        # a config field set False, and one overridden where the config is built
        "import torch\nfrom dataclasses import dataclass\n@dataclass\nclass Config:\n    benchmark: bool = False\n"
        "torch.backends.cudnn.benchmark = Config().benchmark\n",
        "import torch\nfrom dataclasses import dataclass\n@dataclass\nclass Config:\n    benchmark: bool = True\n"
        "config = Config(benchmark=False)\ntorch.backends.cudnn.benchmark = config.benchmark\n",
        # nothing says what the value is: quiet
        "import torch\ndef setup(cudnn_benchmark):\n    torch.backends.cudnn.benchmark = cudnn_benchmark\n",
        "import torch\nconfig = load_config()\ntorch.backends.cudnn.benchmark = config.CUDNN.BENCHMARK\n",
    )
    INVALID = (
        Invalid("import torch\ntorch.backends.cudnn.benchmark = True\n", line=2, fixed="import torch\ntorch.backends.cudnn.benchmark = False\n"),
        # the file's convolutions are named here, not reported one by one
        Invalid("import torch\ntorch.backends.cudnn.benchmark = True\nconv = torch.nn.Conv2d(3, 8, 3)\n", line=2, message="1 call site of torch.nn.Conv2d"),
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
        # the value comes through a parameter whose default no caller overrides
        Invalid(
            "import torch\ndef setup(seed, cudnn_benchmark=True):\n    torch.backends.cudnn.benchmark = cudnn_benchmark\nsetup(0)\n",
            line=3,
            message="the default of parameter cudnn_benchmark of setup(), line 2",
        ),
        # ... or from a config class's field default
        Invalid(
            "import torch\nfrom dataclasses import dataclass\n@dataclass\nclass Config:\n    benchmark: bool = True\n"
            "config = Config()\ntorch.backends.cudnn.benchmark = config.benchmark\n",
            line=7,
            message="the default set at",
        ),
    )

    def finish(self) -> None:
        for write in self.facts.settings_of(*_CUDNN_BENCHMARK.attributes):
            value = self.analyses.values.evaluate(write.value, write.scope)
            if value.truthy:
                attribute = write.target.rpartition(".")[2]
                convolutions = decided_by_settings_here(self.analyses.op_sites)
                self.report(
                    write.node,
                    f"cuDNN autotuning turned on ({attribute} = {value.describe()}): the algorithm choice of every convolution"
                    f"{' (' + convolutions + ')' if convolutions else ''} can differ between runs.",
                    fix=_replace_value(write, value, _CUDNN_BENCHMARK),
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
            setting = _REDUCED_PRECISION_ATTRIBUTES.get(write.target)
            if setting is None:
                continue
            value = self.analyses.values.evaluate(write.value, write.scope)
            if isinstance(setting.safe, bool):  # an on/off switch: any truthy value turns TF32 on
                if value.truthy:
                    self.report(
                        write.node,
                        f"TF32 turned on: {write.target} = {value.describe()}.",
                        fix=_replace_value(write, value, setting),
                    )
            elif value.is_(*setting.risky):
                self.report(
                    write.node,
                    f"reduced float32 precision: {write.target} = {value.describe()}.",
                    fix=_replace_value(write, value, setting),
                )
        for call in facts.calls_to(*_REDUCED_PRECISION_SETTERS):
            setting, spelling = _REDUCED_PRECISION_SETTERS[call.qualname]
            argument = call.value_node(spelling.argument, spelling.position)
            value = self.analyses.values.evaluate(argument, call.scope)
            if value.is_(*setting.risky):
                self.report(
                    call.node,
                    f"float32 matmuls may use TF32/bf16: {call.qualname.rpartition('.')[2]}({value.describe()}).",
                    fix=_replace(argument, setting, call.qualname, value),
                )
