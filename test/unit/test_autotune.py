"""The autotuner: the cost model's pieces on synthetic plans, the profile cache, `--schedule
auto` end to end (sim and cpu, with --check), compile(schedule="auto") and coco-tune. No
assertion here depends on how fast this machine is."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from xdsl.dialects.builtin import Float32Type

from coconet.core.program import CocoError, Program, load, mark_symmetric, parse_module
from coconet.dialects.coco import TensorType
from coconet.lowering.lower_to_plan import lower
from coconet.lowering.plan import (
    COMM_STREAM,
    Buffer,
    Collective,
    Launch,
    Matmul,
    Plan,
    RecordEvent,
    WaitEvent,
)
from coconet.runtime.executor import plan_traffic
from coconet.tune.autotune import rank_schedules, resolve_profile, spearman
from coconet.tune.cost_model import (
    PUBLISHED_PROFILES,
    Fabric,
    MachineProfile,
    is_one_shot,
    kernel_exchanges,
    kernel_traffic,
    predict,
    published_profile,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Round numbers, so every expected time below is arithmetic on them.
PROFILE = MachineProfile(
    name="synthetic",
    description="round numbers",
    ranks_per_node=4,
    memory_bandwidth=1e9,
    matmul_flops={"f32": 1e9},
    elementwise_flops=1e12,
    intra=Fabric("intra", 1e8, 1e-3, 5e7),
    inter=Fabric("inter", 1e7, 1e-2),
    peer_bandwidth=1e8,
    launch_overhead=1e-4,
    collective_overhead=2e-4,
    fused_sync=3e-3,
)


def f32(*shape: int) -> TensorType:
    return TensorType(shape, Float32Type())


def buffer(name: str, *shape: int) -> Buffer:
    return Buffer(name, f32(*shape), shape)


def plan_of(steps, grid=(4,), buffers=()) -> Plan:
    return Plan("synthetic", grid, list(buffers), steps, "")


# -- the model's pieces -----------------------------------------------------------------------


def test_collectives_are_alpha_beta_on_the_fabric_the_group_spans():
    src, dst = buffer("x", 1000), buffer("y", 1000)  # 4000 bytes
    n = 4000.0
    ar = Collective("all_reduce", src, dst, kind="sum", axes=(0,))
    t = predict(plan_of([ar]), PROFILE).seconds
    # ring: 2(p-1) alpha + 2(p-1)/p n / reduce_bandwidth, plus the per-call overhead
    assert t == pytest.approx(2e-4 + 6 * 1e-3 + 1.5 * n / 5e7)
    ag = Collective("all_gather", src, dst, axes=(0,))
    assert predict(plan_of([ag]), PROFILE).seconds == pytest.approx(2e-4 + 3e-3 + 0.75 * n / 1e8)
    # 8 ranks, 4 per node: the group crosses nodes and goes at the inter-node fabric's rate
    t8 = predict(plan_of([ag], grid=(8,)), PROFILE).seconds
    assert t8 == pytest.approx(2e-4 + 7 * 1e-2 + 7 / 8 * n / 1e7)


def test_all_to_all_is_priced_as_an_all_gather_of_its_input():
    """(p-1) alpha + (p-1)/p n / beta: each rank keeps its own part of its piece."""
    src, dst = buffer("x", 1000), buffer("y", 1000)
    a2a = Collective("all_to_all", src, dst, axes=(0,))
    assert predict(plan_of([a2a]), PROFILE).seconds == pytest.approx(
        2e-4 + 3e-3 + 0.75 * 4000.0 / 1e8
    )
    assert plan_traffic(plan_of([a2a]), 0) == 3000


def test_overlapped_streams_cost_the_max_not_the_sum():
    a, b, c = buffer("a", 100, 100), buffer("b", 100, 100), buffer("c", 100, 100)
    big_src, big_dst = buffer("g", 250_000), buffer("h", 250_000)
    mm = Matmul(a, b, c)  # 2e6 flops at 1e9 FLOP/s: 2 ms, plus the launch overhead
    coll = Collective("all_reduce", big_src, big_dst, kind="sum", axes=(0,), stream=COMM_STREAM)
    gpu_like = dataclasses.replace(PROFILE, host_serializes_kernels=False)
    t_mm = predict(plan_of([mm]), gpu_like).seconds
    t_coll = predict(plan_of([coll]), gpu_like).seconds
    side_by_side = plan_of([coll, mm, RecordEvent("done", stream=COMM_STREAM), WaitEvent("done")])
    assert predict(side_by_side, gpu_like).seconds == pytest.approx(max(t_mm, t_coll))
    # in order on one stream, the same steps add up
    in_order = plan_of([dataclasses.replace(coll, stream=0), mm])
    assert predict(in_order, gpu_like).seconds == pytest.approx(t_mm + t_coll)
    # a wait makes the compute stream take the collective's end
    waited = plan_of([coll, RecordEvent("e", stream=COMM_STREAM), WaitEvent("e"), mm])
    assert predict(waited, gpu_like).seconds == pytest.approx(t_coll + t_mm)
    # on a host, kernels share one thread but a non-blocking collective still overlaps
    host = dataclasses.replace(PROFILE, host_serializes_kernels=True)
    two_kernels = plan_of([dataclasses.replace(mm, stream=COMM_STREAM), mm])
    assert predict(two_kernels, host).seconds == pytest.approx(2 * t_mm)
    assert predict(side_by_side, host).seconds == pytest.approx(max(t_mm, t_coll))


# A matmul whose result only an all_to_all reads (MoE's dispatch buffers): experts E = 8,
# token groups G = 64 cut over 8 ranks, C = 1024 capacity slots (the dim ol(mm,a2a) chunks),
# bf16 [K = 2048] @ [2048, N = 1024]. On the H100 node the matmul (~0.40 ms at the tensor
# cores' rate) and the exchange over NVLink (~0.35 ms) take about as long.
DISPATCH_GEMM = """
func.func @dispatch(%x: !coco.tensor<8x64x1024x2048xbf16, sliced<1>>, %w: !coco.tensor<2048x1024xbf16>) -> !coco.tensor<8x64x1024x1024xbf16, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  %y = coco.matmul %x, %w : !coco.tensor<8x64x1024x2048xbf16, sliced<1>>, !coco.tensor<2048x1024xbf16> -> !coco.tensor<8x64x1024x1024xbf16, sliced<1>>
  %z = comm.all_to_all %y : !coco.tensor<8x64x1024x1024xbf16, sliced<1>> -> !coco.tensor<8x64x1024x1024xbf16, sliced<0>>
  func.return %z : !coco.tensor<8x64x1024x1024xbf16, sliced<0>>
}
"""


def test_an_all_to_all_overlap_pays_latency_per_chunk_and_hides_the_exchange():
    """ol(mm,a2a) on the H100 node: each chunk's all_to_all pays the exchange's whole
    latency and its share of the bytes, beside the next chunk's matmul. 4 chunks hide most of
    the exchange (below the unpipelined step); 1024 chunks of one slot pay 1024 latencies
    (above it)."""
    from coconet.schedule import apply_pipeline

    h100 = published_profile("dgx-h100")
    p = Program(parse_module(DISPATCH_GEMM))
    base = predict(lower(p, 8), h100)
    t_mm, t_a2a = (s.seconds for s in base.steps)
    assert 0.5 < t_mm / t_a2a < 2, "the premise: the matmul and the exchange take similar time"
    latency = h100.collective_overhead + 7 * h100.intra.latency

    def overlapped(chunks: int):
        return predict(lower(apply_pipeline(p, f"coco-overlap{{chunks={chunks} ops=y}}"), 8), h100)

    few = overlapped(4)
    exchanges = [s for s in few.steps if "all_to_all" in s.text]
    assert len(exchanges) == 4
    for s in exchanges:
        assert s.stream == COMM_STREAM
        assert s.seconds == pytest.approx(latency + (t_a2a - latency) / 4)
    assert few.seconds < base.seconds
    assert few.seconds < base.busy  # some of the exchange ran beside a matmul
    many = overlapped(1024)
    assert many.seconds > base.seconds
    assert many.seconds > 1024 * latency


def test_kernel_bytes_come_from_the_plan():
    from coconet.schedule import apply_schedule

    program = load(EXAMPLES / "sgd.mlir")
    plan = lower(apply_schedule(program, "ar-c"), 2)  # all_reduce, one kernel w - lr * g1 -> w
    (launch,) = [s for s in plan.steps if isinstance(s, Launch)]
    local, peer, flops, syncs = kernel_traffic(plan, launch, 1)
    # reads g1 (4096 f32), w (4096 f32) and lr (one f32); writes w (4096 f32)
    assert local == 3 * 4096 * 4 + 4
    assert peer == 0
    assert syncs == 0
    assert flops >= 4096

    fused = lower(apply_schedule(program, "fuse(rs-c-ag)"), 2)
    (kernel,) = [s for s in fused.steps if isinstance(s, Launch)]
    local, peer, _flops, syncs = kernel_traffic(fused, kernel, 2)
    assert syncs >= 1  # its flags: at least one cross-rank exchange
    assert peer > 0  # half of what it reads and writes is on the peer
    # the roofline: on a profile with slow peers, the peer term bounds the kernel
    slow_peers = dataclasses.replace(PROFILE, peer_bandwidth=1e3, fused_sync=0.0)
    (cost,) = [c for c in predict(fused, slow_peers).steps if c.text.startswith("launch")]
    assert cost.bound == "peers"
    assert cost.seconds == pytest.approx(slow_peers.launch_overhead + peer / 1e3)

    # w kept in symmetric memory: the gather assembles in place -- the staging store's
    # n/p local bytes gone, the same n/p read from the peer, one handshake more (the exit)
    marked = program.clone()
    mark_symmetric(marked.func, [a.value.index for a in marked.arguments if a.name == "w"])
    in_place = lower(apply_schedule(marked, "fuse(rs-c-ag)"), 2)
    (kernel,) = [s for s in in_place.steps if isinstance(s, Launch)]
    local_ip, peer_ip, _flops, syncs_ip = kernel_traffic(in_place, kernel, 2)
    assert local_ip == local - 4096 * 4 / 2
    assert peer_ip == peer
    assert syncs_ip == syncs + 1


def test_matmul_is_a_roofline():
    a, b, c = buffer("a", 64, 32), buffer("b", 32, 16), buffer("c", 64, 16)
    flops = 2 * 64 * 32 * 16
    nbytes = 4 * (64 * 32 + 32 * 16 + 64 * 16)
    fast_memory = dataclasses.replace(PROFILE, memory_bandwidth=1e15)
    (cost,) = predict(plan_of([Matmul(a, b, c)]), fast_memory).steps
    assert cost.flops == flops
    assert cost.bytes == nbytes
    assert cost.bound == "compute"
    slow_memory = dataclasses.replace(PROFILE, memory_bandwidth=1e3, matmul_flops={"f32": 1e15})
    (cost,) = predict(plan_of([Matmul(a, b, c)]), slow_memory).steps
    assert cost.bound == "memory"
    assert cost.seconds == pytest.approx(PROFILE.launch_overhead + nbytes / 1e3)
    half = Matmul(a, b, c, rows=((0, 32),))
    (cost,) = predict(plan_of([half]), fast_memory).steps
    assert cost.flops == flops / 2


def test_profiles_round_trip_and_bad_ones_are_refused():
    for profile in PUBLISHED_PROFILES.values():
        assert MachineProfile.from_json(json.loads(json.dumps(profile.to_json()))) == profile
    data = PROFILE.to_json()
    data["memory_bandwidth"] = -1
    with pytest.raises(ValueError, match="must be positive numbers"):
        MachineProfile.from_json(data)
    with pytest.raises(ValueError, match="not a machine profile"):
        MachineProfile.from_json({"name": "x"})
    with pytest.raises(CocoError, match=r"\[profile-unknown\]"):
        published_profile("dgx-9000")


def test_published_profiles_are_ordered_as_the_hardware_is():
    v100, a100, h100, h200 = (PUBLISHED_PROFILES[n] for n in PUBLISHED_PROFILES)
    assert v100.memory_bandwidth < a100.memory_bandwidth < h100.memory_bandwidth
    assert h100.memory_bandwidth < h200.memory_bandwidth
    assert v100.intra.bandwidth < a100.intra.bandwidth < h100.intra.bandwidth
    assert v100.inter.bandwidth < a100.inter.bandwidth < h100.inter.bandwidth
    assert v100.ranks_per_node == 16
    assert a100.ranks_per_node == 8


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)
    assert math.isnan(spearman([1, 1], [1, 2]))


# -- ranking ----------------------------------------------------------------------------------


def test_ranking_on_a_gpu_profile_prefers_the_fused_schedule_at_scale():
    from examples_adam import build

    program = build(1 << 24)
    ranking = rank_schedules(program, 16, published_profile("dgx2-v100"), space="named")
    names = [c.name for c in ranking.ranked]
    assert names[0] == "fuse(rs-c-ag)"
    # rs-c-ag moves the same bytes over the network as ar-c but updates 1/p of the state
    assert names.index("rs-c-ag") < names.index("ar-c")
    assert "auto picked fuse(rs-c-ag)" in ranking.headline()


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("examples_adam", EXAMPLES / "adam.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "examples_adam", module)


# -- the profile cache ------------------------------------------------------------------------


def _fake_measurements(ranks: int) -> dict:
    m = {
        "ranks": ranks,
        "scale": 1.0,
        "triad_bandwidth": 1e10,
        "matmul_flops_f32": 1e10,
        "launch_step": 2e-5,
        "launch_plan": 1,
        "matmul_f32_step": 3e-5,
        "matmul_f32_plan": 1,
        "matmul_f16_step": 9e-5,
        "matmul_f16_plan": 2,
    }
    if ranks > 1:
        for key in ("all_reduce", "all_gather"):
            m |= {f"{key}_small_step": 1e-4, f"{key}_small_plan": 1}
            m |= {f"{key}_large_step": 1e-2, f"{key}_large_plan": 1}
        m |= {"fused_small_step": 5e-5, "fused_small_plan": 1}
    return m


def _fake_probe(monkeypatch, tmp_path, extra: dict | None = None) -> list[int]:
    """A cache of its own and a probe job that writes a profile of `_fake_measurements` (and
    `extra`'s entries, read at each run); returns the rank counts it was run for."""
    from coconet.tune import machine_probe

    monkeypatch.setenv("COCONET_CACHE_DIR", str(tmp_path))
    runs: list[int] = []

    def fake_job(ranks: int, out: Path, timeout: float = 600.0) -> None:
        runs.append(ranks)
        m = _fake_measurements(ranks) | (extra or {})
        out.write_text(json.dumps(machine_probe.profile_from_measurements(m).to_json()))

    monkeypatch.setattr(machine_probe, "_run_probe_job", fake_job)
    return runs


def test_profile_is_measured_once_reused_and_remeasured_when_corrupt(monkeypatch, tmp_path):
    from coconet.tune import machine_probe

    runs = _fake_probe(monkeypatch, tmp_path)
    first = machine_probe.cpu_profile(2)
    assert runs == [2]
    assert first.source == "measured"
    assert first.host_serializes_kernels
    assert machine_probe.cpu_profile(2) == first
    assert runs == [2]
    machine_probe.cpu_profile(3)
    assert runs == [2, 3]  # one profile per rank count
    path = machine_probe.PROBE_CACHE.path_for(machine_probe.profile_key(2), ".json")
    path.write_text(path.read_text().replace("1", "7", 1))  # a flipped byte: digest mismatch
    machine_probe.cpu_profile(2)
    assert runs == [2, 3, 2]
    # intact (its digest matches) but not a profile: refused, measured again
    path.write_text('{"name": "cpu-2"}')
    import hashlib

    (path.parent / (path.name + ".sha256")).write_text(
        hashlib.sha256(path.read_bytes()).hexdigest()
    )
    assert machine_probe.cpu_profile(2) == first
    assert runs == [2, 3, 2, 2]


def test_a_profile_of_other_code_is_measured_again(monkeypatch, tmp_path):
    """The profile measures the generated kernels and the runtime running them: a change to
    the compiler or the runtime (an upgrade, a kernel fix) measures again."""
    from coconet.lowering import plan_cache
    from coconet.tune import machine_probe

    runs = _fake_probe(monkeypatch, tmp_path)
    machine_probe.cpu_profile(2)
    machine_probe.cpu_profile(2)
    assert runs == [2]
    monkeypatch.setattr(plan_cache, "_compiler_digest", "another compiler")
    machine_probe.cpu_profile(2)
    assert runs == [2, 2]


def test_a_profile_measured_while_the_host_was_busy_serves_the_run_but_is_not_cached(
    monkeypatch, tmp_path
):
    from coconet.tune import machine_probe

    share = {"others_cpu_share": 0.6}
    runs = _fake_probe(monkeypatch, tmp_path, share)
    logged: list[str] = []
    busy = machine_probe.cpu_profile(2, log=logged.append)
    assert busy.source == "measured"
    assert any("60%" in line and "not cached" in line for line in logged)
    machine_probe.cpu_profile(2, log=logged.append)
    assert runs == [2, 2]  # measured again: nothing was cached
    share["others_cpu_share"] = 0.1  # a quiet host: cached from now on
    machine_probe.cpu_profile(2, log=logged.append)
    machine_probe.cpu_profile(2, log=logged.append)
    assert runs == [2, 2, 2]


def test_the_probe_counts_what_other_processes_take_of_the_host():
    """The load the probe reports is the host's busy CPU time less its own ranks', from
    /proc/stat (steal counts: time another machine got); a host running a busy process on
    every core while it looks is reported busy."""
    from coconet.tune import machine_probe

    stat = "cpu  100 0 50 800 50 0 0 25 0 0\ncpu0 ...\n"
    hz = os.sysconf("SC_CLK_TCK")
    assert machine_probe.host_cpu_seconds(stat) == pytest.approx(175 / hz)
    assert machine_probe.host_cpu_seconds("intr 1 2 3\n") is None
    assert machine_probe.others_share(3.0, 1.0, 2.0, 2) == pytest.approx(0.5)
    assert machine_probe.others_share(1.0, 1.5, 2.0, 2) == 0.0  # jiffy rounding: never < 0
    before = machine_probe.host_cpu_seconds()
    if before is None:
        pytest.skip("no /proc/stat on this host")
    cores = os.cpu_count() or 1
    spin = "import time\nend = time.time() + 1.0\nwhile time.time() < end: pass\n"
    t0 = time.perf_counter()
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(cores)]
    for h in hogs:
        h.wait()
    busy = machine_probe.host_cpu_seconds()
    assert busy is not None
    share = machine_probe.others_share(busy - before, 0.0, time.perf_counter() - t0, cores)
    assert share > machine_probe.BUSY_HOST_SHARE


