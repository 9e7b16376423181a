"""One rank of tools/benchmark-groups (run under rdmacc-run with a torch
python): forms the world group on BACKEND, then a 2 x (N/2) and a 2 x 2 x
(N/4) DeviceMesh, an all_reduce on every group after each step, and prints
one JSON line of what this process holds after each: threads, memory pinned
for the device (VmPin: registrations) and resident memory.

    rdmacc-run -n 8 -- python tools/groups_probe.py rdmacc|gloo
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import rdmacc_torch  # noqa: F401  (registers the "rdmacc" backend)


def status_mib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return 0.0


def sample():
    return {"threads": len(os.listdir("/proc/self/task")), "pinned_mib": status_mib("VmPin:"),
            "resident_mib": status_mib("VmRSS:")}


def exercise(groups):
    rank = dist.get_rank()
    for group in groups:
        t = torch.full((1024,), float(rank))
        dist.all_reduce(t, group=group)
        members = dist.get_process_group_ranks(group) if group is not None else range(
            dist.get_world_size())
        assert t[0].item() == float(sum(members)), (t[0].item(), list(members))


def main():
    backend = sys.argv[1]
    dist.init_process_group(backend)
    size = dist.get_world_size()
    if size % 4:
        raise SystemExit(f"groups_probe.py: needs a multiple of 4 ranks, not {size}")
    steps = []
    exercise([None])
    steps.append(("world", sample()))
    mesh2 = init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("a", "b"))
    exercise([mesh2.get_group(d) for d in ("a", "b")])
    steps.append((f"+ 2x{size // 2} mesh", sample()))
    mesh3 = init_device_mesh("cpu", (2, 2, size // 4), mesh_dim_names=("x", "y", "z"))
    exercise([mesh3.get_group(d) for d in ("x", "y", "z")])
    steps.append((f"+ 2x2x{size // 4} mesh", sample()))
    dist.barrier()
    print("groups-probe " + json.dumps({"backend": backend, "rank": dist.get_rank(),
                                        "steps": steps}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
