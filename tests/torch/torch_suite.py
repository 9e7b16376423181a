"""PyTorch's own distributed test suite, run against rdmacc.

torch.testing._internal.distributed.distributed_test (DistributedTest.
_DistTestBase) driven the way PyTorch's test/distributed/
test_distributed_spawn.py drives it, with rdmacc registered as a plug-in
backend (DistTestCases.backend_feature["plugin"]); the tests that torch gates
on the name "gloo" (its CPU backend) are gated for rdmacc the same way, so
both backends face the same tests. Every test spawns
WORLD_SIZE processes that rendezvous through a file store; their ranks share
this host, so rdmacc talks through shared memory unless RDMACC_TRANSPORT says
otherwise.

    BACKEND=rdmacc WORLD_SIZE=2 python torch_suite.py [--selection FILE] [unittest args]

BACKEND=gloo runs the same selection on gloo (what tools/torch-suite compares
against). --selection FILE names the tests to run, one per line (# comments);
tests/torch/suite-selection.txt is the project's, with the excluded tests and
their reasons.
"""

import os
import sys
import unittest

if "BACKEND" not in os.environ or "WORLD_SIZE" not in os.environ:
    sys.exit("torch_suite.py: set BACKEND (rdmacc or gloo) and WORLD_SIZE (2, 3, 4)")

BACKEND = os.environ["BACKEND"]
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

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


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


def read_selection(path):
    names = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                names.append(line)
    return names


def run_selection(names):
    """Runs the named tests; every one must pass (a skip is a failure here:
    the selection holds tests that run and pass on gloo). Returns the exit
    status."""
    known = set(unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn))
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"torch_suite.py: not in this torch's suite ({dist.__file__}): {', '.join(unknown)}")
        return 2
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    bad = [(t.id().rsplit(".", 1)[-1], "FAILED") for t, _ in result.failures + result.errors]
    bad += [(t.id().rsplit(".", 1)[-1], f"SKIPPED ({why})") for t, why in result.skipped]
    print(f"torch_suite.py: {BACKEND}, {os.environ['WORLD_SIZE']} ranks: "
          f"{result.testsRun - len(bad)} of {len(names)} selected tests passed")
    for name, what in bad:
        print(f"  {name}: {what}")
    return 1 if bad else 0


def main():
    if "--selection" in sys.argv:
        i = sys.argv.index("--selection")
        sys.exit(run_selection(read_selection(sys.argv[i + 1])))
    run_tests()


if __name__ == "__main__":
    main()
