"""Every torch.distributed collective on the rdmacc backend against torch's gloo.

Run on N ranks (rdmacc-run -n N -- python3 tests/torch/collectives.py, or
torchrun). The default group is rdmacc; a gloo group over the same ranks (TCP)
computes the reference. Where gloo 1.13 lacks a dtype (bfloat16, bool), an op
(AVG, PREMUL_SUM) or a collective (reduce_scatter, _allgather_base, list
alltoall), the reference is built from gloo collectives it has (float32
copies, SUM then scale, allreduce then slice, all_gather then cat).

Inputs are small integers, so every dtype holds every partial result exactly
and results must be bit-identical whatever the reduction order; one case per
float dtype uses random reals and compares with a tolerance. Every collective
runs synchronously and with async_op=True (wait, is_completed, get_future),
on the whole world and on a new_group subgroup. Exits non-zero naming every
mismatch.
"""

import datetime
import sys
import warnings

import torch
import torch.distributed as dist

import rdmacc_torch

TIMEOUT = datetime.timedelta(seconds=120)
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16]
INTS = (torch.int32, torch.int64)
SIZES = [7, 33000]  # 33000 float32 = 132 KB: crosses rdmacc's 64 KiB chunks

failures = []
checks = 0


def fail(what):
    failures.append(what)
    print(f"rank {dist.get_rank()}: MISMATCH {what}", file=sys.stderr, flush=True)


def same(name, got, want, exact=True):
    """Compares tensors or lists of tensors; records a failure with details."""
    global checks
    checks += 1
    if isinstance(got, (list, tuple)):
        if len(got) != len(want):
            fail(f"{name}: {len(got)} tensors, want {len(want)}")
            return
        for i, (g, w) in enumerate(zip(got, want)):
            same(f"{name}[{i}]", g, w, exact)
        return
    if got.dtype != want.dtype or got.shape != want.shape:
        fail(f"{name}: got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}")
    elif exact and not torch.equal(got, want):
        bad = (got != want).nonzero()[:3].flatten().tolist()
        fail(f"{name}: differs at {bad}: got {got.flatten()[:6].tolist()} want {want.flatten()[:6].tolist()}")
    elif not exact:
        try:
            torch.testing.assert_close(got, want)
        except AssertionError as e:
            fail(f"{name}: {str(e).splitlines()[0]}")


def values(shape, dtype, seed, low=-3, high=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=g).to(dtype)


def gloo_dtype(dtype):
    """The dtype gloo computes a reference in (exact for our small integers)."""
    return torch.float32 if dtype == torch.bfloat16 else dtype


class Case:
    """Runs one collective on rdmacc (sync or async) and checks the outputs."""

    def __init__(self, group, gloo, members):
        self.group, self.gloo, self.members = group, gloo, members
        self.rank = dist.get_rank()
        self.n = len(members)
        self.me = members.index(self.rank)

    def run(self, name, call, outputs, want, exact=True):
        """call(group, async_op) issues the collective; outputs() returns what it wrote."""
        for async_op in (False, True):
            label = f"{name} {'async' if async_op else 'sync'} n={self.n}"
            try:
                work = call(self.group, async_op)
                if async_op:
                    if work is None:
                        fail(f"{label}: async_op=True returned no work")
                        continue
                    if isinstance(work, torch._C.Future):
                        # the *_coalesced calls hand back the work's future
                        fut = work.wait()
                    else:
                        if work.wait() is not True:
                            fail(f"{label}: wait() did not return True")
                        if not work.is_completed():
                            fail(f"{label}: not completed after wait()")
                        fut = work.get_future().wait()
                    if not isinstance(fut, list):
                        fail(f"{label}: future value is {type(fut)}, want a list of tensors")
            except Exception as e:  # a failure here is a finding, keep going in step
                fail(f"{label}: raised {type(e).__name__}: {e}")
                continue
            same(label, outputs(), want, exact)


