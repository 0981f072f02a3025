"""Seeds drawn from a source that differs on every run (DET006 entropy-seed)."""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import RESEED_FROM_ENTROPY, RNG_LABELS, SEED_PARAMETERS
from detaudit.static.analyses.strings import is_string_expression
from detaudit.static.engine.facts import CallFact
from detaudit.static.engine.names import dotted_name
from detaudit.static.engine.walk import child_nodes
from detaudit.static.rule import Invalid, Rule


#: Calls whose value differs on every run: a seed derived from one is no seed.
ENTROPY_CALLS = frozenset(
    {
        "time.time", "time.time_ns", "time.perf_counter", "time.perf_counter_ns",
        "time.monotonic", "time.monotonic_ns", "time.process_time", "time.process_time_ns",
        "datetime.datetime.now", "datetime.datetime.utcnow", "datetime.datetime.today",
        "datetime.date.today", "os.urandom", "os.getrandom", "os.getpid",
        "uuid.uuid1", "uuid.uuid4", "random.SystemRandom",
        "torch.seed", "torch.random.seed", "torch.cuda.seed", "torch.cuda.seed_all",
    }
)

#: Every function of these modules draws from the OS entropy pool.
ENTROPY_MODULE_PREFIXES = ("secrets.",)
# Generator classes whose ``.seed()`` method, called without an argument, reseeds
# the object from the OS (torch's from std::random_device) on every run.
RESEEDED_BY_SEED_METHOD = frozenset({"torch.Generator", "random.Random", "numpy.random.RandomState"})

#: Calls of SEED_PARAMETERS that seed from the OS when the seed is missing or ``None``.
SEEDED_BY_OS_WHEN_NONE = frozenset(
    {
        "random.seed", "random.Random", "numpy.random.seed", "numpy.random.default_rng",
        "numpy.random.RandomState", "numpy.random.SeedSequence", "numpy.random.PCG64",
        "numpy.random.MT19937", "numpy.random.Philox", "numpy.random.SFC64",
    }
)

#: Methods that seed a generator object in place (``rng.seed(0)``, ``g.manual_seed(0)``).
SEEDING_METHODS = frozenset({"seed", "manual_seed"})

#: Methods that seed or restore a generator object's state (``rng.setstate(saved)``).
STATE_RESTORING_METHODS = frozenset({"setstate", "set_state", "set_rng_state"})

#: Identifiers that hold text more often than numbers: ``hash(run_name)`` is
#: salted per process, ``hash(seed)`` of an int is not.  A naming heuristic, so
#: it only widens the string test for ``hash()`` arguments.
_TEXT_NAME_PARTS = ("name", "path", "key", "str", "text", "file", "tag", "label", "word", "prefix")

#: How far a seed expression is followed through ``x = ...`` assignments.
_MAX_ALIAS_DEPTH = 3


def _is_seed_name(target: cst.BaseExpression) -> bool:
    name = dotted_name(target)
    return name is not None and "seed" in name.rsplit(".", 1)[-1].lower()


