"""Catalogue part B (entropy-seed, uninitialized-memory, dataloader-worker-seed,
unordered-file-listing, set-iteration-order) on whole files and on the cases
the rules' own VALID/INVALID examples do not pin down."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from detaudit.static.engine.check import check_file, check_source
from detaudit.static.rule import find_rule

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures" / "static" / "catalogue_b"
CODES = {"DET006", "DET021", "DET030", "DET031", "DET032", "DET033"}
_EXPECT = re.compile(r"#\s*expect:\s*(DET\d{3})")


def _ours(result) -> list[tuple[int, str]]:
    return sorted((f.line, f.code) for f in result.findings if f.code in CODES)


def _check(code: str) -> list[tuple[int, str]]:
    return _ours(check_source(textwrap.dedent(code), "train.py"))


@pytest.mark.parametrize("name", ["train_hazards.py", "train_unseeded.py", "train_lookalikes.py", "datasets_lib.py"])
def test_fixture_findings_are_exactly_the_expected_lines(name):
    path = FIXTURES / name
    expected = sorted(
        (number, match.group(1))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        for match in [_EXPECT.search(line)]
        if match is not None
    )
    assert _ours(check_file(path, name, FIXTURES)) == expected


def test_rules_are_registered_under_their_issue_names():
    for code, name in [
        ("DET006", "entropy-seed"),
        ("DET021", "uninitialized-memory"),
        ("DET030", "dataloader-worker-seed"),
        ("DET031", "unordered-file-listing"),
        ("DET032", "set-iteration-order"),
    ]:
        assert find_rule(code) is find_rule(name) is not None


# -- entropy-seed ---------------------------------------------------------------


@pytest.mark.parametrize(
    "seed_expression",
    ["int(time.time_ns() % 2**31)", "os.getpid()", "int(datetime.datetime.now().strftime('%S'))", "hash(f'run-{name}') % 1000"],
)
def test_entropy_sources_are_reported_through_a_variable(seed_expression):
    found = _check(
        f"""
        import datetime, os, time, torch
        name = 'x'
        value = {seed_expression}
        torch.manual_seed(value)
        """
    )
    assert found == [(5, "DET006")]


def test_unseeded_generator_that_is_seeded_later_through_an_attribute_is_fine():
    assert _check(
        """
        import numpy as np
        class Sampler:
            def __init__(self, seed):
                self.state = np.random.RandomState()
                self.state.seed(seed)
        """
    ) == []


# -- uninitialized-memory ---------------------------------------------------------


@pytest.mark.parametrize(
    "fill",
    ["buf.fill_(0)", "buf.zero_()", "buf.uniform_(-1, 1)", "buf[:] = 0", "buf[...] = 1", "torch.randn(4, 4, out=buf)", "kernel(buf)"],
)
def test_full_writes_and_unknown_fillers_end_the_check(fill):
    assert _check(f"import torch\nbuf = torch.empty(4, 4)\n{fill}\ntotal = buf.sum()\n") == []


def test_mask_and_its_complement_cover_the_tensor():
    assert _check(
        "import torch\ndef f(t, m):\n    x = torch.empty_like(t)\n    x[m] = 1.0\n    x[~m] = 0.0\n    return x.mean()\n"
    ) == []


def test_returned_without_a_read_is_left_to_the_caller():
    assert _check("import torch\ndef alloc(n):\n    out = torch.empty(n)\n    out[0] = 1\n    return out\n") == []


# -- dataloader-worker-seed -------------------------------------------------------


def test_imgaug_in_workers_without_worker_init_fn_is_reported():
    found = _check(
        """
        import imgaug.augmenters as iaa
        import torch
        torch.manual_seed(0)
        AUG = iaa.Fliplr(0.5)
        loader = torch.utils.data.DataLoader(range(4), num_workers=2)
        """
    )
    assert found == [(6, "DET030")]


def test_workers_from_a_flag_default_of_zero_are_not_reported():
    assert _check(
        """
        import argparse, cv2, torch
        p = argparse.ArgumentParser()
        p.add_argument('--workers', type=int, default=0)
        args = p.parse_args()
        torch.manual_seed(0)
        def noisy(x):
            return cv2.randu(x, 0, 1)
        loader = torch.utils.data.DataLoader(range(4), num_workers=args.workers, collate_fn=noisy)
        """
    ) == []


def test_sampler_with_shuffle_off_needs_no_set_epoch():
    assert _check(
        "import torch\nfrom torch.utils.data import DistributedSampler\ntorch.manual_seed(0)\ns = DistributedSampler(range(4), shuffle=False)\n"
    ) == []


# -- unordered-file-listing -------------------------------------------------------


@pytest.mark.parametrize(
    "listing",
    ["os.listdir(d)", "glob.glob(d + '/*')", "list(glob.iglob(d))", "list(Path(d).iterdir())", "list(Path(d).rglob('*.pt'))", "[e.path for e in os.scandir(d)]"],
)
def test_every_listing_spelling_is_reported_when_indexed(listing):
    found = _check(f"import glob, os, torch\nfrom pathlib import Path\nd = 'data'\nfiles = {listing}\nfirst = files[0]\n")
    assert found == [(4, "DET031")]


@pytest.mark.parametrize(
    "use",
    ["files = sorted(files)\nfirst = files[0]", "files.sort()\nfirst = files[0]", "n = len(files)", "ok = 'a.pt' in files", "if files:\n    pass", "unique = set(files)"],
)
def test_sorted_later_or_order_free_uses_are_not_reported(use):
    assert _check(f"import os, torch\nfiles = os.listdir('data')\n{use}\n") == []


def test_walk_with_sorted_dirs_and_files_is_fine():
    assert _check(
        """
        import os, torch
        def images(root):
            out = []
            for base, dirs, files in os.walk(root):
                dirs.sort()
                for name in sorted(files):
                    out.append(name)
            return out
        """
    ) == []


def test_a_listing_used_twice_is_reported_once():
    found = _check("import glob, torch\nfiles = glob.glob('*.pt')\na = files[0]\nb = files[1]\n")
    assert found == [(2, "DET031")]


# -- set-iteration-order ----------------------------------------------------------


def test_set_of_names_from_a_loop_over_words_is_reported():
    found = _check(
        """
        import torch
        def build(lines):
            seen = set()
            for line in lines:
                for token in line.strip().split():
                    seen.add(token)
            return list(seen)
        """
    )
    assert found == [(8, "DET032")]


def test_set_of_unknown_elements_is_not_reported():
    # the elements may be ints (fixed order): precision first
    assert _check("import torch\ndef f(xs):\n    s = set(xs)\n    return list(s)\n") == []


# -- the static path stays light ---------------------------------------------------


def test_checking_does_not_import_torch_or_numpy():
    script = (
        "import sys\nfrom pathlib import Path\nfrom detaudit.static.engine.check import check_file\n"
        f"root = Path({str(FIXTURES)!r})\n"
        "for p in sorted(root.iterdir()):\n    check_file(p, p.name, root)\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, sorted(m for m in sys.modules if m in ('torch', 'numpy'))\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, timeout=120)