def suite(group, gloo, members, dtypes, sizes):
    c = Case(group, gloo, members)
    rank, n, me = c.rank, c.n, c.me
    for dtype in dtypes:
        ref = gloo_dtype(dtype)
        for numel in sizes:
            tag = f"{str(dtype).replace('torch.', '')} numel={numel}"
            seed = 1000 * rank + numel

            # broadcast from every member
            for root in members:
                want = values([numel], dtype, 1000 * root + numel)
                holder = {}

                def bcast(g, a, root=root):
                    holder["t"] = values([numel], dtype, seed)
                    return dist.broadcast(holder["t"], root, group=g, async_op=a)
                c.run(f"broadcast root={root} {tag}", bcast, lambda: holder["t"], want)

            # all_reduce: reference from gloo (in float32 for bfloat16)
            ops = ["SUM", "PRODUCT", "MIN", "MAX"] + (["BAND", "BOR", "BXOR"] if dtype in INTS else [])
            for opname in ops:
                op = getattr(dist.ReduceOp, opname)
                expect = values([numel], dtype, seed).to(ref)
                dist.all_reduce(expect, op=op, group=gloo)
                expect = expect.to(dtype)

                def allreduce(g, a, op=op):
                    holder["t"] = values([numel], dtype, seed)
                    return dist.all_reduce(holder["t"], op=op, group=g, async_op=a)
                c.run(f"all_reduce {opname} {tag}", allreduce, lambda: holder["t"], expect)

            if dtype.is_floating_point:
                # AVG and PREMUL_SUM (gloo has neither): gloo SUM, then scale.
                total = values([numel], dtype, seed).to(torch.float64)
                dist.all_reduce(total, group=gloo)

                def avg(g, a):
                    holder["t"] = values([numel], dtype, seed)
                    return dist.all_reduce(holder["t"], op=dist.ReduceOp.AVG, group=g, async_op=a)
                c.run(f"all_reduce AVG {tag}", avg, lambda: holder["t"], (total / n).to(dtype),
                      exact=False)

                def premul(g, a):
                    holder["t"] = values([numel], dtype, seed)
                    return dist.all_reduce(holder["t"], op=dist._make_nccl_premul_sum(0.5), group=g,
                                           async_op=a)
                c.run(f"all_reduce PREMUL_SUM(0.5) {tag}", premul, lambda: holder["t"],
                      (total * 0.5).to(dtype))

                # random reals: reduction order may differ from gloo's, compare with tolerance
                if numel == sizes[-1] and dtype in (torch.float32, torch.float64):
                    g = torch.Generator().manual_seed(seed)
                    reals = torch.randn(numel, generator=g, dtype=dtype)
                    expect = reals.clone()
                    dist.all_reduce(expect, group=gloo)

                    def real_sum(g, a):
                        holder["t"] = reals.clone()
                        return dist.all_reduce(holder["t"], group=g, async_op=a)
                    c.run(f"all_reduce SUM random reals {tag}", real_sum, lambda: holder["t"],
                          expect, exact=False)

            # reduce to the last member
            root = members[-1]
            expect = values([numel], dtype, seed).to(ref)
            dist.reduce(expect, root, op=dist.ReduceOp.SUM, group=gloo)
            expect = expect.to(dtype)

            def reduce(g, a):
                holder["t"] = values([numel], dtype, seed)
                return dist.reduce(holder["t"], root, group=g, async_op=a)
            c.run(f"reduce root={root} {tag}", reduce,
                  lambda: holder["t"] if rank == root else expect, expect)

            # all_gather (list) and _all_gather_base / all_gather_into_tensor
            mine = values([numel], dtype, seed)
            expect = [torch.empty(numel, dtype=ref) for _ in range(n)]
            dist.all_gather(expect, mine.to(ref), group=gloo)
            expect = [e.to(dtype) for e in expect]

            def allgather(g, a):
                holder["l"] = [torch.full([numel], 99, dtype=dtype) for _ in range(n)]
                return dist.all_gather(holder["l"], mine, group=g, async_op=a)
            c.run(f"all_gather {tag}", allgather, lambda: holder["l"], expect)

            def allgather_base(g, a):
                holder["t"] = torch.full([n * numel], 99, dtype=dtype)
                return dist._all_gather_base(holder["t"], mine, group=g, async_op=a)
            c.run(f"_all_gather_base {tag}", allgather_base, lambda: holder["t"], torch.cat(expect))

            if numel != sizes[0]:
                continue  # the rest: small tensors only

            # gather / scatter at the first member
            root = members[0]

            def gather(g, a):
                holder["l"] = [torch.zeros(numel, dtype=dtype) for _ in range(n)] if rank == root else None
                return dist.gather(mine, holder["l"], root, group=g, async_op=a)
            c.run(f"gather root={root} {tag}", gather,
                  lambda: holder["l"] if rank == root else expect, expect)

            pieces = [values([numel], dtype, 7000 + 10 * root + i) for i in range(n)]

            def scatter(g, a):
                holder["t"] = torch.zeros(numel, dtype=dtype)
                return dist.scatter(holder["t"], pieces if rank == root else None, root, group=g,
                                    async_op=a)
            c.run(f"scatter root={root} {tag}", scatter, lambda: holder["t"], pieces[me])

            # reduce_scatter (list and tensor forms): gloo allreduce, then my block
            blocks = [values([numel], dtype, seed + 17 * i) for i in range(n)]
            expect = torch.cat(blocks).to(ref)
            dist.all_reduce(expect, group=gloo)
            expect = expect.to(dtype)[me * numel:(me + 1) * numel]

            def reduce_scatter(g, a):
                holder["t"] = torch.zeros(numel, dtype=dtype)
                return dist.reduce_scatter(holder["t"], blocks, group=g, async_op=a)
            c.run(f"reduce_scatter {tag}", reduce_scatter, lambda: holder["t"], expect)

            def reduce_scatter_base(g, a):
                holder["t"] = torch.zeros(numel, dtype=dtype)
                return dist._reduce_scatter_base(holder["t"], torch.cat(blocks), group=g, async_op=a)
            c.run(f"_reduce_scatter_base {tag}", reduce_scatter_base, lambda: holder["t"], expect)

            # all_to_all_single: even split of a 2-D tensor (rows), then uneven splits
            rows = values([n * 2, 3], dtype, seed)
            expect = torch.empty_like(rows.to(ref))
            dist.all_to_all_single(expect, rows.to(ref), group=gloo)
            expect = expect.to(dtype)

            def a2a_even(g, a):
                holder["t"] = torch.zeros_like(rows)
                return dist.all_to_all_single(holder["t"], rows, group=g, async_op=a)
            c.run(f"all_to_all_single even {tag}", a2a_even, lambda: holder["t"], expect)

            # rank i sends (i + j) % 3 rows to rank j
            send_splits = [(me + j) % 3 for j in range(n)]
            recv_splits = [(j + me) % 3 for j in range(n)]
            src = values([sum(send_splits), 2], dtype, seed)
            expect = torch.empty([sum(recv_splits), 2], dtype=ref)
            dist.all_to_all_single(expect, src.to(ref), recv_splits, send_splits, group=gloo)
            expect = expect.to(dtype)

            def a2a_uneven(g, a):
                holder["t"] = torch.zeros([sum(recv_splits), 2], dtype=dtype)
                return dist.all_to_all_single(holder["t"], src, recv_splits, send_splits, group=g,
                                              async_op=a)
            c.run(f"all_to_all_single uneven {tag}", a2a_uneven, lambda: holder["t"], expect)

            # all_to_all (lists): gloo's all_to_all_single on the concatenation
            ins = [values([j + 1], dtype, seed + j) for j in range(n)]
            outs_shape = [me + 1] * n
            flat = torch.empty(sum(outs_shape), dtype=ref)
            dist.all_to_all_single(flat, torch.cat(ins).to(ref), outs_shape, [j + 1 for j in range(n)],
                                   group=gloo)
            expect = list(flat.to(dtype).split(outs_shape))

            def a2a_list(g, a):
                holder["l"] = [torch.zeros(me + 1, dtype=dtype) for _ in range(n)]
                return dist.all_to_all(holder["l"], ins, group=g, async_op=a)
            c.run(f"all_to_all {tag}", a2a_list, lambda: holder["l"], expect)

            # coalesced forms
            pair = [values([numel], dtype, seed), values([3, 2], dtype, seed + 1)]
            expect = [p.to(ref, copy=True) for p in pair]
            dist.all_reduce_coalesced(expect, group=gloo)
            expect = [e.to(dtype) for e in expect]

            def allreduce_coalesced(g, a):
                holder["l"] = [p.clone() for p in pair]
                return dist.all_reduce_coalesced(holder["l"], group=g, async_op=a)
            c.run(f"all_reduce_coalesced {tag}", allreduce_coalesced, lambda: holder["l"], expect)

            expect = [[torch.empty_like(p.to(ref)) for p in pair] for _ in range(n)]
            dist.all_gather_coalesced(expect, [p.to(ref) for p in pair], group=gloo)
            expect = [e.to(dtype) for lst in expect for e in lst]

            def allgather_coalesced(g, a):
                holder["ll"] = [[torch.zeros_like(p) for p in pair] for _ in range(n)]
                return dist.all_gather_coalesced(holder["ll"], pair, group=g, async_op=a)
            c.run(f"all_gather_coalesced {tag}", allgather_coalesced,
                  lambda: [e for lst in holder["ll"] for e in lst], expect)

            # point to point around the ring of members, tags out of order
            right, left = members[(me + 1) % n], members[(me - 1) % n]
            if n > 1:
                a_in, b_in = values([numel], dtype, seed + 5), values([4], dtype, seed + 6)
                a_out, b_out = torch.zeros(numel, dtype=dtype), torch.zeros(4, dtype=dtype)
                works = [dist.isend(a_in, right, group=group, tag=1),
                         dist.isend(b_in, right, group=group, tag=2)]
                works += [dist.irecv(b_out, left, group=group, tag=2),
                          dist.irecv(a_out, left, group=group, tag=1)]
                for w in works:
                    w.wait()
                same(f"isend/irecv tags {tag}", [a_out, b_out],
                     [values([numel], dtype, 1000 * left + numel + 5),
                      values([4], dtype, 1000 * left + numel + 6)])
                out = torch.zeros(numel, dtype=dtype)
                if me % 2 == 0:
                    dist.send(a_in, right, group=group)
                    dist.recv(out, left, group=group)
                else:
                    dist.recv(out, left, group=group)
                    dist.send(a_in, right, group=group)
                same(f"send/recv {tag}", out, values([numel], dtype, 1000 * left + numel + 5))
    # recv from any source: every other member sends its rank to the first
    if n > 1:
        first = members[0]
        if rank == first:
            seen = set()
            for _ in range(n - 1):
                t = torch.zeros(1, dtype=torch.int64)
                src = dist.recv(t, group=group)
                if int(t.item()) != src:
                    fail(f"recv(any source): got {t.item()} from {src}")
                seen.add(src)
            same("recv any source: senders", torch.tensor(sorted(seen)),
                 torch.tensor([m for m in members if m != first]))
        else:
            dist.send(torch.tensor([rank], dtype=torch.int64), first, group=group)
    dist.barrier(group=group)
    w = dist.barrier(group=group, async_op=True)
    w.wait()


