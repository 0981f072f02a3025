"""Calibration recipes: for each ops-table entry with a ``recipe``, a small
runnable instance of its op on fixed inputs that give a race something to race
on (duplicate indices, overlapping windows, ties), for ``detaudit calibrate``.

Adding an op to the table means adding its JSON entry and, to measure it, one
``@recipe("name")`` function here.  Imports torch: only calibration imports
this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F


@dataclass
class Probe:
    """One runnable instance of an op: ``run`` computes the outputs from fixed
    inputs; ``leaves`` are the inputs gradients flow to (empty: no backward)."""

    run: Callable[[], Any]
    leaves: tuple[torch.Tensor, ...] = ()


class Inputs:
    """Seeded input factory, so every calibration sees the same tensors."""

    def __init__(self, device: str):
        self.device = device
        self.generator = torch.Generator().manual_seed(0)

    def randn(self, *shape: int, grad: bool = False, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
        values = torch.randn(*shape, generator=self.generator) * scale + offset
        return values.to(self.device).requires_grad_(grad)

    def rand(self, *shape: int, grad: bool = False) -> torch.Tensor:
        return torch.rand(*shape, generator=self.generator).to(self.device).requires_grad_(grad)

    def index(self, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=self.generator).to(self.device)

    def ties(self, *shape: int, grad: bool = False) -> torch.Tensor:
        """Floats with many equal values, for ops whose indices pick among ties."""
        values = torch.randint(0, 4, shape, generator=self.generator).float()
        return values.to(self.device).requires_grad_(grad)

    def zeros(self, *shape: int) -> torch.Tensor:
        return torch.zeros(*shape, device=self.device)


RECIPES: dict[str, Callable[[Inputs], Probe]] = {}


def recipe(name: str):
    """Register a recipe under the name table entries give in ``recipe``."""

    def register(build: Callable[[Inputs], Probe]):
        RECIPES[name] = build
        return build

    return register


# Shared shapes: many duplicate indices into few rows.
_ROWS, _COLS, _MANY = 64, 256, 4096


@recipe("put")
def _put(x: Inputs) -> Probe:
    base, source, index = x.randn(256, grad=True), x.randn(65536, grad=True), x.index(256, 65536)
    return Probe(lambda: base.clone().put_(index, source), (base, source))


@recipe("put_accumulate")
def _put_accumulate(x: Inputs) -> Probe:
    base, source, index = x.randn(256, grad=True), x.randn(65536, grad=True), x.index(256, 65536)
    return Probe(lambda: base.clone().put_(index, source, accumulate=True), (base, source))


@recipe("take")
def _take(x: Inputs) -> Probe:
    source, index = x.randn(256, grad=True), x.index(256, 65536)
    return Probe(lambda: torch.take(source, index), (source,))


@recipe("index_put_accumulate")
def _index_put_accumulate(x: Inputs) -> Probe:
    # forward: index_put_ itself; backward: advanced indexing W[idx]
    values, flat_index = x.randn(200000, grad=True), x.index(_ROWS, 200000)
    weight, row_index = x.randn(_ROWS, _COLS, grad=True), x.index(_ROWS, _MANY)
    return Probe(
        lambda: (x.zeros(_ROWS).index_put_((flat_index,), values, accumulate=True), weight[row_index]),
        (values, weight),
    )


@recipe("index_put_duplicates")
def _index_put_duplicates(x: Inputs) -> Probe:
    values, index = x.randn(_MANY, _COLS, grad=True), x.index(_ROWS, _MANY)
    return Probe(lambda: x.zeros(_ROWS, _COLS).index_put_((index,), values), (values,))


@recipe("index_copy")
def _index_copy(x: Inputs) -> Probe:
    source, index = x.randn(_MANY, _COLS, grad=True), x.index(_ROWS, _MANY)
    return Probe(lambda: x.zeros(_ROWS, _COLS).index_copy_(0, index, source), (source,))


@recipe("scatter_src")
def _scatter_src(x: Inputs) -> Probe:
    source, index = x.randn(_MANY, _COLS, grad=True), x.index(_ROWS, _MANY, _COLS)
    return Probe(lambda: x.zeros(_ROWS, _COLS).scatter_(0, index, source), (source,))


@recipe("scatter_add")
def _scatter_add(x: Inputs) -> Probe:
    source, index = x.randn(_MANY, _COLS, grad=True), x.index(_ROWS, _MANY, _COLS)
    return Probe(lambda: x.zeros(_ROWS, _COLS).scatter_add_(0, index, source), (source,))


@recipe("gather")
def _gather(x: Inputs) -> Probe:
    weight, index = x.randn(_ROWS, _COLS, grad=True), x.index(_ROWS, _MANY, _COLS)
    return Probe(lambda: torch.gather(weight, 0, index), (weight,))


@recipe("scatter_reduce_sum")
def _scatter_reduce_sum(x: Inputs) -> Probe:
    source, index = x.randn(_MANY, _COLS, grad=True), x.index(_ROWS, _MANY, _COLS)
    return Probe(lambda: x.zeros(_ROWS, _COLS).scatter_reduce(0, index, source, "sum"), (source,))


@recipe("scatter_reduce_prod")
def _scatter_reduce_prod(x: Inputs) -> Probe:
    # values near 1 keep the products finite; few columns because CPU prod is slow
    source, index = x.randn(_MANY, 32, grad=True, scale=0.01, offset=1.0), x.index(_ROWS, _MANY, 32)
    base = x.randn(_ROWS, 32, scale=0.01, offset=1.0)
    return Probe(lambda: base.scatter_reduce(0, index, source, "prod"), (source,))


@recipe("index_add")
def _index_add(x: Inputs) -> Probe:
    source, index = x.randn(_MANY, _COLS, grad=True), x.index(_ROWS, _MANY)
    return Probe(lambda: x.zeros(_ROWS, _COLS).index_add_(0, index, source), (source,))


@recipe("index_select")
def _index_select(x: Inputs) -> Probe:
    weight, index = x.randn(_ROWS, _COLS, grad=True), x.index(_ROWS, _MANY)
    return Probe(lambda: weight.index_select(0, index), (weight,))


@recipe("repeat_interleave")
def _repeat_interleave(x: Inputs) -> Probe:
    weight = x.randn(_ROWS, _COLS, grad=True)
    return Probe(lambda: torch.repeat_interleave(weight, 64, dim=0), (weight,))


@recipe("embedding_bag_max")
def _embedding_bag_max(x: Inputs) -> Probe:
    weight, index = x.randn(_ROWS, 32, grad=True), x.index(_ROWS, 8192)
    offsets = torch.arange(0, 8192, 8, device=x.device)
    return Probe(lambda: F.embedding_bag(index, weight, offsets, mode="max"), (weight,))


@recipe("avg_pool3d")
def _avg_pool3d(x: Inputs) -> Probe:
    volume = x.randn(2, 4, 9, 9, 9, grad=True)
    return Probe(lambda: F.avg_pool3d(volume, 3, stride=2), (volume,))


@recipe("adaptive_avg_pool2d")
def _adaptive_avg_pool2d(x: Inputs) -> Probe:
    image = x.randn(4, 8, 15, 15, grad=True)  # 15 -> 4 makes the windows overlap
    return Probe(lambda: F.adaptive_avg_pool2d(image, 4), (image,))


@recipe("adaptive_avg_pool3d")
def _adaptive_avg_pool3d(x: Inputs) -> Probe:
    volume = x.randn(2, 4, 9, 9, 9, grad=True)
    return Probe(lambda: F.adaptive_avg_pool3d(volume, 4), (volume,))


@recipe("adaptive_max_pool2d")
def _adaptive_max_pool2d(x: Inputs) -> Probe:
    image = x.ties(4, 8, 15, 15, grad=True)
    return Probe(lambda: F.adaptive_max_pool2d(image, 4), (image,))


@recipe("fractional_max_pool2d")
def _fractional_max_pool2d(x: Inputs) -> Probe:
    image, samples = x.randn(4, 8, 16, 16, grad=True), x.rand(4, 8, 2)  # fixed samples: no RNG
    return Probe(lambda: F.fractional_max_pool2d(image, 3, output_size=8, _random_samples=samples), (image,))


@recipe("max_pool3d")
def _max_pool3d(x: Inputs) -> Probe:
    volume = x.ties(2, 4, 9, 9, 9, grad=True)
    return Probe(lambda: F.max_pool3d(volume, 3, stride=2), (volume,))


@recipe("max_unpool2d")
def _max_unpool2d(x: Inputs) -> Probe:
    pooled, indices = F.max_pool2d(x.randn(4, 8, 16, 16), 3, stride=1, return_indices=True)
    pooled = pooled.detach().requires_grad_()
    return Probe(lambda: F.max_unpool2d(pooled, indices, 3, stride=1), (pooled,))


def _upsample_probe(x: Inputs, shape: tuple[int, ...], **options: Any) -> Probe:
    signal = x.randn(*shape, grad=True)
    return Probe(lambda: F.interpolate(signal, **options), (signal,))


@recipe("interpolate_linear")
def _interpolate_linear(x: Inputs) -> Probe:
    return _upsample_probe(x, (4, 8, 32), scale_factor=2.5, mode="linear")


@recipe("interpolate_bilinear")
def _interpolate_bilinear(x: Inputs) -> Probe:
    return _upsample_probe(x, (4, 8, 16, 16), scale_factor=2.5, mode="bilinear")


@recipe("interpolate_bicubic")
def _interpolate_bicubic(x: Inputs) -> Probe:
    return _upsample_probe(x, (4, 8, 16, 16), scale_factor=2.5, mode="bicubic")


@recipe("interpolate_bilinear_antialias")
def _interpolate_bilinear_antialias(x: Inputs) -> Probe:
    return _upsample_probe(x, (4, 8, 32, 32), size=(13, 13), mode="bilinear", antialias=True)


@recipe("reflection_pad1d")
def _reflection_pad1d(x: Inputs) -> Probe:
    signal = x.randn(4, 8, 32, grad=True)
    return Probe(lambda: F.pad(signal, (5, 5), mode="reflect"), (signal,))


@recipe("replication_pad2d")
def _replication_pad2d(x: Inputs) -> Probe:
    image = x.randn(4, 8, 16, 16, grad=True)
    return Probe(lambda: F.pad(image, (5, 5, 5, 5), mode="replicate"), (image,))


@recipe("nll_loss2d")
def _nll_loss2d(x: Inputs) -> Probe:
    logits, target = x.randn(4, 5, 32, 32, grad=True), x.index(5, 4, 32, 32)
    return Probe(lambda: F.nll_loss(F.log_softmax(logits, 1), target), (logits,))


@recipe("ctc_loss")
def _ctc_loss(x: Inputs) -> Probe:
    steps, batch, classes, longest = 50, 16, 20, 30
    logits = x.randn(steps, batch, classes, grad=True)
    targets = x.index(classes - 1, batch, longest) + 1  # 0 is the blank
    input_lengths = torch.full((batch,), steps, dtype=torch.long)
    target_lengths = torch.randint(10, longest, (batch,), generator=x.generator)
    return Probe(
        lambda: F.ctc_loss(logits.log_softmax(2), targets, input_lengths, target_lengths),
        (logits,),
    )


@recipe("histc")
def _histc(x: Inputs) -> Probe:
    values = x.randn(200000)
    return Probe(lambda: torch.histc(values, bins=64, min=-3, max=3))


@recipe("bincount_weights")
def _bincount_weights(x: Inputs) -> Probe:
    index, weights = x.index(_ROWS, 200000), x.randn(200000)
    return Probe(lambda: torch.bincount(index, weights=weights))


@recipe("median_dim")
def _median_dim(x: Inputs) -> Probe:
    values = x.ties(256, 257, grad=True)
    return Probe(lambda: torch.median(values, dim=1), (values,))


@recipe("nanmedian_dim")
def _nanmedian_dim(x: Inputs) -> Probe:
    values = x.ties(256, 257, grad=True)
    return Probe(lambda: torch.nanmedian(values, dim=1), (values,))


@recipe("grid_sample")
def _grid_sample(x: Inputs) -> Probe:
    image = x.randn(2, 4, 16, 16, grad=True)
    grid = (x.rand(2, 24, 24, 2) * 2 - 1).requires_grad_()
    return Probe(lambda: F.grid_sample(image, grid, align_corners=False), (image, grid))


@recipe("cumsum")
def _cumsum(x: Inputs) -> Probe:
    values = x.randn(200000, grad=True)
    return Probe(lambda: torch.cumsum(values, 0), (values,))


@recipe("index_reduce")
def _index_reduce(x: Inputs) -> Probe:
    source, index = x.randn(_MANY, _COLS, grad=True), x.index(_ROWS, _MANY)
    return Probe(lambda: x.zeros(_ROWS, _COLS).index_reduce_(0, index, source, "mean"), (source,))


@recipe("sdpa")
def _sdpa(x: Inputs) -> Probe:
    query, key, value = (x.randn(2, 4, 64, 32, grad=True) for _ in range(3))
    return Probe(lambda: F.scaled_dot_product_attention(query, key, value), (query, key, value))


@recipe("conv2d")
def _conv2d(x: Inputs) -> Probe:
    image, weight = x.randn(8, 16, 32, 32, grad=True), x.randn(32, 16, 3, 3, grad=True)
    return Probe(lambda: F.conv2d(image, weight, padding=1), (image, weight))


@recipe("bmm_sparse")
def _bmm_sparse(x: Inputs) -> Probe:
    dense = x.randn(4, 32, 32)
    sparse = (dense * (x.rand(4, 32, 32) < 0.2)).to_sparse()
    other = x.randn(4, 32, 16, grad=True)
    return Probe(lambda: torch.bmm(sparse, other), (other,))


@recipe("topk")
def _topk(x: Inputs) -> Probe:
    values = x.ties(256, 1024, grad=True)
    return Probe(lambda: torch.topk(values, 64), (values,))


@recipe("resize_quantized")
def _resize_quantized(x: Inputs) -> Probe:
    quantized = torch.quantize_per_tensor(x.randn(64), 0.1, 0, torch.quint8)
    # int_repr: the raw uint8 values, new (uninitialized) elements included
    return Probe(lambda: quantized.clone().resize_(65536).int_repr())
