"""cuDNN autotuning (``cudnn.benchmark``) turned on (DET010 cudnn-benchmark).

Which settings exist, their spellings on every torch version and their risky and
safe values come from the settings table (``knowledge/backend_settings.json``).
"""

from __future__ import annotations

from detaudit.findings import Severity
from detaudit.knowledge.backend_settings import backend_settings
from detaudit.static.analyses.op_sites import decided_by_settings_here
from detaudit.static.rule import Invalid, Rule
from detaudit.static.rules.settings._common import safe_value_fix

_SETTINGS = backend_settings()
_CUDNN_BENCHMARK = _SETTINGS["cudnn-benchmark"]


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
                    fix=safe_value_fix(write, value, _CUDNN_BENCHMARK),
                )
