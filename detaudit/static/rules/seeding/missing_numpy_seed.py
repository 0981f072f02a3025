"""NumPy's global RNG drawn from when the file runs, and seeded nowhere (DET002 missing-numpy-seed)."""

from __future__ import annotations

from detaudit.knowledge.apis import NUMPY
from detaudit.static.rule import Invalid
from detaudit.static.rules.seeding._common import NON_TRAINING_SCRIPTS, MissingSeed


class MissingNumpySeed(MissingSeed):
    code = "DET002"
    name = "missing-numpy-seed"
    rng = NUMPY
    summary = "The script draws from NumPy's global RNG but never seeds it."
    rationale = """
        The legacy global functions (`np.random.rand`, `np.random.shuffle`,
        `np.random.choice`, ...) share one generator that NumPy seeds from the
        operating system at import.  Augmentation parameters, sampled indices
        and splits drawn from it differ in every run.
        """ + NON_TRAINING_SCRIPTS
    fix_hint = "Seed it once at startup (`np.random.seed(SEED)`), or better draw from a seeded `rng = np.random.default_rng(SEED)`."
    VALID = (
        "import numpy as np\nnp.random.seed(0)\nidx = np.random.permutation(10)\n",
        "import numpy as np\nrng = np.random.default_rng(0)\nidx = rng.permutation(10)\n",
        "import numpy as np\nimport pytorch_lightning as pl\npl.seed_everything(1)\nnp.random.shuffle([1, 2])\n",
        "import numpy as np\n\ndef augment(x):\n    return x + np.random.rand()\n",
    )
    INVALID = (
        Invalid("import numpy as np\nidx = np.random.permutation(10)\nprint(idx)\n", line=2, message="numpy.random.permutation"),
        Invalid("from numpy import random as npr\nimport torch\ntorch.manual_seed(0)\nnpr.shuffle([1, 2, 3])\n", line=4),
        # random.seed() without a value reseeds from the OS
        Invalid("import numpy\nnumpy.random.seed()\nx = numpy.random.rand(3)\n", line=3),
        # a worker_init_fn seeds the workers' NumPy, never the main process's
        Invalid(
            "import numpy as np, torch\nfrom torch.utils.data import DataLoader\ntorch.manual_seed(0)\n"
            "loader = DataLoader(ds, num_workers=2, worker_init_fn=lambda i: np.random.seed(i))\n"
            "for batch in loader:\n    batch = batch * np.random.uniform()\n",
            line=6,
        ),
        # calling an object runs its __call__: exploration noise drawn at every step (minimalRL's DDPG)
        Invalid(
            "import numpy as np\n\nclass OUNoise:\n    def __call__(self):\n        return np.random.normal(size=1)\n\n"
            "def main():\n    noise = OUNoise()\n    for step in range(10):\n        action = 0.5 + noise()[0]\n\n"
            "if __name__ == '__main__':\n    main()\n",
            line=10,
            message="noise()",
        ),
    )
