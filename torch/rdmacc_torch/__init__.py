"""rdmacc as a torch.distributed backend (PyTorch >= 2.0, and Debian's 1.13).

    import torch.distributed as dist
    import rdmacc_torch  # registers the backend "rdmacc"
    dist.init_process_group("rdmacc")  # under torchrun or rdmacc-run

CPU tensors of dtype float32, float64, float16, bfloat16, int8, uint8, int32,
int64 and bool; every collective of torch.distributed, point-to-point calls,
subgroups (new_group) and DDP. Configuration: the RDMACC_* environment
variables (see docs/configuration.md and docs/pytorch.md).
"""

import re as _re

import torch as _torch
import torch.distributed as _dist

from ._build import TORCH_VERSION as BUILT_FOR_TORCH

try:
    from ._C import BACKEND_API, BackendRdmacc, ProcessGroupRdmacc, __version__, create_process_group
except ImportError as _e:
    _running = _re.match(r"[0-9.]*", _torch.__version__).group(0)
    if _running != BUILT_FOR_TORCH:
        raise ImportError(
            f"rdmacc_torch was built for torch {BUILT_FOR_TORCH}, this is torch {_torch.__version__}: "
            "rebuild it for this torch with `pip install --no-build-isolation --force-reinstall .` "
            f"in rdmacc's source tree (the import failed with: {_e})"
        ) from _e
    raise

__all__ = ["BackendRdmacc", "ProcessGroupRdmacc", "backend_of", "create_process_group", "BACKEND"]

BACKEND = "rdmacc"


def _create_backend(*args, **kwargs):
    """create_process_group, and the group's default backend type when torch
    left it undefined. torch (2.x) sets it for "cpu:X,..." specs only when a
    plugin's upper-case registry name equals the spec's lower-case backend
    name, which never holds; a group without one warns "No backend of type 0
    found" at destroy_process_group. The group being built is the caller's
    local `pg` (torch.distributed's _new_process_group_helper)."""
    backend = create_process_group(*args, **kwargs)
    try:
        import inspect

        frame = inspect.currentframe().f_back
        pg = frame.f_locals.get("pg") if frame is not None else None
        if isinstance(pg, _dist.ProcessGroup) and pg.name() == "undefined":
            pg._set_default_backend(_dist.ProcessGroup.BackendType.CUSTOM)
    except Exception:  # a torch without these internals: only the warning remains
        pass
    return backend

# register_backend asserts on a second registration (importlib.reload, or two
# copies of the package on sys.path): register once per interpreter.
if BACKEND.upper() not in _dist.Backend._plugins:
    if BACKEND_API:
        # torch >= 2.0: a c10d::Backend for CPU tensors, so that
        # init_process_group("cpu:rdmacc,cuda:nccl") routes CPU tensors here.
        _dist.Backend.register_backend(BACKEND, _create_backend, extended_api=True, devices=["cpu"])
    else:
        _dist.Backend.register_backend(BACKEND, create_process_group, extended_api=True)


def backend_of(group=None):
    """The BackendRdmacc behind a process group (default: the default group),
    for rdmacc's own methods (register_memory, deregister_memory). On torch
    >= 2.0 a ProcessGroup holds one backend per device and rdmacc is the CPU
    one; on 1.13 the group is rdmacc's object itself."""
    pg = group if group is not None else _dist.distributed_c10d._get_default_group()
    if BACKEND_API:
        import torch

        pg = pg._get_backend(torch.device("cpu"))
    if not isinstance(pg, BackendRdmacc):
        raise RuntimeError(f"rdmacc_torch.backend_of: the group's CPU backend is {type(pg).__name__}, not rdmacc")
    return pg
