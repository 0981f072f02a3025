"""The knowledge base of nondeterministic ops: the shipped data, its loader and
validation, the aten lookup, the call matcher and ``detaudit ops``."""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from detaudit.cli import main
from detaudit.knowledge.ops import (
    SCHEMA_VERSION,
    SHIPPED_TABLE,
    TABLE_ENV_VAR,
    UNKNOWN,
    CallArguments,
    OpsTableError,
    alert_caller,
    load_ops_table,
)
from detaudit.knowledge.versions import installed_torch_version, version_in_range

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def table():
    return load_ops_table(SHIPPED_TABLE)


def ids(matches):
    return sorted(match.entry.id for match in matches)


def certain_ids(matches):
    return sorted(match.entry.id for match in matches if match.certain)


# --- the shipped data ------------------------------------------------------------


def test_shipped_table_loads_with_schema_version_and_torch_range(table):
    assert table.schema_version == SCHEMA_VERSION
    assert version_in_range("2.13.0+cpu", table.torch_versions)
    assert not version_in_range("1.13.1", table.torch_versions)
    assert len(table) >= 35
    assert table.provenance["kind"] == "curated"


def test_every_entry_has_sources_aten_names_spellings_and_behaviours(table):
    for entry in table:
        assert entry.sources and entry.aten and entry.spellings and entry.behaviours, entry.id
        assert all(source["ref"].strip() for source in entry.sources), entry.id


def test_issue_entries_are_present(table):
    wanted = {
        "embedding_bag-max", "interpolate-bilinear-trilinear", "interpolate-bicubic", "index_put-accumulate",
        "bincount-weights", "nll_loss-nd", "scatter_reduce-prod", "put", "histc", "median-indices",
        "cumsum-float", "grid_sample-backward", "ctc_loss-backward", "index_reduce",
        "interpolate-bilinear-antialias", "nanmedian-indices", "index_copy", "scatter-src",
        "index_put-duplicates", "sdpa-backward", "reflection_pad-backward", "replication_pad-backward",
        "avg_pool3d-backward", "adaptive_avg_pool2d-backward", "max_unpool",
    }  # fmt: skip
    assert wanted <= {entry.id for entry in table}


def test_every_aten_name_is_an_overload_of_the_installed_torch(table):
    torch = pytest.importorskip("torch")
    for entry in table:
        for name in entry.aten:
            _, packet, overload = name.split(".")
            assert overload in getattr(torch.ops.aten, packet).overloads(), (entry.id, name)


def _resolve(dotted: str):
    parts = dotted.split(".")
    value = importlib.import_module(parts[0])
    for part in parts[1:]:
        value = getattr(value, part)
    return value


def test_every_spelling_exists_and_its_signature_matches_torch(table):
    """Argument positions come from the table's signatures: a wrong order would
    make the matcher read the wrong positional argument."""
    torch = pytest.importorskip("torch")
    for entry in table:
        for spelling in entry.spellings:
            if spelling.kind == "method":
                assert hasattr(torch.Tensor, spelling.name), (entry.id, spelling.name)
                continue
            target = _resolve(spelling.name)
            try:
                signature = inspect.signature(target.__init__ if inspect.isclass(target) else target)
            except (TypeError, ValueError):  # C builtins have no signature to compare
                continue
            if list(signature.parameters) in (["args", "kwargs"], ["self", "args", "kwargs"]):
                continue
            real = [
                p.name
                for p in signature.parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in ("self", "cls")
            ]
            ours = [p.name for p in spelling.params if p.position is not None]
            assert real[: len(ours)] == ours, (entry.id, spelling.name)


def test_put_alert_from_real_torch_maps_to_the_put_entry(table):
    torch = pytest.importorskip("torch")
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError) as raised:
            torch.zeros(4).put_(torch.tensor([1, 1]), torch.tensor([1.0, 2.0]))
    finally:
        torch.use_deterministic_algorithms(False)
    caller = alert_caller(str(raised.value))
    assert caller == "put_"
    assert table.lookup_alert(caller).id == "put"
    assert alert_caller("index out of range") is None


# --- aten lookup and hints -------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["aten.index_put.default", "aten.index_put_.default", "aten.index_put", "aten::index_put_", "index_put"],
)
def test_lookup_aten_accepts_overloads_packets_and_schema_names(table, name):
    assert table.lookup_aten(name).id == "index_put-accumulate"


def test_lookup_aten_accepts_real_torch_op_objects(table):
    torch = pytest.importorskip("torch")
    assert table.lookup_aten(str(torch.ops.aten.index_put_.default)).id == "index_put-accumulate"
    assert table.lookup_aten(str(torch.ops.aten.index_put)).id == "index_put-accumulate"
    assert table.lookup_aten(str(torch.ops.aten._adaptive_avg_pool2d_backward.default)).id == (
        "adaptive_avg_pool2d-backward"
    )


