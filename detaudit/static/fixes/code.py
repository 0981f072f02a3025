"""The code that fixes write, in the fix style a project chose.

``plain`` (the default) writes what detaudit's runtime helpers do as plain
``random`` / NumPy / torch code, so a fixed file does not depend on detaudit
and a repository owner can merge it:

- seeding: ``random.seed(0)``, ``np.random.seed(0)``, ``torch.manual_seed(0)``
  (what ``detaudit.seed_everything`` calls), with the names the file's imports
  bind (``np``), importing only what the file does not import yet;
- deterministic algorithms: the settings ``detaudit.enable_determinism()``
  changes from torch's defaults, one line each, generated from the settings
  table (``knowledge/backend_settings.json``, the only place that spells
  them; see ``determinism_settings``);
- a seeded DataLoader / ``random_split`` generator:
  ``torch.Generator().manual_seed(0)`` (torch derives every worker's seeds
  from it).

``detaudit`` writes calls of detaudit's helpers instead
(``detaudit.seed_everything(0)``, ``detaudit.enable_determinism()``,
``detaudit.make_generator(0)`` with ``worker_init_fn=detaudit.seed_worker``):
shorter, and the helpers adapt to the torch that runs them, but the fixed
code needs detaudit installed.  ``[tool.detaudit] fix-style`` or
``--fix-style`` chooses.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

# The knowledge base is imported where it is read: the engine and the command
# line import this module for its constants, also in runs that parse nothing.
if TYPE_CHECKING:
    from detaudit.knowledge.backend_settings import Setting, Spelling

PLAIN, DETAUDIT = "plain", "detaudit"
FIX_STYLES = (PLAIN, DETAUDIT)
DEFAULT_FIX_STYLE = PLAIN
#: The module whose helpers the detaudit style calls.
FIX_MODULE = "detaudit"

#: What the detaudit style calls.
_HELPER_SEEDING = "seed_everything"
_HELPER_DETERMINISM = "enable_determinism"
_HELPER_GENERATOR = "make_generator"
_HELPER_WORKER_INIT_FN = "seed_worker"
#: How the plain style writes a seeded torch generator (``Generator.manual_seed`` returns the generator).
_PLAIN_GENERATOR = "{torch}.Generator().manual_seed({seed})"


@dataclass(frozen=True)
class FixCode:
    """Statements (or one expression) a fix writes, and the modules they need
    imported that the file does not import yet."""

    lines: tuple[str, ...]
    imports: tuple[str, ...] = ()


def check_style(style: str) -> str:
    if style not in FIX_STYLES:
        raise ValueError(f"unknown fix style {style!r} (choose from {', '.join(FIX_STYLES)})")
    return style


def module_name(bindings: Mapping[str, str], module: str) -> tuple[str, tuple[str, ...]] | None:
    """How code in the file names ``module``: the name itself or an alias its
    imports bind to it (``np``), else the module's name with the import it
    needs; None when that name is bound to something else (``from numpy import
    random`` leaves no room for ``import random``)."""
    aliases = sorted(name for name, qualified in bindings.items() if qualified == module)
    if module in aliases:
        return module, ()
    if aliases:
        return aliases[0], ()
    if module in bindings:
        return None
    return module, (module,)


def seeding_code(
    rngs: Iterable[str], bindings: Mapping[str, str], style: str, *, also: Iterable[str] = ()
) -> FixCode | None:
    """Seed the global RNGs ``rngs`` (``knowledge.apis.RNGS``) with the default
    seed; ``also``: RNGs to seed as well where the file already imports their
    module (``seed_everything`` seeds them all).  None when the file's names
    leave no way to spell a needed call."""
    from detaudit.knowledge.apis import FIX_DEFAULT_SEED, NUMPY, PYTHON, TORCH

    if style == DETAUDIT:
        return _helper_call(bindings, _HELPER_SEEDING, FIX_DEFAULT_SEED)
    needed, optional = set(rngs), set(also)
    lines: list[str] = []
    imports: list[str] = []
    for rng in (PYTHON, NUMPY, TORCH):  # the order seed_everything seeds in
        if rng not in needed and rng not in optional:
            continue
        module, _, function = _seeding_function(rng).partition(".")
        spelled = module_name(bindings, module)
        if spelled is None or (rng not in needed and spelled[1]):
            if rng in needed:
                return None
            continue
        local, missing = spelled
        lines.append(f"{local}.{function}({FIX_DEFAULT_SEED})")
        imports += [m for m in missing if m not in imports]
    return FixCode(tuple(lines), tuple(imports))


def determinism_code(bindings: Mapping[str, str], style: str) -> FixCode | None:
    """Ask for deterministic algorithms: the table's ``determinism_settings``
    written out (environment variables first: CUDA reads them when it starts),
    or ``detaudit.enable_determinism()``."""
    if style == DETAUDIT:
        return _helper_call(bindings, _HELPER_DETERMINISM)
    lines: list[str] = []
    imports: list[str] = []
    for setting, spelling in sorted(determinism_settings(), key=lambda pair: pair[1].environment is None):
        code = _setting_line(bindings, spelling, setting.safe)
        if code is None:
            return None
        line, missing = code
        lines.append(line)
        imports += [m for m in missing if m not in imports]
    return FixCode(tuple(lines), tuple(imports))


def seeded_generator(bindings: Mapping[str, str], style: str) -> tuple[FixCode, str | None] | None:
    """(an expression for a seeded torch generator, the ``worker_init_fn`` to
    pass with it or None).  The plain style passes none: since torch 1.9 every
    worker reseeds ``random``, NumPy and torch from the generator's draw."""
    from detaudit.knowledge.apis import FIX_DEFAULT_SEED

    if style == DETAUDIT:
        generator = _helper_call(bindings, _HELPER_GENERATOR, FIX_DEFAULT_SEED)
        if generator is None:
            return None
        return generator, f"{module_name(bindings, FIX_MODULE)[0]}.{_HELPER_WORKER_INIT_FN}"
    spelled = module_name(bindings, "torch")
    if spelled is None:
        return None
    torch, imports = spelled
    return FixCode((_PLAIN_GENERATOR.format(torch=torch, seed=FIX_DEFAULT_SEED),), imports), None


