"""The ops table's published JSON Schema and detaudit's own reader agree.

detaudit validates tables without a JSON Schema library (``knowledge.ops.loading``);
editors validate them with ``nondeterministic_ops.schema.json``.  The same
documents go through both here, so neither can drift from the other: the
shipped table, a document using every optional field, and a set of broken ones.
"""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from detaudit.knowledge.ops import SCHEMA_FILE, SCHEMA_VERSION, SHIPPED_TABLE, OpsTableError, load_ops_table, parse_ops_table
from detaudit.knowledge.ops.loading import ATEN_NAME
from detaudit.knowledge.ops.model import (
    CONDITION_TESTS,
    DETERMINISTIC_MODES,
    DEVICES,
    PHASES,
    SOURCE_KINDS,
    SPELLING_KINDS,
)
from detaudit.knowledge.versions import VERSION_CLAUSE

SCHEMA = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)


def shipped() -> dict:
    return json.loads(SHIPPED_TABLE.read_text(encoding="utf-8"))


def schema_errors(document) -> list[str]:
    return [error.message for error in VALIDATOR.iter_errors(document)]


def test_the_schema_is_a_valid_draft_7_schema():
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def test_shipped_table_follows_the_published_schema():
    assert schema_errors(shipped()) == []


def test_shipped_table_points_editors_at_the_schema_next_to_it():
    reference = shipped()["$schema"]
    assert (SHIPPED_TABLE.parent / reference).resolve() == SCHEMA_FILE.resolve()


def test_schema_vocabulary_is_the_readers():
    definitions = SCHEMA["definitions"]
    behaviour = definitions["behaviour"]["properties"]
    assert tuple(behaviour["devices"]["items"]["enum"]) == DEVICES
    assert tuple(behaviour["phases"]["items"]["enum"]) == PHASES
    assert tuple(behaviour["deterministic_mode"]["enum"]) == tuple(DETERMINISTIC_MODES)
    assert tuple(definitions["source"]["properties"]["kind"]["enum"]) == SOURCE_KINDS
    assert tuple(choice["required"][0] for choice in definitions["spelling"]["oneOf"]) == SPELLING_KINDS
    assert tuple(choice["required"][0] for choice in definitions["condition"]["oneOf"]) == CONDITION_TESTS
    assert SCHEMA["properties"]["schema_version"]["maximum"] == SCHEMA_VERSION
    assert definitions["op"]["properties"]["aten"]["items"]["pattern"] == f"^{ATEN_NAME.pattern}$"
    clause = VERSION_CLAUSE.pattern
    assert definitions["versionRange"]["pattern"] == rf"^\s*{clause}\s*(,\s*{clause}\s*)*$"


def test_every_optional_field_is_accepted_by_both():
    document = shipped()
    entry = document["ops"][0]
    entry.update(
        static="only when the index holds duplicates",
        note="a note",
        measurements=[{"torch": "2.13.0", "device": "cpu"}],
        alerts=["put_"],
        when=[{"arg": "accumulate", "in": [False]}],
        one_thread_deterministic=True,
        deterministic_settings=["cudnn-benchmark"],
        replacement="use put_ on unique indices",
        hazard_by_default=True,
    )
    entry["spellings"][0].update(shared_name=False, when=[{"arg": "index", "passed": True}])
    entry["spellings"][1]["when"] = [{"arg": "source", "not_number": True}]
    entry["spellings"][2]["when"] = [{"arg": "accumulate", "equals": False}]
    entry["behaviours"][0].update(torch=">=2.0, <2.14", evidence={"observed": True})
    document["provenance"]["device"] = "cpu"
    assert schema_errors(document) == []
    parse_ops_table(document)


def _edit(change) -> dict:
    document = shipped()
    change(document)
    return document


def _without(mapping: dict, key: str) -> None:
    del mapping[key]


