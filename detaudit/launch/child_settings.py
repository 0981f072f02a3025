"""The settings detaudit can make in a child before the script runs, as one table.

A child setting is what code pasted at the top of the script would change:
torch's thread count, PYTHONHASHSEED, the CPU capability torch dispatches
to, deterministic algorithms, the settings of the backend settings table
(``knowledge/backend_settings.json``), seeds for the generators a script
makes without one.  Each entry says, once, how it is made:

* ``environment``: an environment variable the child starts with (the parent
  sets it: PYTHONHASHSEED only counts when the interpreter starts; a value
  of None unsets it, leaving the machine's default), or ``apply``: what the
  bootstrap does in the child, before the script, torch imported;
* ``paste``: the same change as plain Python (no detaudit import), for the
  code ``detaudit run --remedy`` prints;
* ``fingerprint_key``: the key of the environment fingerprint
  (``detaudit.runtime.environment``) that shows what a run really ran with.

``--vary`` (``detaudit.dynamic.variations``) and ``--remedy``
(``detaudit.dynamic.remedy.catalogue``) name these entries; ``LaunchOptions
.settings`` carries their values to the child, which applies them in table
order.  Adding a setting is one entry here.  Imports neither torch nor numpy.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class PasteContext:
    """What the pasted code depends on besides the settings' values."""

    torch_version: str | None  # spellings of the backend settings differ by torch version
    seed: int | None  # detaudit's seed (None with --no-seed)
    generators: tuple[str, ...] = ()  # the generators the script made without a seed (only they are seeded)


@dataclass(frozen=True)
class Pasted:
    """A setting as code: its imports and statements; ``before_imports`` for
    code that must run first (a restart of the interpreter)."""

    imports: tuple[str, ...] = ()
    statements: tuple[str, ...] = ()
    before_imports: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChildSetting:
    name: str
    help: str
    environment: str = ""  # the environment variable it is, set by the parent
    apply: Callable[[Any, Any], None] | None = None  # (value, the bootstrap's ChildSession), in the child
    paste: Callable[[Any, PasteContext], Pasted] | None = None  # None: never pasted
    fingerprint_key: str = ""

    @property
    def needs_torch(self) -> bool:
        return self.apply is not None


# -- how each one is made in the child ---------------------------------------------
def _set_threads(value: int, session) -> None:
    import torch

    torch.set_num_threads(int(value))
    _note_overrides(torch, "set_num_threads", session.payload)


def _note_overrides(module, function_name: str, payload: dict) -> None:
    """Record where the script calls ``module.function_name`` itself, after
    detaudit made that setting: its call wins, and a variation of the
    setting then varies nothing."""
    from detaudit.launch.watcher import user_frame

    original = getattr(module, function_name)
    overrides = payload.setdefault("overrides", [])

    @functools.wraps(original)
    def recording(*args, **kwargs):
        frame = user_frame(sys._getframe(1))
        shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
        overrides.append(
            {
                "call": f"{module.__name__}.{function_name}({shown})",
                "path": frame.f_code.co_filename if frame else "",
                "line": frame.f_lineno if frame else 0,
            }
        )
        return original(*args, **kwargs)

    setattr(module, function_name, recording)


def _enable_determinism(value: bool, session) -> None:
    if value:
        from detaudit.runtime.determinism import enable_determinism

        enable_determinism()


def _write_backend_settings(values: Mapping[str, Any], session) -> None:
    import torch

    from detaudit.runtime.settings import write_settings

    write_settings(torch, values)


def _seed_generators(value: bool, session) -> None:
    if value:
        from detaudit.launch.seed_generators import GENERATORS, install

        made = session.payload["unseeded_generators"] = []
        install(list(GENERATORS), (session.seed or 0) + 1, made)


# -- how each one is pasted ----------------------------------------------------------
def _paste_restart(variable: str, why: str) -> Callable[[Any, PasteContext], Pasted]:
    """A variable read when Python starts: restart the script with it set."""

    def paste(value: Any, context: PasteContext) -> Pasted:
        return Pasted(before_imports=(
            "import os",
            "import sys",
            "",
            f"# {why}: restart with {variable} set (or export it)",
            f"if os.environ.get({variable!r}) != {value!r}:",
            f"    os.environ[{variable!r}] = {value!r}",
            "    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])",
        ))

    return paste


def _paste_cpu_capability(value: str | None, context: PasteContext) -> Pasted:
    if value is None:
        return Pasted(("import os",), ("os.environ.pop('ATEN_CPU_CAPABILITY', None)",))
    # torch reads it at its first vectorized op, not at import
    return Pasted(("import os",), (f"os.environ['ATEN_CPU_CAPABILITY'] = {value!r}  # before torch's first op",))


