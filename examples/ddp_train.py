"""Data-parallel training over RDMA: a small model, DDP on the rdmacc backend.

    rdmacc-run -n 2 -- python3 examples/ddp_train.py
    torchrun --nproc_per_node 2 --redirects 1 --tee 1 examples/ddp_train.py
    python3 examples/ddp_train.py --backend gloo     # the same run on torch's gloo

Every rank trains on its own synthetic batch; DDP averages the gradients with
allreduce (one per gradient bucket), broadcasts the initial parameters and
the BatchNorm buffers. Prints the loss of every step on every rank.
"""

import argparse
import datetime

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import rdmacc_torch  # noqa: F401  (registers the "rdmacc" backend)


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
    for step in range(steps):
        x, y = batch(step, rank)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        log(f"rank {rank} step {step} loss {loss.item():.6f}")
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="rdmacc", help="torch.distributed backend")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    dist.init_process_group(args.backend, timeout=datetime.timedelta(minutes=5))
    model = train(args.steps, log=lambda s: print(s, flush=True))
    checksum = sum(p.double().sum().item() for p in model.parameters())
    print(f"rank {dist.get_rank()} parameter checksum {checksum:.9f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
