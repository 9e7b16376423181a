"""Host test (no device needed): importing rdmacc_torch registers the backend
"rdmacc" once, a second import or a reload is harmless, and on a machine
without an RDMA device init_process_group fails at once with rdmacc's
message instead of hanging."""

import datetime
import importlib
import socket
import sys

import torch.distributed as dist

import rdmacc_torch

assert "RDMACC" in dist.Backend._plugins, dist.Backend._plugins
assert dist.Backend("rdmacc") == "rdmacc"
importlib.reload(rdmacc_torch)  # must not assert "already exist"
# torch >= 2.0: a c10d::Backend (ProcessGroup dispatches to it for "cpu");
# 1.13: a c10d::ProcessGroup.
if rdmacc_torch.BACKEND_API:
    from torch._C._distributed_c10d import Backend as _CBackend
    assert issubclass(rdmacc_torch.BackendRdmacc, _CBackend)
    assert dist.Backend.backend_capability["rdmacc"] == ["cpu"], dist.Backend.backend_capability
else:
    assert issubclass(rdmacc_torch.ProcessGroupRdmacc, dist.ProcessGroup)
assert rdmacc_torch.ProcessGroupRdmacc is rdmacc_torch.BackendRdmacc
assert rdmacc_torch.__version__.count(".") == 2, rdmacc_torch.__version__

with socket.socket() as s:  # a free port for torch's TCPStore
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
try:
    dist.init_process_group("rdmacc", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=30))
except RuntimeError as e:
    # No device here: the message must be rdmacc's and say what to do.
    print(f"init_process_group raised: {e}")
    assert "rdmacc" in str(e) and "RDMA" in str(e), str(e)
else:
    # A device is present: a one-rank group works.
    import torch
    t = torch.arange(4.0)
    dist.all_reduce(t)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0], t
    dist.destroy_process_group()
    print("one-rank group on this machine's RDMA device works")
print("registration OK")
sys.exit(0)
