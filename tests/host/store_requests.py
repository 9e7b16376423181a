#!/usr/bin/env python3
"""Store requests per group formation grow with N, not N x N: forms groups of
4 and 16 ranks (one allreduce) under rdmacc-run, reads the request counts the
launcher's store server logs at exit (debug level), and fails unless the
records (every request but `check`) are at most 2 N + 4 (one record per
rank: a set and one multiGet) and grow linearly (16 ranks <= 4.5x 4).
`check` requests are the eager formation's looks for an "abort" key (a few
per rank, at doubling gaps while it waits: at most 4 N here); other modes
make none beyond the 2 N + 4. Usage: store_requests.py RUN PERF
[shm|rdma|rdma-eager]; rdma connects on first use (RDMACC_CONNECT=lazy),
rdma-eager at formation (4 and 8 ranks: its slots ride the hellos, its
addresses and the group secret the host records)."""
import os
import re
import subprocess
import sys

run, perf = sys.argv[1], sys.argv[2]
transport = sys.argv[3] if len(sys.argv) > 3 else "shm"
counts = {}
eager = transport == "rdma-eager"
sizes = (4, 8) if eager else (4, 16)
records, checks = {}, {}
for n in sizes:
    env = dict(os.environ, RDMACC_LOG_LEVEL="debug",
               RDMACC_TRANSPORT="rdma" if eager else transport)
    if transport.startswith("rdma"):
        env["RDMACC_CONNECT"] = "eager" if eager else "lazy"
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
    c = re.search(r"check (\d+)", line)
    checks[n] = int(c.group(1)) if c else 0
    records[n] = counts[n] - checks[n] if eager else counts[n]
    print(f"{n} ranks: {line}")
bad = [f"{n} ranks made {c} record requests (limit 2 N + 4 = {2 * n + 4})"
       for n, c in records.items() if c > 2 * n + 4]
bad += [f"{n} ranks looked for an abort {c} times (limit 4 N = {4 * n})"
        for n, c in checks.items() if eager and c > 4 * n]
small, large = sizes
if records[large] > 1.125 * (large / small) * records[small]:
    bad.append(f"{large} ranks took {records[large] / records[small]:.1f}x the requests of "
               f"{small} (linear: {large / small:.0f}x)")
if bad:
    sys.exit("store_requests: " + "; ".join(bad))
print("store_requests: linear in N")
