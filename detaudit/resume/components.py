"""What ``detaudit resume`` compares, and what a difference in each means.

One ``Component`` per kind of state a checkpoint must carry, in the order a
report lists the differences of one step: the causes a checkpoint forgets
(the global generators, the schedule, then the batch, which an augmentation
may draw from a generator, and the script's own generators, which a new
DataLoader iterator draws from: a loop that starts its epoch over on resume
draws there, so they follow the batch) before what they change (the
parameters, the optimizer state, the gradients).  Every part reads this
table: the child digests each component under its name, the comparison and
the report take their order, meaning and fix from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from detaudit.findings import Severity


@dataclass(frozen=True)
class Component:
    code: str  # the findings' code (SARIF rule id)
    name: str  # as the JSON report spells it
    meaning: str  # what a difference at the resume says
    fix: str  # what to put in the checkpoint
    severity = Severity.ERROR  # a difference fails the resume audit

    # the SARIF writer's rule metadata (report.sarif.RuleMetadata)
    @property
    def summary(self) -> str:
        return self.meaning

    @property
    def fix_hint(self) -> str:
        return self.fix


COMPONENTS: dict[str, Component] = {
    component.name: component
    for component in (
        Component(
            "RES001",
            "torch-rng",
            "the torch RNG state differs after the resume: it is not in the checkpoint, or something drew from it "
            "before training went on (a new DataLoader iterator draws its base seed from it); dropout masks and "
            "random augmentations differ",
            "save torch.get_rng_state() in the checkpoint and restore it with torch.set_rng_state() on resume",
        ),
        Component(
            "RES002",
            "cuda-rng",
            "the CUDA RNG states are not in the checkpoint",
            "save torch.cuda.get_rng_state_all() and restore it with torch.cuda.set_rng_state_all() on resume",
        ),
        Component(
            "RES003",
            "numpy-rng",
            "NumPy's global RNG state is not in the checkpoint",
            "save np.random.get_state() and restore it with np.random.set_state() on resume",
        ),
        Component(
            "RES004",
            "python-rng",
            "Python's global RNG state is not in the checkpoint",
            "save random.getstate() and restore it with random.setstate() on resume",
        ),
        Component(
            "RES005",
            "scheduler",
            "the LR schedule restarted: the scheduler's state is not in the checkpoint",
            "save scheduler.state_dict() and load it with scheduler.load_state_dict() on resume",
        ),
        Component(
            "RES006",
            "lr",
            "the learning rate differs after the resume",
            "save and load the optimizer's and the scheduler's state_dict()",
        ),
        Component(
            "RES007",
            "grad-scaler",
            "the GradScaler's scale is not in the checkpoint",
            "save scaler.state_dict() and load it with scaler.load_state_dict() on resume",
        ),
        Component(
            "RES008",
            "batch",
            "the resumed run trains on other batches: the sampler or epoch position is not restored, "
            "or an augmentation drew from a generator that differs (see the RNG and generator components)",
            "save the step and epoch in the checkpoint, and on resume skip the batches already seen "
            "(and call sampler.set_epoch(epoch) for the resumed epoch)",
        ),
        Component(
            "RES013",
            "generator",
            "a generator the script made (a DataLoader's or a sampler's torch.Generator, a NumPy Generator or "
            "RandomState, a random.Random, held by the script or its dataset) is not restored: what it draws "
            "after the resume (worker seeds, shuffles, augmentations) differs",
            "save the generator's state (generator.get_state(), rng.bit_generator.state, rng.getstate()) in the "
            "checkpoint and restore it on resume",
        ),
        Component(
            "RES009",
            "parameters",
            "the model's parameters differ: the checkpoint did not restore them as they were",
            "save model.state_dict() after the optimizer step and load it with model.load_state_dict() on resume",
        ),
        Component(
            "RES010",
            "buffers",
            "the model's buffers (BatchNorm running statistics, ...) differ after the resume",
            "save model.state_dict() (it holds the buffers) and load it on resume",
        ),
        Component(
            "RES011",
            "optimizer-state",
            "the optimizer's state (momentum, Adam's moments, its hyperparameters) is not restored",
            "save optimizer.state_dict() and load it with optimizer.load_state_dict() on resume",
        ),
        Component(
            "RES012",
            "gradients",
            "the first gradients after the resume differ: something the step reads differs",
            "see the other components that differ at this step; gradients follow from them",
        ),
    )
}
