"""The dynamic pass's layers, as its folders state them.

``dynamic/compare/`` and ``dynamic/verdict/`` read what runs recorded and
must import neither torch nor numpy (the parent of ``detaudit run`` imports
torch only to measure tensors that differ); so must the parent's side of
launching a run and every launch feature's module (the parent builds the
options).  Every launch feature is in the one table the bootstrap walks.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import detaudit
from detaudit.launch.child_settings import CHILD_SETTINGS
from detaudit.launch.features import FEATURES, ChildFeature, feature_class

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(detaudit.__file__).parent

#: folders whose every module imports neither torch nor numpy
TORCH_FREE_FOLDERS = ("dynamic/compare", "dynamic/verdict", "dynamic/remedy")
#: single modules of other folders that the parent imports
TORCH_FREE_MODULES = (
    "detaudit.launch.process",
    "detaudit.launch.options",
    "detaudit.launch.torchrun",
    "detaudit.launch.features",
    "detaudit.launch.child_settings",
    "detaudit.launch.seed_generators",
    "detaudit.dynamic.runner",
    "detaudit.dynamic.variations",
    "detaudit.dynamic.faults.spec",
    "detaudit.dynamic.batch.report",
    "detaudit.dynamic.batch.vary",
    "detaudit.dynamic.record.native",
    "detaudit.resume.components",
    "detaudit.resume.compare",
    "detaudit.resume.report",
    "detaudit.resume.presets",
    "detaudit.resume.audit",
    "detaudit.launch.import_hooks",
    "detaudit.cli.resume",
)


def _modules_of(folder: str) -> list[str]:
    package = "detaudit." + folder.replace("/", ".")
    return [package] + [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(PACKAGE / folder)])]


def _imported_heavy(modules: list[str]) -> list[str]:
    code = f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n" \
        "print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return eval(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("folder", TORCH_FREE_FOLDERS)
def test_the_torch_free_folders_import_neither_torch_nor_numpy(folder):
    modules = _modules_of(folder)
    assert len(modules) > 2
    assert _imported_heavy(modules) == []


def test_the_parent_side_of_a_launch_and_every_feature_imports_neither_torch_nor_numpy():
    features = sorted({FEATURES[key].partition(":")[0] for key in FEATURES})
    assert _imported_heavy([*TORCH_FREE_MODULES, *features]) == []


def _all_modules() -> list[str]:
    return [
        module.name
        for module in pkgutil.walk_packages([str(PACKAGE)], prefix="detaudit.")
        if not module.name.endswith("__main__")
    ]


def test_every_launch_feature_is_in_the_bootstraps_table_under_its_own_key():
    for key in FEATURES:
        assert feature_class(key).key == key
    for name in _all_modules():
        importlib.import_module(name)
    defined = {cls for cls in _subclasses(ChildFeature)}
    listed = {feature_class(key) for key in FEATURES}
    assert defined == listed, f"features not in launch/features.py FEATURES: {defined - listed}"


def _subclasses(cls):
    for sub in cls.__subclasses__():
        if sub.__module__.startswith("detaudit."):
            yield sub
        yield from _subclasses(sub)


def test_every_child_setting_is_made_one_way_and_pasted_or_never_remedied():
    from detaudit.dynamic.remedy.catalogue import REMEDIES

    for setting in CHILD_SETTINGS.values():
        assert bool(setting.environment) != bool(setting.apply), setting.name  # the parent or the child makes it
    remedied = {name for remedy in REMEDIES.values() for name in remedy.settings} | {"backend"}
    for name in remedied:
        assert CHILD_SETTINGS[name].paste is not None, f"remedy setting {name} has no code to paste"
