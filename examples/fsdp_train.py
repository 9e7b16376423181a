"""Fully sharded data parallel on rdmacc: FSDP2 (`fully_shard`) on CPU.

    rdmacc-run -n 4 -- python3 examples/fsdp_train.py
    torchrun --nproc_per_node 4 examples/fsdp_train.py
    rdmacc-run -n 4 -- python3 examples/fsdp_train.py --backend gloo   # the same on gloo

Each rank holds 1/N of every parameter (a DTensor sharded on dim 0). Before
each layer's forward and backward, FSDP all-gathers the layer's parameters
(all_gather_into_tensor); after backward it reduce-scatters the gradients
(reduce_scatter_tensor, averaged), so each rank updates only its shard.
Needs torch >= 2.6 (fully_shard on CPU). Prints the loss of every step and a
checksum of the full parameters.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from example_common import fit, run


def make_model():
    torch.manual_seed(1234)  # the same on every rank: fully_shard keeps each rank's slice
    return nn.Sequential(nn.Linear(32, 96), nn.ReLU(), nn.Linear(96, 96), nn.ReLU(),
                         nn.Linear(96, 4))


def batch(step, rank, size=48):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, 32, generator=g)
    y = (x[:, :4] * 2.0 + 0.1 * torch.randn(size, 4, generator=g)).tanh()
    return x, y


def train(mesh: DeviceMesh, steps=5, log=print):
    """Trains for `steps` steps with every Linear sharded over `mesh` (1-D);
    returns the full parameters (all-gathered), in order."""
    model = make_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    rank = mesh.get_local_rank()
    fit(model, opt, batch, steps, rank, log)
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def main():
    run(__doc__, lambda steps, log: train(init_device_mesh("cpu", (dist.get_world_size(),)), steps, log))


if __name__ == "__main__":
    main()
