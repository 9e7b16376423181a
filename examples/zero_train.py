"""ZeRO stage 1 on rdmacc: DDP with torch's ZeroRedundancyOptimizer.

    rdmacc-run -n 4 -- python3 examples/zero_train.py
    rdmacc-run -n 4 -- python3 examples/zero_train.py --backend gloo   # the same on gloo

DDP averages the gradients (allreduce per bucket); ZeroRedundancyOptimizer
keeps Adam's state for 1/N of the parameters on each rank, updates those and
broadcasts them from their owner to everyone. At the end the optimizer state
is consolidated on rank 0 (gather by broadcast), as a checkpoint would.
Prints the loss of every step and a checksum of the parameters.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from example_common import fit, run


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
    fit(model, opt, batch, steps, rank, log)
    opt.consolidate_state_dict(to=0)
    state = opt.state_dict() if rank == 0 else None
    return [p.detach().clone() for p in model.parameters()], state


def main():
    def train_and_report(steps, log):
        params, state = train(steps, log=log)
        if state is not None:
            log(f"rank 0 consolidated optimizer state for {len(state['state'])} parameters")
        return params

    run(__doc__, train_and_report)


if __name__ == "__main__":
    main()
