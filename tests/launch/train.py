"""The smallest PyTorch program on rdmacc: init_process_group from the
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), one allreduce
checked, one barrier. tests/launch/launch.py runs it under srun."""

import torch
import torch.distributed as dist

import rdmacc_torch  # noqa: F401  (registers the "rdmacc" backend)

dist.init_process_group("rdmacc")
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.full((1024,), float(rank + 1))
dist.all_reduce(t)
expected = size * (size + 1) / 2
assert torch.all(t == expected), f"rank {rank}: got {t[0].item()}, expected {expected}"
dist.barrier()
print(f"rank {rank} of {size}: allreduce ok", flush=True)
dist.destroy_process_group()