# (label, broken document, the JSON path the reader must name)
BROKEN = [
    ("not an object", [], "top level"),
    ("missing ops", _edit(lambda d: _without(d, "ops")), "top level"),
    ("unknown top-level key", _edit(lambda d: d.update(comment="x")), "top level"),
    ("$schema not a string", _edit(lambda d: d.update({"$schema": 1})), "$schema"),
    ("schema_version newer", _edit(lambda d: d.update(schema_version=SCHEMA_VERSION + 1)), "schema_version"),
    ("schema_version zero", _edit(lambda d: d.update(schema_version=0)), "schema_version"),
    ("schema_version a string", _edit(lambda d: d.update(schema_version="1")), "schema_version"),
    ("schema_version a boolean", _edit(lambda d: d.update(schema_version=True)), "schema_version"),
    ("range without operator", _edit(lambda d: d.update(torch_versions="2.0")), "torch_versions"),
    ("range with a plus", _edit(lambda d: d.update(torch_versions=">=2.0+")), "torch_versions"),
    ("range with an empty clause", _edit(lambda d: d.update(torch_versions=">=2.0,")), "torch_versions"),
    ("provenance without kind", _edit(lambda d: d.update(provenance={"date": "x"})), "provenance"),
    ("provenance kind a number", _edit(lambda d: d.update(provenance={"kind": 1})), "provenance.kind"),
    ("ops empty", _edit(lambda d: d.update(ops=[])), "ops"),
    ("op not an object", _edit(lambda d: d["ops"].__setitem__(3, "put")), "ops[3]"),
    ("op missing aten", _edit(lambda d: _without(d["ops"][2], "aten")), "ops[2]"),
    ("op unknown key", _edit(lambda d: d["ops"][0].update(summry="typo")), "ops[0]"),
    ("op id blank", _edit(lambda d: d["ops"][4].update(id="  ")), "ops[4].id"),
    ("op summary a number", _edit(lambda d: d["ops"][4].update(summary=3)), "ops[4].summary"),
    ("op static empty", _edit(lambda d: d["ops"][4].update(static="")), "ops[4].static"),
    ("op recipe null", _edit(lambda d: d["ops"][4].update(recipe=None)), "ops[4].recipe"),
    ("spellings empty", _edit(lambda d: d["ops"][5].update(spellings=[])), "ops[5].spellings"),
    ("spelling with two kinds", _edit(lambda d: d["ops"][0]["spellings"][0].update(method="put_")), "ops[0].spellings[0]"),
    ("spelling with no kind", _edit(lambda d: _without(d["ops"][0]["spellings"][1], "method")), "ops[0].spellings[1]"),
    ("spelling unknown key", _edit(lambda d: d["ops"][0]["spellings"][0].update(alias="x")), "ops[0].spellings[0]"),
    ("spelling without signature", _edit(lambda d: _without(d["ops"][0]["spellings"][0], "signature")), "ops[0].spellings[0]"),
    ("shared_name a string", _edit(lambda d: d["ops"][0]["spellings"][2].update(shared_name="yes")), "ops[0].spellings[2].shared_name"),
    ("when not a list", _edit(lambda d: d["ops"][0].update(when={"arg": "accumulate", "equals": False})), "ops[0].when"),
    ("condition with two tests", _edit(lambda d: d["ops"][0]["when"][0].update(passed=True)), "ops[0].when[0]"),
    ("condition without test", _edit(lambda d: _without(d["ops"][0]["when"][0], "equals")), "ops[0].when[0]"),
    ("condition unknown key", _edit(lambda d: d["ops"][0]["when"][0].update(note="x")), "ops[0].when[0]"),
    ("condition passed false", _edit(lambda d: d["ops"][0].update(when=[{"arg": "accumulate", "passed": False}])), "ops[0].when[0].passed"),
    ("condition in empty", _edit(lambda d: d["ops"][0].update(when=[{"arg": "accumulate", "in": []}])), "ops[0].when[0].in"),
    ("aten empty", _edit(lambda d: d["ops"][0].update(aten=[])), "ops[0].aten"),
    ("aten without prefix", _edit(lambda d: d["ops"][0].update(aten=["index_put"])), "ops[0].aten[0]"),
    ("aten with three dots", _edit(lambda d: d["ops"][0].update(aten=["aten.a.b.c"])), "ops[0].aten[0]"),
    ("alert blank", _edit(lambda d: d["ops"][0].update(alerts=[""])), "ops[0].alerts[0]"),
    ("behaviours empty", _edit(lambda d: d["ops"][6].update(behaviours=[])), "ops[6].behaviours"),
    ("device unknown", _edit(lambda d: d["ops"][12]["behaviours"][0].update(devices=["tpu"])), "ops[12].behaviours[0].devices[0]"),
    ("devices a string", _edit(lambda d: d["ops"][12]["behaviours"][0].update(devices="cuda")), "ops[12].behaviours[0].devices"),
    ("devices empty", _edit(lambda d: d["ops"][12]["behaviours"][0].update(devices=[])), "ops[12].behaviours[0].devices"),
    ("phase unknown", _edit(lambda d: d["ops"][12]["behaviours"][0].update(phases=["both"])), "ops[12].behaviours[0].phases[0]"),
    ("mode unknown", _edit(lambda d: d["ops"][0]["behaviours"][0].update(deterministic_mode="maybe")), "ops[0].behaviours[0].deterministic_mode"),
    ("behaviour unknown key", _edit(lambda d: d["ops"][0]["behaviours"][0].update(device="cpu")), "ops[0].behaviours[0]"),
    ("behaviour without mechanism", _edit(lambda d: _without(d["ops"][0]["behaviours"][0], "mechanism")), "ops[0].behaviours[0]"),
    ("behaviour range bad", _edit(lambda d: d["ops"][1]["behaviours"][0].update(torch="2.11")), "ops[1].behaviours[0].torch"),
    ("sources empty", _edit(lambda d: d["ops"][0].update(sources=[])), "ops[0].sources"),
    ("source kind unknown", _edit(lambda d: d["ops"][0]["sources"][0].update(kind="blog")), "ops[0].sources[0].kind"),
    ("source without ref", _edit(lambda d: _without(d["ops"][0]["sources"][0], "ref")), "ops[0].sources[0]"),
    ("source unknown key", _edit(lambda d: d["ops"][0]["sources"][0].update(url="x")), "ops[0].sources[0]"),
    ("one_thread_deterministic a string", _edit(lambda d: d["ops"][0].update(one_thread_deterministic="yes")), "ops[0].one_thread_deterministic"),
    ("deterministic_settings empty", _edit(lambda d: d["ops"][0].update(deterministic_settings=[])), "ops[0].deterministic_settings"),
    ("hazard_by_default a string", _edit(lambda d: d["ops"][0].update(hazard_by_default="yes")), "ops[0].hazard_by_default"),
    ("replacement empty", _edit(lambda d: d["ops"][0].update(replacement="")), "ops[0].replacement"),
    ("measurement not an object", _edit(lambda d: d["ops"][0].update(measurements=["2.13"])), "ops[0].measurements[0]"),
]  # fmt: skip


