"""A Lightning Trainer run on CPU: one process, or DDP (gloo) under torchrun,
optionally in bf16 autocast (``--precision bf16-mixed``).

Written for the real-code corpus in the shape of Lightning's BoringModel:
a LightningModule with its own optimizer and StepLR, a DataLoader over random
data, ``seed_everything`` inside the script, the Trainer driving the loop.
"""

import argparse
import os

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


class RandomData(Dataset):
    def __init__(self, size: int, length: int):
        self.data = torch.randn(length, size)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


class Boring(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                         torch.nn.Dropout(0.1), torch.nn.Linear(16, 2))

    def training_step(self, batch, batch_index):
        loss = self.layer(batch).sum()
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.01)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]


parser = argparse.ArgumentParser()
parser.add_argument("--precision", default="32-true")
parser.add_argument("--root", default="lightning-out")
options = parser.parse_args()
L.seed_everything(7)
world_size = int(os.environ.get("WORLD_SIZE", "1"))
trainer = L.Trainer(
    accelerator="cpu",
    devices=world_size,
    strategy="ddp" if world_size > 1 else "auto",
    precision=options.precision,
    default_root_dir=options.root,
    max_epochs=1,
    limit_train_batches=6,
    limit_val_batches=0,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    logger=False,
)
trainer.fit(Boring(), DataLoader(RandomData(32, 64), batch_size=4))
