"""Fused collectives on groups that span nodes lower hierarchically (lowering/hierarchical.py):
intra-node kernels over symmetric memory around library collectives between nodes.

The plan's shape is checked step by step; the host kernels run every rank (threads of this
process, symmetric memory shared only within each declared node) against the sim oracle; the
CUDA text compiles with NVRTC. Real MPI ranks: test/mpi/test_hierarchical_mpi.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import coconet
from coconet.compile import apply_schedule
from coconet.core import values as V
from coconet.lowering.lower_to_plan import LaunchConfig, lower
from coconet.lowering.plan import Collective, Launch, PeerTable
from coconet.runtime import sim
from coconet.runtime.threaded import ThreadedExecutor
from coconet.toolchain.nvrtc import compile_cuda, nvrtc_available

EXAMPLES = Path(__file__).parents[2] / "examples"


def fused(name: str, schedule: str = "fuse(rs-c-ag)"):
    return apply_schedule(coconet.load(EXAMPLES / f"{name}.mlir"), schedule)


def peer_parts(step: Launch) -> set[str]:
    return {a.part for a in step.args if isinstance(a, PeerTable)}


def test_two_nodes_of_two_plan_node_kernels_around_library_collectives():
    plan = lower(fused("adam"), 4, None, (0, 0, 1, 1))
    assert plan.nodes == (0, 0, 1, 1)
    shape = []
    for s in plan.steps:
        if isinstance(s, Collective):
            shape.append(f"{s.op} {s.part}")
        elif isinstance(s, Launch):
            shape.append("node kernel" if peer_parts(s) == {"node"} else "kernel")
            assert peer_parts(s) <= {"node"}  # nothing reaches a rank of another node
    assert shape == [
        "node kernel",  # the node's partial sums of this rank's members' slices
        "reduce_scatter across",  # finished between nodes: this rank's slice
        "kernel",  # Adam on the slice
        "all_gather across",  # the slices of this rank's members across nodes
        "node kernel",  # every node member's pieces into w
    ]
    reduce, gather = (s for s in plan.steps if isinstance(s, Launch) and peer_parts(s))
    assert reduce.kernel.startswith("k_node_reduce")
    assert gather.kernel.startswith("k_node_gather")
    assert "comm.reduce_scatter within the node" in plan.cuda_source
    # Packed partials in double: the nodes' sums are rounded once, between nodes.
    rs = next(s for s in plan.steps if isinstance(s, Collective) and s.op == "reduce_scatter")
    assert rs.src.elt == "f64"
    assert rs.src.count == 2 * rs.dst.count
    assert "reduce_scatter sum %g1_rs_node -> %g1_rs over [0] across nodes" in plan.format()
    assert "peers(%g on node)" in plan.format()


def test_one_node_keeps_the_single_fused_kernel():
    for nodes in ((), (0, 0, 0, 0)):
        plan = lower(fused("adam"), 4, None, nodes)
        assert plan.nodes == ()
        assert not any(isinstance(s, Collective) for s in plan.steps)
        assert [peer_parts(s) for s in plan.steps if isinstance(s, Launch)] == [{"all"}]


def test_groups_within_a_node_stay_fused_on_a_two_axis_grid():
    # pipeline_boundary's collectives span axis 1 of a [2, ?] grid: with 2 ranks per node
    # every group is one node's, so the plan is the single-node one.
    plan = lower(fused("pipeline_boundary"), 4, None, (0, 0, 1, 1))
    assert not any(isinstance(s, Collective) and s.part != "all" for s in plan.steps)
    plan = lower(fused("pipeline_boundary"), 4, None, (0, 1, 2, 3))
    assert any(isinstance(s, Collective) and s.part == "across" for s in plan.steps)


def test_unequal_shares_of_a_group_on_nodes_are_refused():
    with pytest.raises(coconet.CocoError, match=r"\[fused-across-nodes\].*\[3, 1\]"):
        lower(fused("adam"), 4, None, (0, 0, 0, 1))


def test_group_parts():
    nodes = (0, 0, 1, 1, 2, 2)
    group = [0, 1, 2, 3, 4, 5]
    assert V.group_part(group, nodes, "node", 3) == [2, 3]
    assert V.group_part(group, nodes, "across", 3) == [1, 3, 5]
    assert V.part_groups((6,), (0,), nodes, "across") == [[0, 2, 4], [1, 3, 5]]
    assert V.part_groups((2, 3), (1,), (0, 0, 1, 1, 2, 2), "node") == [[0, 1], [2], [3], [4, 5]]
    with pytest.raises(coconet.CocoError, match="fused-across-nodes"):
        V.group_part([0, 1, 2], (0, 0, 1), "across", 0)


CASES = [
    ("adam", 4, 2),
    ("adam_bf16_grads", 4, 2),
    ("lamb", 4, 2),
    ("lamb_scattered", 4, 1),
    ("sgd", 2, 1),
    ("model_parallel_mlp", 4, 2),  # sliced along dim 1: strided pieces
    ("allreduce_rmsnorm", 4, 2),  # row reductions on the slice between the node kernels
]


@pytest.mark.parametrize(("name", "ranks", "per_node"), CASES)
def test_host_kernels_across_nodes_match_the_oracle(name, ranks, per_node):
    program = fused(name)
    for config in (LaunchConfig(), LaunchConfig(block=1, max_blocks=3)):
        plan = lower(program, ranks, config, V.nodes_of(ranks, per_node))
        assert any(isinstance(s, Collective) and s.part == "across" for s in plan.steps)
        inputs = sim.prepare_inputs(program, None, plan.grid_shape, seed=ranks)
        want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks)
        got = ThreadedExecutor(plan).run({k: v.copy() for k, v in inputs.items()})
        for out, value in want.outputs.items():
            # Node partials are combined in double and rounded once: bit for bit here.
            assert np.array_equal(got[out], value), f"{name}: {out}"


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
@pytest.mark.parametrize("name", ["adam_f16_grads", "lamb", "model_parallel_mlp"])
def test_hierarchical_kernels_compile_with_nvrtc(name):
    plan = lower(fused(name), 4, None, (0, 0, 1, 1))
    assert "k_node_gather" in plan.cuda_source
    for arch in ("sm_80", "sm_90"):
        assert compile_cuda(plan.cuda_source, arch, warnings_as_errors=True).binary
