"""What every example shares: the training loop, and the command line
(--backend, --steps) with the process group around a run and the checksum
line the examples print at the end."""

import argparse
import datetime

import torch.distributed as dist
import torch.nn as nn

import rdmacc_torch  # noqa: F401  (registers the "rdmacc" backend)


def fit(model, opt, batch, steps, rank, log):
    """`steps` steps of MSE regression on batch(step, rank), logging each loss."""
    for step in range(steps):
        x, y = batch(step, rank)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        log(f"rank {rank} step {step} loss {loss.item():.6f}")


def run(doc, train):
    """Parses --backend and --steps, forms the default group, calls
    train(steps, log) (which returns the parameters), prints their checksum."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--backend", default="rdmacc", help="torch.distributed backend")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    dist.init_process_group(args.backend, timeout=datetime.timedelta(minutes=5))
    params = train(args.steps, lambda s: print(s, flush=True))
    checksum = sum(p.double().sum().item() for p in params)
    print(f"rank {dist.get_rank()} parameter checksum {checksum:.9f}", flush=True)
    dist.destroy_process_group()
