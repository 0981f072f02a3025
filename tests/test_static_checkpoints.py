"""incomplete-checkpoint (DET050) and the checkpoints analysis beyond the rule's examples:
save helpers of project modules, a dict saved at several places, schedulers put back
by construction, draws behind options that are off by default."""

from __future__ import annotations

import textwrap
from pathlib import Path

from detaudit.static.engine.check import check_file, check_source

from project_files import write_project

CODE = "DET050"

#: a MAE-style script: the checkpoint dict is built in util/misc.py's save_model
MAE_STYLE = {
    "util/__init__.py": "",
    "util/misc.py": """
        import torch

        def save_on_master(*args, **kwargs):
            torch.save(*args, **kwargs)

        def save_model(args, epoch, model, optimizer, loss_scaler):
            to_save = {
                'model': model.state_dict(),
                'optimizer': optimizer.state_dict(),
                'epoch': epoch,
                'scaler': loss_scaler.state_dict(),
            }
            save_on_master(to_save, f'checkpoint-{epoch}.pth')
        """,
    "main_pretrain.py": """
        import torch
        import torchvision.transforms as transforms
        import util.misc as misc
        from timm.utils import NativeScaler

        def main(args):
            torch.manual_seed(args.seed)
            transform = transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])
            model = torch.nn.Linear(4, 4)
            optimizer = torch.optim.AdamW(model.parameters())
            loss_scaler = NativeScaler()
            for epoch in range(args.epochs):
                loss_scaler(model(torch.ones(1, 4)).sum(), optimizer)
                misc.save_model(
                    args=args, epoch=epoch, model=model, optimizer=optimizer,
                    loss_scaler=loss_scaler)

        if __name__ == '__main__':
            main(None)
        """,
}


def _findings(code: str):
    return [f for f in check_source(textwrap.dedent(code), "train.py").findings if f.code == CODE]


def test_a_save_helper_of_another_module_is_read_and_what_the_call_passes_counts_as_saved(tmp_path: Path):
    write_project(tmp_path, MAE_STYLE)
    result = check_file(tmp_path / "main_pretrain.py", "main_pretrain.py", tmp_path)
    findings = [f for f in result.findings if f.code == CODE]
    assert [f.line for f in findings] == [15]
    assert "torch RNG" in findings[0].message and "GradScaler" not in findings[0].message
    assert str(tmp_path / "util" / "misc.py") in result.dependencies
    # the helper's module alone: no training state, no seed, nothing to report
    assert [f for f in check_file(tmp_path / "util" / "misc.py", "util/misc.py", tmp_path).findings if f.code == CODE] == []


def test_a_dict_saved_at_several_places_is_reported_once():
    findings = _findings(
        """
        import torch
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        scaler = torch.cuda.amp.GradScaler()
        for epoch in range(10):
            scaler.scale(model(torch.ones(1, 4)).sum()).backward()
            scaler.step(optimizer)
            scaler.update()
            ckpt = {'model': model.state_dict(), 'optimizer': optimizer.state_dict()}
            torch.save(ckpt, 'last.pt')
            if epoch % 2 == 0:
                torch.save(ckpt, 'best.pt')
        """
    )
    assert [f.line for f in findings] == [11]


def test_a_scheduler_given_last_epoch_positionally_is_put_back_by_construction():
    assert _findings(
        """
        import torch
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        last_epoch = 0
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 30, 0.1, last_epoch - 1)
        for epoch in range(last_epoch, 90):
            scheduler.step()
            torch.save({'state_dict': model.state_dict(), 'optimizer': optimizer.state_dict()}, 'checkpoint.pth')
        """
    ) == []


def test_a_scheduler_put_back_through_last_epoch_is_not_reported_but_a_scaler_is():
    """yolov5's train.py: ``scheduler.last_epoch = start_epoch - 1``, and ``GradScaler(enabled=amp)``."""
    findings = _findings(
        """
        import torch
        from torch.optim import lr_scheduler
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        scheduler = lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda x: 1 - x / 300)
        start_epoch = 0
        scheduler.last_epoch = start_epoch - 1
        amp = torch.cuda.is_available()
        scaler = torch.cuda.amp.GradScaler(enabled=amp)
        for epoch in range(start_epoch, 300):
            scaler.scale(model(torch.ones(1, 4)).sum()).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            ckpt = {'epoch': epoch, 'model': model, 'optimizer': optimizer.state_dict()}
            torch.save(ckpt, 'last.pt')
        """
    )
    assert len(findings) == 1
    assert "GradScaler `scaler`" in findings[0].message and "scheduler" not in findings[0].message


def test_draws_behind_an_option_off_by_default_do_not_count():
    assert _findings(
        """
        import argparse, random
        import torch
        parser = argparse.ArgumentParser()
        parser.add_argument('--multi-scale', action='store_true')
        opt = parser.parse_args()
        random.seed(0)
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for epoch in range(10):
            if opt.multi_scale:
                size = random.randrange(16, 48)
            torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, 'last.pt')
        """
    ) == []


def test_a_dict_with_something_spread_into_it_is_not_read():
    assert _findings(
        """
        import torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        extra = {}
        for step in range(10):
            torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(), **extra}, 'ckpt.pt')
        """
    ) == []


def test_draws_repeated_in_another_function_are_no_part_of_the_saving_run():
    """yolov5's genetic hyperparameter search draws from ``random`` in loops of its own functions."""
    assert _findings(
        """
        import random
        import torch

        def train(epochs):
            model = torch.nn.Linear(4, 4)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            for epoch in range(epochs):
                model(torch.ones(1, 4)).sum().backward()
                optimizer.step()
                torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, 'last.pt')

        def mutate(hyp):
            for key in hyp:
                if random.uniform(0, 1) < 0.1:
                    hyp[key] *= random.uniform(0.8, 1.2)

        if __name__ == '__main__':
            random.seed(0)
            train(10)
        """
    ) == []
