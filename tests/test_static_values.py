"""Values that reach backend settings through project configs: yacs modules,
dataclasses in other modules, Hydra YAML; read without importing, each file
consulted named as a dependency, unresolvable values left quiet."""

from __future__ import annotations

import textwrap
from pathlib import Path

from detaudit.static.analyses.project import content_hash
from detaudit.static.engine.check import check_file

from project_files import write_project

CODES = {"DET010", "DET011", "DET013", "DET018"}

YACS_DEFAULTS = textwrap.dedent("""\
    from yacs.config import CfgNode as CN

    _C = CN()
    _C.GPUS = (0,)
    _C.CUDNN = CN()
    _C.CUDNN.BENCHMARK = True
    _C.CUDNN.DETERMINISTIC = False
    _C.CUDNN.ENABLED = True


    def get_cfg_defaults():
        return _C.clone()
""")

HRNET_STYLE_SCRIPT = """\
    import torch
    import torch.backends.cudnn as cudnn

    import _init_paths
    from config import config


    def main():
        config.merge_from_file(args.cfg)
        cudnn.benchmark = config.CUDNN.BENCHMARK
        torch.backends.cudnn.deterministic = config.CUDNN.DETERMINISTIC
        torch.backends.cudnn.enabled = config.CUDNN.ENABLED


    if __name__ == "__main__":
        main()
"""


def _check(root: Path, name: str):
    result = check_file(root / name, name, root)
    assert not result.internal_errors
    return sorted((f.code, f.line, f.message) for f in result.findings if f.code in CODES), result.dependencies


def test_yacs_defaults_of_a_config_package_on_a_source_folder(tmp_path):
    """HRNet's layout: ``tools/train.py`` puts ``lib/`` on sys.path and imports the
    config package, which re-exports ``_C`` from ``default.py``."""
    write_project(tmp_path, {
        "lib/config/__init__.py": "from .default import _C as config\nfrom .default import update_config\n",
        "lib/config/default.py": YACS_DEFAULTS + "\n\ndef update_config(cfg, args):\n    cfg.merge_from_file(args.cfg)\n",
        "tools/train.py": HRNET_STYLE_SCRIPT,
    })
    findings, dependencies = _check(tmp_path, "tools/train.py")
    assert [(code, line) for code, line, _ in findings] == [("DET010", 10), ("DET013", 11)]
    assert "True (the default set at lib/config/default.py:6)" in findings[0][2]
    assert "False (the default set at lib/config/default.py:7)" in findings[1][2]
    for module in ("lib/config/__init__.py", "lib/config/default.py"):
        assert dependencies[str(tmp_path / module)] == content_hash((tmp_path / module).read_bytes())


def test_a_config_built_by_a_defaults_function(tmp_path):
    write_project(tmp_path, {
        "configs.py": YACS_DEFAULTS,
        "train.py": "import torch\nfrom configs import get_cfg_defaults\ncfg = get_cfg_defaults()\n"
                    "torch.backends.cudnn.benchmark = cfg.CUDNN.BENCHMARK\n",
    })
    findings, _ = _check(tmp_path, "train.py")
    assert [(code, line) for code, line, _ in findings] == [("DET010", 4)]


def test_config_values_set_false_or_unknown_stay_quiet(tmp_path):
    write_project(tmp_path, {
        "configs.py": YACS_DEFAULTS.replace("BENCHMARK = True", "BENCHMARK = False").replace("DETERMINISTIC = False", "DETERMINISTIC = True"),
        "train.py": "import torch\nfrom configs import get_cfg_defaults, other\ncfg = get_cfg_defaults()\n"
                    "torch.backends.cudnn.benchmark = cfg.CUDNN.BENCHMARK\n"
                    "torch.backends.cudnn.deterministic = cfg.CUDNN.DETERMINISTIC\n"
                    # a key the config never sets, and a module that is not there
                    "torch.backends.cuda.matmul.allow_tf32 = cfg.CUDNN.TF32\n"
                    "torch.backends.cudnn.allow_tf32 = other.TF32\n",
    })
    findings, _ = _check(tmp_path, "train.py")
    assert findings == []


