"""The cause registry: one object per kind, equal to its name wherever it goes."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from detaudit.dynamic.causes import CAUSE_KINDS, RNG, CauseKind, _register


def test_a_kind_is_its_name_and_stays_the_registrys_object():
    assert RNG == "rng" and RNG.name == "rng" and type(RNG.name) is str and f"{RNG}" == "rng"
    assert CAUSE_KINDS["rng"] is RNG and RNG.code == "DYN002"
    assert copy.deepcopy(RNG) is RNG and pickle.loads(pickle.dumps(RNG)) is RNG
    assert json.dumps({"kind": RNG}) == '{"kind": "rng"}'


def test_codes_and_names_are_unique():
    assert len({kind.code for kind in CAUSE_KINDS.values()}) == len(CAUSE_KINDS)
    with pytest.raises(ValueError, match="clashes with DYN002 rng"):
        _register(CauseKind("DYN099", "rng", "", ""))
