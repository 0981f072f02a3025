"""TF32 and other reduced-precision float32 math turned on (DET011 tf32).

Which settings exist, their spellings on every torch version and their risky and
safe values come from the settings table (``knowledge/backend_settings.json``).
"""

from __future__ import annotations

from detaudit.findings import Severity
from detaudit.knowledge.backend_settings import backend_settings
from detaudit.static.rule import Invalid, Rule
from detaudit.static.rules.settings._common import safe_value_edit, safe_value_fix

_SETTINGS = backend_settings()
_REDUCED_PRECISION = _SETTINGS.in_hazard("reduced-precision")
#: attribute path -> setting, and setter function -> (setting, its spelling)
_REDUCED_PRECISION_ATTRIBUTES = {attribute: s for s in _REDUCED_PRECISION for attribute in s.attributes}
_REDUCED_PRECISION_SETTERS = {w.write: (s, w) for s in _REDUCED_PRECISION for w in s.writers}


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
                        fix=safe_value_fix(write, value, setting),
                    )
            elif value.is_(*setting.risky):
                self.report(
                    write.node,
                    f"reduced float32 precision: {write.target} = {value.describe()}.",
                    fix=safe_value_fix(write, value, setting),
                )
        for call in facts.calls_to(*_REDUCED_PRECISION_SETTERS):
            setting, spelling = _REDUCED_PRECISION_SETTERS[call.qualname]
            argument = call.value_node(spelling.argument, spelling.position)
            value = self.analyses.values.evaluate(argument, call.scope)
            if value.is_(*setting.risky):
                self.report(
                    call.node,
                    f"float32 matmuls may use TF32/bf16: {call.qualname.rpartition('.')[2]}({value.describe()}).",
                    fix=safe_value_edit(argument, setting, call.qualname, value),
                )