def errors_are_clear():
    """Bad input raises at the call on every rank, naming the problem and the fix."""
    expectations = [
        ("non-contiguous", lambda: dist.all_reduce(torch.ones(4, 4).t()), "not contiguous"),
        ("int16", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)), "not supported"),
    ]
    # torch >= 2.0 views complex tensors as real pairs before a backend sees
    # them (gloo and rdmacc alike); 1.13 hands them over and rdmacc refuses.
    if not rdmacc_torch.BACKEND_API:
        expectations.append(("complex", lambda: dist.broadcast(torch.ones(2, dtype=torch.complex64), 0),
                      "not supported"))
    else:
        z = torch.full((3,), complex(dist.get_rank(), 1), dtype=torch.complex64)
        dist.broadcast(z, 0)
        same("complex64 broadcast (as real pairs)", z, torch.full((3,), complex(0, 1), dtype=torch.complex64))
    expectations += [
        ("bitwise on floats", lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND), "band is not defined"),
        ("bad root", lambda: dist.broadcast(torch.ones(2), 99), "99"),
    ]
    for name, call, text in expectations:
        global checks
        checks += 1
        try:
            call()
            fail(f"error case '{name}' did not raise")
        except Exception as e:
            if text not in str(e):
                fail(f"error case '{name}': message lacks '{text}': {e}")


