"""ZeRO stage 1 on rdmacc: DDP with torch's ZeroRedundancyOptimizer.

    rdmacc-run -n 4 -- python3 examples/zero_train.py
    rdmacc-run -n 4 -- python3 examples/zero_train.py --backend gloo   # the same on gloo

DDP averages the gradients (allreduce per bucket); ZeroRedundancyOptimizer
keeps Adam's state for 1/N of the parameters on each rank, updates those and
broadcasts them from their owner to everyone. At the end the optimizer state
is consolidated on rank 0 (gather by broadcast), as a checkpoint would.
Prints the loss of every step and a checksum of the parameters.
"""

import argparse
import datetime

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import rdmacc_torch  # noqa: F401  (registers the "rdmacc" backend)


def make_model():
    torch.manual_seed(4321)
    return nn.Sequential(nn.Linear(24, 80), nn.Tanh(), nn.Linear(80, 80), nn.Tanh(),
                         nn.Linear(80, 40), nn.Tanh(), nn.Linear(40, 3))


def batch(step, rank, size=40):
    g = torch.Generator().manual_seed(7000 * step + rank)
    x = torch.randn(size, 24, generator=g)
    return x, torch.sin(x[:, :3])


def train(steps=5, process_group=None, log=print):
    """Trains for `steps` steps; returns (parameters, the consolidated
    optimizer state on rank 0 or None elsewhere)."""
    rank = dist.get_rank(process_group)
    model = DistributedDataParallel(make_model(), process_group=process_group,
                                    bucket_cap_mb=0.01)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                  process_group=process_group, lr=0.01)
    for step in range(steps):
        x, y = batch(step, rank)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        log(f"rank {rank} step {step} loss {loss.item():.6f}")
    opt.consolidate_state_dict(to=0)
    state = opt.state_dict() if rank == 0 else None
    return [p.detach().clone() for p in model.parameters()], state


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="rdmacc", help="torch.distributed backend")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    dist.init_process_group(args.backend, timeout=datetime.timedelta(minutes=5))
    params, state = train(args.steps, log=lambda s: print(s, flush=True))
    checksum = sum(p.double().sum().item() for p in params)
    print(f"rank {dist.get_rank()} parameter checksum {checksum:.9f}", flush=True)
    if state is not None:
        print(f"rank 0 consolidated optimizer state for {len(state['state'])} parameters",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
