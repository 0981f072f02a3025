"""Python's ``random`` drawn from when the file runs, and seeded nowhere (DET003 missing-python-seed)."""

from __future__ import annotations

from detaudit.knowledge.apis import PYTHON
from detaudit.static.rule import Invalid
from detaudit.static.rules.seeding._common import NON_TRAINING_SCRIPTS, MissingSeed


class MissingPythonSeed(MissingSeed):
    code = "DET003"
    name = "missing-python-seed"
    rng = PYTHON
    summary = "The script draws from Python's `random` module but never seeds it."
    rationale = """
        `random.shuffle`, `random.choice`, `random.random` and friends use one
        module-level generator seeded from the operating system at import, so
        file orders, sampled subsets and augmentation choices made with it
        change from run to run.
        """ + NON_TRAINING_SCRIPTS
    fix_hint = "Call `random.seed(SEED)` at startup, or use a seeded `random.Random(SEED)` instance."
    VALID = (
        "import random\nrandom.seed(0)\nfiles = ['a', 'b']\nrandom.shuffle(files)\n",
        "import random\nrng = random.Random(0)\nrng.shuffle([1, 2])\n",
        "import random\nfrom accelerate.utils import set_seed\nset_seed(3)\nk = random.randint(0, 9)\n",
        "from random import *\nimport torch\nseed(0)\nk = randint(0, 9)\nprint(k)\n",
    )
    INVALID = (
        Invalid("import random\nfiles = ['a', 'b']\nrandom.shuffle(files)\n", line=3, message="random.shuffle"),
        Invalid("from random import choice\nimport torch\npick = choice([1, 2, 3])\nprint(pick)\n", line=3),
        # a method of an instance of the file's (or a project module's) class draws
        Invalid(
            "import random\nimport torch\n\nclass Buffer:\n    def sample(self):\n        return random.random()\n\n"
            "buffer = Buffer()\nx = buffer.sample()\nprint(x)\n",
            line=9,
            message="through `random.random`",
        ),
        # a star import binds the module's functions
        Invalid("from random import *\nimport torch\nk = randint(0, 9)\nprint(k)\n", line=3, message="random.randint"),
    )