def test_fitted_profile_reproduces_its_measurements():
    from coconet.tune.machine_probe import profile_from_measurements

    m = _fake_measurements(2)
    profile = profile_from_measurements(m)
    p = 2
    # the all_gather and all_reduce latencies solve t = overhead + k alpha exactly
    ag = profile.collective_overhead + (p - 1) * profile.intra.latency
    ar = profile.collective_overhead + 2 * (p - 1) * profile.intra.latency
    assert ag == pytest.approx(m["all_gather_small_step"])
    assert ar == pytest.approx(m["all_reduce_small_step"])
    assert profile.memory_bandwidth == m["triad_bandwidth"]
    # a matmul step's fixed cost per element type (f16's includes converting to f32); the
    # probe's program prices as measured: one matmul step plus its other steps' launches
    from coconet.tune.machine_probe import MATMUL_SHAPE

    rows, k = MATMUL_SHAPE
    compute = 2.0 * rows * k * k / m["matmul_flops_f32"]
    for elt in ("f32", "f16"):
        others = (m[f"matmul_{elt}_plan"] - 1) * profile.launch_overhead
        priced = profile.matmul_call(elt) + compute + others
        assert priced == pytest.approx(m[f"matmul_{elt}_step"])
    assert profile.matmul_call("f16") > profile.matmul_call("f32")
    assert profile.matmul_call("bf16") == profile.matmul_call("f32")  # not measured: f32's


