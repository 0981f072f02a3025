"""The settings table: its loader, its facts against the installed torch, and
the rule that it is the only place in ``detaudit/`` spelling a backend flag."""

from __future__ import annotations

import ast
import copy
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from detaudit.knowledge.backend_settings import (
    SHIPPED_TABLE,
    SettingsTableError,
    backend_settings,
    parse_backend_settings,
)
from detaudit.static.engine import check_source

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "detaudit"


def run_python(code: str, env_extra: dict | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")}
    env.update({"PYTHONPATH": str(REPO), **(env_extra or {})})
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=180
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# --- the loader ---------------------------------------------------------------------


def shipped_document() -> dict:
    return json.loads(SHIPPED_TABLE.read_text(encoding="utf-8"))


def test_shipped_table_loads_with_typed_entries():
    table = backend_settings()
    benchmark = table["cudnn-benchmark"]
    assert benchmark.key == "torch.backends.cudnn.benchmark"
    assert benchmark.is_risky(True) and not benchmark.is_risky(False) and not benchmark.is_risky(1)
    assert benchmark.hazard.problem and benchmark.hazard.why and benchmark.hazard.cost and benchmark.hazard.sources
    cublas = table["cublas-workspace-config"]
    assert cublas.key == "env.CUBLAS_WORKSPACE_CONFIG"
    assert cublas.is_risky(None) and cublas.is_risky(":0:0") and not cublas.is_risky(":16:8")
    assert table.namespaces["torch.backends.cudnn"].flags[:2] == ("enabled", "benchmark")
    # legacy TF32 getters are read after the API that supersedes them
    order = [s.id for s in table.settings]
    assert order.index("cudnn-conv-fp32-precision") < order.index("cudnn-allow-tf32")
    assert backend_settings() is table  # read once per process


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(schema_version=99), r"\$\.schema_version: 99 is newer than this detaudit reads"),
        (lambda d: d["settings"][0].update(hazard="nope"), r"\$\.settings\[0\]\.hazard: no hazard 'nope'"),
        (lambda d: d["settings"][5]["spellings"][0].update(torch="2.9+"), r"\$\.settings\[5\]\.spellings\[0\]\.torch: '2.9\+' is not a version clause"),
        (lambda d: d["settings"][1].update(enable_determinism="sometimes"), r"\$\.settings\[1\]\.enable_determinism: 'sometimes' is not one of"),
        (lambda d: d["settings"][5].update(colour="red"), r"\$\.settings\[5\]: unknown key 'colour'"),
        (lambda d: d["settings"][5].update(safe=True), r"\$\.settings\[5\]: the safe value True is also risky"),
        (lambda d: d["settings"][0]["spellings"][0].pop("argument"), r"\$\.settings\[0\]\.spellings\[0\]: a 'write' function needs the 'argument'"),
        (lambda d: d["settings"].append(copy.deepcopy(d["settings"][0])), r"duplicate id 'deterministic-algorithms'"),
        (lambda d: d["settings"][5]["spellings"][0].update(attribute="torch.backends.cudnn.benchmarks"), r"'benchmarks' is not listed in namespaces\['torch.backends.cudnn'\]"),
        (lambda d: d["hazards"]["autotuning"].update(problem="{name} is {value}"), r"\$\.hazards\.autotuning\.problem: the only placeholder"),
        (lambda d: d["settings"].insert(0, d["settings"].pop(18)), r"'cudnn-fp32-precision' must come first"),
    ],
)
def test_bad_tables_are_refused_with_the_json_path(edit, message):
    document = shipped_document()
    edit(document)
    with pytest.raises(SettingsTableError, match=message):
        parse_backend_settings(document, "edited.json")


# --- the facts, against the installed torch ------------------------------------------


def test_every_setting_reads_on_this_torch_with_its_documented_default():
    """In a fresh interpreter (Inductor imported, no TORCHINDUCTOR_* set), every
    setting the table puts on this torch exists and has the default it states."""
    out = run_python(
        """
        import json, torch, torch._inductor.config
        from detaudit.knowledge.backend_settings import backend_settings
        from detaudit.runtime.settings import reader
        values = {}
        for setting in backend_settings().settings:
            get = reader(torch, setting)
            if get is not None:
                values[setting.id] = get()
        print(json.dumps(values))
        """
    )
    values = json.loads(out)
    import torch

    for setting in backend_settings().settings:
        if setting.spellings[0].environment is not None:
            continue
        assert any(s.exists_on(torch.__version__) for s in setting.spellings), setting.id
        assert values[setting.id] == setting.default, setting.id


