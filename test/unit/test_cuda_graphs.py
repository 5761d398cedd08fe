"""Steps replayed from CUDA graphs (issue #29 item 3), on the strict GPU double.

A plan of kernel launches and events is captured at its second step and replayed from then
on (runtime/executor.py PlanRunner.run). A replay's arguments are frozen at capture, so the
fused collectives' epochs live on the device (coco_device.h coco_epoch_next): these tests
hold the results to the oracle across replays with new inputs each step and a peer late to
every step, after a buffer moved, and through the u32 epochs' wrap-around; and they hold the
double to what a real capture refuses.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FULL
from cuda_double import CaptureError, FakeWorld, StrictDevice, on_fake_gpus

import coconet
from coconet.compile import apply_schedule
from coconet.core import values as V
from coconet.core.program import CocoError, Program, parse_module
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import EPOCH_WORDS, Epoch, Launch, Plan
from coconet.runtime import sim
from coconet.runtime.check import compare_outputs
from coconet.runtime.cuda import GRAPHS_ENV, CudaBackend, graphs_wanted
from coconet.runtime.executor import PlanRunner, graph_refusal
from coconet.toolchain.nvrtc import nvrtc_available

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.skipif(
    not nvrtc_available(), reason="the cuda backend compiles with NVRTC"
)


def pieces_of(plan: Plan, inputs: dict[str, np.ndarray], r: int) -> dict[str, np.ndarray]:
    return {
        name: V.piece_of(inputs[name], buf.type, V.coords_of(r, plan.grid_shape), plan.grid_shape)
        for name, buf in plan.arguments.items()
    }


def outputs(plan: Plan, backend: CudaBackend) -> dict[str, np.ndarray]:
    return {name: backend.read(buf) for name, buf in plan.outputs.items()}


def graph_calls(backend: CudaBackend) -> list[str]:
    device: Any = backend.device
    return [c[0] for c in device.calls if c[0] in ("begin_capture", "end_capture", "replay")]


def scheduled(example: str, spec: str):
    return apply_schedule(coconet.load(EXAMPLES / f"{example}.mlir"), spec)


def oracle(program, inputs: dict[str, np.ndarray], ranks: int):
    return sim.run(program, {k: v.copy() for k, v in inputs.items()}, ranks=ranks, inplace=False)


# ---------------------------------------------------------------------------------------------
# Replays match the oracle
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["fuse(ar-c)", "fuse(rs-c-ag)"])
def test_replays_with_new_inputs_match_the_oracle_with_a_peer_late_every_step(spec):
    """Every step new inputs (copied into the same buffers: one graph), and rank 1 sets its
    own only after a delay: a replayed kernel whose epoch did not advance would pass its
    peers' entry at once and read rank 1's previous input."""
    program = scheduled("allreduce_rmsnorm", spec)
    plan = lower(program, 2)
    assert graph_refusal(plan) is None
    steps = [sim.prepare_inputs(program, None, (2,), seed=s) for s in range(4)]
    want = [oracle(program, inputs, 2).per_rank for inputs in steps]

    def body(r: int, runner: PlanRunner, backend: CudaBackend):
        got = []
        for inputs in steps:
            if r == 1:
                time.sleep(0.05)
            runner.set_inputs(pieces_of(plan, inputs, r))
            runner.run()
            got.append(outputs(plan, backend))
        return got, graph_calls(backend), runner.captures

    results = on_fake_gpus(plan, 2, body)
    for step in range(len(steps)):
        result = compare_outputs([results[r][0][step] for r in range(2)], want[step])
        assert result.ok, f"step {step}: {result}"
    for _got, calls, captures in results:
        # the first step launches, the second is captured and replayed, then replays
        assert calls == ["begin_capture", "end_capture", "replay", "replay", "replay"]
        assert captures == 1


def test_a_moved_buffer_is_captured_again():
    """Device inputs bound in place: the same arrays for three steps (one capture), then new
    ones at other addresses, which move the buffers: the graph, which holds the old
    addresses, is captured again before it replays."""
    program = scheduled("allreduce_rmsnorm", "fuse(ar-c)")
    plan = lower(program, 2)
    steps = [sim.prepare_inputs(program, None, (2,), seed=s) for s in (0, 0, 0, 1)]
    want = [oracle(program, inputs, 2).per_rank for inputs in steps]

    def body(r: int, runner: PlanRunner, backend: CudaBackend):
        device: Any = backend.device
        got, arrays = [], {}
        for i, inputs in enumerate(steps):
            if i in (0, 3):
                arrays = {
                    n: backend.coerce_input(n, device.user_array(np.asarray(v)), plan.arguments[n])
                    for n, v in pieces_of(plan, inputs, r).items()
                }
            runner.set_inputs(arrays, fresh=None if i in (0, 3) else ())
            runner.run()
            got.append(outputs(plan, backend))
        return got, runner.captures, graph_calls(backend)

    results = on_fake_gpus(plan, 2, body)
    for step in range(len(steps)):
        assert compare_outputs([results[r][0][step] for r in range(2)], want[step]).ok
    for _got, captures, calls in results:
        assert captures == 2
        assert calls == [
            "begin_capture",
            "end_capture",
            "replay",
            "replay",
            "begin_capture",
            "end_capture",
            "replay",
        ]


DRIFT = """
func.func @drift(
    %g: !coco.tensor<96xf32, local>,
    %d: !coco.tensor<96xf32, local>,
    %w: !coco.tensor<96xf32>
) attributes {coco.grid = #coco.grid<[?]>} {
  %s = comm.all_reduce sum %g : !coco.tensor<96xf32, local> -> !coco.tensor<96xf32>
  %w1 = coco.add %w, %s : !coco.tensor<96xf32>
  coco.update %w, %w1 : !coco.tensor<96xf32>
  %g1 = coco.add %g, %d : !coco.tensor<96xf32, local>
  coco.update %g, %g1 : !coco.tensor<96xf32, local>
  func.return
}
"""


def start_epochs(plan: Plan, backend: CudaBackend, value: int) -> list[str]:
    """Every flag array of the plan as if `value` launches had run at its site: its flags
    and its counter at `value`, the ticket at 0. The sites, sorted."""
    sites = sorted(
        {
            a.site
            for s in plan.steps
            if isinstance(s, Launch)
            for a in s.args
            if isinstance(a, Epoch)
        }
    )
    for site in sites:
        words = np.asarray(backend.arrays[site]).reshape(-1).view(np.uint32)
        words[:] = np.uint32(value)
        words[-1] = 0
    return sites


def counters(backend: CudaBackend, sites: list[str]) -> list[list[int]]:
    return [
        [int(x) for x in np.asarray(backend.arrays[s]).reshape(-1).view(np.uint32)[-EPOCH_WORDS:]]
        for s in sites
    ]


@pytest.mark.parametrize("spec", ["fuse(ar-c)", "fuse(rs-c-ag)"])
def test_replay_loops_carry_the_epochs_through_their_wrap_around(spec):
    """A long replay loop (10^5 steps under COCONET_FULL=1) of a step whose collective reads
    what the peers' previous step wrote (w += all_reduce(g); g += d), the epochs starting
    just below 2^32 so that they wrap mid-loop: bit for bit NumPy's loop, and each site's
    counter advanced once a step, modulo 2^32."""
    replays = 100_000 if FULL else 2_000
    program = apply_schedule(Program(parse_module(DRIFT)), spec)
    plan = lower(program, 2)
    assert graph_refusal(plan) is None
    rng = np.random.default_rng(7)
    g = rng.standard_normal((2, 96)).astype(np.float32)
    d = (rng.standard_normal((2, 96)) / 64).astype(np.float32)
    w = rng.standard_normal(96).astype(np.float32)
    first = 2**32 - replays // 2

    def body(r: int, runner: PlanRunner, backend: CudaBackend):
        sites = start_epochs(plan, backend, first)
        backend.comm.Barrier()  # no peer's flag store before every rank has set its own
        runner.set_inputs({"g": g[r], "d": d[r], "w": w})
        for _ in range(replays):
            runner.run()
        return outputs(plan, backend), counters(backend, sites), graph_calls(backend)

    results = on_fake_gpus(plan, 2, body)
    want_g, want_w = g.copy(), w.copy()
    for _ in range(replays):
        want_w = want_w + (want_g[0] + want_g[1])
        want_g = want_g + d
    for r, (got, sites, calls) in enumerate(results):
        assert np.array_equal(got["w"], want_w)
        assert np.array_equal(got["g"], want_g[r])
        assert sites
        assert all(c == [(first + replays) % 2**32, 0] for c in sites)
        assert calls.count("begin_capture") == 1
        assert calls.count("replay") == replays - 1


# ---------------------------------------------------------------------------------------------
# When steps are not replayed
# ---------------------------------------------------------------------------------------------


def test_library_steps_and_the_opt_out_launch_every_step(monkeypatch):
    """A plan with a library collective (ar-c: an NCCL call) runs eagerly, saying why; so
    does every plan under COCONET_CUDA_GRAPHS=0; a bad value is one clear error."""
    library = lower(scheduled("allreduce_rmsnorm", "ar-c"), 2)
    refusal = graph_refusal(library)
    assert refusal is not None
    assert "all_reduce" in refusal
    assert "library call" in refusal
    fused = lower(scheduled("allreduce_rmsnorm", "fuse(ar-c)"), 2)
    program = scheduled("allreduce_rmsnorm", "fuse(ar-c)")
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)

    def steps(plan: Plan):
        def body(r: int, runner: PlanRunner, backend: CudaBackend):
            runner.set_inputs(pieces_of(plan, inputs, r))
            for _ in range(3):
                runner.run()
            return graph_calls(backend), runner.graph_refusal, outputs(plan, backend)

        return on_fake_gpus(plan, 2, body)

    for calls, why, _ in steps(library):
        assert calls == []
        assert why == refusal
    monkeypatch.setenv(GRAPHS_ENV, "0")
    want = oracle(program, inputs, 2).per_rank
    results = steps(fused)
    for calls, why, _ in results:
        assert calls == []
        assert why == "off"
    assert compare_outputs([got for _c, _w, got in results], want).ok
    monkeypatch.setenv(GRAPHS_ENV, "yes")
    with pytest.raises(CocoError, match=r"COCONET_CUDA_GRAPHS='yes': use 1 .* or 0"):
        graphs_wanted()


# ---------------------------------------------------------------------------------------------
# The double refuses what a capture does not allow
# ---------------------------------------------------------------------------------------------


def test_the_double_refuses_what_a_capture_does_not_allow():
    device = StrictDevice(FakeWorld())
    s0, s1 = device.stream(0), device.stream(1)
    a = device.zeros((4,), np.dtype(np.float32), s0)
    b = device.zeros((4,), np.dtype(np.float32), s0)
    device.synchronize()
    with pytest.raises(CaptureError, match="legacy"):
        device.begin_capture(device.legacy)
    device.begin_capture(s0)
    for what, call in [
        ("cudaDeviceSynchronize", device.synchronize),
        ("allocation", lambda: device.zeros((4,), np.dtype(np.float32), s0)),
        ("host-to-device", lambda: device.upload(np.ones(4, np.float32), s0)),
        ("device-to-host", lambda: device.download(a, s0)),
        ("second capture", lambda: device.begin_capture(s1)),
    ]:
        with pytest.raises(CaptureError, match=what):
            call()
    device.record("outside", s1)  # s1 is not in the capture: its event is not the capture's
    with pytest.raises(CaptureError, match="recorded outside the capture"):
        device.wait("outside", s0)
    # A side stream forked into the capture must be joined back before it ends.
    device.record("fork", s0)
    device.wait("fork", s1)
    device.copy(b, a, s1)  # recorded, not run
    with pytest.raises(CaptureError, match="StreamCaptureUnjoined"):
        device.end_capture(s0)
    # Again, joined: the replay runs the copy, which the capture only recorded.
    device.begin_capture(s0)
    device.record("fork", s0)
    device.wait("fork", s1)
    device.copy(b, a, s1)
    device.record("join", s1)
    device.wait("join", s0)
    graph = device.end_capture(s0)
    a[:] = 3.0  # array work outside the capture: on the legacy stream
    device.synchronize()
    assert not b.any()
    with pytest.raises(CaptureError, match="array work"):
        device.begin_capture(s0)
        a[:] = 4.0
        device.copy(b, a, s0)
    device.capture = None
    a[:] = 3.0
    device.synchronize()
    graph.launch(s0)
    device.synchronize()
    assert list(b) == [3.0] * 4
    assert graph.replays == 1


@pytest.mark.parametrize("spec", ["ar-c", "fuse(rs-c-ag)"])
def test_a_step_waits_for_its_own_streams_never_the_whole_device(spec):
    """After set-up, steps and the reads of their outputs synchronize this rank's streams
    only (issue #24): a device-wide synchronization would make ranks sharing a GPU wait for
    each other's spinning kernels."""
    program = scheduled("adam", spec)
    plan = lower(program, 2)
    inputs = sim.prepare_inputs(program, None, (2,), seed=0)

    def body(r: int, runner: PlanRunner, backend: CudaBackend):
        device: Any = backend.device
        runner.set_inputs(pieces_of(plan, inputs, r))
        before = len(device.calls)
        for _ in range(3):
            runner.run()
            outputs(plan, backend)
        return [c[0] for c in device.calls[before:]]

    for calls in on_fake_gpus(plan, 2, body):
        assert "synchronize" not in calls
        assert calls.count("sync_streams") >= 3
