"""This host's machine profile for the cpu backend: measured once per rank count, then cached.

    from coconet.tune.machine_probe import cpu_profile
    profile = cpu_profile(ranks=2)      # measured on first use (an mpiexec job), then cached

The measurements run as a job of `ranks` processes, all at once (what a rank gets while its
peers are busy too, which is how a program runs):

* memory bandwidth: STREAM's triad (a = b + s c, 12 bytes per element) in a host-compiled
  kernel, every rank on its own arrays, several back to back per timed run;
* launch overhead: a one-kernel coconet program of 256 elements through the real executor,
  its launch timed alone (argument resolution, ctypes call, the kernel) and the whole step
  (the rest is the walk's fixed cost, paid once per step: `step_overhead`);
* collectives: coconet programs of one all_reduce and one all_gather, small (latency) and
  large (bandwidth), over the job's communicator; per-call overhead and per-step latency come
  from solving t = overhead + k alpha for the all_reduce's k = 2(p-1) and the all_gather's
  p-1; bandwidth from the large ones once the latency is taken off;
* fused-kernel synchronization: a tiny `fuse(rs-c-ag)` program, its time less one launch
  (`fused_sync`), and the same program one-shot, `fuse(ar-c)` (`one_shot_sync`: one
  handshake fewer, which the cost model weighs against reading every peer's whole input);
* matmul FLOP/s: NumPy's f32 matmul of 256 x 256 matrices on every rank (one BLAS thread per
  rank, as ranks run); a matmul step's fixed cost: a one-matmul coconet program of 16 x 64
  times 64 x 64 per element type (f16 and bf16 are converted to f32 on the host).

Every time is the slowest rank's, the fastest of the repetitions after warm-up. The result is cached
as JSON in the coconet cache (lowering/kernel_cache.py's rules: atomic publish, a digest
beside it, owned by this user and writable by no one else; an entry that is corrupt or does not
parse as a profile is measured again). The key is the host (name, cores, CPU model), the rank
count, PROBE_VERSION and the code measured (`measured_code_digest`: the compiler and the
runtime; an upgrade measures again).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coconet.core.program import CocoError
from coconet.lowering.plan import Launch
from coconet.toolchain.kernel_cache import KernelCache, content_key
from coconet.tune.cost_model import Fabric, MachineProfile

__all__ = [
    "PROBE_CACHE",
    "PROBE_VERSION",
    "cpu_profile",
    "measure",
    "profile_from_measurements",
]

# Bump when what is measured or how it becomes a profile changes: old entries are not reused.
PROBE_VERSION = 6
PROBE_CACHE = KernelCache("profiles")

STREAM_SOURCE = r"""
#include "coco_device.h"
COCO_KERNEL(stream_triad, float* __restrict__ a, const float* __restrict__ b,
            const float* __restrict__ c, float s, coco_i64 n) {
  COCO_KERNEL_BODY_BEGIN
  const coco_range r = coco_chunk(n, coco_grid_dim(), coco_block_idx(), 16);
  COCO_BLOCK_STRIDE_LOOP(coco_i64, i, r.begin, r.end) { a[i] = b[i] + s * c[i]; }
  COCO_KERNEL_BODY_END
}
"""

LAUNCH_PROGRAM = """
func.func @probe_launch(%x: !coco.tensor<{n}xf32>, %a: !coco.tensor<f32>)
    attributes {{coco.grid = #coco.grid<[?]>}} {{
  %y = coco.mul %a, %x : !coco.tensor<f32>, !coco.tensor<{n}xf32> -> !coco.tensor<{n}xf32>
  coco.update %x, %y : !coco.tensor<{n}xf32>
  func.return
}}
"""

ALL_REDUCE_PROGRAM = """
func.func @probe_all_reduce(%g: !coco.tensor<{n}xf32, local>)
    -> !coco.tensor<{n}xf32> attributes {{coco.grid = #coco.grid<[?]>}} {{
  %s = comm.all_reduce sum %g : !coco.tensor<{n}xf32, local> -> !coco.tensor<{n}xf32>
  func.return %s : !coco.tensor<{n}xf32>
}}
"""

ALL_GATHER_PROGRAM = """
func.func @probe_all_gather(%x: !coco.tensor<{n}xf32, sliced<0>>)
    -> !coco.tensor<{n}xf32> attributes {{coco.grid = #coco.grid<[?]>}} {{
  %s = comm.all_gather %x : !coco.tensor<{n}xf32, sliced<0>> -> !coco.tensor<{n}xf32>
  func.return %s : !coco.tensor<{n}xf32>
}}
"""

FUSED_PROGRAM = """
func.func @probe_fused(%g: !coco.tensor<{n}xf32, local>, %w: !coco.tensor<{n}xf32>,
                       %lr: !coco.tensor<f32>) attributes {{coco.grid = #coco.grid<[?]>}} {{
  %g1 = comm.all_reduce sum %g : !coco.tensor<{n}xf32, local> -> !coco.tensor<{n}xf32>
  %0 = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<{n}xf32> -> !coco.tensor<{n}xf32>
  %w1 = coco.sub %w, %0 : !coco.tensor<{n}xf32>
  coco.update %w, %w1 : !coco.tensor<{n}xf32>
  func.return
}}
"""

# The fused all_reduce with a norm of the reduced value inside (LAMB's trust ratio, global-norm
# clipping): under fuse(rs-c-ag) its first kernel finishes the norm in the kernel, the last
# block of each rank exchanging its partial sum with its peers' after all blocks are done.
FUSED_NORM_PROGRAM = """
func.func @probe_fused_norm(%g: !coco.tensor<{n}xf32, local>, %w: !coco.tensor<{n}xf32>,
                            %lr: !coco.tensor<f32>) attributes {{coco.grid = #coco.grid<[?]>}} {{
  %g1 = comm.all_reduce sum %g : !coco.tensor<{n}xf32, local> -> !coco.tensor<{n}xf32>
  %n = coco.reduce norm %g1 : !coco.tensor<{n}xf32> -> !coco.tensor<f32>
  %s = coco.div %lr, %n : !coco.tensor<f32>
  %0 = coco.mul %s, %g1 : !coco.tensor<f32>, !coco.tensor<{n}xf32> -> !coco.tensor<{n}xf32>
  %w1 = coco.sub %w, %0 : !coco.tensor<{n}xf32>
  coco.update %w, %w1 : !coco.tensor<{n}xf32>
  func.return
}}
"""

MATMUL_PROGRAM = """
func.func @probe_matmul(%a: !coco.tensor<{m}x{k}x{elt}>, %b: !coco.tensor<{k}x{k}x{elt}>)
    -> !coco.tensor<{m}x{k}x{elt}> attributes {{coco.grid = #coco.grid<[?]>}} {{
  %c = coco.matmul %a, %b : !coco.tensor<{m}x{k}x{elt}>, !coco.tensor<{k}x{k}x{elt}>
      -> !coco.tensor<{m}x{k}x{elt}>
  func.return %c : !coco.tensor<{m}x{k}x{elt}>
}}
"""
MATMUL_SHAPE = (16, 64)  # (m, k): small, so that the step is its fixed cost
MATMUL_TYPES = ("f32", "f16", "bf16")

SMALL = 256
LARGE = 1 << 22
TRIADS_PER_RUN = 4
FUSED_STEPS_PER_RUN = 8
LAUNCHES_PER_RUN = 8


def _scale() -> float:
    """COCONET_PROBE_SCALE shrinks the large sizes (tests: a quick, rough profile)."""
    try:
        return min(1.0, max(1e-3, float(os.environ.get("COCONET_PROBE_SCALE", "1"))))
    except ValueError:
        return 1.0


def _timed(comm, fn: Callable[[], Any], warmup: int, iters: int, per_run: int = 1) -> float:
    """The fastest of `iters` runs of `fn`, each run's time the slowest rank's (barrier before
    each), per call when a run makes `per_run` calls back to back. The fastest, not the
    median: the profile is the machine's own cost, and a probe that runs while the host is
    busy with other work sees that work only as slower runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(per_run):
            fn()
        dt = (time.perf_counter() - t0) / per_run
        times.append(max(comm.allgather(dt)))
    return min(times)


