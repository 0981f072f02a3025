"""The NCCL path of ``detaudit run --nproc-per-node``, for a machine with two or more CUDA GPUs.

    detaudit run --nproc-per-node 2 --repeats 3 bench/gpu_ddp.py              # expected: deterministic
    detaudit run --nproc-per-node 2 --repeats 3 bench/gpu_ddp.py -- --scatter # expected: nondeterministic

A small DistributedDataParallel model on NCCL, one GPU per rank (LOCAL_RANK),
each rank its own fixed shard of a fixed dataset.  With ``--scatter`` the
model also adds up embedding rows with ``index_add_`` on CUDA (atomic adds,
nondeterministic without deterministic algorithms); the audit should name it
on every rank ("ranks 0-1"), its gradient all-reduced by DDP's NCCL
allreduce.  Without a GPU per rank it says so and exits 0 at once.  (NCCL
rejects two ranks on one GPU, so a single-GPU machine cannot run it.)

Not run in CI: no GPU there.  Prints nothing but what the script logs.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class ScatterModel(torch.nn.Module):
    def __init__(self, scatter: bool):
        super().__init__()
        self.scatter = scatter
        self.embedding = torch.nn.Parameter(torch.randn(512, 64))
        self.head = torch.nn.Linear(64, 1)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        picked = self.embedding[rows]  # backward: index_put_ with accumulate (atomic adds on CUDA)
        if self.scatter:
            buckets = torch.zeros(32, 64, device=rows.device).index_add_(0, rows % 32, picked)
            return self.head(buckets).sum().reshape(1, 1).expand(rows.shape[0], 1)
        return self.head(picked)


def main() -> int:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if not torch.cuda.is_available() or torch.cuda.device_count() < world:
        print(f"gpu_ddp.py: needs {world} CUDA GPUs, found {torch.cuda.device_count()}; nothing to do")
        return 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)
    torch.manual_seed(0)
    model = DistributedDataParallel(ScatterModel("--scatter" in sys.argv).to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1)
    rows = torch.randint(0, 512, (8 * world, 4096), generator=generator).to(device)
    for step in range(8):
        batch = rows[(step * world + rank) % rows.shape[0]]
        optimizer.zero_grad()
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
    if rank == 0:
        print(f"gpu_ddp.py: final loss {loss.item():.6f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
