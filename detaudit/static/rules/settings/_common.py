"""What several settings rules share: the fix that writes a setting's safe value
(cudnn-benchmark, tf32) and how a call is named in messages
(deterministic-off, deterministic-warn-only).
"""

from __future__ import annotations

import libcst as cst

from detaudit.knowledge.backend_settings import Setting
from detaudit.static.engine.facts import CallFact, SettingWrite, StaticValue
from detaudit.static.fixes.edits import Replace, same_quotes_string, setting_comment_words


def _safe_value(setting: Setting, like: cst.BaseExpression) -> cst.BaseExpression:
    """The setting's safe value as code (a string keeps the quotes of ``like``)."""
    if isinstance(setting.safe, str):
        return same_quotes_string(like, setting.safe)
    return cst.Name(repr(setting.safe))


def safe_value_fix(write: SettingWrite, value: StaticValue, setting: Setting) -> Replace | None:
    """Fix a setting's value in place (dropping a comment about the old value);
    unsafe when the value came from a flag default."""
    if write.value is None:
        return None
    return safe_value_edit(write.value, setting, write.target, value)


def safe_value_edit(old: cst.BaseExpression, setting: Setting, name: str, value: StaticValue) -> Replace:
    return Replace(
        old, _safe_value(setting, old), safe=not value.from_default, stale_comment=setting_comment_words(name, value.describe())
    )


def describe_call(call: CallFact) -> str:
    """A short spelling of the callee for messages: ``use_deterministic_algorithms``."""
    return (call.qualname or call.method or "call").rpartition(".")[2]