def test_lookup_aten_by_device_and_misses(table):
    # CUDA index_put with accumulate is sort-based: on CUDA only the duplicate-index race is left
    assert table.lookup_aten("aten.index_put.default", device="cuda").id == "index_put-duplicates"
    assert table.lookup_aten("aten.add.Tensor") is None
    assert table.lookup_aten("aten.put.default").id == "put"


def test_hints_say_what_deterministic_mode_does(table):
    assert table.entry("index_add").hint() == (
        "atomicAdd on CUDA (forward); torch.use_deterministic_algorithms(True) switches to a deterministic kernel"
    )
    assert table.entry("adaptive_avg_pool2d-backward").hint() == (
        "atomicAdd on CUDA (backward); torch.use_deterministic_algorithms(True) raises: no deterministic implementation"
    )
    mixed = table.entry("put-accumulate").hint()
    assert "raises on CUDA: no deterministic implementation" in mixed
    assert "switches to a deterministic kernel on CPU" in mixed
    assert "no known nondeterminism on CPU" in table.entry("index_add").hint(device="cpu")


def test_version_dependent_behaviour(table):
    entry = table.entry("max_pool3d-backward")
    assert "raises" in entry.hint(torch_version="2.11.0")
    assert "switches" in entry.hint(torch_version="2.13.0+cu130")
    old = table.match_call("torch.nn.MaxPool3d", None, CallArguments((2,)), torch_version="2.12.1")
    new = table.match_call("torch.nn.MaxPool3d", None, CallArguments((2,)), torch_version="2.13.0")
    assert old[0].raises_under_deterministic_mode and not old[0].fixed_by_deterministic_mode
    assert new[0].fixed_by_deterministic_mode
    torch = pytest.importorskip("torch")
    assert installed_torch_version() == torch.__version__
    # by default the installed torch decides (2.13 here: MaxPool3d switches)
    assert table.match_call("torch.nn.MaxPool3d", None, CallArguments((2,)))[0].fixed_by_deterministic_mode
    # cumsum's alert is gone from 2.11: nothing to match there
    assert table.match_call("torch.cumsum", None, CallArguments((UNKNOWN, 0)), torch_version="2.13.0") == []


# --- the call matcher --------------------------------------------------------------


def test_embedding_bag_mode_max_matches_and_sum_does_not(table):
    module = "torch.nn.EmbeddingBag"
    hit = table.match_call(module, None, CallArguments((1000, 64), {"mode": "max"}))
    assert certain_ids(hit) == ["embedding_bag-max"]
    assert hit[0].cuda_only and hit[0].phases == ("backward",) and hit[0].raising_devices == ("cuda",)
    # mode is the sixth positional parameter of the constructor
    assert certain_ids(table.match_call(module, None, CallArguments((10, 3, None, 2.0, False, "max")))) == [
        "embedding_bag-max"
    ]
    assert table.match_call(module, None, CallArguments((1000, 64), {"mode": "sum"})) == []
    assert table.match_call(module, None, CallArguments((1000, 64))) == []  # default mode='mean'
    assert certain_ids(
        table.match_call("torch.nn.EmbeddingBag.from_pretrained", None, CallArguments((UNKNOWN,), {"mode": "max"}))
    ) == ["embedding_bag-max"]


def test_interpolate_nearest_is_fine_bilinear_and_bicubic_match(table):
    interpolate = "torch.nn.functional.interpolate"
    assert table.match_call(interpolate, None, CallArguments((UNKNOWN,), {"scale_factor": 2})) == []
    assert table.match_call(interpolate, None, CallArguments((UNKNOWN,), {"mode": "nearest"})) == []
    bilinear = table.match_call(interpolate, None, CallArguments((UNKNOWN,), {"mode": "bilinear"}), torch_version="2.13")
    assert certain_ids(bilinear) == ["interpolate-bilinear-trilinear"]
    assert bilinear[0].fixed_by_deterministic_mode
    older = table.match_call(interpolate, None, CallArguments((UNKNOWN,), {"mode": "bilinear"}), torch_version="2.10")
    assert older[0].raises_under_deterministic_mode
    bicubic = table.match_call(interpolate, None, CallArguments((UNKNOWN, None, 2.0, "bicubic")))
    assert certain_ids(bicubic) == ["interpolate-bicubic"] and bicubic[0].raises_under_deterministic_mode
    antialiased = table.match_call(interpolate, None, CallArguments((UNKNOWN,), {"mode": "bilinear", "antialias": True}))
    assert certain_ids(antialiased) == ["interpolate-bilinear-antialias"]
    upsample = table.match_call("torch.nn.Upsample", None, CallArguments((), {"scale_factor": 2, "mode": "bicubic"}))
    assert certain_ids(upsample) == ["interpolate-bicubic"]
    assert certain_ids(table.match_call("torch.nn.UpsamplingBilinear2d", None, CallArguments((), {"scale_factor": 2}))) == [
        "interpolate-bilinear-trilinear"
    ]


