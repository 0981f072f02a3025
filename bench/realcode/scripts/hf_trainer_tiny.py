"""A transformers Trainer run from a tiny GPT-2 config, on synthetic tokens.

Written for the real-code corpus (no hub access here: no pretrained weights or
tokenizer), the way the library's causal-LM examples use the Trainer: the
model is built from its config before Trainer seeds, TrainingArguments on
CPU, the Trainer's own DataLoader, AdamW and linear schedule.
Under torchrun the Trainer wraps the model in DDP (gloo on CPU).
"""

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class SyntheticTokens(torch.utils.data.Dataset):
    def __init__(self, count: int, length: int, vocab: int):
        generator = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, vocab, (count, length), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
model = GPT2LMHeadModel(config)
arguments = TrainingArguments(
    output_dir=sys.argv[1] if len(sys.argv) > 1 else "hf-out",
    per_device_train_batch_size=4,
    max_steps=6,
    learning_rate=1e-3,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    use_cpu=True,
    seed=42,
    dataloader_num_workers=0,
)
Trainer(model=model, args=arguments, train_dataset=SyntheticTokens(64, 32, 128)).train()
