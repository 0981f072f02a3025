"""The remedy table, which remedies fit a cause, and how they reach a run: the
launch options the bootstrap applies and the code users paste.  (The search
itself, on fixture scripts, is in test_remedy.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from detaudit.dynamic.compare.causes import (
    CAUSE_KINDS,
    EXTERNAL_INPUT,
    NONDETERMINISTIC_OP,
    THREAD_COUNT,
)
from detaudit.dynamic.remedy.catalogue import (
    REMEDIES,
    Conflict,
    Machine,
    candidates,
    check_registry,
    combined_options,
    deterministic_algorithms_raised,
    paste_code,
    remedy_with_settings,
)
from detaudit.dynamic.verdict.run_report import RootCause
from detaudit.knowledge.apis import RESEED_FROM_ENTROPY
from detaudit.knowledge.ops import load_ops_table
from detaudit.launch.features import RecordEnvironment
from detaudit.launch.options import LaunchOptions
from detaudit.launch.process import run_script
from detaudit.launch.seed_generators import GENERATORS, RESEEDER
from detaudit.launch.seed_generators import paste_code as generators_code
from detaudit.static.rules.seeding.entropy_seed import SEEDED_BY_OS_WHEN_NONE

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "dynamic"
CPU = Machine({"torch.version": "2.13.0+cpu", "torch.cuda.is_available": False}, default_threads=4)
OLD_CUDA = Machine(
    {"torch.version": "2.8.0+cu126", "torch.version.cuda": "12.6", "torch.cuda.is_available": True}, default_threads=4
)


def cause(kind, op="aten.add.Tensor", line=7) -> RootCause:
    return RootCause(kind, op, "train.py", line, "", "forward", seen=1, pairs=1, first_step=1)


def test_every_remedy_a_cause_kind_or_an_op_names_exists():
    check_registry()
    assert any(kind.remedies for kind in CAUSE_KINDS.values())
    for entry in load_ops_table():
        if entry.deterministic_settings:
            assert remedy_with_settings(entry.deterministic_settings) is not None, entry.id


def test_the_generators_seeded_are_those_the_knowledge_base_says_draw_from_the_os():
    for generator in GENERATORS.values():
        known = RESEED_FROM_ENTROPY if generator.kind == RESEEDER else SEEDED_BY_OS_WHEN_NONE
        assert generator.name in known, generator.name


@pytest.mark.parametrize(
    "machine, op, remedies, advice",
    [
        # the CPU race: one thread or deterministic algorithms (ops table: one_thread_deterministic, switches)
        (CPU, "aten.index_put.default", ["one-thread", "deterministic-algorithms"], None),
        # cuDNN: its own settings first, then deterministic algorithms
        (OLD_CUDA, "aten.convolution_backward.default", ["cudnn-deterministic", "deterministic-algorithms"], None),
        # deterministic algorithms raise: nothing to switch on, a replacement to make
        (CPU, "aten.max_unpool2d.default", [], "scatter_"),
        # put_ with accumulate (raises on CUDA, switches on CPU) or without (raises): the trace cannot
        # tell which, so both entries speak, and the CUDA replacement is among the advice
        (OLD_CUDA, "aten.put_.default", ["one-thread", "deterministic-algorithms"], "index_put_"),
        # an op the table does not know: the cause kind's remedies
        (CPU, "aten.add.Tensor", ["deterministic-algorithms"], None),
    ],
)
def test_candidates_for_a_nondeterministic_op_come_from_the_ops_table(machine, op, remedies, advice):
    found = candidates(cause(NONDETERMINISTIC_OP, op), machine)
    assert found.remedies == remedies
    if advice is None:
        assert found.advice == []
    else:
        assert all("no deterministic kernel: replace the op" in text for text in found.advice)
        assert any(advice in text for text in found.advice)


def test_candidates_for_other_causes_come_from_the_cause_registry():
    assert candidates(cause(EXTERNAL_INPUT), CPU).remedies == ["seed-generators", "hash-seed"]
    assert candidates(cause(THREAD_COUNT), CPU).remedies == ["pin-threads"]


def test_settings_take_the_tables_safe_values_where_they_matter_on_the_audited_machine():
    deterministic = REMEDIES["deterministic-algorithms"]
    assert deterministic.options(CPU) == {"backend": {"deterministic-algorithms": True}}
    # a CUDA torch before 2.10 raises in cuBLAS without the workspace variable
    assert deterministic.options(OLD_CUDA)["backend"] == {"deterministic-algorithms": True, "cublas-workspace-config": ":4096:8"}
    assert REMEDIES["pin-threads"].options(CPU) == {"threads": 4}
    assert REMEDIES["pin-threads"].label(CPU) == "threads pinned to 4"


def test_remedies_that_set_one_option_to_two_values_do_not_combine():
    with pytest.raises(Conflict):
        combined_options([REMEDIES["one-thread"], REMEDIES["pin-threads"]], CPU)
    options = combined_options([REMEDIES["deterministic-algorithms"], REMEDIES["cudnn-deterministic"]], OLD_CUDA)
    assert set(options["backend"]) == {"deterministic-algorithms", "cublas-workspace-config", "cudnn-benchmark", "cudnn-deterministic"}


def test_pasted_code_spells_settings_as_the_audited_torch_does():
    options = combined_options(
        [REMEDIES[name] for name in ("hash-seed", "deterministic-algorithms", "cudnn-deterministic", "one-thread")], OLD_CUDA
    )
    code = paste_code(options, OLD_CUDA, seed=3, generators=[])
    compile(code, "pasted", "exec")
    lines = code.splitlines()
    assert "import detaudit" not in code
    # the restart comes first, the variable CUDA reads before any other setting
    assert lines[0] == "import os" and any("os.execv" in line for line in lines[:8])
    assert lines.index("os.environ['CUBLAS_WORKSPACE_CONFIG'] = ':4096:8'") < lines.index(
        "torch.use_deterministic_algorithms(True)"
    )
    for expected in (
        "torch.backends.cudnn.benchmark = False",
        "torch.backends.cudnn.deterministic = True",
        "torch.set_num_threads(1)",
        "torch.manual_seed(3)",
        "np.random.seed(3)",
    ):
        assert expected in lines


def test_without_seed_no_seeding_is_pasted():
    code = paste_code({"threads": 1}, CPU, seed=None, generators=[])
    assert "manual_seed" not in code and "torch.set_num_threads(1)" in code


def test_deterministic_algorithms_raising_is_turned_into_the_ops_tables_replacement():
    import torch
    import torch.nn.functional as F

    import detaudit

    pooled, indices = F.max_pool2d(torch.randn(1, 1, 4, 4), 2, return_indices=True)
    with detaudit.deterministic(), pytest.raises(RuntimeError) as raised:
        F.max_unpool2d(pooled, indices, 2)
    advice = deterministic_algorithms_raised(f"Traceback ...\nRuntimeError: {raised.value}")
    assert advice.startswith("deterministic algorithms raise in max_unpooling2d_forward_out")
    assert load_ops_table().entry("max_unpool").replacement in advice
    assert deterministic_algorithms_raised("ValueError: the data loader ran dry") is None


# -- in a real child process ------------------------------------------------------------
UNSEEDED = textwrap.dedent(
    """
    import random
    import numpy as np
    import torch

    draws = [
        float(np.random.default_rng().random()),
        float(np.random.RandomState().rand()),
        random.Random().random(),
        float(np.random.default_rng(5).random()),  # seeded by the script: left as it is
    ]
    torch.seed()
    draws.append(float(torch.rand(1)))
    print(draws)
    """
)


def _draws(stdout: str) -> list[float]:
    return json.loads(stdout.strip().splitlines()[-1])


def test_the_bootstrap_seeds_generators_made_without_a_seed_and_says_where(tmp_path):
    script = tmp_path / "unseeded.py"
    script.write_text(UNSEEDED)
    options = LaunchOptions(seed=0, settings={"seed-generators": True})
    first, second = (run_script(script, options=options, cwd=tmp_path) for _ in range(2))
    assert not first.failed, first.stderr
    assert _draws(first.stdout) == _draws(second.stdout)
    import numpy as np

    assert _draws(first.stdout)[3] == float(np.random.default_rng(5).random())
    made = {(m["call"], m["line"]) for m in first.payload["unseeded_generators"]}
    assert made == {("numpy.random.default_rng", 7), ("numpy.random.RandomState", 8), ("random.Random", 9), ("torch.seed", 12)}


def test_the_pasted_generator_seeding_does_the_same_in_a_plain_process(tmp_path):
    imports, statements = generators_code(list(GENERATORS), first_seed=1)
    script = tmp_path / "unseeded.py"
    script.write_text("\n".join([*imports, *statements]) + "\n" + UNSEEDED)
    runs = [
        subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        for _ in range(2)
    ]
    assert runs[0].returncode == 0, runs[0].stderr
    assert _draws(runs[0].stdout) == _draws(runs[1].stdout)
    bare = subprocess.run([sys.executable, "-c", UNSEEDED], capture_output=True, text=True, timeout=300)
    assert _draws(bare.stdout)[:3] != _draws(runs[0].stdout)[:3]  # without the code they come from the OS


def test_settings_reach_the_child_and_every_step_end_is_timed():
    result = run_script(
        FIXTURES / "deterministic_mlp.py",
        options=LaunchOptions(
            max_steps=3, settings={"backend": {"deterministic-algorithms": True}}, features=(RecordEnvironment(),)
        ),
    )
    assert not result.failed, result.stderr
    ends = result.payload["step_ends"]
    assert len(ends) == 3 and ends == sorted(ends)
    assert result.payload["environment"]["torch.are_deterministic_algorithms_enabled"] is True
