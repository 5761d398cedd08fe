"""Computation fused into the pipeline send (lowering/fused_send.py): `fuse(sliced-send)` on
examples/pipeline_boundary.mlir computes the stage's output slice and stores it straight into
the next stage's receive buffer, in one kernel; across nodes the send is a library send.

Plan-level checks, the host kernels on every rank (threads, symmetric memory) against the sim
oracle at 2 and 4 ranks, NVRTC. Real MPI ranks: test/mpi/test_hierarchical_mpi.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import coconet
from coconet.compile import apply_schedule
from coconet.lowering.lower_to_plan import LaunchConfig, lower
from coconet.lowering.plan import Collective, Launch, PeerTable, RankValue
from coconet.runtime import sim
from coconet.runtime.threaded import ThreadedExecutor
from coconet.toolchain.nvrtc import compile_cuda, nvrtc_available

EXAMPLE = Path(__file__).parents[2] / "examples" / "pipeline_boundary.mlir"


def scheduled(name: str):
    return apply_schedule(coconet.load(EXAMPLE), name)


def send_launch(plan) -> Launch:
    (launch,) = [s for s in plan.steps if isinstance(s, Launch) and "send" in s.kernel]
    return launch


def test_the_send_kernel_computes_and_pushes_into_the_receiver():
    plan = lower(scheduled("fuse(sliced-send)"), 4)
    # No library send: the kernel's stores are the send.
    assert not any(isinstance(s, Collective) and s.op == "send" for s in plan.steps)
    launch = send_launch(plan)
    tables = [a for a in launch.args if isinstance(a, PeerTable)]
    received = next(a.buffer for a in tables if a.buffer.kind != "scratch")
    assert received.symmetric
    assert received.name == "recv_s"
    assert all(a.span == (0,) for a in tables)  # the stage axis
    ranks = {a.label: a.table for a in launch.args if isinstance(a, RankValue)}
    assert ranks["send_to"] == (1, 1, -1, -1)  # stage 0 -> stage 1; the last stage: nobody
    assert ranks["receives"] == (0, 0, 1, 1)  # stage 0 receives zeros
    # The all_gather of the next stage reads what the kernel pushed.
    ag = next(s for s in plan.steps if isinstance(s, Collective) and s.op == "all_gather")
    assert ag.src is received
    # The computation is inside the send kernel: bias, dropout, residual, then the push.
    text = plan.cuda_source
    body = text[text.index(f"COCO_KERNEL({launch.kernel},") :]
    body = body[: body.index("COCO_KERNEL_BODY_END")]
    for piece in ("coco.add %biased_s", "coco.dropout", "coco.add %out_s"):
        assert piece in body
    push = "if (send_to >= 0) ((coco_f16*)recv_s_peers[send_to])[i] = "
    assert push in body
    assert "// comm.send into the receiver" in body
    assert body.index("coco.add %out_s") < body.index(push)
    assert "coco_peers_entry" in body
    assert "coco_peers_done" in body


def test_plain_sliced_send_keeps_the_library_send():
    plan = lower(scheduled("sliced-send"), 4)
    assert any(isinstance(s, Collective) and s.op == "send" for s in plan.steps)
    assert "comm.send into the receiver" not in plan.cuda_source


def test_stages_on_different_nodes_send_through_the_library():
    plan = lower(scheduled("fuse(sliced-send)"), 4, None, (0, 0, 1, 1))
    sends = [s for s in plan.steps if isinstance(s, Collective) and s.op == "send"]
    assert len(sends) == 1
    assert "comm.send into the receiver" not in plan.cuda_source
    # Stages within one node push: (0, 1, 0, 1) puts stage 0 and 1 of each rank together.
    plan = lower(scheduled("fuse(sliced-send)"), 4, None, (0, 1, 0, 1))
    assert not any(isinstance(s, Collective) and s.op == "send" for s in plan.steps)


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize(
    "schedule",
    ["fuse(sliced-send)", "ol(mm,rs)+fuse(sliced-send)", "ol(mm,rs,fuse(sliced-send),ag)"],
)
def test_host_kernels_match_the_oracle(ranks, schedule):
    program = scheduled(schedule)
    for config in (LaunchConfig(), LaunchConfig(block=1, max_blocks=3)):
        plan = lower(program, ranks, config)
        assert not any(isinstance(s, Collective) and s.op == "send" for s in plan.steps)
        inputs = sim.prepare_inputs(program, None, plan.grid_shape, seed=ranks)
        want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks)
        runner = ThreadedExecutor(plan)
        for _ in range(2):  # a second step reuses the receive buffers: epochs, flags
            got = runner.run({k: v.copy() for k, v in inputs.items()})
            for out, value in want.outputs.items():
                assert np.array_equal(got[out], value), f"{schedule} at {ranks}: {out}"


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
@pytest.mark.parametrize("schedule", ["fuse(sliced-send)", "ol(mm,rs,fuse(sliced-send),ag)"])
def test_send_kernel_compiles_with_nvrtc(schedule):
    plan = lower(scheduled(schedule), 4)
    assert "comm.send into the receiver" in plan.cuda_source
    for arch in ("sm_80", "sm_90"):
        assert compile_cuda(plan.cuda_source, arch, warnings_as_errors=True).binary


@pytest.mark.parametrize("ranks", [2, 4])
def test_chunked_send_across_nodes_matches_the_oracle(ranks):
    """The RS/send/AG overlap with the stages on different nodes: per chunk, the computation
    kernel and a library send of its rows (threads over the in-process communicator)."""
    program = scheduled("ol(mm,rs,fuse(sliced-send),ag)")
    nodes = tuple(range(ranks)) if ranks == 2 else (0, 0, 1, 1)
    plan = lower(program, ranks, None, nodes)
    sends = [s for s in plan.steps if isinstance(s, Collective) and s.op == "send"]
    piece_rows = 2 * 16 // (ranks // 2)  # [2, 16, 64] split on dim 1 over the stage's ranks
    assert [s.rows for s in sends] == [
        (k * piece_rows // 4, (k + 1) * piece_rows // 4) for k in range(4)
    ]
    inputs = sim.prepare_inputs(program, None, plan.grid_shape, seed=ranks)
    want = sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks)
    got = ThreadedExecutor(plan).run({k: v.copy() for k, v in inputs.items()})
    for out, value in want.outputs.items():
        assert np.array_equal(got[out], value), out