def test_the_walk_s_fixed_cost_is_priced_once_per_step_not_per_launch():
    """The probe times its one-kernel program's launch alone and its whole step: the rest is
    the executor walk's fixed cost, which a plan pays once. Priced per launch (the whole step
    taken as one launch's cost), a 5-launch schedule of LAMB was predicted at twice its
    measured time, and auto ranked it below a 2-launch one that measured slower."""
    from coconet.schedule import apply_schedule
    from coconet.tune.machine_probe import LAUNCH_PROGRAM, SMALL, profile_from_measurements

    probe = lower(Program(parse_module(LAUNCH_PROGRAM.format(n=SMALL))), 2)
    steps = len(probe.steps)
    m = _fake_measurements(2) | {"launch_each": 6e-6, "launch_step": 2e-5, "launch_plan": steps}
    profile = profile_from_measurements(m)
    kernel_bytes = 256 * 8 / m["triad_bandwidth"]
    launch = 6e-6 - kernel_bytes
    assert profile.launch_overhead == pytest.approx(launch)
    assert profile.step_overhead == pytest.approx(2e-5 - steps * launch - kernel_bytes)
    # the probe's own program prices back at its measured step
    assert predict(probe, profile).seconds == pytest.approx(2e-5, rel=0.05)
    # a collective's and a matmul's fitted costs take the walk's cost off their step times
    assert profile.collective_overhead + profile.intra.latency + profile.step_overhead == (
        pytest.approx(m["all_gather_small_step"])
    )
    older = profile_from_measurements(_fake_measurements(2))
    assert older.step_overhead == 0.0
    assert older.launch_overhead == pytest.approx(2e-5 - kernel_bytes)
    # each launch beyond the first costs a launch, not a whole step
    three = lower(apply_schedule(load(EXAMPLES / "lamb.mlir"), "rs-c-ag"), 2)
    launches = sum(isinstance(s, Launch) for s in three.steps)
    assert launches >= 3
    assert predict(three, profile).seconds < predict(three, older).seconds