def test_unknown_mode_is_never_a_certain_hit(table):
    interpolate = "torch.nn.functional.interpolate"
    matches = table.match_call(interpolate, None, CallArguments((UNKNOWN,), {"mode": UNKNOWN}))
    assert ids(matches) == ["interpolate-bicubic", "interpolate-bilinear-trilinear", "interpolate-linear"]
    assert not any(match.certain for match in matches)
    assert "mode" in matches[0].reasons[0]
    # **kwargs may carry mode: same answer
    unpacked = table.match_call(interpolate, None, CallArguments((UNKNOWN,), {}, unpacked=True))
    assert unpacked and not any(match.certain for match in unpacked)


def test_bincount_with_and_without_weights(table):
    assert certain_ids(table.match_call("torch.bincount", None, CallArguments((UNKNOWN,), {"weights": UNKNOWN}))) == [
        "bincount-weights"
    ]
    assert certain_ids(table.match_call(None, "bincount", CallArguments((UNKNOWN,)))) == ["bincount-weights"]
    assert table.match_call("torch.bincount", None, CallArguments((UNKNOWN,))) == []
    assert table.match_call("torch.bincount", None, CallArguments((UNKNOWN,), {"weights": None})) == []
    assert table.match_call("torch.bincount", None, CallArguments((UNKNOWN,), {"minlength": 10})) == []


def test_index_put_accumulate_and_methods_on_unknown_objects(table):
    accumulate = table.match_call(None, "index_put_", CallArguments((UNKNOWN, UNKNOWN), {"accumulate": True}))
    assert certain_ids(accumulate) == ["index_put-accumulate"]
    assert accumulate[0].devices == ("cpu",)
    plain = table.match_call(None, "index_put_", CallArguments((UNKNOWN, UNKNOWN)))
    assert ids(plain) == ["index_put-duplicates"] and not plain[0].certain  # duplicates are not visible
    unknown = table.match_call(None, "index_put_", CallArguments((UNKNOWN, UNKNOWN, UNKNOWN)))
    assert ids(unknown) == ["index_put-accumulate", "index_put-duplicates"]
    assert not any(match.certain for match in unknown)
    # an explicit self shifts the positions
    explicit = table.match_call("torch.Tensor.index_put_", None, CallArguments((UNKNOWN, UNKNOWN, UNKNOWN, True)))
    assert certain_ids(explicit) == ["index_put-accumulate"]
    assert certain_ids(table.match_call(None, "index_add_", CallArguments((0, UNKNOWN, UNKNOWN)))) == ["index_add"]


def test_accumulate_one_is_not_accumulate_true(table):
    assert table.match_call(None, "put_", CallArguments((UNKNOWN, UNKNOWN, 1))) == []


def test_put_without_accumulate_raises_everywhere(table):
    (match,) = table.match_call(None, "put_", CallArguments((UNKNOWN, UNKNOWN)))
    assert match.entry.id == "put" and match.certain
    assert match.raising_devices == ("cpu", "cuda") and not match.cuda_only


def test_scatter_with_a_scalar_is_not_a_race_with_a_tensor_it_may_be(table):
    assert table.match_call(None, "scatter_", CallArguments((0, UNKNOWN, 1.0))) == []
    assert table.match_call(None, "scatter_", CallArguments((0, UNKNOWN), {"value": 1.0})) == []
    assert ids(table.match_call(None, "scatter_", CallArguments((0, UNKNOWN, UNKNOWN)))) == ["scatter-src"]


def test_scatter_reduce_prod_versus_sum(table):
    prod = table.match_call("torch.scatter_reduce", None, CallArguments((UNKNOWN, 0, UNKNOWN, UNKNOWN, "prod")))
    assert certain_ids(prod) == ["scatter_reduce-prod"] and prod[0].raises_under_deterministic_mode
    total = table.match_call(None, "scatter_reduce_", CallArguments((0, UNKNOWN, UNKNOWN), {"reduce": "sum"}))
    assert certain_ids(total) == ["scatter_reduce-sum-mean"] and total[0].fixed_by_deterministic_mode
    assert table.match_call(None, "scatter_reduce", CallArguments((0, UNKNOWN, UNKNOWN, "amax"))) == []


