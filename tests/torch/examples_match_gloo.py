"""examples/{fsdp,zero,device_mesh}_train.py on rdmacc against the same runs
on gloo (torch >= 2.6; 4 ranks for the 2x2 mesh, any even number works).

rdmacc is the default group; gloo gets the same ranks as its own groups. Each
example's full parameters after its 5 steps must be bit-identical on every
rank and equal to gloo's to float tolerance; the mesh's sub-groups must be
rdmacc's (not a silent fallback) and their collectives correct.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import device_mesh_train  # noqa: E402
import fsdp_train  # noqa: E402
import zero_train  # noqa: E402


def flat(tensors):
    return torch.cat([t.detach().double().flatten() for t in tensors])


def gloo_mesh(shape, names):
    """The same mesh as init_device_mesh(shape) builds, over gloo groups."""
    ranks = torch.arange(dist.get_world_size()).view(shape)
    groups = []
    for dim in range(len(shape)):
        mine = None
        for row in ranks.movedim(dim, -1).reshape(-1, shape[dim]).tolist():
            group = dist.new_group(row, backend="gloo")
            if dist.get_rank() in row:
                mine = group
        groups.append(mine)
    return DeviceMesh.from_group(groups if len(groups) > 1 else groups[0], "cpu", mesh=ranks,
                                 mesh_dim_names=names)


def backend_name(group):
    return group._get_backend(torch.device("cpu")).name()


def compare(what, on_rdmacc, on_gloo, gloo_world, same_on_all_ranks=True):
    rank, size = dist.get_rank(), dist.get_world_size()
    everyone = [torch.empty_like(on_rdmacc) for _ in range(size)]
    dist.all_gather(everyone, on_rdmacc, group=gloo_world)
    ok = True
    for r, other in enumerate(everyone):
        if same_on_all_ranks and not torch.equal(other, on_rdmacc):
            print(f"rank {rank}: {what}: parameters differ from rank {r}'s by up to "
                  f"{(other - on_rdmacc).abs().max().item():.3g}", flush=True)
            ok = False
    try:
        torch.testing.assert_close(on_rdmacc, on_gloo, rtol=1e-5, atol=1e-6)
    except AssertionError as e:
        print(f"rank {rank}: {what}: rdmacc and gloo differ: {e}", flush=True)
        ok = False
    print(f"rank {rank}: {what}: {on_rdmacc.numel()} values, identical on all ranks: "
          f"{all(torch.equal(o, on_rdmacc) for o in everyone)}, max |rdmacc - gloo| = "
          f"{(on_rdmacc - on_gloo).abs().max().item():.3g}", flush=True)
    return ok


def main():
    dist.init_process_group("rdmacc", timeout=datetime.timedelta(minutes=2))
    size = dist.get_world_size()
    gloo_world = dist.new_group(backend="gloo")
    quiet = lambda s: None  # noqa: E731
    ok = True

    # FSDP2 over a 1-D mesh: all_gather_into_tensor and reduce_scatter_tensor.
    mesh = init_device_mesh("cpu", (size,))
    assert backend_name(mesh.get_group()) == "rdmacc", backend_name(mesh.get_group())
    ok &= compare("fsdp", flat(fsdp_train.train(mesh, 5, log=quiet)),
                  flat(fsdp_train.train(DeviceMesh.from_group(gloo_world, "cpu"), 5, log=quiet)),
                  gloo_world)

    # ZeRO-1: DDP's allreduce and the optimizer's broadcasts, then a
    # consolidated state on rank 0.
    params, state = zero_train.train(5, log=quiet)
    gloo_params, gloo_state = zero_train.train(5, process_group=gloo_world, log=quiet)
    ok &= compare("zero", flat(params), flat(gloo_params), gloo_world)
    if state is not None:
        for key in state["state"]:
            for name, value in state["state"][key].items():
                if torch.is_tensor(value):
                    torch.testing.assert_close(value, gloo_state["state"][key][name])

    # A 2-D mesh: its sub-groups' collectives, then HSDP over it.
    shape = device_mesh_train.mesh_shape(size)
    mesh2 = init_device_mesh("cpu", shape, mesh_dim_names=device_mesh_train.DIMS)
    for dim in device_mesh_train.DIMS:
        assert backend_name(mesh2.get_group(dim)) == "rdmacc", (dim, backend_name(mesh2.get_group(dim)))
    gloo2 = gloo_mesh(shape, device_mesh_train.DIMS)
    checked = flat(device_mesh_train.check_sub_groups(mesh2))
    ok &= compare("sub-group collectives", checked,
                  flat(device_mesh_train.check_sub_groups(gloo2)), gloo_world,
                  same_on_all_ranks=False)
    ok &= compare("hsdp", flat(device_mesh_train.train(mesh2, 5, log=quiet)),
                  flat(device_mesh_train.train(gloo2, 5, log=quiet)), gloo_world)

    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