_LOG = logging.getLogger("coconet.autotune")

# The share of the host's CPU time that went to anything but the probe's own ranks while it
# measured (other processes, and time the hypervisor gave other machines: steal), above which
# the profile measured the neighbours as much as the host: it is used for the run that asked
# but not cached. A probe keeps the fastest of its runs, which a short burst of other work
# cannot spoil; load over the whole probe (a test suite beside it) can.
BUSY_HOST_SHARE = 0.25


def host_cpu_seconds(stat: str | None = None) -> float | None:
    """Seconds of CPU time the host's CPUs have spent on anything but idling (steal included:
    time this machine wanted and another got), from /proc/stat; None where there is none."""
    if stat is None:
        try:
            stat = Path("/proc/stat").read_text()
        except OSError:
            return None
    fields = stat.split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu" or len(fields) < 5:
        return None
    ticks = [int(x) for x in fields[1:9]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def others_share(host_busy: float, own: float, wall: float, cores: int) -> float:
    """The share of `cores` cores over `wall` seconds that the host spent busy (`host_busy`
    CPU seconds) on anything but the probe's own ranks (`own` CPU seconds between them)."""
    if wall <= 0 or cores <= 0:
        return 0.0
    return min(1.0, max(0.0, (host_busy - own) / (wall * cores)))


class _CpuAccount:
    """What the host's CPUs did while the probe measured (collective: every rank starts and
    stops it): `share()` is `others_share` over that time."""

    def __init__(self, comm) -> None:
        self.comm = comm
        comm.Barrier()
        self.wall = time.perf_counter()
        self.own = time.process_time()
        self.busy = host_cpu_seconds()

    def share(self) -> float | None:
        own = self.comm.allreduce(time.process_time() - self.own)
        busy = host_cpu_seconds()
        wall = time.perf_counter() - self.wall
        share = None
        if self.comm.Get_rank() == 0 and busy is not None and self.busy is not None:
            share = others_share(busy - self.busy, own, wall, os.cpu_count() or 1)
        return self.comm.bcast(share, root=0)


def _compiled(comm, text: str, schedule: str | None = None):
    from coconet.compiled import apply_schedule, prepare
    from coconet.core.program import Program, parse_module

    program = apply_schedule(Program(parse_module(text, "<probe>")), schedule)
    return prepare(program, "cpu", comm)


def _ready(compiled, seed: int = 0):
    """`compiled` with its inputs set once (steps then run on resident buffers)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    inputs = {}
    for name, (shape, dtype) in compiled.input_shapes().items():
        inputs[name] = (rng.random(shape) * 1e-3).astype(dtype)
    compiled(**inputs)
    return compiled


def measure(comm) -> dict[str, Any]:
    """Every measurement, on every rank of `comm` at once (collective); the same dict on every
    rank. Times in seconds, bandwidths in bytes/s per rank."""
    import ctypes

    import numpy as np

    from coconet.toolchain.host_compiler import compile_host

    size = comm.Get_size()
    scale = _scale()
    out: dict[str, Any] = {"ranks": size, "scale": scale}
    account = _CpuAccount(comm)

    # memory: STREAM triad on every rank's own arrays
    n = max(1 << 16, int((1 << 23) * scale))
    lib = compile_host(STREAM_SOURCE)
    kernel = lib.kernel(
        "stream_triad", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float,
        ctypes.c_int64,
    )  # fmt: skip
    a = np.zeros(n, np.float32)
    b = np.ones(n, np.float32)
    c = np.full(n, 2.0, np.float32)

    # Several triads back to back per timed run: the ranks' runs then overlap for most of it
    # (one short run apiece can fall between the other rank's, each alone on the memory bus).
    def triads() -> None:
        for _ in range(TRIADS_PER_RUN):
            kernel(64, 256, a, b, c, 3.0, n)

    t = _timed(comm, triads, 1, 5)
    out["triad_bandwidth"] = 12.0 * n * TRIADS_PER_RUN / t

    # matmul FLOP/s (NumPy, one BLAS thread per rank)
    m = 256
    x = np.ones((m, m), np.float32)
    y = np.ones((m, m), np.float32)
    t = _timed(comm, lambda: x @ y, 2, 7)
    out["matmul_flops_f32"] = 2.0 * m**3 / t

    # one kernel launch through the executor: the whole step, and the launch alone (a plan's
    # walk has a fixed cost, run()'s bookkeeping and final synchronize, paid once per step:
    # priced per launch, it made a 5-launch schedule look twice its measured time)
    launch = _ready(_compiled(comm, LAUNCH_PROGRAM.format(n=SMALL)))
    out["launch_step"] = _timed(comm, launch.step, 20, 101)
    out["launch_plan"] = _plan_steps(launch.plan)
    index, only = next((i, s) for i, s in enumerate(launch.plan.steps) if isinstance(s, Launch))
    runner = launch.runner
    out["launch_each"] = _timed(comm, lambda: runner.execute(index, only), 20, 41, LAUNCHES_PER_RUN)
    launch.close()

    # one small matmul step through the executor, per element type (the fixed cost of a
    # matmul: f16 / bf16 operands are converted to f32 first)
    m, k = MATMUL_SHAPE
    for elt in MATMUL_TYPES:
        prog = _ready(_compiled(comm, MATMUL_PROGRAM.format(m=m, k=k, elt=elt)))
        out[f"matmul_{elt}_step"] = _timed(comm, prog.step, 10, 41)
        out[f"matmul_{elt}_plan"] = _plan_steps(prog.plan)
        prog.close()

    if size > 1:
        big = max(SMALL * size, int(LARGE * scale) // size * size)
        for name, text in (("all_reduce", ALL_REDUCE_PROGRAM), ("all_gather", ALL_GATHER_PROGRAM)):
            for label, count in (("small", SMALL * size), ("large", big)):
                prog = _ready(_compiled(comm, text.format(n=count)))
                out[f"{name}_{label}_step"] = _timed(
                    comm, prog.step, 10 if label == "small" else 2, 41 if label == "small" else 7
                )
                out[f"{name}_{label}_plan"] = _plan_steps(prog.plan)
                prog.close()
        fused = _ready(_compiled(comm, FUSED_PROGRAM.format(n=SMALL * size), "fuse(rs-c-ag)"))
        # Fused steps back to back, as a job runs them: a run right after a barrier starts
        # every rank's flag waits at once, the luckiest case of what they cost.
        out["fused_small_step"] = _timed(comm, fused.step, 10, 15, FUSED_STEPS_PER_RUN)
        out["fused_small_plan"] = _plan_steps(fused.plan)
        fused.close()
        # the same program one-shot: its handshakes (entry, done) against the two-shot's three
        one_shot = _ready(_compiled(comm, FUSED_PROGRAM.format(n=SMALL * size), "fuse(ar-c)"))
        out["one_shot_small_step"] = _timed(comm, one_shot.step, 10, 15, FUSED_STEPS_PER_RUN)
        out["one_shot_small_plan"] = _plan_steps(one_shot.plan)
        one_shot.close()
        normed = _ready(_compiled(comm, FUSED_NORM_PROGRAM.format(n=SMALL * size), "fuse(rs-c-ag)"))
        out["fused_norm_small_step"] = _timed(comm, normed.step, 10, 15, FUSED_STEPS_PER_RUN)
        out["fused_norm_small_plan"] = _plan_steps(normed.plan)
        normed.close()
    out["others_cpu_share"] = account.share()
    return out


def _plan_steps(plan) -> int:
    return len(plan.steps)


def _host() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"host": platform.node(), "cores": os.cpu_count() or 1, "cpu": cpu}


def profile_from_measurements(
    m: dict[str, Any], host: dict[str, Any] | None = None
) -> MachineProfile:
    """The cpu backend's profile from `measure`'s numbers: each parameter is what is left of a
    measured step once the parameters fitted before it are taken off (the cost model's own
    formulas, so the model reproduces the measurements it was fitted on)."""
    host = host or _host()
    p = int(m["ranks"])
    mem = float(m["triad_bandwidth"])
    kernel_bytes = 256 * 8 / mem  # the probe kernel's own memory time
    if "launch_each" in m:
        launch = max(1e-7, float(m["launch_each"]) - kernel_bytes)
        step_overhead = max(
            0.0, float(m["launch_step"]) - int(m["launch_plan"]) * launch - kernel_bytes
        )
    else:  # a probe of before PROBE_VERSION 5: the step's fixed cost counted per launch
        launch = max(1e-7, float(m["launch_step"]) - kernel_bytes)
        step_overhead = 0.0

    def step_time(key: str) -> float:
        """A probe program's measured step, less the walk's fixed cost."""
        return float(m[f"{key}_step"]) - step_overhead

    intra = Fabric("shared memory (MPI)", mem, 0.0, mem)
    collective_overhead = 0.0
    fused_sync = 0.0
    exchange_sync: float | None = None
    one_shot_sync: float | None = None
    if p > 1:
        # the programs' steps other than the collective: a copy out at most (priced as one launch)
        def collective_time(key: str) -> float:
            extra = max(0, int(m[f"{key}_plan"]) - 1) * launch
            return max(1e-7, step_time(key) - extra)

        ar_small, ag_small = (
            collective_time("all_reduce_small"),
            collective_time("all_gather_small"),
        )
        # t = overhead + k alpha: all_reduce k = 2(p-1), all_gather k = p-1
        alpha = max(0.0, (ar_small - ag_small) / (p - 1))
        collective_overhead = max(0.0, ag_small - (p - 1) * alpha)
        if collective_overhead == 0.0:
            alpha = ag_small / (p - 1)
        big = max(SMALL * p, int(LARGE * float(m["scale"])) // p * p)
        nbytes = 4.0 * big
        ar_large = collective_time("all_reduce_large") - collective_overhead - 2 * (p - 1) * alpha
        ag_large = collective_time("all_gather_large") - collective_overhead - (p - 1) * alpha
        reduce_bw = 2 * (p - 1) / p * nbytes / max(1e-7, ar_large)
        move_bw = (p - 1) / p * nbytes / max(1e-7, ag_large)
        intra = Fabric("shared memory (MPI)", move_bw, alpha, reduce_bw)
        extra = max(0, int(m["fused_small_plan"]) - 1) * launch
        fused_sync = max(0.0, step_time("fused_small") - extra - launch)
        if "one_shot_small_step" in m:
            # its reads of the peers' whole (small) inputs are priced apart, as bytes
            extra = max(0, int(m["one_shot_small_plan"]) - 1) * launch
            one_shot_sync = max(0.0, step_time("one_shot_small") - extra - launch)
        if "fused_norm_small_step" in m:
            # each of its kernels is a launch and a flag handshake; what is left is the
            # exchange of the norm's partials
            kernels = int(m["fused_norm_small_plan"])
            exchange_sync = max(
                0.0, step_time("fused_norm_small") - kernels * (launch + fused_sync)
            )
    matmul_overhead = {}
    m_rows, k = MATMUL_SHAPE
    for elt in MATMUL_TYPES:
        if f"matmul_{elt}_step" in m:
            others = max(0, int(m[f"matmul_{elt}_plan"]) - 1) * launch
            compute = 2.0 * m_rows * k * k / float(m["matmul_flops_f32"])
            matmul_overhead[elt] = max(1e-7, step_time(f"matmul_{elt}") - others - compute)
    return MachineProfile(
        name=f"cpu-{p}",
        description=(
            f"{host['cpu']} ({host['cores']} cores, host {host['host']}), {p} rank(s) of the "
            "cpu backend, measured"
        ),
        ranks_per_node=max(p, 1),
        memory_bandwidth=mem,
        matmul_flops={"f32": float(m["matmul_flops_f32"])},
        # elementwise kernels are memory bound; their compute ceiling: the triad's 2 flops per
        # element at the measured bandwidth, times 8 lanes of a vector unit
        elementwise_flops=8 * 2 * mem / 12,
        intra=intra,
        inter=None,
        peer_bandwidth=mem,
        launch_overhead=launch,
        step_overhead=step_overhead,
        collective_overhead=collective_overhead,
        fused_sync=fused_sync,
        exchange_sync=exchange_sync,
        one_shot_sync=one_shot_sync,
        host_serializes_kernels=True,
        exchange_reductions=("f16", "bf16", "i1"),
        matmul_overhead=matmul_overhead,
        source="measured",
        notes={"measurements": m, "host": host, "probe_version": PROBE_VERSION},
    )


def profile_key(ranks: int) -> str:
    host = _host()
    return content_key(
        "coconet-cpu-profile",
        str(PROBE_VERSION),
        measured_code_digest(),
        host["host"],
        str(host["cores"]),
        host["cpu"],
        str(ranks),
        str(_scale()),
    )


def measured_code_digest() -> str:
    """What a profile measured: the compiler that generated the probe's kernels (and their
    device layer) and the runtime that ran them. A profile measured with other code is not
    this code's: a kernel generator fix once made LAMB's fused kernel 2.6x faster, and the
    cached profile, probed with the slow kernel, kept pricing it slow."""
    import coconet.runtime
    from coconet.lowering.plan_cache import compiler_digest

    h = hashlib.sha256(compiler_digest().encode())
    for path in sorted(Path(coconet.runtime.__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _load(path: Path) -> MachineProfile:
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not JSON: {e}") from None
    return MachineProfile.from_json(data)


def _run_probe_job(ranks: int, out: Path, timeout: float = 600.0) -> None:
    """`python -m coconet.tune.machine_probe OUT` on `ranks` MPI processes."""
    from coconet.runtime.cpu import apply_rank_env_defaults
    from coconet.runtime.launcher import find_mpiexec

    env = apply_rank_env_defaults(dict(os.environ))
    if ranks > (os.cpu_count() or 1):
        env.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")
    cmd = [
        find_mpiexec(),
        "-n",
        str(ranks),
        sys.executable,
        "-m",
        "coconet.tune.machine_probe",
        str(out),
    ]
    try:
        done = subprocess.run(
            cmd, check=False, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise CocoError(
            f"[profile-measure] measuring this host's profile on {ranks} rank(s) took over "
            f"{timeout:.0f} s; pass a profile instead (--profile FILE.json or a published name)"
        ) from None
    if done.returncode != 0 or not out.exists() or out.stat().st_size == 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise CocoError(
            f"[profile-measure] measuring this host's profile on {ranks} rank(s) failed "
            f"(status {done.returncode}): {' / '.join(tail) or 'no output'}"
        )


def cpu_profile(
    ranks: int, comm=None, *, log: Callable[[str], None] | None = None
) -> MachineProfile:
    """This host's profile for `ranks` ranks of the cpu backend: from the cache, else measured
    (by an mpiexec job of `ranks` processes; with `comm`, collectively on that communicator,
    every rank calling) and cached -- unless other work took more than BUSY_HOST_SHARE of the
    host's CPU while it measured: then it serves this run only, and `log` (or the
    `coconet.autotune` logger) says so."""
    key = profile_key(ranks)
    rank = 0 if comm is None else comm.Get_rank()
    cached = _cached(key) if rank == 0 else None
    if comm is not None and comm.Get_size() > 1:
        # in a job: rank 0 decides whether the cache holds it; if not, every rank measures
        shared = comm.bcast(cached.to_json() if cached else None, root=0)
        cached = MachineProfile.from_json(shared) if shared is not None else None
    if cached is not None:
        return cached
    if log and rank == 0:
        log(
            f"measuring this host's machine profile on {ranks} rank(s) (cached for later runs "
            "unless other work loads the host meanwhile)"
        )
    if comm is not None:
        profile = profile_from_measurements(measure(comm))
    else:
        with tempfile.TemporaryDirectory(prefix="coconet-probe-") as tmp:
            out = Path(tmp) / "profile.json"
            _run_probe_job(ranks, out)
            try:
                profile = _load(out)
            except ValueError as e:
                raise CocoError(f"[profile-measure] the probe wrote no profile: {e}") from None
    if rank == 0:
        _keep(key, profile, log)
    return profile


def _cached(key: str) -> MachineProfile | None:
    """The cached profile under `key`, if there is a usable one."""
    found = PROBE_CACHE.get(key, ".json", _load)
    return found.value if found is not None else None


def _keep(key: str, profile: MachineProfile, log: Callable[[str], None] | None) -> None:
    """Cache a freshly measured profile, unless the host was busy with other work while it
    was measured (its notes' `others_cpu_share`)."""
    share = profile.notes.get("measurements", {}).get("others_cpu_share")
    if share is not None and share > BUSY_HOST_SHARE:
        (log or _LOG.warning)(
            f"other work took {share:.0%} of this host's CPU time while its profile was "
            "measured: the profile serves this run but is not cached (it would price every "
            "later run by this load); it is measured again next time"
        )
        return

    def publish(tmp: Path) -> None:
        tmp.write_text(json.dumps(profile.to_json(), indent=1) + "\n")

    PROBE_CACHE.get_or_build(key, ".json", publish, _load)


def main(argv: list[str] | None = None) -> None:
    """Under mpiexec: measure on COMM_WORLD, rank 0 writes the profile's JSON to argv[0]."""
    argv = sys.argv[1:] if argv is None else argv
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    m = measure(comm)
    if comm.Get_rank() == 0:
        profile = profile_from_measurements(m)
        target = Path(argv[0])
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".probe-")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(profile.to_json(), indent=1) + "\n")
        os.replace(tmp, target)


if __name__ == "__main__":
    main()