def test_dataclass_config_of_another_module_and_a_structured_config_parameter(tmp_path):
    write_project(tmp_path, {
        "conf.py": """\
            from dataclasses import dataclass, field


            @dataclass
            class Cudnn:
                benchmark: bool = True


            @dataclass
            class TrainConfig:
                tf32: bool = field(default=True)
                cudnn: Cudnn = field(default_factory=Cudnn)
        """,
        "train.py": """\
            import torch
            from conf import TrainConfig


            def main(cfg: TrainConfig):
                torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
                torch.backends.cudnn.benchmark = cfg.cudnn.benchmark


            def also(cfg=TrainConfig(tf32=False)):
                pass
        """,
    })
    findings, _ = _check(tmp_path, "train.py")
    assert [(code, line) for code, line, _ in findings] == [("DET010", 7), ("DET011", 6)]
    assert "conf.py:11" in findings[1][2]


def test_hydra_main_reads_its_yaml_and_the_groups_its_defaults_list_names(tmp_path):
    write_project(tmp_path, {
        "conf/config.yaml": "defaults:\n  - trainer: gpu\n  - _self_\ncudnn:\n  benchmark: true\n  deterministic: ${oc.env:DET}\n",
        "conf/trainer/gpu.yaml": "max_epochs: 10\nbenchmark: true\ndeterministic: false\n",
        "train.py": """\
            import hydra
            import lightning as L
            import torch


            @hydra.main(version_base=None, config_path="conf", config_name="config")
            def main(cfg):
                torch.backends.cudnn.benchmark = cfg.cudnn.benchmark
                torch.backends.cudnn.deterministic = cfg.cudnn.deterministic
                trainer = L.Trainer(benchmark=cfg.trainer.benchmark, deterministic=cfg.trainer.deterministic)


            if __name__ == "__main__":
                main()
        """,
    })
    findings, dependencies = _check(tmp_path, "train.py")
    assert [(code, line) for code, line, _ in findings] == [("DET010", 8), ("DET018", 10), ("DET018", 10)]
    assert "conf/config.yaml:5" in findings[0][2]
    assert any("conf/trainer/gpu.yaml:3" in message for _, _, message in findings)
    assert str(tmp_path / "conf" / "trainer" / "gpu.yaml") in dependencies


def test_a_yaml_file_loaded_by_a_literal_path(tmp_path):
    write_project(tmp_path, {
        "configs/train.yaml": "cudnn_benchmark: True\nseed: 0\n",
        "train.py": "import torch\nfrom omegaconf import OmegaConf\nconfig = OmegaConf.load('configs/train.yaml')\n"
                    "torch.backends.cudnn.benchmark = config.cudnn_benchmark\n",
    })
    findings, _ = _check(tmp_path, "train.py")
    assert [(code, line) for code, line, _ in findings] == [("DET010", 4)]


def test_editing_the_config_changes_the_result(tmp_path):
    write_project(tmp_path, {
        "configs.py": YACS_DEFAULTS,
        "train.py": "import torch\nfrom configs import _C as cfg\ntorch.backends.cudnn.benchmark = cfg.CUDNN.BENCHMARK\n",
    })
    before, _ = _check(tmp_path, "train.py")
    (tmp_path / "configs.py").write_text(YACS_DEFAULTS.replace("BENCHMARK = True", "BENCHMARK = False"))
    after, _ = _check(tmp_path, "train.py")
    assert [code for code, _, _ in before] == ["DET010"] and after == []