def extras(members):
    """monitored_barrier, sequence numbers: c10d methods outside the dist.* API."""
    pg = dist.distributed_c10d._get_default_group()
    pg.monitored_barrier(datetime.timedelta(seconds=30), wait_all_ranks=True)
    # torch >= 2.0: sequence numbers of a custom backend live on the backend.
    pg = rdmacc_torch.backend_of()
    pg._set_sequence_number_for_group()
    seq = torch.tensor([pg._get_sequence_number_for_group()], dtype=torch.int64)
    allseq = [torch.zeros(1, dtype=torch.int64) for _ in members]
    dist.all_gather(allseq, seq)
    same("sequence numbers agree", allseq, [allseq[0]] * len(members))


def sparse(gloo):
    """allreduce of sparse COO tensors (SUM) against gloo's sparse allreduce:
    overlapping and distinct entries, dense trailing dims, a rank with none."""
    rank, size = dist.get_rank(), dist.get_world_size()
    for dense_dims in ((), (3,)):
        nnz = 0 if rank == 1 else 2 + rank
        g = torch.Generator().manual_seed(100 + rank)
        idx = torch.stack([torch.randint(0, 6, (nnz,), generator=g), torch.randint(0, 5, (nnz,), generator=g)])
        val = torch.randn((nnz, *dense_dims), generator=g)
        mine = torch.sparse_coo_tensor(idx, val, (6, 5, *dense_dims))
        theirs = mine.clone()
        dist.all_reduce(mine)
        dist.all_reduce(theirs, group=gloo)
        same(f"sparse allreduce {dense_dims}", mine.to_dense(), theirs.to_dense(), exact=False)
    try:
        dist.all_reduce(torch.sparse_coo_tensor(idx, val, (6, 5, 3)), op=dist.ReduceOp.MAX)
        fail("sparse allreduce MAX was accepted")
    except RuntimeError as e:
        if "SUM only" not in str(e):
            fail(f"sparse allreduce MAX: unclear error {e}")


