"""What one launch of a user's script asks of its child process.

``LaunchOptions`` has three parts:

* what every run has: the seed detaudit seeds Python, numpy and torch with
  before the script (``None``: the script's own seeding), the step limit,
  where the child writes its results, extra environment variables;
* ``settings``: the child settings made before the script runs, as code
  pasted at its top would make them (``child_settings.CHILD_SETTINGS``:
  threads, PYTHONHASHSEED, the CPU capability, deterministic algorithms,
  backend settings, seeded generators), by name;
* ``features``: what the bootstrap does around the script, one
  ``features.ChildFeature`` of each kind (tracing, the final state, a fault
  to inject...), each owning its own options.

The parent writes the options to the child as JSON (``config``) and starts
it with the environment ``environment`` gives; ``bootstrap.py`` reads them
back.  Imports neither torch nor numpy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, TypeVar

from detaudit.launch.child_settings import child_setting
from detaudit.launch.features import ChildFeature

Feature = TypeVar("Feature", bound=ChildFeature)


@dataclass(frozen=True)
class LaunchOptions:
    seed: int | None = 0  # seed random/numpy/torch(+CUDA) before the script; None = the script's own seeding
    max_steps: int = 0  # stop cleanly after N optimizer steps; 0 = run to completion
    output_dir: Path | None = None  # where the child writes results; a temp dir if None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)  # child setting name -> value (child_settings.py)
    features: tuple[ChildFeature, ...] = ()  # at most one of each kind (features.py)
    per_rank: bool = False  # one bootstrap per rank (torchrun.py): results, output and pid in rank<LOCAL_RANK>/

    def __post_init__(self) -> None:
        for name in self.settings:
            child_setting(name)  # an unknown name is a bug of the caller: say so here, not in the child
        kinds = [feature.key for feature in self.features]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"more than one feature of a kind: {kinds}")

    def feature(self, kind: type[Feature]) -> Feature | None:
        """The feature of that kind these options have, if any."""
        return next((feature for feature in self.features if isinstance(feature, kind)), None)

    def with_features(self, *features: ChildFeature) -> "LaunchOptions":
        """These options with ``features`` added, each replacing the one of its kind."""
        keys = {feature.key for feature in features}
        kept = tuple(feature for feature in self.features if feature.key not in keys)
        return dataclasses.replace(self, features=kept + features)

    def changing(self, kind: type[ChildFeature], **fields) -> "LaunchOptions":
        """These options with fields of their ``kind`` feature changed."""
        feature = self.feature(kind)
        if feature is None:
            raise LookupError(f"these options have no {kind.__name__}")
        return self.with_features(dataclasses.replace(feature, **fields))

    def with_settings(self, settings: Mapping[str, Any]) -> "LaunchOptions":
        """These options with ``settings`` made too, overriding the same names."""
        return dataclasses.replace(self, settings={**self.settings, **settings})

    def config(self, script: str, args: list[str], output_dir: Path) -> dict:
        """The JSON document the bootstrap reads."""
        return {
            "script": script,
            "args": args,
            "output_dir": str(output_dir),
            "seed": self.seed,
            "max_steps": self.max_steps,
            "per_rank": self.per_rank,
            "settings": dict(self.settings),
            "features": {feature.key: dataclasses.asdict(feature) for feature in self.features},
        }

    def environment(self, inherited: Mapping[str, str]) -> dict[str, str]:
        """The child's environment: ``inherited``, ``extra_env``, and the
        settings that are environment variables (which must be set before the
        interpreter or torch start)."""
        environment = {**inherited, **self.extra_env}
        for name, value in self.settings.items():
            variable = child_setting(name).environment
            if not variable:
                continue
            if value is None:  # unset: the machine's own default
                environment.pop(variable, None)
            else:
                environment[variable] = str(value)
        return environment
