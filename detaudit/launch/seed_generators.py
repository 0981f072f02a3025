"""Seeding the generators a script makes without a seed: the remedy for RNG
and external-input causes, in its two forms.

``np.random.default_rng()``, ``random.Random()``, ``torch.seed()`` and the
like draw their seed from the OS, so no global seed reaches them.  Each call
in ``GENERATORS`` is replaced by one that passes the next seed of a counter
(S+1, S+2, ... in the order the calls happen) when it is called without one,
and behaves as before when given one.  The same replacement exists twice:

* ``install`` applies it in the child process of a run (the child setting
  ``seed-generators``, ``child_settings.py``) and records where the script
  made each unseeded generator;
* ``paste_code`` writes it as plain numpy/random/torch code to paste at the
  top of a script.

``tests/test_remedy.py`` runs the pasted code by hand against the fixtures.
Which calls draw from the OS, and where their seed goes, is the knowledge
base's (``detaudit.knowledge.apis``).  Importing this module imports neither
torch nor numpy.
"""

from __future__ import annotations

import importlib
import itertools
import os
import sys
from dataclasses import dataclass
from typing import Iterable

from detaudit.knowledge.apis import SEED_PARAMETERS

FUNCTION, CLASS, RESEEDER = "function", "class", "reseeder"
#: how the pasted code imports each library
_IMPORTS = {"numpy": ("np", "import numpy as np"), "random": ("random", "import random"), "torch": ("torch", "import torch")}


@dataclass(frozen=True)
class Generator:
    name: str  # as the knowledge base spells it: "numpy.random.default_rng"
    kind: str  # FUNCTION or CLASS taking a seed, or a RESEEDER of a global generator
    library: str  # "numpy", "random", "torch"

    @property
    def parameter(self) -> str:
        return SEED_PARAMETERS[self.name][0]

    @property
    def seeder(self) -> str:
        """A reseeder's seeding twin: ``torch.cuda.seed_all`` -> ``torch.cuda.manual_seed_all``."""
        module, _, function = self.name.rpartition(".")
        return f"{module}.{function.replace('seed', 'manual_seed', 1)}"


#: Every generator the remedy seeds.  numpy's bit generators and SeedSequence
#: also draw from the OS, but they are extension types that the generators
#: below build for you; scripts rarely make them directly.
GENERATORS: dict[str, Generator] = {
    generator.name: generator
    for generator in (
        Generator("numpy.random.default_rng", FUNCTION, "numpy"),
        Generator("numpy.random.RandomState", CLASS, "numpy"),
        Generator("numpy.random.seed", FUNCTION, "numpy"),
        Generator("random.Random", CLASS, "random"),
        Generator("random.seed", FUNCTION, "random"),
        Generator("torch.seed", RESEEDER, "torch"),
        Generator("torch.random.seed", RESEEDER, "torch"),
        Generator("torch.cuda.seed", RESEEDER, "torch"),
        Generator("torch.cuda.seed_all", RESEEDER, "torch"),
    )
}


# -- in the child -----------------------------------------------------------------
def install(names: list[str], first_seed: int, made: list[dict]) -> None:
    """Replace the named calls in this process; append to ``made`` one
    ``{"call", "path", "line", "seeds"}`` per line that made a generator
    without a seed (``seeds``: how many it made).  The line is the call's own
    caller, a library's line included: a generator a library makes for itself
    is not the user line that called the library."""
    next_seed = itertools.count(first_seed).__next__
    sites: dict[tuple, dict] = {}

    def note(name: str) -> int:
        caller = sys._getframe(2)  # 0: note, 1: the seeding wrapper, 2: who called the generator
        path = caller.f_code.co_filename
        cwd = os.getcwd()
        if path.startswith(cwd + os.sep):
            path = os.path.relpath(path, cwd)
        key = (name, path, caller.f_lineno)
        if key not in sites:
            sites[key] = {"call": name, "path": key[1], "line": key[2], "seeds": 0}
            made.append(sites[key])
        sites[key]["seeds"] += 1
        return next_seed()

    for name in names:
        generator = GENERATORS[name]
        module_name, _, attribute = name.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # numpy not installed: nothing of it to seed
            continue
        original = getattr(module, attribute, None)
        if original is not None:
            setattr(module, attribute, _seeding(generator, original, note))


def _seeding(generator: Generator, original, note):
    name = generator.name
    if generator.kind == RESEEDER:
        manual_seed = _resolve(generator.seeder)

        def reseed():
            seed = note(name)
            manual_seed(seed)
            return seed

        return reseed
    parameter = generator.parameter
    if generator.kind == CLASS:

        class Seeded(original):
            def __init__(self, *args, **kwargs):
                if not args and kwargs.get(parameter) is None:
                    kwargs[parameter] = note(name)
                elif args and args[0] is None:
                    args = (note(name), *args[1:])
                super().__init__(*args, **kwargs)

        Seeded.__name__ = Seeded.__qualname__ = original.__name__
        Seeded.__module__ = original.__module__
        return Seeded

    def seeded(*args, **kwargs):
        if not args and kwargs.get(parameter) is None:
            kwargs[parameter] = note(name)
        elif args and args[0] is None:
            args = (note(name), *args[1:])
        return original(*args, **kwargs)

    return seeded


def _resolve(dotted: str):
    module, _, attribute = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


# -- as code to paste ----------------------------------------------------------
def paste_code(names: Iterable[str], first_seed: int) -> tuple[list[str], list[str]]:
    """(imports, statements): plain Python that does what ``install`` does for the named calls."""
    generators = [generator for name, generator in GENERATORS.items() if name in set(names)]
    imports = ["import itertools", *dict.fromkeys(_IMPORTS[g.library][1] for g in generators)]
    statements = [
        f"# generators made without a seed get seeds {first_seed}, {first_seed + 1}, ... in the order they are made",
        f"_next_seed = itertools.count({first_seed}).__next__",
    ]
    for generator in generators:
        statements += ["", *_replacement_code(generator)]
    return imports, statements


def _spelled(dotted: str) -> str:
    """``numpy.random.default_rng`` as the pasted code spells it (``np.random.default_rng``)."""
    library, _, rest = dotted.partition(".")
    return f"{_IMPORTS[library][0]}.{rest}"


def _replacement_code(generator: Generator) -> list[str]:
    target = _spelled(generator.name)
    local = "_" + generator.name.replace(".", "_")
    if generator.kind == RESEEDER:
        return [
            f"def {local}():",
            "    seed = _next_seed()",
            f"    {_spelled(generator.seeder)}(seed)",
            "    return seed",
            f"{target} = {local}",
        ]
    parameter = generator.parameter
    if generator.kind == CLASS:
        class_name = "_Seeded" + generator.name.rpartition(".")[2]
        return [
            f"class {class_name}({target}):",
            f"    def __init__(self, {parameter}=None, *args, **kwargs):",
            f"        super().__init__(_next_seed() if {parameter} is None else {parameter}, *args, **kwargs)",
            f"{target} = {class_name}",
        ]
    return [
        f"{local} = {target}",
        f"{target} = lambda {parameter}=None, *args, **kwargs: "
        f"{local}(_next_seed() if {parameter} is None else {parameter}, *args, **kwargs)",
    ]