def coalescing():
    """torch >= 2.0: batch_isend_irecv and _coalescing_manager go through the
    backend's startCoalescing/endCoalescing and the *_tensor_coalesced ops."""
    rank, size = dist.get_rank(), dist.get_world_size()
    send = torch.full((5,), float(rank))
    recv = torch.zeros(5)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % size),
           dist.P2POp(dist.irecv, recv, (rank - 1) % size)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same("batch_isend_irecv ring", recv, torch.full((5,), float((rank - 1) % size)))
    ins = [torch.full((3,), float(rank * 10 + i)) for i in range(3)]
    outs = [torch.zeros(3 * size) for _ in range(3)]
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for i, o in enumerate(outs):
        want = torch.cat([torch.full((3,), float(r * 10 + i)) for r in range(size)])
        same(f"coalesced all_gather_into_tensor {i}", o, want)
    ins = [torch.arange(2.0 * size) + rank + i for i in range(2)]
    outs = [torch.zeros(2) for _ in range(2)]
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    for i, o in enumerate(outs):
        full = sum(torch.arange(2.0 * size) + r + i for r in range(size))
        same(f"coalesced reduce_scatter_tensor {i}", o, full[2 * rank: 2 * rank + 2])
    # A coalesced all_reduce (the fast path of allreduce_coalesced).
    ts = [torch.full((4,), float(rank + k)) for k in range(2)]
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for k, t in enumerate(ts):
        same(f"coalesced all_reduce {k}", t, torch.full((4,), float(sum(r + k for r in range(size)))))


def registered(gloo):
    """Zero-copy from a registered tensor (64 KiB chunks: at least one message
    above RDMACC_ZERO_COPY_MIN_BYTES), reused across operations, then released."""
    pg = rdmacc_torch.backend_of()
    n = 100_000
    t = torch.zeros(n, dtype=torch.float32)
    pg.register_memory(t)
    for step in range(3):
        t.copy_(values((n,), torch.float32, 500 + step))
        want = t.clone()
        dist.all_reduce(want, group=gloo)
        dist.all_reduce(t)
        same(f"all_reduce from registered memory, round {step}", t, want)
    t.copy_(values((n,), torch.float32, 600))
    want = t.clone()
    dist.broadcast(want, 0, group=gloo)
    dist.broadcast(t, 0)
    same("broadcast from registered memory", t, want)
    pg.deregister_memory(t)
    try:
        pg.deregister_memory(t)
        fail("deregistering twice did not raise")
    except RuntimeError as e:
        if "was not registered" not in str(e):
            fail(f"deregistering twice: unclear message: {e}")


def after_shutdown(pg):
    """destroy_process_group shut the backend down (its connections and
    thread are gone): using it afterwards raises a clear error."""
    global checks
    checks += 1
    try:
        pg.allreduce([torch.ones(4)]).wait()
        fail("allreduce on a backend shut down by destroy_process_group did not raise")
    except RuntimeError as e:
        if "shut down" not in str(e):
            fail(f"allreduce after shutdown: unclear message: {e}")


def main():
    # the underscore and *_coalesced forms warn that they will be renamed
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")
    dist.init_process_group("rdmacc", timeout=TIMEOUT)
    rank, size = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "rdmacc", dist.get_backend()
    world = list(range(size))
    gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    suite(None, gloo, world, DTYPES, SIZES)
    errors_are_clear()
    extras(world)
    sparse(gloo)
    if rdmacc_torch.BACKEND_API:
        coalescing()
    registered(gloo)
    # A subgroup: every rank but rank 1 (ranks 0 and 1 on two ranks).
    sub = [r for r in world if r != 1] if size > 2 else world
    sub_rdmacc = dist.new_group(sub, backend="rdmacc", timeout=TIMEOUT)
    sub_gloo = dist.new_group(sub, backend="gloo", timeout=TIMEOUT)
    if rank in sub:
        suite(sub_rdmacc, sub_gloo, sub, [torch.float32, torch.int64, torch.bfloat16], SIZES[:1])
    dist.barrier()
    pg = rdmacc_torch.backend_of()
    dist.destroy_process_group()
    if rdmacc_torch.BACKEND_API:
        after_shutdown(pg)
    print(f"rank {rank}: {checks} checks, {len(failures)} mismatches", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
