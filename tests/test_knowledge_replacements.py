"""Each replacement the ops table suggests (``replacement``: what to compute
where deterministic algorithms raise) computes what the op computes.

Checked on the CPU, on random inputs with duplicate indices where the op has
them: values, and gradients for an entry about the backward.  Sums may add in
another order, so floating-point results are compared with allclose.  A new
replacement in the table needs its check here (the last test says so)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from detaudit.knowledge.ops import load_ops_table


def _gradient(function, x: torch.Tensor) -> torch.Tensor:
    x = x.detach().requires_grad_()
    output = function(x)
    (gradient,) = torch.autograd.grad(output, x, torch.linspace(-1, 1, output.numel()).view_as(output))
    return gradient


def _put_accumulate():
    index, source = torch.randint(0, 30, (200,)), torch.randn(200)
    expected = torch.zeros(6, 5).put_(index, source, accumulate=True)
    replaced = torch.zeros(6, 5)
    replaced.view(-1).index_put_((index.view(-1),), source.view(-1), accumulate=True)
    assert torch.allclose(expected, replaced)


def _take_backward():
    x, index = torch.randn(6, 5), torch.randint(0, 30, (200,))
    assert torch.equal(torch.take(x, index), x.reshape(-1)[index])
    assert torch.allclose(_gradient(lambda t: torch.take(t, index), x), _gradient(lambda t: t.reshape(-1)[index], x))


def _bincount_weights():
    values, weights, minlength = torch.randint(0, 10, (300,)), torch.randn(300), 12
    expected = torch.bincount(values, weights, minlength=minlength)
    replaced = torch.zeros(max(int(values.max()) + 1, minlength), dtype=weights.dtype).index_add_(0, values, weights)
    assert expected.dtype == replaced.dtype and torch.allclose(expected, replaced)


def _histc():
    x = torch.randn(1000)
    assert torch.equal(torch.histc(x, 10, -2, 2), torch.histc(x.cpu(), 10, -2, 2).to(x.device))


def _median_indices():
    for columns in (7, 8):  # odd and even: median is the lower middle value
        x = torch.randint(0, 5, (16, columns)).float()  # ties
        values, indices = x.median(dim=1)
        sorted_values, sorted_indices = x.sort(dim=1, stable=True)
        middle = (x.size(1) - 1) // 2
        assert torch.equal(values, sorted_values[:, middle])
        assert torch.equal(x.gather(1, sorted_indices[:, middle : middle + 1]).squeeze(1), values)


def _ctc_loss_backward():
    log_probs = torch.randn(12, 2, 6).log_softmax(2)
    targets = torch.randint(1, 6, (2, 4))
    lengths = (torch.full((2,), 12), torch.full((2,), 4))
    loss = lambda t: F.ctc_loss(t, targets, *lengths)  # noqa: E731
    on_cpu = lambda t: F.ctc_loss(t.cpu(), targets.cpu(), lengths[0].cpu(), lengths[1].cpu())  # noqa: E731
    assert torch.allclose(loss(log_probs), on_cpu(log_probs))
    assert torch.allclose(_gradient(loss, log_probs), _gradient(on_cpu, log_probs))


def _adaptive_avg_pool2d_backward():
    x = torch.randn(2, 3, 8, 8)
    for pooled, replaced in (
        (lambda t: F.adaptive_avg_pool2d(t, 1), lambda t: t.mean((-2, -1), keepdim=True)),
        (lambda t: F.adaptive_avg_pool2d(t, 4), lambda t: F.avg_pool2d(t, 2, stride=2)),
    ):
        assert torch.allclose(pooled(x), replaced(x))
        assert torch.allclose(_gradient(pooled, x), _gradient(replaced, x))


def _adaptive_avg_pool3d_backward():
    x = torch.randn(2, 3, 4, 4, 4)
    pooled, replaced = lambda t: F.adaptive_avg_pool3d(t, 1), lambda t: t.mean((-3, -2, -1), keepdim=True)
    assert torch.allclose(pooled(x), replaced(x))
    assert torch.allclose(_gradient(pooled, x), _gradient(replaced, x))


def _nll_loss_nd():
    logits, target, weight = torch.randn(2, 5, 4, 4), torch.randint(0, 5, (2, 4, 4)), torch.rand(5)
    for reduction in ("mean", "sum"):
        options = dict(weight=weight, ignore_index=2, reduction=reduction)
        spatial = F.cross_entropy(logits, target, **options)
        flat = F.cross_entropy(logits.movedim(1, -1).reshape(-1, 5), target.reshape(-1), **options)
        assert torch.allclose(spatial, flat)
        log_probs = logits.log_softmax(1)
        assert torch.allclose(
            F.nll_loss(log_probs, target, **options), F.nll_loss(log_probs.movedim(1, -1).reshape(-1, 5), target.reshape(-1), **options)
        )


def _max_unpool():
    x = torch.randn(2, 3, 8, 8)
    pooled, indices = F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True)  # overlapping windows
    rows = indices.flatten(0, 1).flatten(1)
    assert any(len(row.unique()) < row.numel() for row in rows)  # duplicate indices to race on
    expected = F.max_unpool2d(pooled, indices, 3, stride=2, padding=1, output_size=x.shape[-2:])
    n, c, h, w = expected.shape
    replaced = (
        torch.zeros(n, c, h * w, dtype=pooled.dtype, device=pooled.device)
        .scatter_(-1, indices.flatten(-2), pooled.flatten(-2))
        .view(n, c, h, w)
    )
    assert torch.equal(expected, replaced)


CHECKS = {
    "put-accumulate": _put_accumulate,
    "take-backward": _take_backward,
    "bincount-weights": _bincount_weights,
    "histc": _histc,
    "median-indices": _median_indices,
    "ctc_loss-backward": _ctc_loss_backward,
    "adaptive_avg_pool2d-backward": _adaptive_avg_pool2d_backward,
    "adaptive_avg_pool3d-backward": _adaptive_avg_pool3d_backward,
    "nll_loss-nd": _nll_loss_nd,
    "max_unpool": _max_unpool,
}


@pytest.mark.parametrize("entry_id", sorted(CHECKS))
def test_replacement_computes_what_the_op_computes(entry_id):
    torch.manual_seed(0)
    assert load_ops_table().entry(entry_id).replacement
    CHECKS[entry_id]()


def test_every_replacement_in_the_table_is_checked_here():
    assert {entry.id for entry in load_ops_table() if entry.replacement} == set(CHECKS)


def test_replacements_are_offered_only_where_deterministic_algorithms_raise():
    for entry in load_ops_table():
        if entry.replacement:
            assert "raises" in entry.deterministic_modes, entry.id
