"""Launches as a cluster job does: Open MPI's mpirun and Slurm's srun (a
single-node Slurm of the test's own, tools/slurm-sandbox), both through
their PMIx servers, and the commands docs/multi-node.md shows. Each case
runs a command that docs/multi-node.md contains verbatim (build/ stands for
BIN_DIR, venv/bin/python for PYTHON), so the docs cannot drift from what
was run.

    python3 tests/launch/launch.py CASE BIN_DIR REPO_DIR [PYTHON]

CASE: mpirun (C++ ranks bootstrapped through PMIx, no MASTER_ADDR),
mpirun-env (the same with RDMACC_BOOTSTRAP=env and MASTER_ADDR: the store
path the first is measured against), srun (srun --mpi=pmix in the
sandbox), srun-no-pmix (srun --mpi=none and no MASTER_ADDR: the error says
what to do), srun-torch (a PyTorch program under srun, as the docs map
SLURM_* to RANK/WORLD_SIZE).
"""

import os
import re
import shlex
import socket
import subprocess
import sys

CASE, BIN, REPO = sys.argv[1], sys.argv[2], sys.argv[3]
PYTHON = sys.argv[4] if len(sys.argv) > 4 else ""
DOC = open(os.path.join(REPO, "docs", "multi-node.md")).read()
SANDBOX = os.path.join(REPO, "tools", "slurm-sandbox")


def doc_command(command):
    """The command as docs/multi-node.md shows it (continuation lines
    joined), with build/ and venv/bin/python pointed at this build."""
    joined = re.sub(r" *\\\n\s*", " ", DOC)
    if command not in joined:
        sys.exit(f"docs/multi-node.md no longer shows `{command}`: update the docs or this test")
    command = command.replace("build/", BIN + "/")
    return command.replace("venv/bin/python", PYTHON)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(**extra):
    env = dict(os.environ)
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    # root in CI, and 8 ranks on a 2-CPU machine: what a user's
    # mpirun does not need on a cluster, given without changing the command.
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", RDMACC_LOG_LEVEL="info")
    env.update(extra)
    return env


def run(argv, env, timeout=300):
    print("+", " ".join(shlex.quote(a) for a in argv), flush=True)
    p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    print(p.stdout[-6000:])
    return p


def expect_checked(p, ranks, launcher):
    """rc 0, every element checked right, and every rank says how it was launched."""
    if p.returncode != 0:
        sys.exit(f"exit status {p.returncode}")
    if "# Out of bounds values : 0 OK" not in p.stdout:
        sys.exit("rdmacc-perf --check did not report 0 wrong elements")
    if launcher == "PMIx":
        lines = re.findall(r"rank (\d+) of (\d+)(?: \(local rank \d+\))? bootstrapped through "
                           r"(PMIx)", p.stdout)
    else:
        lines = re.findall(r"rank (\d+) of (\d+) \(group 'default'\).*?launcher: ([^;]*);",
                           p.stdout)
    if sorted(int(r) for r, _, _ in lines) != list(range(ranks)):
        sys.exit(f"expected a startup line from each of {ranks} ranks, got {len(lines)}")
    for rank, size, how in lines:
        if int(size) != ranks or launcher not in how:
            sys.exit(f"rank {rank}: size {size}, launcher '{how}' (expected {ranks}, '{launcher}')")
    if os.environ.get("RDMACC_TRANSPORT") == "rdma":  # the device variant
        over_rdma = p.stdout.count(f"0 peer(s) through shared memory, {ranks - 1} through RDMA")
        if over_rdma != ranks:
            sys.exit(f"RDMACC_TRANSPORT=rdma: {over_rdma} of {ranks} ranks reached every peer "
                     "through RDMA")
        if not re.search(r"^# rdmacc .* RDMACC_TRANSPORT=rdma, RDMA port \S+:\d+$", p.stdout,
                         re.M):
            sys.exit("rdmacc-perf's header does not name the RDMA port")


def sandbox(command, env, timeout=300):
    return run([SANDBOX, "--", "sh", "-c", command], env, timeout)


if CASE == "mpirun":
    cmd = doc_command("mpirun -n 8 build/rdmacc-perf -c allreduce -b 8 -e 1M --check")
    expect_checked(run(shlex.split(cmd), environment()), 8, "PMIx")
elif CASE == "mpirun-env":
    cmd = doc_command("mpirun -n 8 build/rdmacc-perf -c allreduce -b 8 -e 1M --check")
    env = environment(RDMACC_BOOTSTRAP="env", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    argv = shlex.split(cmd)
    argv[1:1] = ["-x", "MASTER_ADDR", "-x", "MASTER_PORT"]
    expect_checked(run(argv, env), 8, "OMPI_COMM_WORLD_RANK")
elif CASE == "srun":
    cmd = doc_command("srun --mpi=pmix -n 8 build/rdmacc-perf -c allreduce -b 8 -e 1M --check")
    p = sandbox(cmd, environment())
    expect_checked(p, 8, "PMIx")
elif CASE == "srun-no-pmix":
    p = sandbox(f"srun --mpi=none -n 2 {BIN}/rdmacc-perf -c allreduce -b 8 -e 8", environment())
    if p.returncode == 0:
        sys.exit("2 ranks without PMIx or MASTER_ADDR formed a group")
    if "MASTER_ADDR/MASTER_PORT are not set" not in p.stdout or "--mpi=pmix" not in p.stdout:
        sys.exit("the error does not say that MASTER_ADDR is missing and --mpi=pmix is the fix")
elif CASE == "srun-torch":
    cmd = doc_command("srun --cpu-bind=cores --export=ALL,OMP_NUM_THREADS=1 sh -c "
                      "'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID "
                      "exec venv/bin/python train.py'")
    cmd = cmd.replace("train.py", os.path.join(REPO, "tests", "launch", "train.py"))
    env = environment(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), SLURM_NTASKS="4")
    p = sandbox(cmd, env)
    if p.returncode != 0:
        sys.exit(f"exit status {p.returncode}")
    done = re.findall(r"rank (\d) of 4: allreduce ok", p.stdout)
    if sorted(done) != ["0", "1", "2", "3"]:
        sys.exit(f"expected 4 ranks to report, got {sorted(done)}")
else:
    sys.exit(f"unknown case {CASE}")
print(f"launch {CASE}: ok")
