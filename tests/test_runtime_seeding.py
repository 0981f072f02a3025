"""seed_everything / seed_worker / make_generator against the real RNGs."""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import detaudit
from detaudit.runtime import DeterminismWarning
from detaudit.runtime.seeding import GLOBAL_SEED_ENV_VAR, last_seed


def draw() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


@pytest.fixture
def hash_seed_set(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "123")


def test_seed_everything_makes_every_rng_repeat(hash_seed_set):
    assert detaudit.seed_everything(7) == 7
    first = draw()
    detaudit.seed_everything(7)
    assert draw() == first
    detaudit.seed_everything(8)
    assert draw() != first
    assert torch.initial_seed() == 8
    assert last_seed() == 8


def test_workers_flag_exports_the_seed(hash_seed_set, monkeypatch):
    monkeypatch.delenv(GLOBAL_SEED_ENV_VAR, raising=False)
    detaudit.seed_everything(3)
    assert os.environ[GLOBAL_SEED_ENV_VAR] == "3"
    detaudit.seed_everything(3, workers=False)
    assert GLOBAL_SEED_ENV_VAR not in os.environ


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, True, "3", None])
def test_bad_seeds_are_refused_in_one_line(bad):
    with pytest.raises((TypeError, ValueError), match="seed must be"):
        detaudit.seed_everything(bad)
    with pytest.raises((TypeError, ValueError), match="seed must be"):
        detaudit.make_generator(bad)


def test_warns_when_hash_seed_is_unset(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.warns(DeterminismWarning, match=r"PYTHONHASHSEED=0 python train.py"):
        detaudit.seed_everything(0)


@pytest.mark.skipif(not sys.flags.hash_randomization, reason="interpreter started with PYTHONHASHSEED=0")
def test_warns_when_hash_seed_was_set_too_late(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # after start-up: no effect on this interpreter
    with pytest.warns(DeterminismWarning, match="after the interpreter started"):
        detaudit.seed_everything(0)


def test_make_generator_repeats_and_depends_on_the_seed():
    first = torch.randperm(20, generator=detaudit.make_generator(5))
    assert torch.equal(first, torch.randperm(20, generator=detaudit.make_generator(5)))
    assert not torch.equal(first, torch.randperm(20, generator=detaudit.make_generator(6)))


class RandomDraws(Dataset):
    """Each item is what the worker's three RNGs produce."""

    def __len__(self):
        return 4

    def __getitem__(self, index):
        worker = torch.utils.data.get_worker_info().id
        return worker, random.random(), float(np.random.rand()), torch.rand(1).item()


def worker_draws() -> dict[int, tuple]:
    loader = DataLoader(
        RandomDraws(), batch_size=None, num_workers=2,
        worker_init_fn=detaudit.seed_worker, generator=detaudit.make_generator(0),
    )
    return {int(worker): tuple(draws) for worker, *draws in loader}


def test_worker_seeds_are_distinct_reproducible_and_rank_aware(hash_seed_set, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    detaudit.seed_everything(11)
    rank0 = worker_draws()
    assert len(rank0) == 2 and rank0[0] != rank0[1]  # distinct per worker
    assert len(set(rank0[0])) == 3  # random, numpy and torch not in lock-step
    assert worker_draws() == rank0  # reproducible
    monkeypatch.setenv("RANK", "1")
    rank1 = worker_draws()
    assert not set(rank1.values()) & set(rank0.values())  # distinct per rank
