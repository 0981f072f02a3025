"""Call sites of ops the knowledge base lists as nondeterministic (DET020).

Which ops, with which arguments, on which devices, and what deterministic mode
does to them is data: ``detaudit.knowledge.ops`` (the shipped table, or one
written by ``detaudit calibrate`` and named by ``$DETAUDIT_OPS_TABLE``).  This
rule only decides what a file's call sites show, and words the finding for the
file: in default mode an op is nondeterministic as written; in a file that
enables deterministic algorithms only the ops that would raise (or that the
mode does not cover) are left to report.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cached_property

import libcst as cst

from detaudit.findings import Severity
from detaudit.static.analyses.op_sites import OpSite, operand
from detaudit.static.engine.facts import CallFact
from detaudit.static.rule import Invalid, Rule

#: Factories that put a tensor on the CPU unless given ``device=`` (or unless
#: ``torch.set_default_device`` changed the default): a CUDA-only hazard cannot hit it.
CPU_DEFAULT_TENSOR_FACTORIES = frozenset(
    f"torch.{name}" for name in ("tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "arange", "linspace", "rand", "randn", "randint")
)
DEFAULT_DEVICE_SETTER = "torch.set_default_device"
#: What a file that puts tensors on an accelerator writes somewhere: ``.cuda()``,
#: ``.to(device)``, ``device=``, cuDNN settings, a framework that places them (``accelerate``,
#: Lightning's ``Trainer``, XLA, MPS, XPU).
ACCELERATOR_WORDS = ("cuda", "cudnn", "device", ".to(", "accelerat", "Trainer", "xla", "mps", "xpu", "hpu")

_DEVICE_NAMES = {"cpu": "CPU", "cuda": "CUDA"}


class NondeterministicOp(Rule):
    code = "DET020"
    name = "nondeterministic-op"
    severity = Severity.WARNING
    summary = "A call reaches an op with a nondeterministic kernel."
    rationale = """
        Some kernels accumulate with atomics or race on duplicate indices, so the
        same inputs give different bits from run to run: `index_add_` and
        `scatter_add_` forward on CUDA, the backward of `gather`, `index_select`,
        adaptive pooling, `interpolate(mode="bilinear")` and `grid_sample`, and
        cuDNN convolution algorithms, and `scaled_dot_product_attention`,
        whose default CUDA backends (flash, memory-efficient) accumulate its
        backward with atomics.  The list, with the devices, the phase
        (forward or backward) and what `torch.use_deterministic_algorithms(True)`
        does, is detaudit's knowledge base (`detaudit ops`).  In a file that
        enables deterministic algorithms, ops with a deterministic kernel are
        fine; ops without one are reported because they will raise.

        Not reported: adaptive average pooling to output size 1 (it runs as
        a mean); call sites whose hazard the code does not show (the
        N-d-target NLL kernel behind `nll_loss`/`cross_entropy`, since 1-D class
        targets use a deterministic kernel, unless the call site gives the
        targets away: `ignore_index=255`, the segmentation convention, or an
        input transposed or permuted there; a tensor's dtype; duplicate
        indices), look-alike arguments (`interpolate(mode="nearest")`,
        `bincount` without weights), `.put()`-style names on objects that may
        not be tensors, code under
        `if torch.are_deterministic_algorithms_enabled():`, and CUDA-only
        hazards in a self-contained script that never names a device (no
        `.cuda()`, `.to(...)`, `device`; no project imports, imported by no
        other project file): its tensors all live on the CPU.

        Third-party layers are not hand-listed: `detaudit calibrate --modules
        torch_geometric.nn` traces each public layer of an installed package
        on the CPU and records the listed ops its forward and backward reach
        (PyG's message passing scatter-adds); building such a layer, or
        calling such a function, is reported with the package version the
        table was derived from.  Tables ship for torch_geometric; more are
        read from `$DETAUDIT_LAYER_TABLES`.

        One cause, one finding: cuDNN convolutions (`Conv*d`, `conv*d`) are
        nondeterministic through a process-wide choice (autotuning, the
        algorithms cuDNN may pick), fixed by one setting, not per call site;
        `cudnn-benchmark` and `determinism-not-requested` name it once, where
        it can be fixed.  Ops whose results are exact in any order (`histc`
        adds ones to float counts, exact below 2**24 per bin) are reported
        only where the file enables deterministic algorithms, which raise on
        them.

        Backward-only hazards (gather, interpolate, reflect pad, adaptive
        pooling, SDPA: nondeterministic only in their CUDA backward) are
        reported only where a parameter's gradient can pass: not under
        `torch.no_grad()`/`inference_mode()` (blocks and decorated functions),
        not in the data pipeline (dataset and loader classes, collate
        functions, transforms), not in functions only called from those (a
        nested function also through a local name or a dispatch table it was
        put in: `fn = [plain, mirrored][level]`), not in evaluation loops (a
        model in eval mode, no backward), not on input data resized on its way
        into a model or on batches a data loader yields, and not on tensors
        that carry no gradient (registered buffers, tensors built from
        constants, detached or integer tensors, what a `no_grad` block
        computed, and what a helper receives only from those).  A
        module-level function's callers are looked for in the project's other
        files too: called only from such places, or private and called
        nowhere, it is not reported.  A module's `forward` and a loss on predictions are where
        they are reported.
        """
    fix_hint = (
        "Call `torch.use_deterministic_algorithms(True)` (ops with a deterministic kernel switch to it), "
        "or replace the op (e.g. `index_add_` by a sort-based reduction); `detaudit ops` lists each op's options."
    )
    VALID = (
        "import torch\nimport torch.nn.functional as F\ny = F.interpolate(x, scale_factor=2, mode='nearest')\n",
        "import torch\ncounts = torch.bincount(labels)\n",
        # 1-D class targets use a deterministic kernel; the target shape is not visible
        "import torch.nn.functional as F\nloss = F.nll_loss(log_probs, target)\nloss = F.cross_entropy(logits, target)\n",
        # the file enables deterministic algorithms, and index_add_ has a deterministic kernel
        "import torch\ntorch.use_deterministic_algorithms(True)\nout.index_add_(0, index, src)\n",
        "import torch\nimport torch.nn.functional as F\nif torch.are_deterministic_algorithms_enabled():\n"
        "    y = F.interpolate(x, scale_factor=2, mode='bilinear')\n",
        # backward-only hazard in code that builds no graph
        "import torch\nimport torch.nn.functional as F\nwith torch.no_grad():\n    y = F.grid_sample(x, grid)\n",
        "import torch\nimport torch.nn.functional as F\nwith torch.no_grad():\n    y = F.scaled_dot_product_attention(q, k, v)\n",
        "import torch\nimport torch.nn.functional as F\n\n@torch.no_grad()\ndef postprocess(masks, size):\n"
        "    return F.interpolate(masks, size=size, mode='bilinear')\n",
        # backward-only hazards in the data pipeline: a dataset, a loader class, a collate function
        "import torch\nimport torch.nn.functional as F\nfrom torch.utils.data import Dataset\n\nclass Padded(Dataset):\n"
        "    def __getitem__(self, i):\n        return F.pad(self.images[i], (4, 4, 4, 4), mode='reflect')\n",
        "import torch\nimport torch.nn.functional as F\n\nclass GpuLoader:\n    def __iter__(self):\n"
        "        padded = F.pad(self.images, (2,) * 4, 'reflect')\n        yield padded\n",
        "import torch\nimport torch.nn.functional as F\nfrom torch.utils.data import DataLoader\n\ndef upsample_batch(items):\n"
        "    return F.interpolate(torch.stack(items), scale_factor=2, mode='bilinear')\n\nloader = DataLoader(ds, collate_fn=upsample_batch)\n",
        # gather from registered buffers (a noise schedule): the buffers carry no gradient
        "import torch\n\ndef extract(a, t, shape):\n    return a.gather(-1, t).reshape(-1, 1, 1, 1)\n\nclass Diffusion(torch.nn.Module):\n"
        "    def __init__(self, betas):\n        super().__init__()\n        self.register_buffer('betas', betas)\n\n"
        "    def forward(self, x, t):\n        return extract(self.betas, t, x.shape) * x\n",
        # integer indices built from constants (repeat_interleave's backward never runs), a detached tensor
        "import torch\nbatch = torch.arange(4).repeat_interleave(3)\n",
        "import torch\nimport torch.nn.functional as F\ny = F.interpolate(x.detach(), scale_factor=2, mode='bilinear')\n",
        # test-time augmentation in a nested function picked from a dispatch table and called under no_grad
        "import torch\nimport torch.nn.functional as F\n\ndef infer(model, images, level):\n"
        "    def plain(x):\n        return model(x)\n    def translated(x):\n"
        "        return model(F.pad(x, (2,) * 4, 'reflect'))\n    infer_fn = [plain, translated][level]\n"
        "    with torch.no_grad():\n        return infer_fn(images)\n",
        # test-time multi-scale resizing of the input before the model
        "import torch\nimport torch.nn.functional as F\n\ndef multi_scale(samples, model):\n"
        "    inp = F.interpolate(samples, scale_factor=0.5, mode='bilinear')\n    return model(inp)\n",
        # multi-scale training resizes the batches a loader yields, inputs and targets alike: data, no gradient
        "import torch.nn.functional as F\nfor images, target in train_loader:\n"
        "    target = F.interpolate(target.cuda(), size=(256, 256), mode='bilinear')\n    loss = crit(model(images), target)\n",
        # a label map cast to float, resized and cast back: still the loader's data
        "import torch.nn.functional as F\nfor i, (input, target) in enumerate(train_loader):\n"
        "    target = F.interpolate(target.unsqueeze(1).float(), size=(64, 64), mode='bilinear').squeeze(1).long()\n",
        # predictions computed under no_grad, resized after the block
        "import torch\nimport torch.nn.functional as F\n\ndef predict(model, image):\n    with torch.no_grad():\n"
        "        output = model(image)\n    output = F.interpolate(output, (512, 512), mode='bilinear')\n"
        "    return F.softmax(output, dim=1)\n",
        # a validation loop: the model in eval mode, no backward pass
        "import torch.nn.functional as F\n\ndef validate(val_loader, model, criterion):\n    model.eval()\n"
        "    for input, target in val_loader:\n        output = F.interpolate(model(input), size=(64, 64), mode='bilinear')\n"
        "        loss = criterion(output, target)\n",
        # a conditioning image taken from the batch
        "import torch.nn.functional as F\nfor step, batch in enumerate(dataloader):\n"
        "    cond = batch['cond'].to(device)\n    loss = model(batch['x'], F.interpolate(cond, scale_factor=2, mode='bicubic')).mean()\n",
        # a histogram's counts are sums of ones, exact in any order below 2**24 per bin
        "import torch\nintersection = torch.histc(pred[pred == target].float(), bins=150, min=0, max=149)\n",
        # per-pixel losses kept unreduced take no atomics
        "import torch\nloss_map = torch.nn.CrossEntropyLoss(ignore_index=255, reduction='none')\n",
        # adaptive average pooling to 1x1 runs as a mean, whose backward only broadcasts
        "import torch\npool = torch.nn.AdaptiveAvgPool2d((1, 1))\nhead = torch.nn.AdaptiveAvgPool3d(1)\n",
        # cuDNN algorithm choice is one cause per script: determinism-not-requested / cudnn-benchmark name it
        "import torch\nconv = torch.nn.Conv2d(3, 8, 3)\n",
        # a third-party layer whose traced run reaches no listed op
        "from torch_geometric.nn import Linear\nlin = Linear(16, 32)\n",
        # numpy's put is not torch's
        "import numpy as np\nimport torch\nnp.put(a, [0, 0], [1, 2])\n",
        # a tensor built on the CPU right there: the CUDA-only kernel never runs
        "import torch\nmedians = torch.median(torch.tensor(estimates), dim=0).values\n",
        # a collective and a module's own method, not Tensor.gather
        "import torch\nwork = group.gather(output_tensors, input_tensors, opts)\n",
        "import torch\n\nclass Parallel(torch.nn.Module):\n    def forward(self, outputs):\n        return self.gather(outputs, 0)\n",
        # the caller detaches what the helper returns (NeRF's hierarchical sampling): no gradient flows back into it
        "import torch\n\ndef sample_pdf(cdf, index):\n    return torch.gather(cdf, 1, index)\n\n"
        "class Renderer(torch.nn.Module):\n    def forward(self, weights, index):\n"
        "        samples = sample_pdf(weights.cumsum(1), index)\n        samples = samples.detach()\n        return samples\n",
        # an attention mask built from token ids carries no gradient, repeated per head or not
        "import torch\n\nclass Text(torch.nn.Module):\n    def mask(self, valid, heads):\n"
        "        additive = torch.zeros_like(valid, dtype=torch.float32)\n        additive.masked_fill_(~valid, float('-inf'))\n"
        "        additive = additive.repeat_interleave(heads, 0)\n        return additive\n",
    )
    INVALID = (
        Invalid("import torch\nout.index_add_(0, index, src)\n", line=2, message="atomicAdd on CUDA (forward)"),
        Invalid(
            "import torch.nn.functional as F\ny = F.interpolate(x, scale_factor=2, mode='bilinear')\n",
            line=2,
            message="(backward)",
        ),
        Invalid("import torch\nhist = torch.bincount(labels, weights=w)\n", line=2),
        # exact counts, but deterministic mode raises on them
        Invalid(
            "import torch\ntorch.use_deterministic_algorithms(True)\ncounts = torch.histc(x.cuda().float(), bins=10)\n",
            line=3,
            message="will raise under deterministic mode",
        ),
        Invalid("import torch\nmedians = torch.median(torch.tensor(xs, device='cuda'), dim=0)\n", line=2),
        Invalid("import torch\npool = torch.nn.AdaptiveAvgPool2d((7, 7))\n", line=2, message="CUDA"),
        Invalid("import torch\nbag = torch.nn.EmbeddingBag(100, 8, mode='max')\n", line=2),
        Invalid(
            "import torch\ntorch.use_deterministic_algorithms(True)\nbag = torch.nn.EmbeddingBag(100, 8, mode='max')\n",
            line=3,
            message="will raise under deterministic mode",
        ),
        Invalid(
            "import torch\ntorch.use_deterministic_algorithms(True, warn_only=True)\nh = torch.histc(x, bins=10)\n",
            line=3,
            message="only a warning",
        ),
        # each call site is its own finding, counted among its op's sites in the file
        Invalid("import torch\nx.put_(index, values)\nx.put_(index2, values)\n", line=2, message="call site 1 of 2"),
        # gradients flow: a module's forward, a loss on predictions
        Invalid(
            "import torch\nimport torch.nn.functional as F\n\nclass Up(torch.nn.Module):\n    def forward(self, x):\n"
            "        return F.interpolate(x, scale_factor=2, mode='bilinear')\n",
            line=6,
            message="(backward)",
        ),
        # the call site gives the N-d targets away: the segmentation convention, a transposed input
        Invalid("import torch\ncriterion = torch.nn.CrossEntropyLoss(ignore_index=255)\n", line=2, message="atomicAdd in the reduction"),
        Invalid(
            "import torch.nn.functional as F\n\ndef loss_labels(logits, target_classes):\n"
            "    return F.cross_entropy(logits.transpose(1, 2), target_classes)\n",
            line=4,
        ),
        # a batch whose gradient the loop asks for (adversarial training) runs the backward
        Invalid(
            "import torch.nn.functional as F\nfor images, target in loader:\n    images.requires_grad_()\n"
            "    loss = crit(model(F.interpolate(images, scale_factor=2, mode='bilinear')), target)\n",
            line=4,
        ),
        # the model's output, resized inside the loop over the loader, carries the parameters' gradient
        Invalid(
            "import torch.nn.functional as F\nfor images, target in loader:\n    out = model(images)\n"
            "    loss = crit(F.interpolate(out, size=target.shape[-2:], mode='bilinear'), target)\n",
            line=4,
        ),
        Invalid("import torch\nfor obs, actions in batches:\n    q = model(obs).gather(1, actions)\n    q.sum().backward()\n", line=3),
        # a frozen teacher in eval mode does not make the student's step an evaluation
        Invalid(
            "import torch.nn.functional as F\n\ndef distill(student, teacher, images):\n    teacher.eval()\n"
            "    out = F.interpolate(student(images), scale_factor=2, mode='bilinear')\n"
            "    F.mse_loss(out, teacher(images)).backward()\n",
            line=5,
        ),
        Invalid("import torch\n\nclass Expand(torch.nn.Module):\n    def forward(self, x):\n        return x.repeat_interleave(2, dim=0)\n", line=5),
        # the nested function is also called where gradients flow
        Invalid(
            "import torch\nimport torch.nn.functional as F\n\ndef step(model, images, level):\n"
            "    def translated(x):\n        return model(F.pad(x, (2,) * 4, 'reflect'))\n"
            "    with torch.no_grad():\n        reference = translated(images)\n"
            "    return translated(images) - reference\n",
            line=6,
        ),
        # a third-party layer whose traced run reaches scatter-add (the shipped derived layer table)
        Invalid("from torch_geometric.nn import GCNConv\nconv = GCNConv(16, 32)\n", line=2, message="derived from torch_geometric"),
        # SDPA's backend is picked at run time, and on CUDA the default picks a kernel with an atomic backward
        Invalid(
            "import torch\nimport torch.nn.functional as F\n\nclass Attention(torch.nn.Module):\n    def forward(self, q, k, v):\n"
            "        return F.scaled_dot_product_attention(q, k, v, is_causal=True)\n",
            line=6,
            message="scaled_dot_product_attention is nondeterministic",
        ),
    )

    def finish(self) -> None:
        state = self.analyses.determinism
        pending: dict[tuple[str, str | None], list[OpSite]] = defaultdict(list)
        for site in self.analyses.op_sites:
            call, match = site.call, site.match
            if site.decided_by_settings:
                continue  # one cause per process, named once by the settings rules
            if site.backward_only and self.analyses.grad_flow.blocked(call, operand(site)) is not None:
                continue
            if match.cuda_only and (self._operand_on_cpu(call, site) or self._stays_on_cpu):
                continue
            if not state.enabled:
                if match.entry.exact_results is None:  # exact whatever the order: only deterministic mode's error matters
                    pending[site.cause].append(site)
            elif match.raises_under_deterministic_mode:
                self.report(call.node, self._raise_message(site, state.warn_only))
            elif "nothing" in match.deterministic_modes:
                self.report(call.node, f"{match.spelling.display}{site.via}: {match.hint()}.")
        # Every call site is its own finding (ruff's way): each one is located, shown by code
        # scanning and suppressible on its own line.  In default mode one switch fixes them
        # all, so each message counts its op's sites in the file.
        for sites in pending.values():
            calls = list({id(site.call): site for site in sites}.values())
            for number, site in enumerate(calls, 1):
                count = f" (call site {number} of {len(calls)} in this file)" if len(calls) > 1 else ""
                self.report(site.call.node, f"{site.match.spelling.display}{site.via} is nondeterministic: {site.match.hint()}{count}.")

    @staticmethod
    def _raise_message(site: OpSite, warn_only: bool) -> str:
        match = site.match
        raising = [b for b in match.behaviours if b.deterministic_mode == "raises"]
        devices = " and ".join(_DEVICE_NAMES[d] for d in match.raising_devices)
        versions = {b.torch for b in raising}
        when = f" with torch {next(iter(versions))}" if len(versions) == 1 and None not in versions else ""
        phases = "/".join(sorted({p for b in raising for p in b.phases}))
        if warn_only:
            return (
                f"{match.spelling.display}{site.via} has no deterministic kernel on {devices}{when} ({phases}): "
                "with warn_only it runs nondeterministically with only a warning."
            )
        return (
            f"{match.spelling.display}{site.via} will raise under deterministic mode on {devices}{when} ({phases}): "
            "it has no deterministic implementation."
        )

    @cached_property
    def _stays_on_cpu(self) -> bool:
        """A self-contained script that never names a device (RL and toy scripts):
        every tensor it makes is a CPU tensor, so a CUDA-only kernel never runs.
        Not a file that imports project modules (they may place what they build),
        nor one another project file names (its importer may move what it makes),
        nor code that is no file of a project on disk (a snippet: its importers are unknown)."""
        code = self.context.source.text
        if not self.analyses.script.does_work or any(word in code for word in ACCELERATOR_WORDS):
            return False
        if not self.context.path.is_file():
            return False
        summary = self.analyses.rng_effects
        index = summary.index
        if index is None:
            return False
        if any(index.module_of(qualname, self.context.path) is not None for qualname in set(self.facts.names.bindings().values())):
            return False
        return index.locator.files_mentioning(self.context.path.stem, self.context.path) == []

    def _operand_on_cpu(self, call: CallFact, site: OpSite) -> bool:
        """The tensor operand is built right there on the CPU (``torch.tensor(xs)``
        without ``device=``), so a CUDA-only kernel never runs."""
        tensor = operand(site)
        if not isinstance(tensor, cst.Call) or self.facts.names.resolve(tensor.func) not in CPU_DEFAULT_TENSOR_FACTORIES:
            return False
        if any(arg.keyword is not None and arg.keyword.value == "device" for arg in tensor.args):
            return False
        return not any(self.facts.calls_to(DEFAULT_DEVICE_SETTER))
