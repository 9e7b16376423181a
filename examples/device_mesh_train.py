"""A 2-D DeviceMesh on rdmacc: hybrid sharding (HSDP) and collectives on the
mesh's sub-groups.

    rdmacc-run -n 4 -- python3 examples/device_mesh_train.py           # a 2x2 mesh
    rdmacc-run -n 4 -- python3 examples/device_mesh_train.py --backend gloo

The mesh is (replicate, shard) = (2, N/2): ranks {0,1} and {2,3} each hold
one full copy of the model, sharded between them (FSDP2 on the "shard"
dimension: all-gather and reduce-scatter inside the pair); the two copies
average their gradients with an allreduce on the "replicate" dimension
({0,2} and {1,3}). Before training, each dimension's group runs an
all_reduce, an all_gather and a broadcast that check themselves. Needs
torch >= 2.6 and an even number of ranks.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from example_common import fit, run

DIMS = ("replicate", "shard")


def mesh_shape(world_size):
    if world_size % 2:
        raise SystemExit(f"device_mesh_train.py: needs an even number of ranks, not {world_size}")
    return (2, world_size // 2)


def check_sub_groups(mesh: DeviceMesh):
    """Collectives on each dimension's group; returns what they gave."""
    rank = dist.get_rank()
    results = []
    for dim in DIMS:
        group = mesh.get_group(dim)
        members = dist.get_process_group_ranks(group)
        total = torch.tensor([float(rank)])
        dist.all_reduce(total, group=group)
        assert total.item() == sum(members), (dim, total.item(), members)
        gathered = [torch.empty(2, dtype=torch.int64) for _ in members]
        dist.all_gather(gathered, torch.tensor([rank, rank * rank]), group=group)
        assert [g.tolist() for g in gathered] == [[r, r * r] for r in members], (dim, gathered)
        root = members[-1]
        value = torch.full((3,), float(rank))
        dist.broadcast(value, src=root, group=group)
        assert value.tolist() == [float(root)] * 3, (dim, value)
        results += [total, *gathered, value]
    return results


def make_model():
    torch.manual_seed(99)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
                         nn.Linear(64, 2))


def batch(step, rank, size=32):
    g = torch.Generator().manual_seed(31 * step + rank)
    x = torch.randn(size, 16, generator=g)
    return x, torch.stack([x[:, 0] * x[:, 1], x[:, 2].abs()], dim=1)


def train(mesh: DeviceMesh, steps=5, log=print):
    """HSDP over the 2-D mesh; returns the full parameters."""
    model = make_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rank = dist.get_rank()
    fit(model, opt, batch, steps, rank, log)
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def main():
    def train_on_mesh(steps, log):
        mesh = init_device_mesh("cpu", mesh_shape(dist.get_world_size()), mesh_dim_names=DIMS)
        check_sub_groups(mesh)
        log(f"rank {dist.get_rank()} sub-group collectives on {mesh} correct")
        return train(mesh, steps, log)

    run(__doc__, train_on_mesh)


if __name__ == "__main__":
    main()
