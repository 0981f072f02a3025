"""Ground truth for the real-code corpus: run a training script *without*
detaudit, stop it after N optimizer steps, and write one digest of what it
trained.

No tracer, no storage tables, no detaudit import: only what a user's seeded
run does (``random``, NumPy and torch seeded, as ``detaudit run`` seeds them
unless ``--no-seed``) and one global optimizer step hook that counts steps.
After the N-th step of any optimizer, every parameter and optimizer-state
tensor of every optimizer seen so far is hashed in order into DIGEST_FILE
(``.rank<R>`` appended under torchrun) and the process ends. A script that
ends before N steps (or makes no optimizer step at all) is digested at exit
from the same optimizers, or from its ``__main__`` globals' modules.

Usage: python plain_truth.py --steps N --out DIGEST_FILE [--no-seed] SCRIPT [ARGS...]
"""

import argparse
import atexit
import hashlib
import os
import random
import runpy
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-seed", action="store_true")
    parser.add_argument("--out", required=True)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args()

    import numpy
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    if not options.no_seed:
        random.seed(options.seed)
        numpy.random.seed(options.seed)
        torch.manual_seed(options.seed)
    rank = os.environ.get("RANK")
    out = options.out + (f".rank{rank}" if rank is not None else "")
    optimizers: list = []
    steps = 0
    written = False
    script_globals: dict = {}

    def tensors_to_digest():
        if optimizers:
            for optimizer in optimizers:
                for group in optimizer.param_groups:
                    for parameter in group["params"]:
                        yield parameter
                        for value in optimizer.state.get(parameter, {}).values():
                            if isinstance(value, torch.Tensor):
                                yield value
            return
        # no optimizer: scripts that update parameters by hand (p.data.add_)
        for value in list(script_globals.values()):
            if isinstance(value, torch.nn.Module):
                yield from value.state_dict().values()

    def write_digest() -> None:
        nonlocal written
        if written:
            return
        written = True
        digest = hashlib.sha256()
        count = 0
        for tensor in tensors_to_digest():
            local = getattr(tensor, "to_local", None)  # a DTensor: this rank's shard
            tensor = (local() if local is not None else tensor).detach().cpu().contiguous()
            digest.update(str((tuple(tensor.shape), str(tensor.dtype))).encode())
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
            count += 1
        with open(out, "w") as handle:
            handle.write(f"{digest.hexdigest()} {steps} {count}\n")

    def count_step(optimizer, args, kwargs) -> None:
        nonlocal steps
        if all(optimizer is not seen for seen in optimizers):
            optimizers.append(optimizer)
        steps += 1
        if steps >= options.steps:
            write_digest()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    register_optimizer_step_post_hook(count_step)
    atexit.register(write_digest)
    sys.argv = [options.script, *options.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(options.script)))
    script_globals.update(runpy.run_path(options.script, run_name="__main__"))
    write_digest()


if __name__ == "__main__":
    main()
