"""Shared test configuration: GPU tests skip cleanly on machines without CUDA;
the tracer's compiled recorder is built before any test runs; temporary
folders detaudit makes in the test process go under pytest's own."""

from __future__ import annotations

import tempfile

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_sessionstart(session):
    # build the tracer's compiled recorder now (a subprocess; about 20 s, once per
    # torch and source), not inside the first test's traced run and its time limit
    from detaudit.dynamic.record import native

    native.ensure_built()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip_cuda)


@pytest.fixture(autouse=True)
def _temporary_folders_under_pytest(tmp_path_factory, monkeypatch):
    # a run_script() given no output_dir leaves its folder to its caller (the
    # payload names files in it): under pytest's base folder, which pytest
    # prunes, a test suite leaves none in /tmp
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.getbasetemp()))