class EntropySeed(Rule):
    code = "DET006"
    name = "entropy-seed"
    severity = Severity.ERROR
    summary = "A seed is drawn from a nondeterministic source (clock, OS entropy, salted hash)."
    rationale = """
        A seed exists to make two runs draw the same random numbers.  A seed
        taken from the clock (`time.time()`, `datetime.now()`), the OS
        (`os.urandom`, `uuid4`, `secrets`, the process id) or from `hash()` of a
        string (salted per process unless PYTHONHASHSEED is fixed before the
        interpreter starts) is different on every run, and so are
        `random.seed()` / `np.random.seed()` without an argument, `torch.seed()`,
        and generators built without a seed (`np.random.default_rng()`,
        `np.random.RandomState()`, `random.Random()`), and a generator's
        `.seed()` method without an argument (`torch.Generator().seed()`).  Note
        that `torch.Generator()` is fine: it starts from a fixed default seed.
        """
    fix_hint = "Use a fixed seed (a constant or a `--seed` flag) and log it; to vary it, pass it in explicitly."
    VALID = (
        "import random, numpy as np, torch\nSEED = 0\nrandom.seed(SEED)\nnp.random.seed(SEED)\ntorch.manual_seed(SEED)\nrng = np.random.default_rng(SEED)\n",
        # a generator created empty and seeded right after
        "import random\nrng = random.Random()\nrng.seed(1234)\n",
        "import random\ndef replay(state):\n    r = random.Random()\n    r.setstate(state)\n    return r.random()\n",
        # time is measured, not used as a seed
        "import time, torch\ntorch.manual_seed(0)\nstart = time.time()\nelapsed = time.time() - start\n",
        # hash() of an int is not salted
        "import torch\ndef seed_for(epoch: int):\n    torch.manual_seed(hash(epoch))\n",
        # torch.Generator() starts from a fixed default seed
        "import torch\ng = torch.Generator()\nx = torch.randn(3, generator=g)\n",
        # a seed passed in by the caller may be None, but that is the caller's choice
        "import numpy as np\ndef make_rng(seed):\n    return np.random.default_rng(seed)\n",
        # guarded by the flag: conditional-seed reports it, once
        "import argparse, random\np = argparse.ArgumentParser()\np.add_argument('--seed', type=int)\nargs = p.parse_args()\n"
        "if args.seed is not None:\n    random.seed(args.seed)\n",
    )
    INVALID = (
        Invalid("import time, torch\ntorch.manual_seed(int(time.time()))\n", line=2, message="time.time()"),
        Invalid("import random\nrandom.seed()\n", line=2, message="without a seed"),
        Invalid("import numpy as np\nnp.random.seed(None)\n", line=2, message="without a seed"),
        # the fallback seed is itself a draw from an unseeded RNG: the finding goes where it is drawn
        Invalid(
            "import argparse, random\np = argparse.ArgumentParser()\np.add_argument('--manualSeed', type=int)\nopt = p.parse_args()\n"
            "if opt.manualSeed is None:\n    opt.manualSeed = random.randint(1, 10000)\nrandom.seed(opt.manualSeed)\n",
            line=6,
            message="drawn here when --manualSeed is not given, from the unseeded Python `random` RNG (`random.randint`)",
        ),
        # unguarded, the flag's default None reseeds from the OS on every default run
        Invalid(
            "import argparse, random\np = argparse.ArgumentParser()\np.add_argument('--seed', type=int)\nargs = p.parse_args()\n"
            "random.seed(args.seed)\n",
            line=5,
        ),
        Invalid("import torch\ntorch.seed()\n", line=2, message="torch.seed()"),
        Invalid("import numpy as np\nrng = np.random.default_rng()\n", line=2),
        Invalid("import numpy\nstate = numpy.random.RandomState()\n", line=2),
        Invalid("import random\nrng = random.Random()\n", line=2),
        Invalid("import os, numpy as np\nnp.random.seed(int.from_bytes(os.urandom(4), 'little'))\n", line=2, message="os.urandom()"),
        Invalid("import uuid, random\nrandom.seed(uuid.uuid4().int)\n", line=2, message="uuid.uuid4()"),
        Invalid("import secrets, torch\ntorch.manual_seed(secrets.randbits(32))\n", line=2, message="secrets.randbits()"),
        Invalid("from datetime import datetime\nimport torch\nseed = int(datetime.now().timestamp())\ntorch.manual_seed(seed)\n", line=3, message="datetime.datetime.now()"),
        Invalid("import torch\ndef setup(run_name):\n    torch.manual_seed(hash(run_name) % 2**32)\n", line=3, message="hash()"),
        Invalid("import argparse, time, torch\np = argparse.ArgumentParser()\nargs = p.parse_args()\nargs.seed = int(time.time())\n", line=4),
        Invalid("import time, torch\nfrom transformers import TrainingArguments\nTrainingArguments('out', seed=int(time.time()))\n", line=3),
        Invalid("import time, torch\ng = torch.Generator()\ng.manual_seed(time.time_ns())\n", line=3),
        # a generator's seed() without an argument draws its seed from the OS
        Invalid("import torch\ng = torch.Generator()\ng.seed()\nx = torch.randn(3, generator=g)\n", line=3, message="torch.Generator"),
        Invalid("import torch\nseed = torch.Generator().seed()\n", line=2, message="torch.Generator"),
    )

    def __init__(self, context) -> None:
        super().__init__(context)
        #: (target, value) of assignments, read in finish() once the import table is complete
        self._assignments: list[tuple[cst.BaseExpression, cst.BaseExpression]] = []

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._assignments.append((target.target, node.value))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._assignments.append((node.target, node.value))

    def finish(self) -> None:
        reported: set[int] = set()
        target_of_value = {id(value): dotted_name(target) for target, value in self._assignments}
        seeded_later = {
            dotted_name(call.node.func.value)
            for call in self.facts.calls
            if call.method in SEEDING_METHODS | STATE_RESTORING_METHODS
            and call.node.args
            and isinstance(call.node.func, cst.Attribute)
        }
        for target, value in self._assignments:
            source = self._entropy_source(value) if _is_seed_name(target) else None
            if source is not None:
                self._report_once(reported, value, f"`{dotted_name(target)}` is derived from {source}: it differs on every run.")
        for call in self.facts.calls:
            self._check_call(call, reported, target_of_value, seeded_later)

    def _check_call(self, call: CallFact, reported: set[int], target_of_value: dict, seeded_later: set) -> None:
        if call.qualname in RESEED_FROM_ENTROPY:
            self._report_once(reported, call.node, f"{call.qualname}() reseeds from a nondeterministic number.")
            return
        seed_node = None
        if call.qualname in SEED_PARAMETERS:
            keyword, position = SEED_PARAMETERS[call.qualname]
            seed_node = call.value_node(keyword, position)
            unseeded = seed_node is None and not call.has_star_args and not call.node.args
            value = self.facts.evaluate(seed_node)
            if value.flag is not None and call.scope.conditions:
                return  # ``if args.seed is not None: random.seed(args.seed)`` is conditional-seed's finding
            if (unseeded or value.is_(None)) and call.qualname in SEEDED_BY_OS_WHEN_NONE:
                fallback = self._drawn_fallback(seed_node)
                if fallback is not None:
                    draw, rng = fallback
                    flag = f"when --{value.flag.replace('_', '-')} is not given, " if value.flag else ""
                    self._report_once(
                        reported,
                        draw.node,
                        f"the seed that `{_code(call.node)}` uses is drawn here {flag}from the unseeded {RNG_LABELS[rng]} "
                        f"(`{draw.qualname or _code(draw.node.func)}`): every such run seeds differently.",
                    )
                    return
                target = target_of_value.get(id(call.node))
                if target is None or target not in seeded_later:  # ``rng = Random(); rng.seed(s)`` is seeded
                    self._report_once(reported, call.node, f"{call.qualname}() without a seed draws its seed from the OS.")
                return
        elif call.method == "seed" and not call.node.args and (made_by := self._generator_class(call)) is not None:
            self._report_once(reported, call.node, f"{made_by}.seed() without an argument reseeds it from the OS.")
            return
        elif call.method in SEEDING_METHODS:
            seed_node = call.value_node(None, 0)
        for node in (seed_node, *(a.value for a in call.node.args if a.keyword is not None and "seed" in a.keyword.value)):
            source = self._entropy_source(node) if node is not None else None
            if source is not None:
                self._report_once(reported, call.node, f"seed derived from {source}: it differs on every run.")
                return

    def _generator_class(self, call: CallFact) -> str | None:
        """The generator class of ``call``'s receiver, made right there
        (``torch.Generator().seed()``) or assigned once in the file (``g = torch.Generator()``),
        when its ``.seed()`` reseeds from the OS."""
        receiver = call.node.func.value if isinstance(call.node.func, cst.Attribute) else None
        if isinstance(receiver, cst.Name):
            made = [value for target, value in self._assignments if dotted_name(target) == receiver.value]
            receiver = made[0] if len(made) == 1 else None
        if not isinstance(receiver, cst.Call):
            return None
        qualname = self.facts.names.resolve(receiver.func)
        return qualname if qualname in RESEEDED_BY_SEED_METHOD else None

    def _drawn_fallback(self, seed: cst.BaseExpression | None) -> tuple[CallFact, str] | None:
        """``opt.seed = random.randint(1, 10000)`` somewhere in the file when the seed
        passed is ``opt.seed``: (that draw, the global RNG it draws from)."""
        name = dotted_name(seed) if seed is not None else None
        if name is None:
            return None
        calls = {id(call.node): call for call in self.facts.calls}
        for target, value in self._assignments:
            call = calls.get(id(value))
            if call is not None and dotted_name(target) == name:
                draws = self.analyses.rng_effects.call_effects(call).draws
                if draws:
                    return call, draws[0][0]
        return None

    def _report_once(self, reported: set[int], node: cst.CSTNode, message: str) -> None:
        if id(node) not in reported:
            reported.add(id(node))
            self.report(node, message)

    def _entropy_source(self, node: cst.CSTNode, depth: int = 0) -> str | None:
        """A description of the run-dependent value ``node`` is computed from, if any."""
        if isinstance(node, cst.Call):
            qualname = self.facts.names.resolve(node.func)
            if qualname is not None and (qualname in ENTROPY_CALLS or qualname.startswith(ENTROPY_MODULE_PREFIXES)):
                return f"{qualname}()"
            if qualname == "hash" and node.args and self._hashes_text(node.args[0].value):
                return "hash() of a string (salted per process by PYTHONHASHSEED)"
        if isinstance(node, cst.Name) and depth < _MAX_ALIAS_DEPTH and "seed" not in node.value.lower():
            # a "seed" variable is reported where it is assigned
            assigned = self.facts.simple_assignments.get(node.value)
            if assigned and len(assigned) == 1:
                return self._entropy_source(assigned[0], depth + 1)
        for child in child_nodes(node):
            source = self._entropy_source(child, depth)
            if source is not None:
                return source
        return None

    def _hashes_text(self, argument: cst.BaseExpression) -> bool:
        if isinstance(argument, cst.Tuple):
            return any(self._hashes_text(element.value) for element in argument.elements)
        if is_string_expression(argument, self.facts):
            return True
        name = dotted_name(argument)
        return name is not None and any(part in name.rsplit(".", 1)[-1].lower() for part in _TEXT_NAME_PARTS)


def _code(node: cst.CSTNode) -> str:
    return " ".join(cst.Module(body=[]).code_for_node(node).split())