def test_statically_undecidable_entries_are_only_possible(table):
    (nll,) = table.match_call("torch.nn.functional.nll_loss", None, CallArguments((UNKNOWN, UNKNOWN)))
    assert nll.entry.id == "nll_loss-nd" and not nll.certain and "N-d targets" in nll.reasons[0]
    assert not table.match_call("torch.nn.CrossEntropyLoss", None, CallArguments())[0].certain


def test_median_needs_a_dim_and_a_tensor_receiver(table):
    assert table.match_call("torch.median", None, CallArguments((UNKNOWN,))) == []
    assert certain_ids(table.match_call("torch.median", None, CallArguments((UNKNOWN, 1)))) == ["median-indices"]
    (method,) = table.match_call(None, "median", CallArguments((1,)))
    assert not method.certain and "receiver may not be a tensor" in method.reasons[0]
    assert table.match_call(None, "median", CallArguments()) == []


def test_unrelated_calls_do_not_match(table):
    assert table.match_call("torch.nn.Linear", None, CallArguments((3, 4))) == []
    assert table.match_call(None, "append", CallArguments((1,))) == []
    assert table.match_call(None, None) == []


# --- loading and validation ----------------------------------------------------------


def _shipped_document():
    return json.loads(SHIPPED_TABLE.read_text())


def _broken_documents():
    def edit(change):
        document = _shipped_document()
        change(document)
        return document

    yield "schema_version", edit(lambda d: d.update(schema_version=SCHEMA_VERSION + 1)), "newer than this detaudit"
    yield "mode", edit(lambda d: d["ops"][0]["behaviours"][0].update(deterministic_mode="maybe")), "'maybe' is not one of"
    yield "device", edit(lambda d: d["ops"][0]["behaviours"][0].update(devices=["tpu"])), "'tpu' is not one of"
    yield "arg", edit(lambda d: d["ops"][0]["when"][0].update(arg="acumulate")), "'acumulate' is not a parameter"
    yield "aten", edit(lambda d: d["ops"][0].update(aten=["index_put"])), "is not an aten op name"
    yield "sources", edit(lambda d: d["ops"][0].update(sources=[])), "sources: expected a non-empty list"
    yield "duplicate", edit(lambda d: d["ops"].append(copy.deepcopy(d["ops"][0]))), "duplicate id"
    yield "range", edit(lambda d: d.update(torch_versions="2.0+")), "is not a version clause"
    yield "signature", edit(lambda d: d["ops"][0]["spellings"][0].update(signature="input, index=torch.x")), (
        "not a Python parameter list"
    )
    yield "key", edit(lambda d: d["ops"][0].update(summry="typo")), "unknown key 'summry'"


@pytest.mark.parametrize("label, document, expected", list(_broken_documents()), ids=lambda v: v if isinstance(v, str) else "")
def test_bad_tables_give_one_line_errors(tmp_path, label, document, expected):
    path = tmp_path / f"{label}.json"
    path.write_text(json.dumps(document))
    with pytest.raises(OpsTableError) as raised:
        load_ops_table(path)
    message = str(raised.value)
    assert expected in message and str(path) in message and "\n" not in message


def test_invalid_json_and_missing_file(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema_version": 1,')
    with pytest.raises(OpsTableError, match=r"is not valid JSON: .* line 1"):
        load_ops_table(broken)
    with pytest.raises(OpsTableError, match="cannot read ops table .*missing.json"):
        load_ops_table(tmp_path / "missing.json")


def test_environment_variable_selects_the_table(tmp_path, monkeypatch):
    document = _shipped_document()
    document["ops"] = [op for op in document["ops"] if op["id"] == "put"]
    custom = tmp_path / "one.json"
    custom.write_text(json.dumps(document))
    monkeypatch.setenv(TABLE_ENV_VAR, str(custom))
    assert [entry.id for entry in load_ops_table()] == ["put"]
    monkeypatch.setenv(TABLE_ENV_VAR, str(tmp_path / "gone.json"))
    with pytest.raises(OpsTableError, match=r"\(from \$DETAUDIT_OPS_TABLE\)"):
        load_ops_table()


def test_ops_module_never_imports_torch_or_numpy():
    code = (
        "import sys; from detaudit.knowledge.ops import load_ops_table; load_ops_table(); "
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, 'heavy import'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# --- detaudit ops ----------------------------------------------------------------------


def test_ops_json_output_is_the_table(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "detaudit", "ops", "--format", "json"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed == _shipped_document()


def test_ops_text_lists_every_entry(capsys):
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "nondeterministic ops" in out and "embedding_bag-max" in out and "raises" in out


def test_ops_with_a_bad_table_exits_2_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1}')
    assert main(["ops", "--table", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("detaudit: error: bad ops table") and "missing 'torch_versions'" in err
    assert len(err.splitlines()) == 1
