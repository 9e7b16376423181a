#!/usr/bin/env python3
"""Store requests per group formation grow with N, not N x N: forms groups of
4 and 16 ranks (one allreduce) under rdmacc-run, reads the request count the
launcher's store server logs at exit (debug level), and fails unless each is
at most 2 N + 4 (one record per rank: a set and one multiGet) and the count
grows linearly (16 ranks <= 4.5x 4). Usage: store_requests.py RUN PERF
[shm|rdma]; rdma connects on first use (RDMACC_CONNECT=lazy), where the
addresses and the group secret travel with the host records."""
import os
import re
import subprocess
import sys

run, perf = sys.argv[1], sys.argv[2]
transport = sys.argv[3] if len(sys.argv) > 3 else "shm"
counts = {}
for n in (4, 16):
    env = dict(os.environ, RDMACC_LOG_LEVEL="debug", RDMACC_TRANSPORT=transport)
    if transport == "rdma":
        env["RDMACC_CONNECT"] = "lazy"
    p = subprocess.run([run, "-n", str(n), "--timeout", "400s", "--", perf, "-c", "allreduce",
                        "-b", "8", "-e", "8", "-n", "1", "-w", "0", "--check"],
                       env=env, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    m = re.search(r"store server: served (\d+) requests", out)
    if p.returncode != 0 or not m:
        print(out[-3000:])
        sys.exit(f"store_requests: {n} ranks: exit {p.returncode}, no request count in the output")
    counts[n] = int(m.group(1))
    line = re.search(r"store server: served .*", out).group(0)
    print(f"{n} ranks: {line}")
bad = [f"{n} ranks took {c} requests (limit 2 N + 4 = {2 * n + 4})"
       for n, c in counts.items() if c > 2 * n + 4]
if counts[16] > 4.5 * counts[4]:
    bad.append(f"16 ranks took {counts[16] / counts[4]:.1f}x the requests of 4 (linear: 4x)")
if bad:
    sys.exit("store_requests: " + "; ".join(bad))
print("store_requests: linear in N")