@functools.lru_cache(maxsize=None)
def determinism_settings() -> tuple[tuple["Setting", "Spelling"], ...]:
    """The settings the plain determinism fix writes, with the spelling it uses:
    those ``enable_determinism()`` sets whose safe value is not already torch's
    default, except

    - one another of them sets as well (deterministic algorithms also turn on
      Inductor's deterministic mode);
    - those of a hazard whose API changed between torch versions (TF32: the
      ``fp32_precision`` API on torch >= 2.9, the legacy flags before, and torch
      raises when the two are mixed): the helper picks at run time, fixed code
      cannot; the reduced-precision rules fix those settings where code sets them;

    each through its first spelling that every torch version has and that
    code can write (an attribute, a setter taking the value first, a variable)."""
    from detaudit.knowledge.backend_settings import backend_settings

    table = backend_settings()
    requested = [s for s in table.settings if s.enable_determinism != "never"]
    implied = {other for s in requested for other in s.also_sets}
    changed_api = {s.hazard.id for s in table.settings if s.superseded_by}
    chosen = []
    for setting in requested:
        if setting.id in implied or setting.hazard.id in changed_api or setting.safe == setting.default:
            continue
        spelling = next((s for s in setting.spellings if s.torch is None and _writable(s)), None)
        if spelling is not None:
            chosen.append((setting, spelling))
    return tuple(chosen)


def _writable(spelling: "Spelling") -> bool:
    return (
        spelling.environment is not None
        or spelling.attribute is not None
        or (spelling.write is not None and spelling.position == 0 and spelling.values is None)
    )


def _setting_line(bindings: Mapping[str, str], spelling: "Spelling", value: Any) -> tuple[str, tuple[str, ...]] | None:
    """(statement, imports) setting ``spelling`` to ``value``.  A variable is
    set only where the launcher has not set it (``os.environ.setdefault``)."""
    if spelling.environment is not None:
        spelled = module_name(bindings, "os")
        return None if spelled is None else (f"{spelled[0]}.environ.setdefault({spelling.environment!r}, {value!r})", spelled[1])
    dotted = spelling.attribute or spelling.write
    module, _, rest = dotted.partition(".")
    spelled = module_name(bindings, module)
    if spelled is None:
        return None
    local, imports = spelled
    if spelling.attribute is not None:
        return f"{local}.{rest} = {value!r}", imports
    return f"{local}.{rest}({value!r})", imports


def _helper_call(bindings: Mapping[str, str], helper: str, *arguments: object) -> FixCode | None:
    spelled = module_name(bindings, FIX_MODULE)
    if spelled is None:
        return None
    local, imports = spelled
    return FixCode((f"{local}.{helper}({', '.join(map(repr, arguments))})",), imports)


def _seeding_function(rng: str) -> str:
    """The library's own seeding function for ``rng`` (``torch.manual_seed``)."""
    from detaudit.knowledge.apis import SEEDING_FUNCTIONS

    return next(name for name, seeded in SEEDING_FUNCTIONS.items() if seeded == frozenset({rng}))
