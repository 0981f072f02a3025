"""The shared analyses of the static pass (``detaudit.static.analyses``) on real parsed code."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from detaudit.static.analyses.execution import Runs, blocks, every_block, header, statements
from detaudit.static.engine.check import analyse_source, check_source

_EMPTY = cst.Module([])


def _code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node).strip().splitlines()[0]


def _walk(source: str, **options) -> list[str]:
    module = cst.parse_module(textwrap.dedent(source))
    return [_code(s) for s in statements(module.body, **options)]


def test_statements_follow_every_compound_statement_in_source_order():
    source = """\
        if a:
            one()
        elif b:
            two()
        elif c: three()
        else:
            four()
        for x in xs:
            five()
        else:
            six()
        while w:
            seven()
        try:
            eight()
        except E:
            nine()
        else:
            ten()
        finally:
            eleven()
        with m:
            twelve()
        match v:
            case 1:
                thirteen()
            case _:
                fourteen()
        def f():
            hidden()
        class C:
            hidden_too()
        fifteen()
        """
    walked = _walk(source)
    calls = [line for line in walked if line.endswith("()") and not line.startswith(("def", "class", "if"))]
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
             "thirteen", "fourteen", "fifteen"]
    assert calls == [f"{word}()" for word in words]
    # the compound statements come before their blocks; an elif is an ``if`` of its own
    assert walked[:4] == ["if a:", "one()", "if b:", "two()"]
    assert "def f():" in walked and "hidden()" not in walked


def test_function_and_class_bodies_are_entered_on_request():
    walked = _walk("def f():\n    inner()\nclass C:\n    x = 1\n", enter=lambda block: True)
    assert walked == ["def f():", "inner()", "class C:", "x = 1"]


def test_blocks_say_how_they_run():
    module = cst.parse_module("try:\n    a()\nexcept E:\n    b()\nfinally:\n    c()\nif x: d()\n")
    try_statement, if_statement = module.body
    assert [block.runs for block in blocks(try_statement)] == [Runs.ALWAYS, Runs.ON_ERROR, Runs.ALWAYS]
    (branch,) = blocks(if_statement)
    assert branch.runs is Runs.BRANCH and isinstance(branch.statements[0], cst.SimpleStatementSuite)


def test_header_is_what_the_statement_evaluates_itself():
    module = cst.parse_module("if ready(a):\n    go()\nelif other(b):\n    stop()\n")
    evaluated = [_EMPTY.code_for_node(node) for node in header(module.body[0]) if isinstance(node, cst.BaseExpression)]
    assert evaluated == ["ready(a)"]  # not the branch's body, not the elif (walked as a statement of its own)
    with_statement = cst.parse_module("try:\n    pass\nexcept (KeyError, OSError) as error:\n    log(error)\n").body[0]
    assert [_EMPTY.code_for_node(n) for n in header(with_statement) if isinstance(n, cst.BaseExpression)] == ["(KeyError, OSError)"]


def test_every_block_reaches_nested_function_bodies():
    module = cst.parse_module("class C:\n    def m(self):\n        if x:\n            y = 1\n")
    innermost = [block for block in every_block(module) if block.statements and _code(block.statements[0]) == "y = 1"]
    assert len(innermost) == 1


def _analyses(source: str, path: str = "train.py"):
    _, context = analyse_source(textwrap.dedent(source), path)
    assert context is not None
    return context.analyses


@pytest.mark.parametrize(
    ("source", "does_work"),
    [
        ("import torch\nmodel = torch.nn.Linear(2, 2)\n", False),  # binds names only: a library
        ("import torch\nmain()\n", True),
        ("import torch\nfor step in range(3):\n    pass\n", True),
        ("import torch\nif a:\n    pass\nelif b:\n    main()\n", True),
        ("import torch\nwith ctx:\n    main()\n", True),
        ("import torch\nif ready: main()\n", True),
        # an import fallback that warns is not what the file is for
        ("import torch\ntry:\n    import apex\nexcept ImportError:\n    print('no apex')\n", False),
        ("import torch\ndef main():\n    train()\n", False),
    ],
)
def test_script_does_work(source, does_work):
    assert _analyses(source).script.does_work is does_work


def test_script_reaches_module_level_calls_and_everything_under_a_main_guard():
    library = _analyses("import torch\nopt = torch.optim.SGD([], lr=1)\ndef f():\n    g()\n")
    module_level, in_function = library.rng_effects.facts.calls[0], library.rng_effects.facts.calls[1]
    assert library.script.reaches(module_level) and not library.script.reaches(in_function)
    script = _analyses("import torch\ndef f():\n    g()\nif __name__ == '__main__':\n    f()\n")
    assert all(script.script.reaches(call) for call in script.rng_effects.facts.calls)


def test_run_order_descends_into_local_functions_where_they_are_called():
    analyses = _analyses(
        """\
        import torch
        def build():
            return torch.nn.Linear(2, 2)
        def main():
            torch.manual_seed(0)
            build()
        if __name__ == '__main__':
            main()
            print('done')
        """
    )
    assert [call.qualname for call in analyses.run_order.calls] == ["torch.manual_seed", "torch.nn.Linear", "print"]
    assert analyses.run_order.spawned == frozenset()


def test_run_order_follows_entry_points_and_marks_what_runs_in_a_spawned_process():
    analyses = _analyses(
        """        import torch
        import torch.multiprocessing as mp
        import threading
        def worker(rank):
            torch.nn.Linear(2, 2)
        def log():
            print('log')
        def main():
            torch.manual_seed(0)
            threading.Thread(target=log).start()
            mp.spawn(worker, nprocs=2)
        main()
        """
    )
    calls = analyses.run_order.calls
    assert [call.qualname for call in calls] == ["torch.manual_seed", None, "threading.Thread", "print", "torch.multiprocessing.spawn", "torch.nn.Linear"]
    spawned = [call.qualname for call in calls if id(call.node) in analyses.run_order.spawned]
    assert spawned == ["torch.nn.Linear"]
    # a module-level call of main() makes main's code the script's: it reaches the spawned worker
    assert analyses.script.reaches(calls[-1]) and not analyses.script.has_main_guard


def test_each_analysis_is_computed_once_per_file():
    analyses = _analyses("import torch\ntorch.manual_seed(0)\nx = torch.rand(2)\n")
    assert analyses.script is analyses.script
    assert analyses.seeding is analyses.seeding and analyses.seeding.seeded is analyses.seeding.seeded
    assert analyses.run_order is analyses.run_order


def test_a_seeded_shuffle_in_a_file_without_module_level_work_is_seeded():
    """The seeding state answers 'seeded' whenever asked: dataloader-worker-seed used
    to see nothing seeded in a file whose only module-level work binds names."""
    source = "import torch\nfrom torch.utils.data import DataLoader\ng = torch.manual_seed(0)\nloader = DataLoader(range(10), shuffle=True)\n"
    assert [f.code for f in check_source(source, "train.py").findings] == []
    unseeded = source.replace("g = torch.manual_seed(0)\n", "") + "optimizer = torch.optim.SGD([], lr=0.1)\n"
    assert "DET030" in [f.code for f in check_source(unseeded, "train.py").findings]
