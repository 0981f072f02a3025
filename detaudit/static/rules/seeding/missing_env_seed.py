"""A reinforcement-learning environment built by a training script and seeded nowhere (DET008 missing-env-seed)."""

from __future__ import annotations

from detaudit.findings import Severity
from detaudit.knowledge.apis import SEEDING_FUNCTIONS
from detaudit.static.rule import Invalid, Rule
from detaudit.static.rules.seeding._common import call_code

#: Calls that build a reinforcement-learning environment (Gym and Gymnasium, single and
#: vector): its own generator is seeded from the operating system unless the script
#: seeds it (``env.reset(seed=...)``, ``env.seed(...)``, ``env.action_space.seed(...)``).
ENVIRONMENT_CONSTRUCTORS = frozenset(
    f"{package}.{name}"
    for package in ("gym", "gymnasium")
    for name in ("make", "make_vec", "vector.make", "vector.SyncVectorEnv", "vector.AsyncVectorEnv")
)
#: The keyword through which an environment's ``reset`` takes its seed.
ENVIRONMENT_RESET_SEED = "seed"


class MissingEnvSeed(Rule):
    code = "DET008"
    name = "missing-env-seed"
    severity = Severity.WARNING
    summary = "The script builds a Gym environment but never seeds it."
    rationale = """
        A Gym or Gymnasium environment draws its start states (and sampled
        actions) from a generator of its own, which the global seeds never
        reach: `torch.manual_seed`, `np.random.seed` and `random.seed` leave
        it seeded from the operating system.  Episodes, returns and the
        trained policy then differ in every run of a seeded script.  Any
        `.seed(...)` call or `reset(seed=...)` in the file counts as seeding
        it (a helper that seeds what it builds, as `make_env(seed)` helpers
        do, is read in the file that defines it).
        """
    fix_hint = "Pass the seed on the first reset (`env.reset(seed=SEED)`; `env.seed(SEED)` with gym < 0.26), and seed `env.action_space` if you sample from it."
    VALID = (
        "import gym\nenv = gym.make('CartPole-v1')\nstate, _ = env.reset(seed=0)\n",
        "import gym\nenv = gym.make('CartPole-v1')\nenv.seed(0)\nstate = env.reset()\n",
        "import gymnasium as gym\n\ndef make_env(seed):\n    env = gym.make('CartPole-v1')\n    env.action_space.seed(seed)\n"
        "    return env\n\nif __name__ == '__main__':\n    envs = gym.vector.SyncVectorEnv([lambda: make_env(1)])\n"
        "    envs.reset(seed=1)\n",
        # a library module that only defines how to build one: its caller seeds
        "import gym\n\ndef build():\n    return gym.make('CartPole-v1')\n",
    )
    INVALID = (
        Invalid(
            "import gym, random\nimport torch\ntorch.manual_seed(0)\nrandom.seed(0)\nenv = gym.make('CartPole-v1')\ns = env.reset()\n",
            line=5,
            message="gym.make('CartPole-v1')",
        ),
        Invalid(
            "import gymnasium\n\ndef main():\n    env = gymnasium.make('Pendulum-v1')\n    for episode in range(3):\n"
            "        state, _ = env.reset()\n\nif __name__ == '__main__':\n    main()\n",
            line=4,
        ),
    )

    def finish(self) -> None:
        script = self.analyses.script
        if not script.does_work:
            return
        built = [call for call in self.facts.calls if call.qualname in ENVIRONMENT_CONSTRUCTORS and script.reaches(call)]
        if not built or any(self._seeds_something(call) for call in self.facts.calls):
            return
        self.report(
            built[0].node,
            f"`{call_code(self, built[0], 40)}` builds an environment that nothing in this file seeds: it draws its "
            "start states from a generator seeded by the operating system, which the global seeds never reach, so "
            "episodes differ in every run. Pass the seed on the first `reset(seed=...)`.",
        )

    @staticmethod
    def _seeds_something(call) -> bool:
        """``env.seed(...)`` with a value (not a global RNG's seed), or ``env.reset(seed=...)``."""
        if call.method == "seed" and call.node.args and call.qualname not in SEEDING_FUNCTIONS:
            return True
        return call.method == "reset" and call.argument(ENVIRONMENT_RESET_SEED) is not None