def test_deterministic_settings_name_settings_of_the_settings_table():
    document = _edit(lambda d: d["ops"][0].update(deterministic_settings=["cudnn-benchmark", "cudnn-turbo"]))
    with pytest.raises(OpsTableError, match=r"ops\[0\]\.deterministic_settings\[1\]: 'cudnn-turbo' is not a setting"):
        parse_ops_table(document, "t.json")


@pytest.mark.parametrize("label, document, path", BROKEN, ids=[case[0] for case in BROKEN])
def test_broken_documents_are_rejected_by_the_schema_and_the_reader(label, document, path):
    assert schema_errors(document), f"the schema accepts: {label}"
    with pytest.raises(OpsTableError) as raised:
        parse_ops_table(document, "t.json")
    message = str(raised.value)
    assert message.startswith(f"bad ops table t.json: {path}: "), message
    assert "\n" not in message


# What a JSON Schema cannot say: only the reader rejects these.
READER_ONLY = [
    ("duplicate id", _edit(lambda d: d["ops"].append(copy.deepcopy(d["ops"][3]))),
     f"ops[{len(shipped()['ops'])}].id: duplicate id {shipped()['ops'][3]['id']!r} (first at ops[3])"),
    ("condition on no parameter", _edit(lambda d: d["ops"][0]["when"][0].update(arg="acumulate")), "ops[0].spellings[0]: condition argument 'acumulate'"),
    ("signature not Python", _edit(lambda d: d["ops"][0]["spellings"][0].update(signature="input, index=(")), "ops[0].spellings[0].signature: "),
    ("hazard_by_default without static", _edit(lambda d: d["ops"][0].update(hazard_by_default=True)), "ops[0].hazard_by_default: only an entry with `static`"),
    ("default not a literal", _edit(lambda d: d["ops"][0]["spellings"][0].update(signature="input, index=torch.x")), "ops[0].spellings[0].signature: "),
]  # fmt: skip


@pytest.mark.parametrize("label, document, expected", READER_ONLY, ids=[case[0] for case in READER_ONLY])
def test_what_only_the_reader_checks(label, document, expected):
    assert schema_errors(document) == []
    with pytest.raises(OpsTableError) as raised:
        parse_ops_table(document, "t.json")
    assert str(raised.value).startswith(f"bad ops table t.json: {expected}"), str(raised.value)


def test_errors_name_the_entry_they_are_in(tmp_path):
    document = _edit(lambda d: d["ops"][12]["behaviours"][0].update(devices=["tpu"]))
    path = tmp_path / "custom.json"
    path.write_text(json.dumps(document))
    with pytest.raises(OpsTableError) as raised:
        load_ops_table(path)
    assert str(raised.value) == (
        f"bad ops table {path}: ops[12].behaviours[0].devices[0]: 'tpu' is not one of cpu, cuda (op '{document['ops'][12]['id']}')"
    )


def test_a_calibrated_table_follows_the_schema_and_points_at_it():
    torch = pytest.importorskip("torch")
    from detaudit.knowledge.calibrate import Measurement, PhaseResult, calibrated_table

    measurements = [
        Measurement("histc", forward=PhaseResult("histc_cpu", "aten.histc.default", 0, None, 3)),
        Measurement("index_copy", forward=PhaseResult(None, None, 2, 1, 3)),
        Measurement("sdpa-backward", error="RuntimeError: no kernel"),
    ]
    document = calibrated_table(load_ops_table(SHIPPED_TABLE), measurements, "cpu").to_document()
    assert schema_errors(document) == []
    # written elsewhere, it names this installation's schema by absolute URI
    assert list(document)[0] == "$schema" and document["$schema"] == SCHEMA_FILE.as_uri()
    assert torch.__version__.split("+")[0] in document["torch_versions"]
