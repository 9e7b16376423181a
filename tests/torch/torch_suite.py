"""PyTorch's own distributed test suite, run against rdmacc.

torch.testing._internal.distributed.distributed_test (DistributedTest.
_DistTestBase) driven the way PyTorch's test/distributed/
test_distributed_spawn.py drives it, with rdmacc registered as a plug-in
backend (DistTestCases.backend_feature["plugin"]); the tests that torch gates
on the name "gloo" (its CPU backend) are gated for rdmacc the same way, so
both backends face the same tests. Every test spawns (or with --fork forks)
WORLD_SIZE processes that rendezvous through a file store; their ranks share
this host, so rdmacc talks through shared memory unless RDMACC_TRANSPORT says
otherwise.

    BACKEND=rdmacc WORLD_SIZE=2 python torch_suite.py --selection suite-2.x.txt [--fork] [--report R.json]
    BACKEND=gloo WORLD_SIZE=3 python torch_suite.py --all --report gloo.json

--selection FILE runs the tests the file names (suite-2.x.txt for torch 2.x,
suite-1.13.txt for 1.13: the tests that pass on gloo on this machine, the
ones left out with their reasons; --fork: each test's ranks forked from
this process, not spawned);
every one must pass; a skip counts as a failure unless it is for the world
size (as on gloo). --all runs the whole suite
(skips allowed), as for a gloo baseline. --report writes each test's outcome
as JSON. Without these, unittest's own arguments (TestDistBackendWithSpawn.
test_broadcast, -k ...).
"""

import functools
import json
import os
import sys
import unittest

if "BACKEND" not in os.environ or "WORLD_SIZE" not in os.environ:
    sys.exit("torch_suite.py: set BACKEND (rdmacc or gloo) and WORLD_SIZE (2, 3, 4)")

BACKEND = os.environ["BACKEND"]
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if BACKEND == "rdmacc":
    import rdmacc_torch  # noqa: F401,E402  (registers the backend)

    # What PyTorch's suite offers a third-party backend: the plug-in set, and
    # the features rdmacc has on CPU (DDP, subgroups). The decorators read
    # these when distributed_test is imported, so before that.
    DistTestCases.backend_feature["plugin"].add(BACKEND)
    DistTestCases.backend_feature["ddp"].add(BACKEND)
    DistTestCases.backend_feature["subgroup"].add(BACKEND)
    # Many CPU tests are gated on the name: @require_backend_is_available(
    # {"gloo"}), BACKEND != "gloo". Their decorators are evaluated as for
    # gloo (the same tests run on both), while the process groups are
    # rdmacc's: the module's BACKEND (what init_process_group, new_group and
    # the test bodies read) is "rdmacc" once the decorators are done.
    os.environ["BACKEND"] = "gloo"

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

os.environ["BACKEND"] = BACKEND
distributed_test.BACKEND = BACKEND


# --fork starts each test's ranks by fork() from this process, which has
# imported torch already, instead of spawning interpreters that import it
# again, most of a test's time on a small machine (the test command's
# choice). No process group exists here before the fork. PyTorch's own CI
# spawns (its fork variant went with CUDA), and so does the tool that
# checks the selection against gloo (tools/torch-suite).
START = "fork" if "--fork" in sys.argv else "spawn"


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if START == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


# Tests whose bodies pick their CPU code path by the backend's name
# (`if BACKEND == "mpi" or BACKEND == "gloo":` builds the CPU model; any
# other name builds none and fails with UnboundLocalError before the first
# collective). They run on rdmacc's groups with the module's BACKEND reading
# "gloo" during the body only; the wrapper checks that the default group is
# rdmacc's, so the name picks the path and nothing else.
BODY_PICKS_CPU_PATH_BY_NAME = [
    "test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_accumulate_gradients_no_sync_grad_is_view",
]


def _cpu_path_by_name(name):
    original = getattr(DistributedTest._DistTestBase, name)

    @functools.wraps(original)
    def test(self):
        assert dist.get_backend() == BACKEND, dist.get_backend()
        distributed_test.BACKEND = "gloo"
        try:
            return original(self)
        finally:
            distributed_test.BACKEND = BACKEND

    return test


if BACKEND != "gloo":
    for _name in BODY_PICKS_CPU_PATH_BY_NAME:
        if hasattr(DistributedTest._DistTestBase, _name):
            setattr(TestDistBackendWithSpawn, _name, _cpu_path_by_name(_name))


def read_selection(path):
    """The tests a selection file names: one per line, `NAME`; `- NAME: reason` documents a
    test that is left out and why; # starts a comment."""
    names, excluded = [], {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("-"):
                name, _, reason = line[1:].partition(":")
                if not reason.strip():
                    sys.exit(f"{path}:{number}: an excluded test needs its reason")
                excluded[name.strip()] = reason.strip()
                continue
            name, *extra = line.split()
            if extra:
                sys.exit(f"{path}:{number}: one test name per line, not {line!r}")
            names.append(name)
    known = set(unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn))
    stale = [n for n in excluded if n not in known]
    if stale:
        sys.exit(f"{path}: excluded tests not in this torch's suite: {', '.join(stale)}")
    both = [n for n in names if n in excluded]
    if both:
        sys.exit(f"{path}: both selected and excluded: {', '.join(both)}")
    return names


def run_selection(names, report=None, skips_fail=True):
    """Runs the named tests; every one must pass (a skip is a failure too,
    unless skips_fail is False: the selection holds tests that run and pass
    on gloo). Writes {name: "ok" | "failed" | "skipped: why"} to `report`
    (JSON) when given. Returns the exit status."""
    known = set(unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn))
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"torch_suite.py: not in this torch's suite ({dist.__file__}): {', '.join(unknown)}")
        return 2
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    outcome = {n: "ok" for n in names}
    for t, _ in result.failures + result.errors:
        outcome[t.id().rsplit(".", 1)[-1]] = "failed"
    for t, why in result.skipped:
        outcome[t.id().rsplit(".", 1)[-1]] = f"skipped: {why}"
    if report:
        with open(report, "w") as f:
            json.dump(outcome, f, indent=1, sort_keys=True)
    # A test for another world size skips on gloo too; any other skip of a
    # selected test means rdmacc was not tested.
    bad = {
        n: o
        for n, o in outcome.items()
        if o == "failed" or (skips_fail and o != "ok" and "world size" not in o.lower())
    }
    passed = sum(o == "ok" for o in outcome.values())
    print(f"torch_suite.py: {BACKEND}, {os.environ['WORLD_SIZE']} ranks, torch {torch.__version__}: "
          f"{passed} of {len(names)} tests passed")
    for name, what in sorted(bad.items()):
        print(f"  {name}: {what}")
    return 1 if bad else 0


def option(name):
    if name not in sys.argv:
        return None
    i = sys.argv.index(name)
    return sys.argv[i + 1]


def main():
    report = option("--report")
    if option("--selection"):
        names = read_selection(option("--selection"))
        sys.exit(run_selection(names, report))
    if "--all" in sys.argv:
        names = unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn)
        sys.exit(run_selection(list(names), report, skips_fail=False))
    run_tests()


if __name__ == "__main__":
    main()