def test_a_launch_timed_above_its_whole_step_still_fits_a_valid_profile():
    """On a busy host the launch timed alone can come out slower than the whole step that
    holds it: the fit clamps the walk's cost at zero rather than going negative."""
    from coconet.tune.machine_probe import profile_from_measurements

    m = _fake_measurements(2) | {"launch_each": 3e-5, "launch_step": 2e-5, "launch_plan": 2}
    profile = profile_from_measurements(m)
    assert profile.step_overhead == 0.0
    assert profile.launch_overhead == pytest.approx(3e-5 - 256 * 8 / m["triad_bandwidth"])


def test_an_in_kernel_norm_exchange_is_priced_as_measured():
    """A norm finished inside a fused kernel (LAMB's trust ratio) waits for every block and
    then trades partials with the peers: the probe times such a program, and the fitted
    profile prices it back at that time (it priced the exchange as one flag handshake, and
    so ranked fused LAMB first where it was not)."""
    from coconet.schedule import apply_schedule
    from coconet.tune.machine_probe import FUSED_NORM_PROGRAM, SMALL, profile_from_measurements

    m = _fake_measurements(2) | {"fused_norm_small_step": 4e-4, "fused_norm_small_plan": 2}
    profile = profile_from_measurements(m)
    assert profile.exchange_sync is not None
    assert profile.exchange_sync > profile.fused_sync
    program = Program(parse_module(FUSED_NORM_PROGRAM.format(n=SMALL * 2)))
    plan = lower(apply_schedule(program, "fuse(rs-c-ag)"), 2)
    assert sum(kernel_exchanges(plan, s) for s in plan.steps if isinstance(s, Launch)) == 1
    assert predict(plan, profile).seconds == pytest.approx(4e-4, rel=0.02)
    # without the measurement, an exchange costs a flag handshake
    plain = profile_from_measurements(_fake_measurements(2))
    assert plain.exchange_sync is None
    cheaper = predict(plan, plain).seconds
    assert cheaper == pytest.approx(4e-4 - profile.exchange_sync + plain.fused_sync, rel=0.02)