def seed_all(seed: int) -> None:
    """Seed Python, numpy and torch (CPU and every CUDA device) the way users do,
    without detaudit's PYTHONHASHSEED warning: the report covers hash order.
    What every launch with a seed does first, and the ``seed-globals`` setting."""
    import warnings

    from detaudit.runtime.seeding import seed_everything

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seed_everything(seed, workers=False)


def _seed_globals(value: int, session) -> None:
    seed_all(int(value))


def _paste_seed_globals(value: int, context: PasteContext) -> Pasted:
    return Pasted(
        ("import random", "import numpy as np", "import torch"),
        (f"random.seed({value})", f"np.random.seed({value})", f"torch.manual_seed({value})  # every device's generator"),
    )


def _paste_threads(value: int, context: PasteContext) -> Pasted:
    return Pasted(("import torch",), (f"torch.set_num_threads({value})",))


def _paste_backend_settings(values: Mapping[str, Any], context: PasteContext) -> Pasted:
    from detaudit.knowledge.backend_settings import backend_settings

    table = backend_settings()
    written = [_setting_code(table[i], value, context.torch_version) for i, value in values.items()]
    written.sort(key=lambda pair: pair[0] != "import os")  # variables first: CUDA reads them when it starts
    return Pasted(tuple(imported for imported, _ in written), tuple(statement for _, statement in written))


def _setting_code(setting, value: Any, torch_version: str | None) -> tuple[str, str]:
    """(import, statement) that set a backend ``setting`` to ``value`` on this torch, as its table spells it."""
    from detaudit.runtime.settings import environment_value

    for spelling in setting.spellings:
        if not spelling.exists_on(torch_version):
            continue
        if spelling.environment is not None:
            return "import os", f"os.environ[{spelling.environment!r}] = {environment_value(value)!r}"
        if spelling.attribute is not None:
            return f"import {spelling.module or 'torch'}", f"{spelling.attribute} = {value!r}"
        if spelling.write is not None and spelling.values is None:
            argument = f"{value!r}" if spelling.position == 0 else f"{spelling.argument}={value!r}"
            return "import torch", f"{spelling.write}({argument})"
    raise LookupError(f"no spelling of {setting.id} sets it on torch {torch_version}")


def _paste_seed_generators(value: bool, context: PasteContext) -> Pasted:
    from detaudit.launch.seed_generators import GENERATORS, paste_code

    seeded = [name for name in GENERATORS if name in set(context.generators)]
    if not value or not seeded:
        return Pasted()
    imports, statements = paste_code(seeded, (context.seed or 0) + 1)
    return Pasted(tuple(imports), tuple(statements))


#: In the order the child applies them (and the pasted code makes them).
CHILD_SETTINGS: dict[str, ChildSetting] = {
    setting.name: setting
    for setting in (
        ChildSetting(
            "hash-seed", "PYTHONHASHSEED", environment="PYTHONHASHSEED",
            paste=_paste_restart("PYTHONHASHSEED", "hash() and set order are fixed when Python starts"),
            fingerprint_key="env.PYTHONHASHSEED",
        ),
        ChildSetting(
            "cpu-capability", "ATEN_CPU_CAPABILITY: the vector instructions torch's CPU kernels use",
            environment="ATEN_CPU_CAPABILITY", paste=_paste_cpu_capability, fingerprint_key="env.ATEN_CPU_CAPABILITY",
        ),
        ChildSetting(
            "seed-globals", "seeds for Python's, NumPy's and torch's global generators, before the script",
            apply=_seed_globals, paste=_paste_seed_globals,
        ),
        ChildSetting("deterministic", "detaudit.enable_determinism()", apply=_enable_determinism),
        ChildSetting(
            "backend", "settings of the backend settings table, by id", apply=_write_backend_settings,
            paste=_paste_backend_settings,
        ),
        ChildSetting(
            "threads", "torch.set_num_threads", apply=_set_threads, paste=_paste_threads,
            fingerprint_key="torch.get_num_threads",
        ),
        ChildSetting(
            "seed-generators", "seeds for the generators the script makes without one (seed_generators.py)",
            apply=_seed_generators, paste=_paste_seed_generators,
        ),
    )
}


def child_setting(name: str) -> ChildSetting:
    try:
        return CHILD_SETTINGS[name]
    except KeyError:
        raise KeyError(f"no child setting {name!r} (known: {', '.join(CHILD_SETTINGS)})") from None


def apply_settings(settings: Mapping[str, Any], session) -> None:
    """In the child: make the settings that are not environment variables, in table order."""
    for name, setting in CHILD_SETTINGS.items():
        if name in settings and setting.apply is not None:
            setting.apply(settings[name], session)


def paste_settings(settings: Mapping[str, Any], context: PasteContext) -> list[Pasted]:
    """The settings as code, in table order."""
    pasted = []
    for name, setting in CHILD_SETTINGS.items():
        if name not in settings:
            continue
        if setting.paste is None:
            raise LookupError(f"the child setting {name!r} has no code to paste")
        pasted.append(setting.paste(settings[name], context))
    return pasted
