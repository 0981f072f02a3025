"""How the resumed run is made to resume, for the frameworks people resume with (torch-free).

A preset saves the user from working out the resume arguments.  Each one
resumes from the newest checkpoint the interrupted run wrote (``{checkpoint}``
in ``--resume-args`` is that path too): the last file ``torch.save`` wrote
to a path, or the last checkpoint a framework's own save wrote
(``child.py`` notes both).  ``plain`` passes it to the script's own
``--resume`` flag; a framework preset passes it where the framework reads it,
in the resumed run's child, without a change to the script
(``frameworks.py``: which call each one hooks).
"""

from __future__ import annotations

from dataclasses import dataclass

CHECKPOINT = "{checkpoint}"  # in the resume arguments: the newest checkpoint the interrupted run wrote


@dataclass(frozen=True)
class Preset:
    name: str
    resume_args: str  # added to the resumed run's arguments
    how: str  # what the resumed run does, for --help and the docs
    framework: str = ""  # the frameworks.py entry that makes the resumed run resume ("": the arguments do)


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset("plain", f"--resume {CHECKPOINT}", "the script's own `--resume PATH` flag, given the newest checkpoint file"),
        Preset(
            "lightning", "", "`Trainer.fit(..., ckpt_path=PATH)`, PATH the newest file `Trainer.save_checkpoint` wrote",
            framework="lightning",
        ),
        Preset(
            "transformers", "",
            "`Trainer.train(resume_from_checkpoint=PATH)`, PATH the newest `checkpoint-N` folder the Trainer saved",
            framework="transformers",
        ),
        Preset(
            "accelerate", "",
            "`Accelerator.load_state(PATH)` as each `accelerator.prepare(...)` returns, "
            "PATH the newest folder `Accelerator.save_state` wrote",
            framework="accelerate",
        ),
    )
}