def test_a_one_shot_kernel_is_priced_as_measured():
    """The probe times the fused program one-shot too (`fuse(ar-c)`: entry and done
    handshakes, no phase between a reduce_scatter and an all_gather): the fitted profile
    prices that program back at its time, and two-shot kernels keep `fused_sync`."""
    from coconet.schedule import apply_schedule
    from coconet.tune.machine_probe import FUSED_PROGRAM, SMALL, profile_from_measurements

    program = Program(parse_module(FUSED_PROGRAM.format(n=SMALL * 2)))
    one_shot = lower(apply_schedule(program, "fuse(ar-c)"), 2)
    two_shot = lower(apply_schedule(program, "fuse(rs-c-ag)"), 2)
    launches = [s for s in one_shot.steps if isinstance(s, Launch)]
    assert len(launches) == 1
    assert is_one_shot(launches[0])
    assert not any(is_one_shot(s) for s in two_shot.steps if isinstance(s, Launch))
    plan_steps = len(one_shot.steps)
    m = _fake_measurements(2) | {"one_shot_small_step": 9e-5, "one_shot_small_plan": plan_steps}
    profile = profile_from_measurements(m)
    assert profile.one_shot_sync is not None
    assert profile.one_shot_sync > 0
    assert predict(one_shot, profile).seconds == pytest.approx(9e-5, rel=0.05)
    # the two-shot program is priced as before the one-shot measurement existed
    plain = profile_from_measurements(_fake_measurements(2))
    assert plain.one_shot_sync is None
    assert predict(two_shot, profile).seconds == predict(two_shot, plain).seconds


