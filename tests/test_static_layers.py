"""The static pass's layering: rule modules are found, not listed, and import no other
rule module; a family's rules share only the family's private modules."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import detaudit.static.rules as rules_package
from detaudit.static.rule import all_rules

REPO = Path(__file__).resolve().parents[1]
RULES_DIR = REPO / "detaudit" / "static" / "rules"
RULES_PACKAGE = "detaudit.static.rules"


def _rule_module_names() -> set[str]:
    """The rule modules under ``rules/``, dotted from there (``seeding.entropy_seed``);
    packages and a family's private modules (``_common.py``) hold no rule."""
    return {
        ".".join(path.relative_to(RULES_DIR).with_suffix("").parts)
        for path in RULES_DIR.rglob("*.py")
        if not path.name.startswith("_")
    }


def _imported_modules(source: str, package: str = RULES_PACKAGE) -> set[str]:
    """Every module a module of ``package`` imports (at any depth of its code,
    relative imports resolved), and every name it imports from one."""
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            imported.add(base)
            imported |= {f"{base}.{alias.name}" for alias in node.names}
    return imported


def _forbidden_imports(source: str, module: str, is_package: bool = False) -> set[str]:
    """What ``module`` (a module or package under ``rules``) imports from ``rules``
    that it may not: the package itself, anything of another family, a module of
    its own family other than the family's private ones (``_common``), or any
    module from the top level (a rule module of no family)."""
    package = module if is_package else module.rpartition(".")[0]
    family = package.removeprefix(RULES_PACKAGE).removeprefix(".").partition(".")[0] or None
    forbidden = set()
    for imported in _imported_modules(source, package):
        if imported != RULES_PACKAGE and not imported.startswith(RULES_PACKAGE + "."):
            continue
        parts = imported.removeprefix(RULES_PACKAGE).removeprefix(".").split(".")
        if family is not None and parts[0] == family and (len(parts) == 1 or parts[1].startswith("_")):
            continue  # the family's own package or private modules, and the names in them
        forbidden.add(imported)
    return forbidden


def test_no_rule_module_imports_another_rule_module():
    offenders = {}
    for path in sorted(RULES_DIR.rglob("*.py")):
        if path == RULES_DIR / "__init__.py":
            continue  # the catalogue itself, which imports every rule module
        parts = path.relative_to(REPO).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        forbidden = _forbidden_imports(path.read_text(encoding="utf-8"), module, is_package)
        if forbidden:
            offenders[str(path.relative_to(RULES_DIR))] = sorted(forbidden)
    assert offenders == {}


def test_the_import_check_sees_every_spelling():
    """The check above must not pass by missing an import form."""
    source = textwrap.dedent(
        """
        from detaudit.static.rules.seeds import X
        from detaudit.static.rules import ordering
        from . import memory
        from .entropy import Y
        import detaudit.static.rules.ops

        def later():
            from detaudit.static.rules.determinism import Z
        """
    )
    found = {m.split(".")[3] for m in _imported_modules(source) if m.startswith(RULES_PACKAGE + ".")}
    assert {"seeds", "ordering", "memory", "entropy", "ops", "determinism"} <= found


def test_the_family_check_sees_every_spelling():
    """Each way a rule module can reach a rule module, or another family, is forbidden."""
    source = textwrap.dedent(
        """
        from detaudit.static.rules.data_order.set_iteration_order import X
        from detaudit.static.rules.seeding import entropy_seed
        from detaudit.static.rules.kernels._common import Y
        from . import missing_numpy_seed
        from .conditional_seed import Z
        from .. import parse_error
        from ..settings import tf32
        import detaudit.static.rules
        import detaudit.static.rules.kernels.nondeterministic_op

        def later():
            from detaudit.static.rules.seeding.seed_after_use import W
        """
    )
    forbidden = _forbidden_imports(source, f"{RULES_PACKAGE}.seeding.missing_torch_seed")
    assert {
        f"{RULES_PACKAGE}.data_order.set_iteration_order",
        f"{RULES_PACKAGE}.seeding.entropy_seed",
        f"{RULES_PACKAGE}.kernels._common",
        f"{RULES_PACKAGE}.seeding.missing_numpy_seed",
        f"{RULES_PACKAGE}.seeding.conditional_seed",
        f"{RULES_PACKAGE}.parse_error",
        f"{RULES_PACKAGE}.settings.tf32",
        RULES_PACKAGE,
        f"{RULES_PACKAGE}.kernels.nondeterministic_op",
        f"{RULES_PACKAGE}.seeding.seed_after_use",
    } <= forbidden
    allowed = "from detaudit.static.rules.seeding._common import MissingSeed\nfrom ._common import seeding_fix\n"
    assert _forbidden_imports(allowed, f"{RULES_PACKAGE}.seeding.missing_torch_seed") == set()
    assert _forbidden_imports(allowed, f"{RULES_PACKAGE}.parse_error")


def test_every_rule_module_is_loaded():
    loaded = {module.__name__.removeprefix(RULES_PACKAGE + ".") for module in rules_package.RULE_MODULES}
    assert loaded == _rule_module_names()
    defined_in = {rule.__module__.removeprefix(RULES_PACKAGE + ".") for rule in all_rules()}
    assert defined_in == _rule_module_names()


def test_each_rule_module_holds_one_rule_named_after_it():
    """``settings/cudnn_benchmark.py`` holds cudnn-benchmark and nothing else."""
    by_module: dict[str, list[str]] = {}
    for rule in all_rules():
        by_module.setdefault(rule.__module__.removeprefix(RULES_PACKAGE + "."), []).append(rule.name)
    misnamed = {
        module: names
        for module, names in by_module.items()
        if names != [module.rpartition(".")[2].replace("_", "-")]
    }
    assert misnamed == {}


