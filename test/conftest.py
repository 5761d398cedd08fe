"""Shared pytest setup: OpenMP behaviour for host-compiled kernels and the `slow` marker."""

import atexit
import os
import shutil
import tempfile

import pytest

# Host kernels run with OpenMP inside rank threads (or MPI ranks) that may outnumber the cores:
# idle OpenMP threads must sleep, not spin, or they starve the ranks they wait for. libgomp
# reads these once, when the first kernel library loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "2")

# The suite's kernels, plans and machine profiles go to a cache of its own (made here, in the
# first process, and inherited by xdist workers and the MPI ranks they launch): a profile
# probed while the suite loads the machine must not become the user's, which `--schedule auto`
# would then rank with until the cache is cleared (a kernel launch measured at 159 us instead
# of 13 us: every prediction 2-3x off).
if "COCONET_CACHE_DIR" not in os.environ:
    _SUITE_CACHE = tempfile.mkdtemp(prefix="coconet-test-cache-")
    os.environ["COCONET_CACHE_DIR"] = _SUITE_CACHE
    atexit.register(shutil.rmtree, _SUITE_CACHE, ignore_errors=True)

# Host kernels build at -O0 here (toolchain/host_compiler.py): the same values as at -O3 (the
# flags fix the arithmetic), and the suite compiles hundreds of one-use kernels (g++ was a
# quarter of its CPU time at -O1; -O0 takes two thirds of that, and its small inputs
# run as fast). The tests that hold the level users run take `product_host_build` (and
# test_lowering's matrix builds the pipelines users run at -O3).
os.environ.setdefault("COCONET_HOST_OPT", "0")

FULL = os.environ.get("COCONET_FULL") == "1"

# Examples whose whole schedule space the generic example sweeps (every enumerated schedule
# equivalent, every listed schedule lowering, every overlap listed) take under COCONET_FULL=1
# only: tens of seconds each, and a test of their own runs every schedule the enumerator
# offers against NumPy (test_loss_scaling.py).
HEAVY_EXAMPLES = frozenset({"adam_loss_scaling"})


def example_params(names):
    """`names` as pytest parameters, the heavy examples marked slow."""
    return [
        pytest.param(n, marks=pytest.mark.slow) if getattr(n, "stem", n) in HEAVY_EXAMPLES else n
        for n in names
    ]


@pytest.fixture
def product_host_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Host kernels built as users build them (-O3), for checks of vectorized code."""
    monkeypatch.setenv("COCONET_HOST_OPT", "3")


def pytest_collection_modifyitems(config, items):
    if FULL:
        return
    skip = pytest.mark.skip(reason="heavier sweep: set COCONET_FULL=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
