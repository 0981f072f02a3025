"""Project-level seeding facts: helpers in other modules of the checked project,
found by parsing (never importing) them, with every consulted file recorded."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import sys
from pathlib import Path

from detaudit.static.analyses.project import project_index
from detaudit.static.engine.check import check_file

from project_files import write_project

FIXTURE_PROJECT = Path(__file__).resolve().parent.parent / "fixtures" / "static" / "project"
SEED_CODES = {"DET001", "DET002", "DET003", "DET004", "DET005"}


def _check(root: Path, name: str):
    result = check_file(root / name, name, root)
    return [(f.name, f.line) for f in result.findings if f.code in SEED_CODES], result.dependencies


def _blake2b(path: Path) -> str:
    return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()


def test_dependencies_name_every_consulted_project_file_with_its_hash():
    root = FIXTURE_PROJECT
    findings, dependencies = _check(root, "train_setup_helper.py")
    assert findings == []
    assert dependencies == {str(root / "utils.py"): _blake2b(root / "utils.py"), str(root / "models.py"): _blake2b(root / "models.py")}


def test_reexported_helper_records_both_modules():
    root = FIXTURE_PROJECT
    _, dependencies = _check(root, "pkg/train_reexport.py")
    # ``from . import seeding`` also runs pkg/__init__.py, read for what it seeds on import
    assert set(dependencies) == {
        str(root / "pkg" / "__init__.py"), str(root / "pkg" / "seeding" / "__init__.py"), str(root / "pkg" / "seeding" / "core.py")
    }


def test_editing_the_helper_changes_the_result_of_the_script(tmp_path):
    shutil.copytree(FIXTURE_PROJECT, tmp_path / "project")
    root = tmp_path / "project"
    findings, before = _check(root, "train_dino_style.py")
    assert findings == []
    utils = root / "utils.py"
    utils.write_text("import numpy as np\n\ndef fix_random_seeds(seed=31):\n    np.random.seed(seed)  # torch and random forgotten\n")
    findings, after = _check(root, "train_dino_style.py")
    assert before[str(utils)] != after[str(utils)] == _blake2b(utils)
    # the script never trains: building ConvNet (line 14) is setup, torch.randn (line 17) is the draw
    assert sorted(findings) == [("missing-python-seed", 15), ("missing-torch-seed", 17)]


def test_project_modules_are_parsed_never_imported(tmp_path):
    marker = tmp_path / "imported.txt"
    write_project(
        tmp_path,
        {
            "pyproject.toml": "",
            "helpers.py": f"""\
                import torch
                open({str(marker)!r}, "w").write("ran")
                raise SystemExit("a checked project module must never run")

                def seed(value):
                    torch.manual_seed(value)
            """,
            "train.py": """\
                import torch
                from helpers import seed
                seed(0)
                x = torch.rand(3)
            """,
        },
    )
    findings, dependencies = _check(tmp_path, "train.py")
    assert findings == []
    assert str(tmp_path / "helpers.py") in dependencies
    assert not marker.exists() and "helpers" not in sys.modules


def test_parent_relative_import_and_src_layout(tmp_path):
    write_project(
        tmp_path,
        {
            "pyproject.toml": "",
            "src/app/__init__.py": "",
            "src/app/common/seeding.py": """\
                import numpy as np
                def seed_numpy(seed):
                    np.random.seed(seed)
            """,
            "src/app/scripts/train.py": """\
                import numpy as np
                from ..common.seeding import seed_numpy
                seed_numpy(3)
                batch = np.random.choice(10, 4)
            """,
            "scripts/run.py": """\
                import numpy as np
                from app.common import seeding
                seeding.seed_numpy(3)
                batch = np.random.choice(10, 4)
            """,
        },
    )
    assert _check(tmp_path, "src/app/scripts/train.py")[0] == []
    assert _check(tmp_path, "scripts/run.py")[0] == []


def test_broken_or_recursive_project_modules_do_not_crash(tmp_path):
    write_project(
        tmp_path,
        {
            "pyproject.toml": "",
            "broken.py": "def seed(:\n",
            "ping.py": "from pong import pong\ndef ping(n):\n    return pong(n)\n",
            "pong.py": "from ping import ping\ndef pong(n):\n    return ping(n)\n",
            "train.py": """\
                import torch
                import broken
                from ping import ping
                broken.seed(0)
                ping(1)
                x = torch.rand(1)
            """,
        },
    )
    findings, dependencies = _check(tmp_path, "train.py")
    assert findings == [("missing-torch-seed", 6)]
    assert {Path(p).name for p in dependencies} == {"broken.py", "ping.py", "pong.py"}


def test_the_index_is_shared_per_process():
    assert project_index(FIXTURE_PROJECT) is project_index(FIXTURE_PROJECT / "pkg" / "..")


def test_training_in_a_project_trainer_makes_the_script_a_training_script(tmp_path):
    """``Trainer(...).run()``: the optimiser and ``backward()`` live in a project
    module; building a class whose other methods would train is not training."""
    write_project(
        tmp_path,
        {
            "lib/trainer.py": """\
                import torch

                class Trainer:
                    def __init__(self, model):
                        self.model = model

                    def run(self):
                        opt = torch.optim.AdamW(self.model.parameters())
                        self.model(torch.ones(2)).sum().backward()
                        opt.step()
            """,
            "lib/evaluator.py": """\
                import torch

                class Evaluator:
                    def run(self, model):
                        return model(torch.ones(2))

                class Model(torch.nn.Module):
                    def configure_optimizers(self):
                        return torch.optim.AdamW(self.parameters())
            """,
            "train.py": """\
                import torch
                from lib.trainer import Trainer

                def main():
                    model = torch.nn.Linear(2, 2)
                    Trainer(model).run()

                if __name__ == '__main__':
                    main()
            """,
            "evaluate.py": """\
                import torch
                from lib.evaluator import Evaluator, Model

                if __name__ == '__main__':
                    model = Model()  # its optimiser method is never called here
                    evaluator = Evaluator()
                    evaluator.run(model)
            """,
        },
    )
    trained = check_file(tmp_path / "train.py", "train.py", tmp_path)
    assert [(f.name, f.line) for f in trained.findings if f.name in ("determinism-not-requested", "missing-torch-seed")] == [
        ("missing-torch-seed", 5),
        ("determinism-not-requested", 6),
    ]
    assert str(tmp_path / "lib" / "trainer.py") in trained.dependencies
    evaluated = check_file(tmp_path / "evaluate.py", "evaluate.py", tmp_path)
    assert not [f for f in evaluated.findings if f.name in ("determinism-not-requested", "missing-torch-seed")]


def test_a_process_started_on_a_project_function_that_trains_makes_a_training_script(tmp_path):
    write_project(
        tmp_path,
        {
            "train.py": """\
                import torch

                def train(model):
                    opt = torch.optim.SGD(model.parameters(), lr=0.1)
                    model(torch.ones(2)).sum().backward()
            """,
            "main.py": """\
                import torch
                import torch.multiprocessing as mp
                from train import train

                if __name__ == '__main__':
                    model = torch.nn.Linear(2, 2)
                    p = mp.Process(target=train, args=(model,))
                    p.start()
            """,
        },
    )
    result = check_file(tmp_path / "main.py", "main.py", tmp_path)
    assert [(f.name, f.line) for f in result.findings if f.name == "determinism-not-requested"] == [("determinism-not-requested", 7)]


def test_a_method_of_a_star_imported_project_class_draws(tmp_path):
    """``from utils import *`` then ``buffer = ReplayBuffer(); buffer.push_and_pop(x)``."""
    write_project(
        tmp_path,
        {
            "utils.py": """\
                import random

                class ReplayBuffer:
                    def push_and_pop(self, item):
                        return item if random.uniform(0, 1) > 0.5 else None
            """,
            "gan.py": """\
                import torch
                from utils import *

                buffer = ReplayBuffer()
                for step in range(3):
                    kept = buffer.push_and_pop(step)
            """,
        },
    )
    findings, dependencies = _check(tmp_path, "gan.py")
    assert ("missing-python-seed", 6) in findings
    assert str(tmp_path / "utils.py") in dependencies


def test_an_entry_script_that_reaches_torch_only_through_project_modules_is_checked(tmp_path):
    """improved-diffusion's ``image_train.py`` shape: no torch in the script's own
    text, so the pre-filter must keep it for its ``__main__`` guard (and for its
    project import); a library file of the same shape is no training script."""
    write_project(
        tmp_path,
        {
            "lib/trainer.py": """\
                import torch

                class Trainer:
                    def run(self):
                        model = torch.nn.Linear(2, 2)
                        opt = torch.optim.AdamW(model.parameters())
                        model(torch.ones(2)).sum().backward()
                        opt.step()
            """,
            "train.py": """\
                from lib.trainer import Trainer

                def main():
                    Trainer().run()

                if __name__ == "__main__":
                    main()
            """,
            "helpers.py": """\
                from lib.trainer import Trainer

                def build():
                    return Trainer()
            """,
        },
    )
    trained = check_file(tmp_path / "train.py", "train.py", tmp_path)
    assert "determinism-not-requested" in {f.name for f in trained.findings}
    assert not check_file(tmp_path / "helpers.py", "helpers.py", tmp_path).findings


def test_a_module_level_script_training_through_a_trainer_without_torch_imports_is_checked(tmp_path):
    """SPADE's ``train.py`` shape: a script without a ``__main__`` guard that never
    names torch, and a trainer module that never imports it either, calling
    ``backward()`` and ``step()`` on what a torch-importing project module built."""
    write_project(
        tmp_path,
        {
            "models/model.py": """\
                import torch

                class Model(torch.nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = torch.nn.Linear(2, 2)
            """,
            "trainers/trainer.py": """\
                from models.model import Model

                class Trainer:
                    def __init__(self, opt):
                        self.model = Model()
                        self.optimizer = opt.build(self.model)

                    def run_one_step(self, data):
                        self.optimizer.zero_grad()
                        loss = self.model(data).sum()
                        loss.backward()
                        self.optimizer.step()
            """,
            "trainers/no_torch.py": """\
                class Engine:
                    def run_one_step(self, value):
                        value.backward()  # a pure-Python autograd engine: not torch
            """,
            "train.py": """\
                from trainers.trainer import Trainer
                from options import parse

                opt = parse()
                trainer = Trainer(opt)
                for data in opt.loader:
                    trainer.run_one_step(data)
            """,
            "engine.py": """\
                from trainers.no_torch import Engine

                engine = Engine()
                for value in [1, 2]:
                    engine.run_one_step(value)
            """,
            "options.py": "def parse():\n    return None\n",
        },
    )
    trained = check_file(tmp_path / "train.py", "train.py", tmp_path)
    assert [(f.name, f.line) for f in trained.findings if f.name == "determinism-not-requested"] == [
        ("determinism-not-requested", 7)
    ]
    engine = check_file(tmp_path / "engine.py", "engine.py", tmp_path)
    assert not [f for f in engine.findings if f.name == "determinism-not-requested"]


def test_a_project_module_that_seeds_when_imported_seeds_its_importer(tmp_path):
    TRAINS = "torch.optim.SGD(model.parameters(), lr=0.1).step()\n"
    write_project(
        tmp_path,
        {
            "pyproject.toml": "",
            "utils/__init__.py": "",
            "utils/seeding.py": "import random\nimport numpy as np\nimport torch\n\nrandom.seed(0)\nnp.random.seed(0)\n"
            "if __name__ == '__main__':\n    pass\ntorch.manual_seed(0)\n",
            "utils/main_only.py": "import torch\n\nif __name__ == '__main__':\n    torch.manual_seed(0)\n",
            "train.py": "import random\nimport numpy as np\nimport torch\nimport utils.seeding\n\n"
            "model = torch.nn.Linear(3, 3)\nx = np.random.rand(3) * random.random()\n" + TRAINS,
            "from_import.py": "import torch\nfrom utils import seeding\n\nmodel = torch.nn.Linear(3, 3)\n" + TRAINS,
            "main_guard.py": "import torch\nimport utils.main_only\n\nmodel = torch.nn.Linear(3, 3)\n" + TRAINS,
        },
    )
    findings, dependencies = _check(tmp_path, "train.py")
    assert findings == [] and str(tmp_path / "utils" / "seeding.py") in dependencies
    assert _check(tmp_path, "from_import.py")[0] == []
    # the module's __main__ block does not run on import: nothing seeds torch
    assert _check(tmp_path, "main_guard.py")[0] == [("missing-torch-seed", 4)]


# A repository as a zip download leaves it: no .git, no packaging; the entry script in tools/
# puts lib/ on sys.path through an imported _init_paths module, and the config module sets
# cuDNN's benchmark mode read through the entry script.
SEGMENTATION_REPOSITORY = {
    "tools/_init_paths.py": "import os.path as osp\nimport sys\n\n\ndef add_path(path):\n    if path not in sys.path:\n"
    "        sys.path.insert(0, path)\n\n\nthis_dir = osp.dirname(__file__)\nadd_path(osp.join(this_dir, '..', 'lib'))\n",
    "lib/config/__init__.py": "from .default import _C as config\n",
    "lib/config/default.py": "from yacs.config import CfgNode as CN\n_C = CN()\n_C.CUDNN = CN()\n_C.CUDNN.BENCHMARK = True\n",
    "lib/utils/__init__.py": "",
    "lib/utils/seeding.py": "import torch\n\ndef seed_all(seed):\n    torch.manual_seed(seed)\n",
    "tools/train.py": "import torch\nimport torch.backends.cudnn as cudnn\nimport _init_paths\nfrom config import config\n"
    "from utils.seeding import seed_all\n\n\ndef main():\n    seed_all(304)\n    cudnn.benchmark = config.CUDNN.BENCHMARK\n"
    "    model = torch.nn.Linear(3, 3)\n    torch.optim.SGD(model.parameters(), lr=0.1).step()\n\n\nmain()\n",
}


def _names(root: Path, name: str, project_root: Path) -> list[str]:
    return sorted({f.name for f in check_file(root / name, name, project_root).findings})


def test_folders_a_script_puts_on_sys_path_hold_its_project_modules(tmp_path):
    write_project(tmp_path, SEGMENTATION_REPOSITORY)
    # config values and the seeding helper come from lib/: benchmark found, no missing seed
    assert _names(tmp_path, "tools/train.py", tmp_path / "tools") == ["cudnn-benchmark", "determinism-not-requested"]
    (tmp_path / "tools" / "_init_paths.py").write_text("import sys\n")
    assert "missing-torch-seed" in _names(tmp_path, "tools/train.py", tmp_path / "tools")


@pytest.mark.parametrize(
    "edit",
    [
        "sys.path.append(os.path.dirname(__file__) + '/../lib')",
        "sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'lib'))",
        "sys.path.insert(0, 'lib')",  # relative to the project root, where the script is started
    ],
)
def test_path_edits_in_the_script_itself_are_followed(tmp_path, edit):
    files = dict(SEGMENTATION_REPOSITORY)
    files["pyproject.toml"] = ""
    files["tools/train.py"] = files["tools/train.py"].replace("import _init_paths\n", f"import os\nimport sys\nfrom pathlib import Path\n{edit}\n")
    write_project(tmp_path, files)
    assert _names(tmp_path, "tools/train.py", tmp_path) == ["cudnn-benchmark", "determinism-not-requested"]


@pytest.mark.parametrize(
    ("files", "root", "found_by"),
    [
        ({"pyproject.toml": "", "requirements.txt": "", "tools/train.py": ""}, ".", "pyproject.toml"),
        ({"requirements.txt": "", "tools/README.md": "", "tools/train.py": ""}, ".", "requirements.txt"),
        ({"lib/models/__init__.py": "", "tools/train.py": "import torch\nfrom models import Net\n"}, ".", "imports lib/models"),
        ({"utils.py": "", "tools/train.py": "import os\nimport utils\n"}, ".", "imports utils"),
        ({"tools/train.py": "import torch\n"}, "tools", "the file's folder"),
    ],
)
def test_the_project_root_without_version_control(tmp_path, files, root, found_by):
    from detaudit.static.run.discovery import find_project_root

    write_project(tmp_path / "repo", files)
    found = find_project_root(tmp_path / "repo" / "tools" / "train.py")
    assert (found.path, found.found_by) == ((tmp_path / "repo" / root).resolve(), found_by)


def test_a_draw_in_the_default_object_a_project_class_builds_is_followed(tmp_path):
    # improved-diffusion's shape: TrainLoop(schedule_sampler=None) falls back to a sampler
    # whose sample() draws from NumPy every step
    write_project(
        tmp_path,
        {
            "pyproject.toml": "",
            "sampler.py": "import numpy as np\n\nclass UniformSampler:\n    def sample(self, n):\n        return np.random.choice(10, size=(n,))\n",
            "train_util.py": "from sampler import UniformSampler\n\nclass TrainLoop:\n"
            "    def __init__(self, model, schedule_sampler=None):\n        self.model = model\n"
            "        self.schedule_sampler = schedule_sampler or UniformSampler()\n\n"
            "    def run_step(self, batch):\n        t = self.schedule_sampler.sample(4)\n        self.model(batch, t).mean().backward()\n",
            "train.py": "import torch\nfrom train_util import TrainLoop\n\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(4, 4)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nloop = TrainLoop(model)\nfor batch in range(3):\n"
            "    loop.run_step(batch)\n    opt.step()\n",
        },
    )
    findings, dependencies = _check(tmp_path, "train.py")
    assert findings == [("missing-numpy-seed", 9)]
    assert str(tmp_path / "sampler.py") in dependencies


_RESIZE_MODULE = """\
    import torch.nn.functional as F

    def resize(x, size):
        return F.interpolate(x, size=size, mode='bilinear')

    def _crop(x, grid):
        return F.grid_sample(x, grid)
"""


@pytest.mark.parametrize(
    ("caller", "reported"),
    [
        # a training loss on the model's output resized by the helper: the backward runs through it
        ("from audio import resize\nloss = (resize(model(x), 64) - y).abs().mean()\nloss.backward()\n", True),
        # only a dataset calls it: data, no gradient
        (
            "import torch\nfrom audio import resize\n\nclass Clips(torch.utils.data.Dataset):\n"
            "    def __getitem__(self, i):\n        return resize(self.clips[i], 64)\n",
            False,
        ),
        # nothing calls it (an import and a comment are no calls): a public function may have
        # callers outside the project, a private one is dead code
        ("from audio import resize  # resize(model(x), 64) was tried once\n", True),
        # passed on to a registry: it may run anywhere, so this file's silence decides nothing
        ("from audio import resize\nTRANSFORMS = {'resize': resize}\n", True),
    ],
)
def test_a_module_functions_callers_are_looked_for_in_the_whole_project(tmp_path, caller, reported):
    write_project(tmp_path, {"pyproject.toml": "", "audio.py": _RESIZE_MODULE, "train.py": caller})
    result = check_file(tmp_path / "audio.py", "audio.py", tmp_path)
    assert any(f.code == "DET020" and f.line == 4 for f in result.findings) is reported
    assert not any(f.code == "DET020" and f.line == 7 for f in result.findings)  # _crop: called nowhere
    if "resize(" in caller.split("\n", 1)[1]:
        assert str(tmp_path / "train.py") in result.dependencies  # a caller read is a dependency


RL_SCRIPT = """\
    import gym
    import torch

    def main():
        env = gym.make("CartPole-v1")
        q = torch.nn.Linear(4, 2)
        optimizer = torch.optim.Adam(q.parameters())
        state, _ = env.reset(seed=0)
        actions = torch.tensor([[0]])
        loss = q(torch.ones(1, 4)).gather(1, actions).sum(){placement}
        loss.backward()
        optimizer.step()

    if __name__ == "__main__":
        main()
"""


@pytest.mark.parametrize(
    ("placement", "imported_by_another_file", "reported"),
    [
        ("", False, False),  # minimalRL's scripts: every tensor is a CPU tensor
        ("\n        q = q.cuda()", False, True),
        ("\n        device = torch.device('cuda')", False, True),
        ("", True, True),  # another project file imports it and may move what it builds
    ],
)
def test_a_self_contained_script_that_never_names_a_device_has_no_cuda_only_hazard(
    tmp_path, placement, imported_by_another_file, reported
):
    files = {"dqn.py": RL_SCRIPT.format(placement=placement)}
    if imported_by_another_file:
        files["run_on_gpu.py"] = "import torch\nfrom dqn import main\ntorch.set_default_device('cuda')\nmain()\n"
    write_project(tmp_path, files)
    result = check_file(tmp_path / "dqn.py", "dqn.py", tmp_path)
    assert any(f.name == "nondeterministic-op" and "gather" in f.message for f in result.findings) is reported


@pytest.mark.parametrize(
    ("detach", "reported"), [("z = z.detach()", False), ("z = z.detach().cpu().numpy()", False), ("z = z * 2", True)]
)
def test_a_helper_whose_star_importing_caller_detaches_its_result_passes_no_gradient(tmp_path, detach, reported):
    """nerf-pytorch: ``from run_nerf_helpers import *`` and ``z = sample_pdf(...)``
    followed by ``z = z.detach()``: the gathers inside never run a backward."""
    write_project(
        tmp_path,
        {
            "helpers.py": """\
                import torch

                def sample_pdf(cdf, index):
                    return torch.gather(cdf, 1, index)
            """,
            "train.py": f"""\
                import torch
                from helpers import *

                class Renderer(torch.nn.Module):
                    def forward(self, weights, index):
                        z = sample_pdf(weights.cumsum(1), index)
                        {detach}
                        return z
            """,
        },
    )
    result = check_file(tmp_path / "helpers.py", "helpers.py", tmp_path)
    assert any(f.name == "nondeterministic-op" for f in result.findings) is reported


def test_a_library_module_checked_alone_finds_its_callers_in_a_nested_source_folder(tmp_path):
    """CenterNet: ``src/main.py`` puts ``src/lib`` on the path through ``_init_paths``;
    ``src/lib/trains/ctdet.py`` imports ``from models.decode import ctdet_decode``.
    Checking ``decode.py`` alone still resolves that caller (``src/lib`` is the one
    source folder holding ``models/decode.py``), which detaches what it gets."""
    write_project(
        tmp_path,
        {
            "src/lib/models/__init__.py": "",
            "src/lib/models/decode.py": """\
                import torch

                def ctdet_decode(heat, wh, index):
                    return wh.gather(2, index) * heat
            """,
            "src/lib/trains/__init__.py": "",
            "src/lib/trains/ctdet.py": """\
                import torch
                from models.decode import ctdet_decode

                class CtdetTrainer(torch.nn.Module):
                    def debug(self, output, index):
                        dets = ctdet_decode(output['hm'], output['wh'], index)
                        dets = dets.detach().cpu().numpy()
                        return dets
            """,
            "README.md": "CenterNet\n",
        },
    )
    (tmp_path / ".git").mkdir()
    result = check_file(tmp_path / "src/lib/models/decode.py", "src/lib/models/decode.py", tmp_path)
    assert not [f for f in result.findings if f.name == "nondeterministic-op"]
    assert str(tmp_path / "src/lib/trains/ctdet.py") in result.dependencies


def test_flags_parsed_in_a_project_options_module_give_their_defaults(tmp_path):
    """CenterNet's ``opt = opts().parse(); main(opt)`` with ``cudnn.benchmark = not
    opt.not_cuda_benchmark and not opt.test``, and a2c-ppo's ``args = get_args()``
    with determinism switched on only under ``args.cuda and args.cuda_deterministic``:
    the flags are defined and parsed in a project module."""
    write_project(
        tmp_path,
        {
            "lib/opts.py": """\
                import argparse
                from lib.base_opts import BaseOpts

                class opts(BaseOpts):
                    def parse(self):
                        self.parser.add_argument('--test', action='store_true')
                        return self.parser.parse_args()
            """,
            "lib/base_opts.py": """\
                import argparse

                class BaseOpts:
                    def __init__(self):
                        self.parser = argparse.ArgumentParser()
                        self.parser.add_argument('--not_cuda_benchmark', action='store_true')
            """,
            "lib/arguments.py": """\
                import argparse

                def get_args():
                    parser = argparse.ArgumentParser()
                    parser.add_argument('--cuda-deterministic', action='store_true', default=False)
                    args = parser.parse_args()
                    args.cuda = not args.no_cuda
                    return args
            """,
            "main.py": """\
                import torch
                from lib.opts import opts

                def main(opt):
                    torch.backends.cudnn.benchmark = not opt.not_cuda_benchmark and not opt.test
                    model = torch.nn.Conv2d(3, 3, 3)
                    torch.optim.SGD(model.parameters(), lr=0.1).step()

                if __name__ == '__main__':
                    opt = opts().parse()
                    main(opt)
            """,
            "ppo.py": """\
                import torch
                from lib.arguments import get_args

                def main():
                    args = get_args()
                    torch.manual_seed(0)
                    if args.cuda and args.cuda_deterministic:
                        torch.backends.cudnn.deterministic = True
                    model = torch.nn.Linear(2, 2)
                    torch.optim.Adam(model.parameters()).step()

                if __name__ == '__main__':
                    main()
            """,
        },
    )
    main = check_file(tmp_path / "main.py", "main.py", tmp_path)
    assert [f.line for f in main.findings if f.name == "cudnn-benchmark"] == [5]
    assert str(tmp_path / "lib" / "base_opts.py") in main.dependencies
    ppo = check_file(tmp_path / "ppo.py", "ppo.py", tmp_path)
    [finding] = [f for f in ppo.findings if f.name == "determinism-not-requested"]
    assert "the default of --cuda-deterministic it is False" in finding.message
