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
from detaudit.static.engine.check import check_source

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


@pytest.mark.cuda
def test_cuda_settings_are_reported_only_where_cuda_runs():
    """On a GPU: the CUDA entries read without error markers, and status reports
    cuDNN autotuning and cuDNN's default TF32 convolutions (``devices: cuda``)."""
    import torch

    import detaudit

    torch.zeros(1, device="cuda")
    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = True
        result = detaudit.status()
        flagged = {issue.setting for issue in result.issues}
        tf32 = backend_settings()["cudnn-conv-fp32-precision"].key
        if tf32 not in result.settings:  # torch < 2.9: the legacy flag, also on by default
            tf32 = backend_settings()["cudnn-allow-tf32"].key
        assert {"torch.backends.cudnn.benchmark", tf32} <= flagged
        for setting in backend_settings().settings:
            value = result.settings.get(setting.key)
            assert not (isinstance(value, str) and value.startswith("error: ")), (setting.key, value)
    finally:
        torch.backends.cudnn.benchmark = before


# --- one place for the flag names ------------------------------------------------------


def flag_terms() -> set[tuple[str, ...]]:
    """What spelling a flag means: the table's spellings (attributes, getters,
    setters, environment variables) in full, each dotted suffix of two or more
    parts (``cudnn.benchmark``), and the last part alone when it is a compound
    identifier (``allow_tf32``, ``CUBLAS_WORKSPACE_CONFIG``).  Single words such
    as ``benchmark`` or ``deterministic`` are also ordinary words and framework
    keywords (Lightning ``Trainer(benchmark=...)``), so they alone do not count."""
    terms = set()
    for _, spelling in backend_settings().spellings():
        for name in (spelling.attribute, spelling.read, spelling.write, spelling.environment):
            if name is None:
                continue
            parts = tuple(name.split("."))
            terms.update(parts[i:] for i in range(len(parts) - 1))
            if "_" in parts[-1].strip("_"):
                terms.add(parts[-1:])
    return terms


def code_names(tree: ast.AST) -> list[tuple[int, str]]:
    """The names a module's code uses: identifiers, attribute chains, and string
    literals that are names (only word characters and dots).  Docstrings, comments
    and prose strings (messages, rule documentation, the rules' VALID/INVALID
    example sources) are documentation and tests, not code."""
    documentation = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for rule in ast.walk(tree):  # a rule's examples: the code it lints and the messages it expects
        if isinstance(rule, ast.ClassDef):
            for statement in rule.body:
                if isinstance(statement, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id in ("VALID", "INVALID") for t in statement.targets
                ):
                    documentation.update(id(node) for node in ast.walk(statement.value))
    names = []
    for node in ast.walk(tree):
        if id(node) in documentation:
            continue
        if isinstance(node, ast.Attribute):
            chain, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name):
                chain.append(inner.id)
            names.append((node.lineno, ".".join(reversed(chain))))
        elif isinstance(node, ast.Name):
            names.append((node.lineno, node.id))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append((node.lineno, node.name))
        elif isinstance(node, ast.keyword) and node.arg:
            names.append((node.lineno, node.arg))
        elif isinstance(node, ast.alias):
            names.append((node.lineno, node.asname or node.name))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(r"[\w.]+", node.value)
        ):
            names.append((node.lineno, node.value))
    return names


def spelled_flags(text: str, terms: set[tuple[str, ...]]) -> list[str]:
    parts = tuple(part for part in re.split(r"\W+", text) if part)
    return sorted(
        ".".join(term)
        for term in terms
        if any(parts[i : i + len(term)] == term for i in range(len(parts) - len(term) + 1))
    )


def test_the_settings_table_is_the_only_place_that_spells_backend_flags():
    """Code in ``detaudit/`` reaches a backend flag only through the settings
    table: no identifier, attribute chain or name-like string spells one.
    Documentation does not count: docstrings, comments, messages and the rules'
    VALID/INVALID examples (source text the tests lint, which must spell the
    real names) may name flags."""
    terms = flag_terms()
    offences = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, name in code_names(tree):
            spelled = spelled_flags(name, terms)
            if spelled:
                offences.append(f"{path.relative_to(REPO)}:{line}: {name} (spells {', '.join(spelled)})")
    assert not offences, "\n".join(sorted(set(offences)))


def test_the_flag_name_check_catches_what_it_looks_for():
    terms = flag_terms()
    code = textwrap.dedent(
        '''
        """Docs may say torch.backends.cudnn.benchmark."""
        import torch
        cudnn = torch.backends.cudnn
        x = cudnn.benchmark
        key = f"{namespace}.fp32_precision"
        message = "set torch.backends.cudnn.benchmark = False"
        torch.use_deterministic_algorithms(True, warn_only=True)
        os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        trainer = Trainer(benchmark=True, deterministic=True)
        '''
    )
    found = sorted({name for _, name in code_names(ast.parse(code)) if spelled_flags(name, terms)})
    assert found == [".fp32_precision", "CUBLAS_WORKSPACE_CONFIG", "cudnn.benchmark", "torch.use_deterministic_algorithms"]


def test_the_fingerprint_names_the_cpu_and_the_libraries_torch_was_built_with():
    """Another machine brings another CPU and, with another torch build, other BLAS and oneDNN: the keys a
    comparison across machines explains a drift with."""
    import torch

    from detaudit.runtime.environment import fingerprint

    readings = fingerprint()
    assert isinstance(readings["cpu.model"], str) and readings["cpu.model"]
    assert readings["torch.get_default_dtype"] == str(torch.get_default_dtype())
    config = torch.__config__.show()
    for key, pattern in (("torch.build.blas", "BLAS_INFO="), ("torch.build.onednn", "MKL-DNN v")):
        assert (key in readings) == (pattern in config)
        if key in readings:
            assert readings[key] in config
