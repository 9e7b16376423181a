"""Failures reach Python (3 ranks): rdmacc's errors come out of work.wait()
as exceptions carrying rdmacc's message, and a killed rank makes the other
ranks' wait() raise within the timeout instead of hanging."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import rdmacc_torch  # noqa: F401

TIMEOUT = datetime.timedelta(seconds=20)
problems = []


def expect_raise(what, work, words, within):
    start = time.monotonic()
    try:
        work.wait()
        problems.append(f"{what}: wait() returned without an error")
        return
    except RuntimeError as e:
        took = time.monotonic() - start
        text = str(e)
    print(f"rank {dist.get_rank()}: {what}: raised after {took * 1000:.0f} ms: {text}", flush=True)
    if not any(w in text for w in words):
        problems.append(f"{what}: message names none of {words}: {text}")
    if took > within:
        problems.append(f"{what}: took {took:.1f} s, more than {within} s")


def main():
    dist.init_process_group("rdmacc", timeout=TIMEOUT)
    rank, size = dist.get_rank(), dist.get_world_size()
    assert size >= 3, "run on 3 or more ranks"

    # 1. Different sizes on different ranks: the call is accepted (each rank's
    # arguments are valid), the protocol check fails, wait() raises on every rank.
    mismatch = dist.new_group(backend="rdmacc", timeout=TIMEOUT)
    t = torch.ones(100 if rank == 0 else 150, dtype=torch.int32)
    expect_raise("mismatched sizes", dist.all_reduce(t, group=mismatch, async_op=True),
                 ["same sizes", "reported a failure"], TIMEOUT.total_seconds() + 5)

    # 1b. A sparse allreduce whose peers send indices outside this rank's
    # tensor (they pass a larger one): rank 0 refuses them naming a peer
    # instead of building a tensor from them (docs/security.md).
    sparse = dist.new_group(backend="rdmacc", timeout=TIMEOUT)
    n = 4 if rank == 0 else 8
    s = torch.sparse_coo_tensor(torch.tensor([[1 if rank == 0 else 6]]), torch.ones(1), (n,))
    try:
        dist.all_reduce(s, group=sparse)
        if rank == 0:
            problems.append("sparse indices out of range: all_reduce returned")
    except RuntimeError as e:
        print(f"rank {rank}: sparse indices out of range: {e}", flush=True)
        if rank != 0 or "rank 1 sent index 6" not in str(e):
            problems.append(f"sparse indices out of range: {e}")

    # 2. The last rank dies while the others are in a 1 MiB allreduce (which
    # cannot complete without it; the C++ failure tests kill a rank mid-transfer).
    killed = dist.new_group(backend="rdmacc", timeout=TIMEOUT)
    victim = size - 1
    dist.barrier(group=killed)
    if rank == victim:
        time.sleep(0.2)
        sys.stdout.flush()
        os._exit(0)  # no goodbye, as in a crash: the kernel closes the connections
    work = dist.all_reduce(torch.ones(1 << 18), group=killed, async_op=True)
    expect_raise("peer killed during an allreduce", work, [f"rank {victim}"],
                 TIMEOUT.total_seconds() + 5)
    # Later operations on the broken group fail at once.
    expect_raise("next op after the failure", dist.barrier(group=killed, async_op=True),
                 [f"rank {victim}", "broken", "failed"], 2)
    # The rest of the program goes on with the survivors' own resources.
    for p in problems:
        print(f"rank {rank}: PROBLEM {p}", file=sys.stderr, flush=True)
    print(f"rank {rank}: {len(problems)} problems", flush=True)
    # Stay a moment: a survivor that exits at once would be one more
    # departed peer in the messages of survivors that are slower to notice.
    time.sleep(2)
    os._exit(1 if problems else 0)  # the default group still counts the victim: no teardown barrier


if __name__ == "__main__":
    main()