def test_each_family_holds_one_decade_of_codes():
    """A family folder holds the rules of one code decade (DET01x: ``settings/``),
    and no two folders share one; DET000 parse-error is the only rule of no family."""
    decades: dict[str | None, set[str]] = {}
    for rule in all_rules():
        parts = rule.__module__.removeprefix(RULES_PACKAGE + ".").split(".")
        decades.setdefault(parts[0] if len(parts) > 1 else None, set()).add(rule.code[:5])
    assert {family: codes for family, codes in decades.items() if family is not None and len(codes) != 1} == {}
    families = [codes for family, codes in decades.items() if family is not None]
    assert len(set().union(*families)) == len(families)
    assert [rule.code for rule in all_rules() if rule.__module__.count(".") == 3] == ["DET000"]


def test_a_new_rule_module_is_loaded_without_being_listed(tmp_path):
    """Dropping a module into a family folder of ``rules/`` (a new folder here) is
    all it takes: in a copy of the package, a new module's rule shows up in the
    registry and runs on a file."""
    shutil.copytree(REPO / "detaudit", tmp_path / "detaudit", ignore=shutil.ignore_patterns("__pycache__"))
    family = tmp_path / "detaudit" / "static" / "rules" / "zz_probes"
    family.mkdir()
    (family / "__init__.py").write_text('"""Rules that exist only in this test."""\n', encoding="utf-8")
    (family / "probe_rule.py").write_text(
        textwrap.dedent(
            '''
            from detaudit.static.rule import Invalid, Rule


            class ProbeRule(Rule):
                code = "DET999"
                name = "probe-rule"
                summary = "A rule that exists only in this test."
                rationale = "It proves that rule modules are discovered."
                fix_hint = "None needed."
                VALID = ("import torch\\n",)
                INVALID = (Invalid("import torch\\nprobe()\\n", line=2),)

                def finish(self):
                    for call in self.facts.calls:
                        if call.qualname is None and call.method is None:
                            self.report(call.node, "probe")
            '''
        ),
        encoding="utf-8",
    )
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import detaudit
        assert detaudit.__file__.startswith({str(tmp_path)!r}), detaudit.__file__
        from detaudit.static.engine.check import check_source
        from detaudit.static.rule import find_rule
        assert find_rule("DET999") is find_rule("probe-rule") is not None
        print(sorted(f.code for f in check_source("import torch\\nprobe()\\n", "train.py").findings))
        """
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert "DET999" in completed.stdout


# --- knowledge/apis.py holds only what two or more modules read ----------------------


def _apis_families(package: Path) -> list[tuple[set[str], set[str]]]:
    """The families of names in ``knowledge/apis.py`` under ``package`` (names
    whose definitions use one another, e.g. a table and the lists derived from
    it), each with the modules of ``package`` that import any of them."""
    apis = package / "knowledge" / "apis.py"
    tree = ast.parse(apis.read_text(encoding="utf-8"))
    uses: dict[str, set[str]] = {}  # name -> the apis names its definition uses
    for statement in tree.body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            defined = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            body = statement.value
        elif isinstance(statement, (ast.ClassDef, ast.FunctionDef)):
            defined, body = [statement.name], statement
        else:
            continue
        used = {n.id for n in ast.walk(body) if isinstance(n, ast.Name)} if body is not None else set()
        for name in defined:
            uses[name] = used
    for name in uses:
        uses[name] &= set(uses) - {name}
    readers: dict[str, set[str]] = {name: set() for name in uses}
    for path in package.rglob("*.py"):
        if path == apis:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "detaudit.knowledge.apis":
                for alias in node.names:
                    if alias.name in readers:
                        readers[alias.name].add(str(path.relative_to(package)))
    neighbours = {name: set(used) for name, used in uses.items()}
    for name, used in uses.items():
        for other in used:
            neighbours[other].add(name)
    families, seen = [], set()
    for start in uses:
        if start in seen:
            continue
        family, stack = set(), [start]
        while stack:
            name = stack.pop()
            if name not in family:
                family.add(name)
                stack.extend(neighbours[name] - family)
        seen |= family
        families.append((family, set().union(*(readers[name] for name in family))))
    return families


def _apis_problems(package: Path) -> list[str]:
    problems = []
    for family, modules in _apis_families(package):
        public = sorted(name for name in family if not name.startswith("_"))
        if public and len(modules) < 2:
            read_by = f"only {', '.join(sorted(modules))} reads it" if modules else "no module reads it"
            problems.append(f"{', '.join(public)}: {read_by}")
    return problems


def test_apis_keeps_only_knowledge_two_modules_read():
    """A list one module alone reads lives in that module (a rule's with its rule),
    and backend settings live in the settings table: what stays in ``apis.py`` is
    read by two or more modules, directly or through a list derived from it."""
    assert _apis_problems(REPO / "detaudit") == []


def test_the_apis_check_finds_single_reader_and_unread_lists(tmp_path):
    package = tmp_path / "detaudit"
    (package / "knowledge").mkdir(parents=True)
    (package / "knowledge" / "apis.py").write_text(
        textwrap.dedent(
            """
            SHARED = frozenset({"a"})
            DERIVED = frozenset(x.upper() for x in SHARED)
            PRIVATE_TO_ONE = ("b",)
            UNREAD = 3
            """
        ),
        encoding="utf-8",
    )
    (package / "one.py").write_text("from detaudit.knowledge.apis import DERIVED, PRIVATE_TO_ONE, SHARED\n", encoding="utf-8")
    (package / "two.py").write_text("from detaudit.knowledge.apis import SHARED\n", encoding="utf-8")
    assert _apis_problems(package) == ["PRIVATE_TO_ONE: only one.py reads it", "UNREAD: no module reads it"]
