"""examples/ddp_train.py on rdmacc against the same run on gloo (2+ ranks).

After the example's 5 steps with DDP on the rdmacc default group, the
parameters must be bit-identical on every rank and equal (to float
tolerance) to the same training run on a gloo group over the same ranks.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import ddp_train  # noqa: E402


def flat(tensors):
    return torch.cat([t.detach().double().flatten() for t in tensors])


def main():
    dist.init_process_group("rdmacc", timeout=datetime.timedelta(minutes=2))
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    rdmacc_model = ddp_train.train(5, log=lambda s: print("rdmacc:", s, flush=True))
    gloo_model = ddp_train.train(5, process_group=gloo, log=lambda s: print("gloo:", s, flush=True))
    # Parameters: the same on every rank. BatchNorm's running statistics are
    # per rank (DDP broadcasts rank 0's before each forward), so they are
    # compared with gloo's only.
    on_rdmacc, on_gloo = flat(rdmacc_model.parameters()), flat(gloo_model.parameters())
    buffers_rdmacc, buffers_gloo = flat(rdmacc_model.buffers()), flat(gloo_model.buffers())
    everyone = [torch.empty_like(on_rdmacc) for _ in range(size)]
    dist.all_gather(everyone, on_rdmacc, group=gloo)
    ok = True
    for r, other in enumerate(everyone):
        if not torch.equal(other, on_rdmacc):
            print(f"rank {rank}: parameters differ from rank {r}'s by up to "
                  f"{(other - on_rdmacc).abs().max().item():.3g}", flush=True)
            ok = False
    for what, mine, theirs in (("parameters", on_rdmacc, on_gloo),
                               ("buffers", buffers_rdmacc, buffers_gloo)):
        try:
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
        except AssertionError as e:
            print(f"rank {rank}: rdmacc and gloo {what} differ: {e}", flush=True)
            ok = False
    moved = (on_rdmacc - flat(ddp_train.make_model().parameters())).abs().max().item()
    print(f"rank {rank}: {on_rdmacc.numel()} values identical on all ranks: "
          f"{all(torch.equal(o, on_rdmacc) for o in everyone)}, max |rdmacc - gloo| = "
          f"{(on_rdmacc - on_gloo).abs().max().item():.3g}, moved from init by {moved:.3g}",
          flush=True)
    # The DDP models hold their groups (through their Reducers). Dropping
    # them first leaves the last reference to the gloo group with Python's
    # holder, which releases the GIL while ~ProcessGroupGloo joins its
    # threads; a Reducer dropped after destroy_process_group would destroy
    # the group with the GIL held, and gloo's worker thread, freeing the last
    # all_gather's tensors, waits for the GIL: a hang in torch itself (1 run
    # in ~10 here before this order).
    del rdmacc_model, gloo_model
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
