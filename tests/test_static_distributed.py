"""The distributed rules beyond their documented examples: each guard that keeps
per-rank-init-seed quiet is shown to be what keeps it quiet (the same script
without it is reported), and async-collective-not-waited follows every spelling
of the collectives and of waiting."""

from __future__ import annotations

import textwrap

import pytest

from detaudit.static.engine.check import check_source


def lines_of(rule: str, code: str) -> list[int]:
    result = check_source(textwrap.dedent(code), "train.py")
    assert not result.internal_errors
    return [f.line for f in result.findings if f.name == rule]


# --- per-rank-init-seed -------------------------------------------------------------

HAND_WRITTEN_DP = """\
import torch
import torch.distributed as dist

def average_gradients(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()

def run(args):
    dist.init_process_group("gloo")
    torch.manual_seed(args.seed + dist.get_rank())
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    {guard}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches():
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        average_gradients(model)
        opt.step()
"""


@pytest.mark.parametrize(
    "guard",
    [
        "model = torch.nn.parallel.DistributedDataParallel(model)",
        "for p in model.parameters(): dist.broadcast(p.data, src=0)",
        "model = create_ddp_model(model)",  # a project helper that wraps it
        "model.load_state_dict(torch.load('init.pt'))",
    ],
)
def test_each_guard_is_what_keeps_the_rule_quiet(guard):
    assert lines_of("per-rank-init-seed", HAND_WRITTEN_DP.format(guard=guard)) == []
    assert lines_of("per-rank-init-seed", HAND_WRITTEN_DP.format(guard="pass")) == [11]


def test_a_checkpoint_loaded_only_on_resume_does_not_make_the_weights_agree():
    guard = "if args.resume: model.load_state_dict(torch.load(args.resume))"
    assert lines_of("per-rank-init-seed", HAND_WRITTEN_DP.format(guard=guard)) == [11]


def test_ranks_that_average_nothing_train_models_of_their_own():
    independent = HAND_WRITTEN_DP.replace("average_gradients(model)\n", "pass\n").replace(
        "dist.all_reduce(p.grad)", "print(p.grad)"
    )
    assert lines_of("per-rank-init-seed", independent.format(guard="pass")) == []


def test_per_rank_seeding_after_the_model_is_built_is_left_alone():
    augmentation_seed = HAND_WRITTEN_DP.replace(
        "    torch.manual_seed(args.seed + dist.get_rank())\n", "    torch.manual_seed(args.seed)\n"
    ).format(guard="torch.manual_seed(args.seed + dist.get_rank())")
    assert lines_of("per-rank-init-seed", augmentation_seed) == []


@pytest.mark.parametrize(
    "rank",
    ["int(os.environ['RANK'])", "int(os.environ.get('LOCAL_RANK', 0))", "args.local_rank", "accelerator.process_index"],
)
def test_every_spelling_of_the_rank_is_seen(rank):
    code = "import os\n" + HAND_WRITTEN_DP.replace("dist.get_rank())", f"{rank})", 1).format(guard="pass")
    assert lines_of("per-rank-init-seed", code) == [12]


def test_a_project_model_class_built_in_the_main_guard_is_followed():
    code = """\
        import os, torch
        import torch.nn as nn
        from torch.distributed import all_reduce

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Conv2d(3, 8, 3)

        if __name__ == "__main__":
            rank = int(os.environ["RANK"])
            torch.manual_seed(rank)
            net = Net()
            for p in net.parameters():
                all_reduce(p.grad)
        """
    assert lines_of("per-rank-init-seed", code) == [12]


# --- async-collective-not-waited ---------------------------------------------------


