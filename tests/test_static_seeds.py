"""The seed rules on realistic scripts: each hazard at its exact line, each look-alike silent.

Fixture lines that must be reported carry ``# expect: RULE-NAME``; every other
line must stay free of seed findings.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from detaudit.static.engine.check import check_file, check_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "static"
SEED_RULES = {"missing-torch-seed", "missing-numpy-seed", "missing-python-seed", "conditional-seed", "seed-after-use"}
_EXPECT = re.compile(r"#\s*expect:\s*(?P<names>[a-z0-9, -]+)")


def expected_findings(path: Path) -> set[tuple[str, int]]:
    expected = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = _EXPECT.search(line)
        if match:
            expected |= {(name.strip(), number) for name in match.group("names").split(",")}
    return expected


def seed_findings(path: Path, project_root: Path) -> set[tuple[str, int]]:
    result = check_file(path, str(path), project_root)
    return {(f.name, f.line) for f in result.findings if f.name in SEED_RULES}


SCRIPTS = sorted((FIXTURES / "seeds").glob("*.py"))
PROJECT_SCRIPTS = sorted(p for p in (FIXTURES / "project").rglob("*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_fixture_reports_exactly_the_expected_lines(path):
    assert seed_findings(path, path.parent) == expected_findings(path)


@pytest.mark.parametrize("path", PROJECT_SCRIPTS, ids=lambda p: str(p.relative_to(FIXTURES / "project")))
def test_project_fixture_reports_exactly_the_expected_lines(path):
    assert seed_findings(path, FIXTURES / "project") == expected_findings(path)


def test_fixtures_cover_every_seed_rule():
    covered = {name for path in SCRIPTS + PROJECT_SCRIPTS for name, _ in expected_findings(path)}
    assert covered == SEED_RULES


def _names(code: str) -> list[tuple[str, int]]:
    result = check_source(textwrap.dedent(code), "train.py")
    return [(f.name, f.line) for f in result.findings if f.name in SEED_RULES]


def test_each_rng_is_reported_once_at_its_first_draw():
    code = """\
        import torch
        a = torch.randn(3)
        b = torch.rand(3)
        layer = torch.nn.Linear(2, 2)
        print(layer(a[:2]))
    """
    assert _names(code) == [("missing-torch-seed", 2)]


def test_message_names_the_call_and_the_drawing_api():
    code = """\
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = Block()

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.drop = nn.Dropout(0.5)

        net = Net()
        torch.optim.SGD(net.parameters(), lr=0.1).step()
    """
    [finding] = [f for f in check_source(textwrap.dedent(code), "train.py").findings if f.code == "DET001"]
    assert finding.line == 14
    assert "`Net()`" in finding.message and "torch.nn.Dropout" in finding.message


def test_subclass_of_a_random_layer_draws_when_built():
    code = """\
        import torch

        class Head(torch.nn.Linear):
            pass

        head = Head(4, 2)
        torch.optim.SGD(head.parameters(), lr=0.1).step()
    """
    assert _names(code) == [("missing-torch-seed", 6)]


def test_seed_inside_a_method_called_through_self_counts():
    code = """\
        import random

        class Trainer:
            def __init__(self, seed):
                self.seed_all(seed)

            def seed_all(self, seed):
                random.seed(seed)

        trainer = Trainer(0)
        random.shuffle([1, 2, 3])
    """
    assert _names(code) == []


def test_draw_only_in_an_uncalled_function_of_a_script_is_not_reported():
    code = """\
        import torch

        def debug_noise():
            return torch.randn(3)

        if __name__ == "__main__":
            print("nothing random runs")
    """
    assert _names(code) == []


def test_seeding_in_the_else_branch_of_a_default_on_switch_is_conditional():
    code = """\
        import argparse
        import torch

        p = argparse.ArgumentParser()
        p.add_argument("--random-init", action="store_false", dest="fixed_init")
        args = p.parse_args()
        if args.fixed_init:
            pass
        else:
            torch.manual_seed(0)
        x = torch.rand(3)
    """
    assert _names(code) == [("conditional-seed", 10)]


def test_draw_under_a_default_off_branch_is_not_a_draw():
    code = """\
        import argparse
        import torch

        p = argparse.ArgumentParser()
        p.add_argument("--noise", action="store_true")
        args = p.parse_args()
        if args.noise:
            x = torch.rand(3)
    """
    assert _names(code) == []


def test_seed_after_use_follows_main_into_its_helpers():
    code = """\
        import torch

        def build():
            return torch.nn.Linear(2, 2)

        def main():
            model = build()
            torch.manual_seed(0)
            torch.optim.SGD(model.parameters(), lr=0.1).step()

        if __name__ == "__main__":
            main()
    """
    assert _names(code) == [("seed-after-use", 4)]


def test_a_seed_before_the_draw_in_a_branch_that_may_run_is_trusted():
    code = """\
        import os
        import torch

        if os.environ.get("SEED"):
            torch.manual_seed(int(os.environ["SEED"]))
        x = torch.rand(2)
        torch.manual_seed(1)
    """
    assert _names(code) == []


def test_dcgan_style_random_seed_fallback_is_not_a_late_seed():
    code = """\
        import argparse
        import random
        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--manualSeed", type=int)
        opt = parser.parse_args()
        if opt.manualSeed is None:
            opt.manualSeed = random.randint(1, 10000)
        print("Random Seed: ", opt.manualSeed)
        random.seed(opt.manualSeed)
        torch.manual_seed(opt.manualSeed)
        noise = torch.randn(4)
    """
    assert _names(code) == []


def test_a_real_draw_before_the_seed_fallback_is_still_late():
    code = """\
        import random
        files = ["a", "b"]
        random.shuffle(files)
        seed = random.randint(1, 10000)
        random.seed(seed)
    """
    assert _names(code) == [("seed-after-use", 3)]


def test_a_definitions_only_module_is_a_library_but_a_module_level_loop_makes_a_script():
    definitions = "import torch\nexample_args = (torch.randn(3, 4),)\nmodel = torch.nn.Linear(4, 2)\n"
    assert _names(definitions) == []
    training_loop = "for step in range(3):\n    model(example_args[0])\n"
    assert _names(definitions + training_loop) == [("missing-torch-seed", 2)]


def test_draws_inside_lambdas_do_not_run_at_import_but_seeds_inside_them_count():
    code = """\
        import random
        import torch
        tests = [dict(input_fn=lambda: torch.rand(3)) for _ in range(2)]
        seeder = lambda: random.seed(0)
        seeder()
        for test in tests:
            print(random.random())
    """
    assert _names(code) == []


_NO_WORK_BLOCKS = {
    "if-elif": "if a:\n    pass\nelif b:\n    pass\n",
    "if-elif-else": "if a:\n    pass\nelif b:\n    pass\nelse:\n    pass\n",
    "if-else": "if a:\n    pass\nelse:\n    pass\n",
    "try-except-else-finally": "try:\n    import cv2\nexcept ImportError:\n    cv2 = None\nelse:\n    pass\nfinally:\n    pass\n",
    "with": "with a:\n    pass\n",
    "one-line-if": "if a: pass\n",
    "match": "match a:\n    case 1:\n        pass\n    case _:\n        pass\n",
}


@pytest.mark.parametrize("block", list(_NO_WORK_BLOCKS.values()), ids=list(_NO_WORK_BLOCKS))
def test_module_level_compound_statements_before_the_first_call_do_not_crash(block):
    """Issue 9: an ``if ... elif`` (or ``else``) before the first module-level call
    or loop made every seed rule fail with an internal error, and the check passed."""
    code = "import torch\n" + block + "x = torch.randn(3)\nfor i in range(3):\n    torch.randn(2)\n"
    result = check_source(code, "train.py")
    assert result.messages == []
    draw_line = code.splitlines().index("x = torch.randn(3)") + 1
    assert [(f.name, f.line) for f in result.findings if f.name in SEED_RULES] == [("missing-torch-seed", draw_line)]


@pytest.mark.parametrize(
    "branches",
    ["if a:\n    pass\nelif b:\n    main()\n", "if a:\n    pass\nelse:\n    main()\n", "if a:\n    pass\nelif b:\n    pass\nelse:\n    main()\n"],
    ids=["elif", "else", "else-after-elif"],
)
def test_work_in_any_branch_of_an_if_chain_makes_a_script(branches):
    code = "import torch\nx = torch.randn(3)\n" + branches
    result = check_source(code, "train.py")
    assert result.messages == []
    assert [(f.name, f.line) for f in result.findings if f.name in SEED_RULES] == [("missing-torch-seed", 2)]
