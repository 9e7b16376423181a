"""Data-parallel training over RDMA: a small model, DDP on the rdmacc backend.

    rdmacc-run -n 2 -- python3 examples/ddp_train.py
    torchrun --nproc_per_node 2 --redirects 1 --tee 1 examples/ddp_train.py
    python3 examples/ddp_train.py --backend gloo     # the same run on torch's gloo

Every rank trains on its own synthetic batch; DDP averages the gradients with
allreduce (one per gradient bucket), broadcasts the initial parameters and
the BatchNorm buffers. Prints the loss of every step on every rank.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from example_common import fit, run


def make_model():
    torch.manual_seed(1234 + dist.get_rank())  # different on each rank: DDP broadcasts rank 0's
    return nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64),
                         nn.ReLU(), nn.Linear(64, 4))


def batch(step, rank, size=64):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, 32, generator=g)
    y = (x[:, :4] * 2.0 + 0.1 * torch.randn(size, 4, generator=g)).tanh()
    return x, y


def train(steps=5, process_group=None, log=print, bucket_cap_mb=0.01):
    """Trains for `steps` steps; returns the DDP-wrapped model. A tiny bucket
    cap gives several gradient buckets, so backward overlaps allreduces."""
    rank = dist.get_rank()
    model = DistributedDataParallel(make_model(), process_group=process_group,
                                    bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    fit(model, opt, batch, steps, rank, log)
    return model


def main():
    run(__doc__, lambda steps, log: list(train(steps, log=log).parameters()))


if __name__ == "__main__":
    main()
