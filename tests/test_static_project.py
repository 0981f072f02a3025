"""Project-level seeding facts: helpers in other modules of the checked project,
found by parsing (never importing) them, with every consulted file recorded."""

from __future__ import annotations

import hashlib
import shutil
import sys
import textwrap
from pathlib import Path

from detaudit.static.engine import check_file
from detaudit.static.project import project_index

FIXTURE_PROJECT = Path(__file__).resolve().parent.parent / "fixtures" / "static" / "project"
SEED_CODES = {"DET001", "DET002", "DET003", "DET004", "DET005"}


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _check(root: Path, name: str):
    result = check_file(root / name, name, root)
    return [(f.name, f.line) for f in result.findings if f.code in SEED_CODES], result.dependencies


def _blake2b(path: Path) -> str:
    return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()


def test_dependencies_name_every_consulted_project_file_with_its_hash():
    root = FIXTURE_PROJECT
    findings, dependencies = _check(root, "train_setup_helper.py")
    assert findings == []
    assert dependencies == {str(root / "utils.py"): _blake2b(root / "utils.py"), str(root / "models.py"): _blake2b(root / "models.py")}


def test_reexported_helper_records_both_modules():
    root = FIXTURE_PROJECT
    _, dependencies = _check(root, "pkg/train_reexport.py")
    assert set(dependencies) == {str(root / "pkg" / "seeding" / "__init__.py"), str(root / "pkg" / "seeding" / "core.py")}


def test_editing_the_helper_changes_the_result_of_the_script(tmp_path):
    shutil.copytree(FIXTURE_PROJECT, tmp_path / "project")
    root = tmp_path / "project"
    findings, before = _check(root, "train_dino_style.py")
    assert findings == []
    utils = root / "utils.py"
    utils.write_text("import numpy as np\n\ndef fix_random_seeds(seed=31):\n    np.random.seed(seed)  # torch and random forgotten\n")
    findings, after = _check(root, "train_dino_style.py")
    assert before[str(utils)] != after[str(utils)] == _blake2b(utils)
    assert sorted(findings) == [("missing-python-seed", 15), ("missing-torch-seed", 14)]


def test_project_modules_are_parsed_never_imported(tmp_path):
    marker = tmp_path / "imported.txt"
    _write(
        tmp_path,
        {
            "pyproject.toml": "",
            "helpers.py": f"""\
                import torch
                open({str(marker)!r}, "w").write("ran")
                raise SystemExit("a checked project module must never run")

                def seed(value):
                    torch.manual_seed(value)
            """,
            "train.py": """\
                import torch
                from helpers import seed
                seed(0)
                x = torch.rand(3)
            """,
        },
    )
    findings, dependencies = _check(tmp_path, "train.py")
    assert findings == []
    assert str(tmp_path / "helpers.py") in dependencies
    assert not marker.exists() and "helpers" not in sys.modules


def test_parent_relative_import_and_src_layout(tmp_path):
    _write(
        tmp_path,
        {
            "pyproject.toml": "",
            "src/app/__init__.py": "",
            "src/app/common/seeding.py": """\
                import numpy as np
                def seed_numpy(seed):
                    np.random.seed(seed)
            """,
            "src/app/scripts/train.py": """\
                import numpy as np
                from ..common.seeding import seed_numpy
                seed_numpy(3)
                batch = np.random.choice(10, 4)
            """,
            "scripts/run.py": """\
                import numpy as np
                from app.common import seeding
                seeding.seed_numpy(3)
                batch = np.random.choice(10, 4)
            """,
        },
    )
    assert _check(tmp_path, "src/app/scripts/train.py")[0] == []
    assert _check(tmp_path, "scripts/run.py")[0] == []


def test_broken_or_recursive_project_modules_do_not_crash(tmp_path):
    _write(
        tmp_path,
        {
            "pyproject.toml": "",
            "broken.py": "def seed(:\n",
            "ping.py": "from pong import pong\ndef ping(n):\n    return pong(n)\n",
            "pong.py": "from ping import ping\ndef pong(n):\n    return ping(n)\n",
            "train.py": """\
                import torch
                import broken
                from ping import ping
                broken.seed(0)
                ping(1)
                x = torch.rand(1)
            """,
        },
    )
    findings, dependencies = _check(tmp_path, "train.py")
    assert findings == [("missing-torch-seed", 6)]
    assert {Path(p).name for p in dependencies} == {"broken.py", "ping.py", "pong.py"}


def test_the_index_is_shared_per_process():
    assert project_index(FIXTURE_PROJECT) is project_index(FIXTURE_PROJECT / "pkg" / "..")
