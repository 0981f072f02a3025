"""Batch invariance on a GPU: the batch fixtures and a transformer decoder step.

    python bench/gpu_batch_invariance.py [--device cuda] [--dtype float32|bfloat16] [--json OUT.json] [--remedies]

Runs ``detaudit.audit_batch_invariance`` on the four CPU fixtures of
``fixtures/dynamic/batch`` (matmul MLP, attention block, LayerNorm model,
training-mode BatchNorm) moved to the device, and on a small transformer
decoder step with a KV cache (one new token per sequence: embedding, RMS-free
pre-LayerNorm attention over the cache with SDPA, MLP, logits), and prints per
model the verdict and each root cause (kind, op, line, batch sizes, max
deviation).  ``--remedies`` audits the decoder step again under the
knowledge base's matmul remedy (cuBLASLt without split-K) and says whether
it made the matmul invariant on this GPU.  ``--json`` writes every report.
``--device cpu`` runs the same on CPU (how the script is tested without a
GPU).  It is a measurement, not a test: it exits 0 whatever the verdicts.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import detaudit  # noqa: E402

FIXTURES = ROOT / "fixtures" / "dynamic" / "batch"
BATCH_SIZES = (1, 2, 4, 8, 32, 64)


class DecoderStep(torch.nn.Module):
    """One decoding step of a small pre-LayerNorm transformer decoder with a KV cache."""

    def __init__(self, vocab: int = 1000, width: int = 256, heads: int = 4, layers: int = 2):
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict(
                {
                    "norm1": torch.nn.LayerNorm(width),
                    "qkv": torch.nn.Linear(width, 3 * width),
                    "proj": torch.nn.Linear(width, width),
                    "norm2": torch.nn.LayerNorm(width),
                    "up": torch.nn.Linear(width, 4 * width),
                    "down": torch.nn.Linear(4 * width, width),
                }
            )
            for _ in range(layers)
        )
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, tokens, past_keys, past_values):
        # tokens [B, 1]; past_keys/values [B, layers, heads, cached, head_dim]
        batch = tokens.shape[0]
        hidden = self.embed(tokens)
        for layer, block in enumerate(self.blocks):
            q, k, v = block["qkv"](block["norm1"](hidden)).split(hidden.shape[-1], dim=-1)
            q, k, v = (t.view(batch, 1, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
            keys = torch.cat([past_keys[:, layer], k], dim=2)
            values = torch.cat([past_values[:, layer], v], dim=2)
            read = F.scaled_dot_product_attention(q, keys, values)
            hidden = hidden + block["proj"](read.transpose(1, 2).reshape(batch, 1, -1))
            hidden = hidden + block["down"](F.gelu(block["up"](block["norm2"](hidden))))
        return self.head(self.norm(hidden))[:, -1]


def decoder_case(device: str, dtype: torch.dtype, samples: int = 8, cached: int = 64):
    torch.manual_seed(0)
    model = DecoderStep().to(device=device, dtype=dtype).eval()
    generator = torch.Generator().manual_seed(1)
    shape = (samples, len(model.blocks), model.heads, cached, model.head_dim)
    inputs = (
        torch.randint(0, 1000, (samples, 1), generator=generator).to(device),
        torch.randn(shape, generator=generator).to(device=device, dtype=dtype),
        torch.randn(shape, generator=generator).to(device=device, dtype=dtype),
    )
    return model, inputs


def fixture_case(name: str, device: str, dtype: torch.dtype):
    namespace = runpy.run_path(str(FIXTURES / f"{name}.py"), run_name="fixture")
    namespace["model"].to(device=device, dtype=dtype)
    return namespace["detaudit_batch_entry"], namespace["detaudit_batch_samples"]().to(device=device, dtype=dtype)


@contextmanager
def no_split_k():
    """The knowledge base's cuBLAS remedy: cuBLASLt, reduced-precision reductions and split-K off."""
    matmul = torch.backends.cuda.matmul
    saved = (matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction)
    saved_split = (
        matmul.allow_bf16_reduced_precision_reduction_split_k,
        matmul.allow_fp16_reduced_precision_reduction_split_k,
    )
    library = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    matmul.allow_bf16_reduced_precision_reduction = (False, False)
    matmul.allow_fp16_reduced_precision_reduction = (False, False)
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction = (saved[0], saved_split[0])
        matmul.allow_fp16_reduced_precision_reduction = (saved[1], saved_split[1])
        torch.backends.cuda.preferred_blas_library(library)


def audit(label: str, model, samples, reports: dict) -> None:
    started = time.perf_counter()
    report = detaudit.audit_batch_invariance(model, samples, batch_sizes=BATCH_SIZES)
    seconds = time.perf_counter() - started
    reports[label] = report.to_dict()
    print(f"== {label} ({seconds:.1f} s)")
    print(report.verdict_line())
    for cell in report.cells:
        if not cell.matched:
            print(
                f"   batch {cell.batch_size:>3} position {cell.position:>3}: {len(cell.differing)}/{cell.samples} samples "
                f"differ, max |diff| {cell.max_abs_diff:.3g}, {cell.max_ulp} ULP"
            )
    for number, cause in enumerate(report.root_causes, 1):
        print(f"   #{number} {cause.kind} {cause.op} at {cause.where()} ({cause.module or '-'}, {cause.device}), "
              f"batch sizes {cause.batch_sizes()}, max |diff| {cause.max_abs_diff}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--json", metavar="OUT", help="write every report to OUT as JSON")
    parser.add_argument("--remedies", action="store_true", help="also audit the decoder step under cuBLASLt without split-K")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_batch_invariance: no CUDA device here (use --device cpu to run it on CPU)", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else "") + f", {args.dtype}")
    reports: dict = {}
    for name in ("mlp_classifier", "attention_block", "layernorm_model", "batchnorm_train"):
        audit(name, *fixture_case(name, args.device, dtype), reports)
    model, inputs = decoder_case(args.device, dtype)
    audit("decoder_step", model, inputs, reports)
    if args.remedies:
        if args.device.startswith("cuda"):
            with no_split_k():
                audit("decoder_step, cuBLASLt without split-K", model, inputs, reports)
        else:
            print("--remedies: the cuBLAS remedy needs a CUDA device; skipped")
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
