"""Shared pytest setup: OpenMP behaviour for host-compiled kernels and the `slow` marker."""

import os

import pytest

# Host kernels run with OpenMP inside rank threads (or MPI ranks) that may outnumber the cores:
# idle OpenMP threads must sleep, not spin, or they starve the ranks they wait for. libgomp
# reads these once, when the first kernel library loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "2")

FULL = os.environ.get("COCONET_FULL") == "1"


def pytest_collection_modifyitems(config, items):
    if FULL:
        return
    skip = pytest.mark.skip(reason="heavier sweep: set COCONET_FULL=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
