#!/usr/bin/env python3
"""docs/multi-node.md's port table, checked: a C++ program under rdmacc-run
uses the launcher's store (it serves requests), a PyTorch program uses
torch's own store only (the launcher's serves no request and no connection).
The PyTorch program uses init_process_group("cpu:rdmacc") and must end
without torch's "No backend of type 0 found" warning.
The count is the one the launcher's store server logs at exit (debug level).

    store_ports.py RDMACC_RUN RDMACC_PERF PYTHON_WITH_TORCH
"""
import os
import re
import subprocess
import sys
import tempfile

run, perf, python = sys.argv[1:4]
PROGRAM = """
import torch, torch.distributed as dist, rdmacc_torch
dist.init_process_group("cpu:rdmacc")
t = torch.ones(8) * (dist.get_rank() + 1)
dist.all_reduce(t)
assert t.tolist() == [3.0] * 8, t
dist.destroy_process_group()
"""


def served(command):
    env = dict(os.environ, RDMACC_LOG_LEVEL="debug", RDMACC_TRANSPORT="shm")
    p = subprocess.run([run, "-n", "2", "--timeout", "300s", "--"] + command, env=env,
                       capture_output=True, text=True, timeout=400)
    out = p.stdout + p.stderr
    m = re.search(r"store server: served (\d+) requests from (\d+) connections", out)
    if "No backend of type" in out:  # torch's warning at destroy_process_group (docs/pytorch.md)
        print(out[-4000:])
        sys.exit(f"store_ports: {command[0]}: torch warned about the group's default backend")
    if p.returncode != 0 or not m:
        print(out[-4000:])
        sys.exit(f"store_ports: {command[0]}: exit {p.returncode}, no store summary")
    return int(m.group(1)), int(m.group(2))


cpp = served([perf, "-b", "8", "-e", "8", "-n", "1", "-w", "0", "--check"])
print(f"C++ program: the launcher's store served {cpp[0]} requests on {cpp[1]} connections")
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write(PROGRAM)
try:
    py = served([python, f.name])
finally:
    os.unlink(f.name)
print(f"PyTorch program: the launcher's store served {py[0]} requests on {py[1]} connections")
if cpp[0] == 0:
    sys.exit("store_ports: the C++ program did not use rdmacc's store")
if py != (0, 0):
    sys.exit("store_ports: the PyTorch program used rdmacc's store, not only torch's")
print("store_ports: as docs/multi-node.md says")
