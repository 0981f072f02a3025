"""detaudit.launch.import_hooks: an action runs once the script imports a
module, by whoever imports it, and not before."""

import importlib
import sys

from detaudit.launch.import_hooks import when_imported


def test_the_action_runs_right_after_the_import_and_once(tmp_path, monkeypatch):
    (tmp_path / "late_framework.py").write_text("class Trainer:\n    def fit(self):\n        return 'fit'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("late_framework", seen.append)
    assert seen == [] and "late_framework" not in sys.modules  # nothing imported it for the action

    module = importlib.import_module("late_framework")
    assert seen == [module]
    importlib.reload(module)
    assert seen == [module]  # once
    # the module works as without the hook
    assert module.Trainer().fit() == "fit"
    monkeypatch.delitem(sys.modules, "late_framework")


def test_an_imported_module_gets_the_action_at_once():
    seen = []
    when_imported("json", seen.append)
    assert seen == [sys.modules["json"]]