def test_a_trainer_hydra_instantiates_from_a_config_group_of_the_main_that_calls_it(tmp_path):
    """lightning-hydra-template's layout: ``main`` is the Hydra main and passes its
    config to ``train``, which instantiates ``cfg.trainer`` (``_target_`` is
    Lightning's Trainer; the group file sets ``deterministic: False``)."""
    write_project(tmp_path, {
        "configs/train.yaml": "# @package _global_\ndefaults:\n  - _self_\n  - trainer: default\nseed: null\n",
        "configs/trainer/default.yaml": "_target_: lightning.pytorch.trainer.Trainer\nmax_epochs: 10\nbenchmark: true\ndeterministic: False\n",
        "src/train.py": """\
            import hydra
            import torch


            def train(cfg):
                trainer = hydra.utils.instantiate(cfg.trainer, logger=None)
                other = hydra.utils.instantiate(cfg.trainer, deterministic=True, benchmark=False)
                trainer.fit()


            @hydra.main(version_base="1.3", config_path="../configs", config_name="train.yaml")
            def main(cfg):
                train(cfg)
        """,
    })
    findings, dependencies = _check(tmp_path, "src/train.py")
    assert [(code, line) for code, line, _ in findings] == [("DET018", 6), ("DET018", 6)]
    assert any("deterministic=False (the default set at configs/trainer/default.yaml:4)" in m for _, _, m in findings)
    assert any("benchmark=True (the default set at configs/trainer/default.yaml:3)" in m for _, _, m in findings)
    assert str(tmp_path / "configs" / "trainer" / "default.yaml") in dependencies


def test_without_a_hydra_main_a_config_parameter_stays_unknown(tmp_path):
    write_project(tmp_path, {
        "configs/trainer/default.yaml": "_target_: lightning.pytorch.trainer.Trainer\ndeterministic: False\n",
        "train.py": "import hydra, torch\n\ndef train(cfg):\n    hydra.utils.instantiate(cfg.trainer)\n    torch.backends.cudnn.benchmark = cfg.benchmark\n",
    })
    findings, _ = _check(tmp_path, "train.py")
    assert findings == []


TRAINING_SCRIPT = """\
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    from engine import setup, train_one_epoch

    setup()
    model = torch.nn.Conv2d(3, 8, 3)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, sampler=sampler, batch_size=8)
    for epoch in range(10):
        train_one_epoch(model, loader, sampler, epoch)
"""


def _codes(root: Path, name: str) -> set[str]:
    result = check_file(root / name, name, root)
    assert not result.internal_errors
    return {f.name for f in result.findings}


def test_determinism_and_set_epoch_in_a_project_helper_of_another_module(tmp_path):
    write_project(tmp_path, {
        "engine.py": """\
            import torch


            def setup():
                torch.use_deterministic_algorithms(True)


            def train_one_epoch(model, loader, sampler, epoch):
                sampler.set_epoch(epoch)
                for x in loader:
                    model(x).sum().backward()
        """,
        "train.py": TRAINING_SCRIPT,
    })
    codes = _codes(tmp_path, "train.py")
    # the request is seen (so its CUBLAS_WORKSPACE_CONFIG is asked for), the epoch is set
    assert "cublas-workspace-config" in codes and "dataloader-worker-seed" not in codes
    assert str(tmp_path / "engine.py") in check_file(tmp_path / "train.py", "train.py", tmp_path).dependencies


def test_helpers_that_neither_switch_determinism_nor_set_the_epoch(tmp_path):
    write_project(tmp_path, {
        "engine.py": """\
            import torch


            def setup():
                torch.use_deterministic_algorithms(False)


            def train_one_epoch(model, loader, sampler, epoch):
                for x in loader:
                    model(x).sum().backward()
        """,
        "train.py": TRAINING_SCRIPT,
    })
    result = check_file(tmp_path / "train.py", "train.py", tmp_path)
    messages = {f.name: f.message for f in result.findings}
    assert "passed to torch.use_deterministic_algorithms inside engine.setup" in messages["deterministic-off"]
    assert "dataloader-worker-seed" in messages
