"""An FSDP2 loop in torchtitan's style, on CPU with gloo under torchrun.

Written for the real-code corpus (torchtitan and pytorch/examples' FSDP2
example need GPUs): the model is built on the meta device, each block and
then the root is ``fully_shard``ed, ``to_empty`` + ``init_weights`` give the
sharded parameters their values, AdamW with a warmup LambdaLR, gradient
clipping over DTensors, a seeded batch per rank.
"""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Model(nn.Module):
    def __init__(self, width: int = 16, depth: int = 3, vocab: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, vocab)

    def init_weights(self):
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                module.reset_parameters()

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
with torch.device("meta"):
    model = Model()
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
model.to_empty(device="cpu")
with torch.no_grad():
    model.init_weights()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 3))
data = torch.Generator().manual_seed(100 + rank)
for step in range(8):
    tokens = torch.randint(0, 64, (4, 12), generator=data)
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    if rank == 0:
        print(f"step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