@pytest.mark.parametrize(
    "imports, call",
    [
        ("import torch.distributed as dist", "dist.all_reduce(t, async_op=True)"),
        ("from torch.distributed import all_reduce as ar", "ar(t, async_op=True)"),
        ("import torch.distributed.distributed_c10d as c10d", "c10d.broadcast(t, 0, async_op=True)"),
        ("import torch", "torch.distributed.reduce_scatter_tensor(t, big, async_op=True)"),
        ("from torch.distributed import irecv", "irecv(t, src=0)"),
    ],
)
def test_every_spelling_of_a_dropped_handle_is_reported(imports, call):
    code = f"import torch\n{imports}\n\ndef step(t, big):\n    {call}\n    return t * 2\n"
    assert lines_of("async-collective-not-waited", code) == [5]


@pytest.mark.parametrize(
    "wait",
    [
        "work.wait()",
        "torch.futures.wait_all([work.get_future()])",
        "pending.append(work)",  # handed on: waited elsewhere
    ],
)
def test_reading_the_result_after_the_handle_is_waited_or_handed_on_is_fine(wait):
    code = f"""\
        import torch
        import torch.distributed as dist

        def step(p, pending):
            work = dist.all_reduce(p.grad, async_op=True)
            {wait}
            return p.grad.norm()
        """
    assert lines_of("async-collective-not-waited", code) == []
    early_read = code.replace(f"{wait}\n", f"norm = p.grad.norm()\n            {wait}\n")
    assert lines_of("async-collective-not-waited", early_read) == [5]


def test_a_dropped_handle_before_a_device_synchronisation_is_left_alone():
    code = """\
        import torch
        import torch.distributed as dist

        def step(t):
            dist.all_reduce(t, async_op=True)
            torch.cuda.synchronize()
            return t
        """
    assert lines_of("async-collective-not-waited", code) == []


def test_async_op_from_the_command_line_follows_its_default():
    code = """\
        import argparse
        import torch.distributed as dist
        parser = argparse.ArgumentParser()
        parser.add_argument("--overlap", action="store_{default}")
        args = parser.parse_args()

        def step(t):
            dist.all_reduce(t, async_op=args.overlap)
            return t
        """
    assert lines_of("async-collective-not-waited", code.format(default="false")) == [8]
    assert lines_of("async-collective-not-waited", code.format(default="true")) == []


def test_handles_kept_in_a_list_and_waited_in_a_loop_are_fine():
    code = """\
        import torch.distributed as dist

        def sync(model):
            works = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]
            for work in works:
                work.wait()
        """
    assert lines_of("async-collective-not-waited", code) == []


def test_a_collective_expected_to_raise_returns_no_handle():
    code = """\
        import pytest
        import torch.distributed as dist

        def test_bad_op(t):
            with pytest.raises(ValueError):
                dist.all_reduce(t, op="nope", async_op=True)
        """
    assert lines_of("async-collective-not-waited", code) == []
    assert lines_of("async-collective-not-waited", code.replace("pytest.raises(ValueError)", "open('log')")) == [6]


def test_an_attribute_or_keyword_of_the_same_name_is_not_a_read_of_the_result():
    code = """\
        import torch.distributed as dist

        def step(self, t):
            work = dist.all_reduce(t, async_op=True)
            log(self.t, t=0)
            work.wait()
            return t
        """
    assert lines_of("async-collective-not-waited", code) == []
    assert lines_of("async-collective-not-waited", code.replace("log(self.t, t=0)", "log(t)")) == [4]


def test_a_receive_read_in_its_branch_before_the_wait_after_the_branch_is_reported():
    """The point-to-point race torch's distributed tutorial warns about: the
    receiving rank prints the buffer before the shared ``req.wait()``."""
    code = """\
        import torch
        import torch.distributed as dist

        def run(rank):
            buf = torch.zeros(1)
            if rank == 0:
                buf += 1
                req = dist.isend(buf, dst=1)
            else:
                req = dist.irecv(buf, src=0)
                print("received", buf[0])
            req.wait()
        """
    assert lines_of("async-collective-not-waited", code) == [10]
    assert lines_of("async-collective-not-waited", code.replace('print("received", buf[0])', "pass")) == []