def test_flags_parameters_are_torchs_signatures():
    import torch
    import torch.backends.mkldnn  # noqa: F401
    import torch.backends.nnpack  # noqa: F401
    import torch.backends.opt_einsum  # noqa: F401

    for name, namespace in backend_settings().namespaces.items():
        if namespace.flags:
            flags = eval(f"{name}.flags", {"torch": torch})  # noqa: S307 (a dotted name from our own table)
            assert tuple(inspect.signature(flags).parameters) == namespace.flags, name


def test_unknown_backend_flag_knows_every_real_setting():
    """Every setting torch's backend namespaces really have (their properties and
    flag descriptors, read from the installed torch) is in the knowledge base,
    so a correct assignment is never reported."""
    import torch
    import torch.backends.cudnn.rnn  # noqa: F401
    import torch.backends.mkldnn  # noqa: F401
    import torch.backends.opt_einsum  # noqa: F401

    for namespace, known in ((n, ns.attributes) for n, ns in backend_settings().namespaces.items()):
        obj = eval(namespace, {"torch": torch})  # noqa: S307 (a dotted name from our own table)
        settable = {
            name
            for klass in type(obj).__mro__
            for name, value in vars(klass).items()
            if not name.startswith("_") and hasattr(value, "__set__")
        }
        assert settable <= known, f"{namespace}: {sorted(settable - known)}"


def test_debug_modes_cover_both_settings_alike():
    """set_deterministic_debug_mode writes two settings: the table maps every
    mode for both."""
    table = backend_settings()
    for on in table["deterministic-algorithms"].writers:
        if on.values is not None:
            (warn,) = [w for w in table["deterministic-warn-only"].writers if w.write == on.write]
            assert [mode for mode, _ in on.values] == [mode for mode, _ in warn.values]


def test_flags_context_managers_of_every_namespace_are_linted():
    """Setting reduced precision through torch.backends.flags / mkldnn.flags
    (torch 2.13 signatures, from the table) is reported like an assignment."""
    source = (
        "import torch\n"
        "with torch.backends.flags(fp32_precision='tf32'):\n    pass\n"
        "with torch.backends.mkldnn.flags(True, True, False, 'bf16'):\n    pass\n"
    )
    findings = [(f.code, f.line, f.message) for f in check_source(source).findings]
    assert [(code, line) for code, line, _ in findings] == [("DET011", 2), ("DET011", 4)]
    assert "torch.backends.mkldnn.fp32_precision = 'bf16'" in findings[1][2]


def test_older_torch_takes_the_legacy_spellings():
    """On a torch older than the fp32_precision API (2.9), the table's version
    ranges make the runtime read and switch TF32 through the legacy API.  The
    installed torch (2.13) still has those setters, so the version string alone
    is set back to 2.8.0 to take that path on real torch."""
    out = run_python(
        """
        import json, torch
        import torch._inductor.config  # use_deterministic_algorithms imports it; keeps the keys alike
        torch.__version__ = "2.8.0"
        import detaudit
        from detaudit.runtime.environment import fingerprint
        torch.set_float32_matmul_precision("high")
        before = fingerprint()
        changes = detaudit.enable_determinism()
        during = fingerprint()
        changes.restore()
        after = fingerprint()
        print(json.dumps({
            "changed": [c.name for c in changes.changes],
            "notes": changes.notes,
            "fp32_keys": sorted(k for k in before if k.endswith("fp32_precision")),
            "during": [during["torch.get_float32_matmul_precision"], during["torch.backends.cudnn.allow_tf32"]],
            "restored": before == after,
            "issues": [i.setting for i in detaudit.status().issues],
        }))
        """
    )
    result = json.loads(out)
    assert "torch.set_float32_matmul_precision" in result["changed"]
    assert "torch.backends.cudnn.allow_tf32" in result["changed"]
    assert not [name for name in result["changed"] if name.endswith("fp32_precision")]
    assert result["fp32_keys"] == []
    assert result["during"] == ["highest", False]
    assert result["restored"]
    assert "CUBLAS_WORKSPACE_CONFIG: not needed (this torch has no CUDA)" in result["notes"]
