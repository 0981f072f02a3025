"""The settings table applied to this process: which spelling the running
torch uses for a setting, and how to read and write it.

``environment.fingerprint`` reads settings through here, ``determinism``
writes them; neither names a setting itself (see
``detaudit/knowledge/backend_settings.json``).  A spelling outside its torch
version range is skipped, so older torch degrades to the spellings it has;
a setting none of whose spellings exists reads as absent (AttributeError).
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from detaudit.knowledge.backend_settings import Setting, Spelling, backend_settings

#: How torch's environment variables spell a boolean (TORCHINDUCTOR_*=1).
ENVIRONMENT_TRUE = "1"


@dataclass(frozen=True)
class Access:
    """A setting as this process reaches it: through ``spelling``, named ``name``."""

    setting: Setting
    spelling: Spelling
    read: Callable[[], Any]
    write: Callable[[Any], None]

    @property
    def name(self) -> str:
        return self.spelling.name


def torch_attribute(torch: Any, dotted_name: str) -> Any:
    """``torch_attribute(torch, "torch.backends.cudnn.conv")`` is that object."""
    value = torch
    for part in dotted_name.split(".")[1:]:
        value = getattr(value, part)
    return value


def reader(torch: Any, setting: Setting) -> Callable[[], Any] | None:
    """A getter for the setting's value through its first readable spelling
    on this torch, or None when this torch has none.  The getter raises
    AttributeError when the setting turns out to be missing (a module
    detaudit must not import is not imported, an attribute this build lacks)."""
    for spelling in setting.spellings:
        if spelling.readable and spelling.exists_on(torch.__version__):
            return _getter(torch, spelling)
    return None


def access(torch: Any, setting: Setting) -> Access | None:
    """How to read and write the setting now: its first spelling on this torch
    that can be read and written right now (an attribute whose module detaudit
    must not import falls through to the next spelling, the environment
    variable that module reads when it is imported).  None: none can."""
    for spelling in setting.spellings:
        if not spelling.exists_on(torch.__version__):
            continue
        if spelling.environment is not None:
            return _environment_access(setting, spelling)
        if spelling.read is not None and spelling.write is not None:
            try:
                getter, setter = torch_attribute(torch, spelling.read), torch_attribute(torch, spelling.write)
            except AttributeError:
                continue
            return Access(setting, spelling, getter, _setter(setter, spelling))
        if spelling.attribute is not None:
            try:
                owner = _owner(torch, spelling)
            except AttributeError:
                continue
            attribute = spelling.attribute.rpartition(".")[2]
            if not _present(lambda: getattr(owner, attribute)):
                continue
            return Access(
                setting,
                spelling,
                lambda: getattr(owner, attribute),
                lambda value: setattr(owner, attribute, value),
            )
    return None


def write_settings(torch: Any, values: Mapping[str, Any]) -> list[str]:
    """Set settings of the table, by id, to ``values`` (as the table spells
    them: ``True``, ``":4096:8"``) in this process, in the order given.
    Returns the ids this torch has no writable spelling for (left alone)."""
    table = backend_settings()
    missing = []
    for setting_id, value in values.items():
        found = access(torch, table[setting_id])
        if found is None:
            missing.append(setting_id)
        else:
            found.write(environment_value(value) if found.spelling.environment is not None else value)
    return missing


def exists(torch: Any, setting: Setting) -> bool:
    """Whether this torch has the setting (a spelling of it is there to read)."""
    get = reader(torch, setting)
    return get is not None and _present(get)


def _present(get: Callable[[], Any]) -> bool:
    """Whether a getter finds its setting (AttributeError: this torch lacks it)."""
    try:
        get()
    except AttributeError:
        return False
    except Exception:  # there, but unreadable now (torch raises when TF32 APIs were mixed)
        pass
    return True


def _getter(torch: Any, spelling: Spelling) -> Callable[[], Any]:
    if spelling.read is not None:
        return lambda: torch_attribute(torch, spelling.read)()
    attribute = spelling.attribute.rpartition(".")[2]
    return lambda: getattr(_owner(torch, spelling), attribute)


def _owner(torch: Any, spelling: Spelling) -> Any:
    """The object holding the attribute, importing its module if detaudit may."""
    if spelling.module is not None:
        module = sys.modules.get(spelling.module)
        if module is None and not spelling.import_module:
            raise AttributeError(f"{spelling.module} is not imported (detaudit does not import it)")
        if module is None:
            try:
                importlib.import_module(spelling.module)
            except ImportError as error:
                raise AttributeError(f"{spelling.module}: {error}") from None
    return torch_attribute(torch, spelling.attribute.rpartition(".")[0])


def _setter(function: Callable[..., Any], spelling: Spelling) -> Callable[[Any], None]:
    """The setter called with the value alone: first positional argument, else by keyword."""
    if spelling.position == 0:
        return lambda value: function(value)
    return lambda value: function(**{spelling.argument: value})


def _environment_access(setting: Setting, spelling: Spelling) -> Access:
    """The variable itself, or (for a setting whose attribute lives in a module
    detaudit does not import) the variable that module reads on import, as
    ``"1"``/unset; writing it also updates the attribute if the module was
    imported since."""
    name = spelling.environment
    standing_in_for = next((s for s in setting.spellings if s.attribute is not None and s.module is not None), None)
    set_variable = environment_writer(name)

    def write(value: str | None) -> None:
        set_variable(value)
        module = sys.modules.get(standing_in_for.module) if standing_in_for is not None else None
        if module is not None:
            setattr(module, standing_in_for.attribute.rpartition(".")[2], value == ENVIRONMENT_TRUE)

    return Access(setting, spelling, lambda: os.environ.get(name), write)


def environment_writer(name: str) -> Callable[[str | None], None]:
    """Sets the variable ``name`` (None: unsets it)."""

    def write(value: str | None) -> None:
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value

    return write


def environment_value(value: Any) -> Any:
    """A setting's value as an environment variable spells it (booleans: ``"1"`` or unset)."""
    if isinstance(value, bool):
        return ENVIRONMENT_TRUE if value else None
    return value
