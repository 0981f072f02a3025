"""The cause registry (one object per kind, equal to its name wherever it goes) and the table of variations."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from detaudit.dynamic.compare.causes import CAUSE_KINDS, RNG, CauseKind, _register
from detaudit.dynamic.variations import VARIATIONS
from detaudit.launch.child_settings import CHILD_SETTINGS


def test_a_kind_is_its_name_and_stays_the_registrys_object():
    assert RNG == "rng" and RNG.name == "rng" and type(RNG.name) is str and f"{RNG}" == "rng"
    assert CAUSE_KINDS["rng"] is RNG and RNG.code == "DYN002"
    assert copy.deepcopy(RNG) is RNG and pickle.loads(pickle.dumps(RNG)) is RNG
    assert json.dumps({"kind": RNG}) == '{"kind": "rng"}'


def test_codes_and_names_are_unique():
    assert len({kind.code for kind in CAUSE_KINDS.values()}) == len(CAUSE_KINDS)
    with pytest.raises(ValueError, match="clashes with DYN002 rng"):
        _register(CauseKind("DYN099", "rng", "", ""))


def test_each_variation_varies_a_child_setting_between_repeats_or_is_an_audit_of_its_own():
    assert VARIATIONS["threads"].settings(4) == [1, 1, 2, 4]
    assert VARIATIONS["hashseed"].settings(4) == ["0", "0", "1", "2"]
    for variation in VARIATIONS.values():
        if variation.repeats_script:
            assert variation.setting in CHILD_SETTINGS and not variation.audit
            assert CHILD_SETTINGS[variation.setting].fingerprint_key  # what a run ran with shows
        else:
            assert callable(variation.audit_function()) and not variation.setting
        assert CAUSE_KINDS[variation.cause.name] is variation.cause
    assert not VARIATIONS["batch"].repeats_script
