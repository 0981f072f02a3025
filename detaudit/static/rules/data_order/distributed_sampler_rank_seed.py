"""Data order that differs between the ranks of one job (DET033 distributed-sampler-rank-seed)."""

from __future__ import annotations

from detaudit.findings import Severity
from detaudit.knowledge.apis import DATA_API_ALIASES, DISTRIBUTED_SAMPLER
from detaudit.static.analyses.distributed import rank_identifiers
from detaudit.static.rule import Invalid, Rule

#: ``DistributedSampler(dataset, num_replicas, rank, shuffle, seed, drop_last)``
_SHUFFLE = ("shuffle", 3)
_SEED = ("seed", 4)


class DistributedSamplerRankSeed(Rule):
    code = "DET033"
    name = "distributed-sampler-rank-seed"
    severity = Severity.WARNING
    summary = "A `DistributedSampler` is seeded from the process's rank."
    rationale = """
        Every rank builds its own `DistributedSampler`, which shuffles the whole
        dataset with `seed + epoch` and keeps every `num_replicas`-th index from
        its `rank` on.  That splits one permutation into disjoint shards only if
        all ranks draw the same permutation, so torch documents that the seed
        "should be identical across all processes in the distributed group".
        Seeded from the rank (`seed=rank`, `seed=args.seed + local_rank`,
        `seed=int(os.environ["RANK"])`), each rank shuffles differently: the
        shards overlap, some samples are seen twice per epoch and others never,
        and the global order is not the single permutation that data-parallel
        training (and its resumption) assumes.  Per-rank seeds belong to the
        RNGs that should differ between ranks (augmentation, dropout), not to
        the sampler.
        """
    fix_hint = "Pass the same seed on every rank (`DistributedSampler(ds, seed=args.seed)`) and call `set_epoch(epoch)` every epoch."
    VALID = (
        "import torch\nfrom torch.utils.data import DistributedSampler\n\ndef loader(ds, args, rank):\n"
        "    return DistributedSampler(ds, rank=rank, seed=args.seed)\n",
        # per-rank seeds for the RNGs that should differ between ranks are fine
        "import torch, torch.distributed as dist\nfrom torch.utils.data import DistributedSampler\n"
        "torch.manual_seed(1234 + dist.get_rank())\nsampler = DistributedSampler(range(10), seed=1234)\n",
        # without shuffling the seed is never used
        "import torch\nfrom torch.utils.data import DistributedSampler\n\ndef evaluation(ds, rank):\n"
        "    return DistributedSampler(ds, shuffle=False, seed=rank)\n",
        # a seed variable that does not depend on the rank
        "import torch\nfrom torch.utils.data import DistributedSampler\nseed = 42\nsampler = DistributedSampler(range(10), seed=seed)\n",
    )
    INVALID = (
        Invalid(
            "import torch\nfrom torch.utils.data import DistributedSampler\n\ndef loader(ds, rank):\n"
            "    return DistributedSampler(ds, seed=rank)\n",
            line=5,
            message="seeded from the rank (rank)",
        ),
        Invalid(
            "import torch, torch.distributed as dist\nfrom torch.utils.data import DistributedSampler\ntorch.manual_seed(0)\n"
            "sampler = DistributedSampler(range(10), seed=42 + dist.get_rank())\nsampler.set_epoch(0)\n",
            line=4,
            message="rank",
        ),
        Invalid(
            "import os, torch\nfrom torch.utils.data.distributed import DistributedSampler\n"
            "seed = 1234 + int(os.environ['LOCAL_RANK'])\nsampler = DistributedSampler(range(10), seed=seed)\n",
            line=4,
            message="LOCAL_RANK",
        ),
        # positional: (dataset, num_replicas, rank, shuffle, seed)
        Invalid(
            "import torch\nimport torch.utils.data as data\n\ndef shard(ds, world, rank):\n"
            "    return data.DistributedSampler(ds, world, rank, True, rank)\n",
            line=5,
        ),
    )

    def finish(self) -> None:
        for call in self.facts.calls:
            if DATA_API_ALIASES.get(call.qualname, call.qualname) != DISTRIBUTED_SAMPLER:
                continue
            seed = call.value_node(*_SEED)
            if seed is None or self.facts.evaluate(call.value_node(*_SHUFFLE)).falsy:
                continue
            ranks = sorted(rank_identifiers(self.facts, seed))
            if ranks:
                self.report(
                    seed,
                    f"DistributedSampler seeded from the rank ({', '.join(ranks)}): each rank shuffles a different "
                    "permutation, so the ranks' shards overlap and some samples are never seen in an epoch; "
                    "pass the same seed on every rank.",
                )
