"""Seeding: one call for every RNG a training script uses, and DataLoader workers.

Modern torch already reseeds Python ``random``, NumPy's global RNG and torch in
each DataLoader worker from a base seed drawn from the loader's generator (or
torch's global RNG).  What it does not do is make those worker seeds differ
across distributed ranks (every rank seeds the same value, so every rank's
worker 0 would draw the same augmentations) or tie them to the experiment seed
when the loader owns an unseeded generator.  ``seed_worker`` does both.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import warnings

from detaudit.runtime import DeterminismWarning

MAX_SEED = 2**32 - 1  # NumPy's legacy global RNG accepts nothing larger
# Set by seed_everything(workers=True); inherited by DataLoader workers whether
# they are forked or spawned, and read by seed_worker.
GLOBAL_SEED_ENV_VAR = "DETAUDIT_GLOBAL_SEED"

_last_seed: int | None = None


def seed_everything(seed: int, *, workers: bool = True) -> int:
    """Seed Python ``random``, NumPy's global RNG, torch's CPU RNG and every
    CUDA device (lazily: CUDA is not initialised), and return ``seed``.

    With ``workers=True`` the seed is exported as ``DETAUDIT_GLOBAL_SEED`` so
    that ``seed_worker`` folds it into each DataLoader worker's seeds.  Warns
    (``DeterminismWarning``) when PYTHONHASHSEED does not fix ``hash()``.
    """
    global _last_seed
    seed = check_seed(seed)
    random.seed(seed)
    numpy = numpy_or_none()
    if numpy is not None:
        numpy.random.seed(seed)
    import torch

    torch.manual_seed(seed)  # also queues manual_seed_all for CUDA devices
    if workers:
        os.environ[GLOBAL_SEED_ENV_VAR] = str(seed)
    else:
        os.environ.pop(GLOBAL_SEED_ENV_VAR, None)
    _last_seed = seed
    problem = hash_seed_problem()
    if problem:
        warnings.warn(f"{problem} {HOW_TO_SET_HASH_SEED}", DeterminismWarning, stacklevel=2)
    return seed


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` for ``DataLoader``: reseeds ``random``, NumPy's global
    RNG and torch in this worker with a seed that is distinct per worker and
    per distributed rank, and the same in every run."""
    import torch

    worker_key = (
        torch.initial_seed(),  # torch set it to base_seed + worker_id
        worker_id,
        distributed_rank(),
        os.environ.get(GLOBAL_SEED_ENV_VAR, ""),
    )
    # One seed per library: `random` and NumPy are both Mersenne Twisters and
    # would produce the very same stream from the same seed.
    random.seed(derive_seed("random", *worker_key))
    torch.manual_seed(derive_seed("torch", *worker_key))
    numpy = numpy_or_none()
    if numpy is not None:
        numpy.random.seed(derive_seed("numpy", *worker_key) & MAX_SEED)


def make_generator(seed: int):
    """A CPU ``torch.Generator`` seeded with ``seed``, for ``DataLoader(generator=...)``:
    the shuffle order and the workers' base seed then depend on this seed only."""
    import torch

    generator = torch.Generator()
    generator.manual_seed(check_seed(seed))
    return generator


def last_seed() -> int | None:
    """The seed of the last ``seed_everything`` call in this process, if any."""
    return _last_seed


def set_last_seed(seed: int | None) -> None:
    """Put back what ``last_seed()`` reports (used when ``deterministic`` restores)."""
    global _last_seed
    _last_seed = seed


def check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be in [0, {MAX_SEED}] (NumPy's limit), got {seed}")
    return seed


def derive_seed(*parts: object) -> int:
    """A 64-bit seed from ``parts``, identical in every process (blake2b, not
    the salted built-in ``hash``)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def distributed_rank() -> int:
    """This process's global rank: torch.distributed's when initialised, else
    the ``RANK`` that torchrun exports (DataLoader workers inherit it), else 0."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def hash_seed_problem() -> str | None:
    """Why ``hash()`` of str/bytes differs between runs of this interpreter, or None."""
    return describe_hash_seed(os.environ.get("PYTHONHASHSEED"), bool(sys.flags.hash_randomization))


def describe_hash_seed(value: str | None, hash_randomization: bool) -> str | None:
    """The problem with a process whose PYTHONHASHSEED is ``value`` and whose
    interpreter flag ``sys.flags.hash_randomization`` is as given, or None."""
    if value in (None, "", "random"):
        return (
            "PYTHONHASHSEED is not set, so hash() of str/bytes and the iteration order "
            "of sets of strings change from run to run."
        )
    if value == "0" and hash_randomization:
        return "PYTHONHASHSEED=0 was set after the interpreter started and has no effect."
    return None


HOW_TO_SET_HASH_SEED = (
    "It cannot be changed inside a running interpreter: start Python with it, "
    "e.g. `PYTHONHASHSEED=0 python train.py`, or export it in the job script or Dockerfile."
)


def numpy_or_none():
    try:
        import numpy
    except ImportError:
        return None
    return numpy