@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100", "dgx-h200"])
def test_auto_picks_one_shot_below_the_crossover_and_two_shot_above(name: str):
    """On a GPU node one handshake less wins while the bytes are few; reading every peer's
    whole input loses once they are many (vLLM's one-shot / two-shot crossover). Without a
    one-shot measurement (a profile probed before it) one-shot never wins on handshakes."""
    from coconet.tune.machine_probe import FUSED_PROGRAM

    profile = PUBLISHED_PROFILES[name]

    def best(n: int, prof=profile) -> str:
        program = Program(parse_module(FUSED_PROGRAM.format(n=n)))
        return rank_schedules(program, 8, prof, space="named").ranked[0].name

    assert best(2048) == "fuse(ar-c)"  # 8 KiB
    assert best(1 << 20) == "fuse(rs-c-ag)"  # 4 MiB
    older = dataclasses.replace(profile, one_shot_sync=None)
    assert best(2048, older) == "fuse(rs-c-ag)"


def test_measuring_on_one_rank_gives_a_valid_profile(monkeypatch, tmp_path):
    """The real probe (host-compiled triad, a compiled one-kernel program, NumPy matmul) on a
    one-rank communicator, at a small scale."""
    from mpi4py import MPI

    from coconet.tune.machine_probe import measure, profile_from_measurements

    monkeypatch.setenv("COCONET_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("COCONET_PROBE_SCALE", "0.05")
    m = measure(MPI.COMM_SELF)
    profile = profile_from_measurements(m)
    assert MachineProfile.from_json(profile.to_json()) == profile
    assert profile.memory_bandwidth > 0
    assert set(profile.matmul_overhead) == {"f32", "f16", "bf16"}
    assert all(t > 0 for t in profile.matmul_overhead.values())
    assert profile.launch_overhead > 0
    assert m["launch_plan"] >= 1
    # two timings, each positive; their order is noise-dependent on a busy host (the launch
    # alone measured above the whole step in 3 of 5 runs), which the fit must absorb
    assert m["launch_each"] > 0
    assert m["launch_step"] > 0
    assert profile.step_overhead >= 0


# -- auto end to end --------------------------------------------------------------------------


def _profile_file(tmp_path: Path) -> str:
    from coconet.tune.machine_probe import profile_from_measurements

    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile_from_measurements(_fake_measurements(2)).to_json()))
    return str(path)


