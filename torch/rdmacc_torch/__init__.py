"""rdmacc as a torch.distributed backend.

    import torch.distributed as dist
    import rdmacc_torch  # registers the backend "rdmacc"
    dist.init_process_group("rdmacc")  # under torchrun or rdmacc-run

CPU tensors of dtype float32, float64, float16, bfloat16, int8, uint8, int32,
int64 and bool; every collective of torch.distributed, point-to-point calls,
subgroups (new_group) and DDP. Configuration: the RDMACC_* environment
variables (see docs/configuration.md and docs/pytorch.md).
"""

import torch.distributed as _dist

from ._C import ProcessGroupRdmacc, create_process_group

__all__ = ["ProcessGroupRdmacc", "create_process_group", "BACKEND"]

BACKEND = "rdmacc"

# register_backend asserts on a second registration (importlib.reload, or two
# copies of the package on sys.path): register once per interpreter.
if BACKEND.upper() not in _dist.Backend._plugins:
    _dist.Backend.register_backend(BACKEND, create_process_group, extended_api=True)
