"""Ground truth for the batch-invariance tests, computed with plain torch calls.

Whether a CPU GEMM or attention kernel gives a row the same bits inside a
batch as alone depends on the CPU (MKL/oneDNN pick their blocking per ISA:
with torch 2.13, ``torch.mm`` with a 1024x1024 weight differs from 4 rows up
on an AVX2 machine and from 2 rows up on an AVX-512 one).  So the tests do not
hard-code which cells differ: they compute it here, the way the audit batches
samples (rotations of the pool, first/middle/last position), and check that
the audit finds exactly that.
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from detaudit.dynamic.batch.audit import batch_positions


def differing_samples(entry: Callable, samples: torch.Tensor, sizes, positions=None) -> dict[tuple[int, int], int]:
    """How many samples get other bits than alone, per (batch size, position) cell."""
    count = samples.shape[0]
    with torch.no_grad():
        alone = [entry(samples[index : index + 1]) for index in range(count)]
        cells: dict[tuple[int, int], int] = {}
        for size in sizes:
            chosen = batch_positions(positions, size)
            for position in chosen:
                cells.setdefault((size, position), 0)
            for start in range(count):
                order = [(start + offset) % count for offset in range(size)]
                batched = entry(samples[order])
                for position in chosen:
                    if not torch.equal(batched[position : position + 1], alone[order[position]]):
                        cells[(size, position)] += 1
    return cells


def variant_cells(entry: Callable, samples: torch.Tensor, sizes, positions=None) -> set[tuple[int, int]]:
    """The cells where some sample differs; skips the test when this CPU's kernels are batch-invariant there."""
    cells = {cell for cell, count in differing_samples(entry, samples, sizes, positions).items() if count}
    if not cells:
        pytest.skip("this CPU's kernels give these shapes the same bits at every batch size")
    return cells