def coco(tool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"coconet.tools.{tool}", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_schedule_auto_on_sim_checks_against_the_program_as_written(tmp_path):
    profile = _profile_file(tmp_path)
    ranking = rank_schedules(load(EXAMPLES / "lamb.mlir"), 2, resolve_profile(profile, "sim", 2))
    r = coco(
        "coco_run", str(EXAMPLES / "lamb.mlir"), "--np", "2", "--backend", "sim",
        "--schedule", "auto", "--profile", profile, "--check", "-q",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"auto picked {ranking.best.name} on 2 rank(s)" in r.stdout
    assert f"check [auto={ranking.best.name}]: outputs match the program as written" in r.stdout


def test_schedule_auto_on_cpu_with_check(tmp_path):
    profile = _profile_file(tmp_path)
    r = coco(
        "coco_run", str(EXAMPLES / "adam.mlir"), "--np", "2", "--backend", "cpu",
        "--schedule", "auto", "--profile", profile, "--check", "-q", "--verbose",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "auto picked" in r.stdout
    assert "  rank    predicted" in r.stdout
    assert "check [auto=" in r.stdout
    assert "match the sim oracle" in r.stdout


def test_auto_errors_are_one_line(tmp_path):
    r = coco("coco_run", str(EXAMPLES / "sgd.mlir"), "--np", "2", "--backend", "sim",
             "--schedule", "auto", "--profile", "dgx-9000")  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0
    assert "[profile-unknown]" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    r = coco("coco_run", str(EXAMPLES / "sgd.mlir"), "--np", "2", "--backend", "sim",
             "--schedule", "auto", "--profile", str(bad))  # fmt: skip
    assert r.returncode == 1
    assert "[profile-file]" in r.stderr
    r = coco("coco_run", str(EXAMPLES / "sgd.mlir"), "--np", "2", "--backend", "sim",
             "--profile", "dgx-a100")  # fmt: skip
    assert r.returncode == 1
    assert "--profile is for --schedule auto" in r.stderr


def test_compile_auto_on_sim_reports_its_choice(tmp_path):
    import numpy as np

    import coconet

    compiled = coconet.compile(
        EXAMPLES / "sgd.mlir", schedule="auto", backend="sim", ranks=4, profile="dgx-a100"
    )
    expected = rank_schedules(load(EXAMPLES / "sgd.mlir"), 4, published_profile("dgx-a100"))
    assert compiled.autotune["name"] == expected.best.name
    assert compiled.autotune["predicted_s"] == expected.best.seconds
    rng = np.random.default_rng(0)
    inputs = {
        "g": rng.random((4, 4096), dtype=np.float32),
        "w": rng.random(4096, dtype=np.float32),
        "lr": np.float32(0.1),
    }
    want = coconet.run(
        load(EXAMPLES / "sgd.mlir"), {k: v.copy() for k, v in inputs.items()}, ranks=4
    ).outputs["w"]
    got = compiled(**{k: v.copy() for k, v in inputs.items()})["w"]
    assert np.allclose(got, want, rtol=1e-6, atol=1e-7)


def test_coco_tune_predicts_for_a_gpu_node_and_refuses_to_measure_it():
    r = coco("coco_tune", str(EXAMPLES / "sgd.mlir"), "--np", "16",
             "--profile", "dgx2-v100", "--predict-only")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "auto picked" in r.stdout
    assert "profile dgx2-v100" in r.stdout
    r = coco("coco_tune", str(EXAMPLES / "sgd.mlir"), "--np", "2", "--profile", "dgx-a100")
    assert r.returncode == 1
    assert "describes another machine" in r.stderr


def test_a_fused_kernel_across_nodes_is_refused_not_priced():
    from coconet.schedule import apply_schedule

    program = apply_schedule(load(EXAMPLES / "sgd.mlir"), "fuse(rs-c-ag)")
    a100 = published_profile("dgx-a100")  # 8 GPUs per node
    with pytest.raises(CocoError, match=r"\[cost-fused-across-nodes\]"):
        predict(lower(program, 16), a100)  # one kernel over 16 GPUs: not on this machine


def test_ranking_lowers_for_the_profiles_nodes():
    """Across nodes a fused collective is ranked as the hierarchical plan the machine would run
    (node kernels, library collectives between nodes), and the pipeline boundary's fused send
    between the stages' nodes as a library send."""
    a100 = published_profile("dgx-a100")  # 8 GPUs per node
    ranking = rank_schedules(load(EXAMPLES / "sgd.mlir"), 16, a100, space="named")
    fused = ranking.find("fuse(rs-c-ag)")
    assert fused in ranking.ranked, fused.refused
    one_node = rank_schedules(load(EXAMPLES / "sgd.mlir"), 8, a100, space="named")
    assert one_node.find("fuse(rs-c-ag)") in one_node.ranked
    # 2 GPUs per node: each stage of the [2, 2] boundary on its own node
    pairs = dataclasses.replace(published_profile("dgx2-v100"), ranks_per_node=2)
    boundary = rank_schedules(load(EXAMPLES / "pipeline_boundary.mlir"), 4, pairs, space="named")
    three_way = boundary.find("ol(mm,rs,fuse(sliced-send),ag)")
    assert three_way in boundary.ranked, three_way.refused
