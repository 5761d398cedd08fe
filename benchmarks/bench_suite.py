"""Adam and LAMB, data parallel, on the cpu backend: CoCoNet's three schedules beside what a
user would write instead, and the machine's memory floor, in ONE run (one table per
optimizer, the same processes).

    .venv/bin/python benchmarks/bench_suite.py                  # 2 ranks, 2^24 parameters
    .venv/bin/python benchmarks/bench_suite.py --np 2 --log2n 22 --rounds 6 --tables lamb

Rows (every rank runs each row on its own resident buffers; a step's time is the slowest
rank's, after a barrier; the median over the timed steps):

* `coconet <schedule>`: `coconet.compile(build(n), schedule=..., backend="cpu", pieces=True)` of
  examples/adam.py or examples/lamb.py, then `compiled.step()` on the bound arrays (as
  benchmarks/bench_adam.py does): ar-c (all_reduce, then the update as fused elementwise
  kernels), rs-c-ag (reduce_scatter, sliced update with sliced m and v, all_gather),
  fuse(rs-c-ag) (one fused reduce-scatter + update + all-gather kernel; LAMB's norms are
  all-reduced inside it), and fuse(rs-c-ag) with w marked `{coco.symmetric}` (the caller
  keeps w in symmetric memory: the all_gather assembles it in place, no staging copy).
* `mpi4py + NumPy`: `comm.Allreduce(g, g1)` then the update in NumPy ufuncs, in place where
  NumPy allows (what a user of mpi4py would write).
* `torch gloo + Adam(foreach)`: `dist.all_reduce(p.grad)` over a gloo process group, then
  `torch.optim.Adam([p], foreach=True).step()`; for LAMB, which torch.optim lacks, the same
  update in in-place torch ops (what a PyTorch user would write, one thread per rank like
  the others).

The memory floor: an Adam step must at least read every rank's gradient slice once (each rank
reads its slice of every rank's gradient: 4N bytes), read and write the sliced m and v
(16N/P), read its slice of w (4N/P) and write all of w (4N): 8N + 20N/P bytes per rank (f32, N
parameters, P ranks; 18N at P = 2). LAMB's update needs the norms of w and of the update
before it can write w: a second pass reads the slice's m, v and w again (12N/P more: 8N +
32N/P). Its time is those bytes of every rank over the node's memory bandwidth,
measured in the same run as STREAM's triad (a[i] = b[i] + s c[i], counted as 12 bytes per
element like STREAM) by a host kernel compiled with the backend's own compiler and flags, run
on every rank at once, right before each row's steps (a VM's memory bandwidth changes with
its neighbours' load). `x floor`: the median, over the rounds, of the row's median step time
over the floor time at the bandwidth measured just before it.

The rows run in rounds (each row's warm-up and timed steps, every row in turn, then the next
round), so a change in the load of a shared machine falls on every row alike.

The ZeRO-3 / FSDP table (`--tables zero3`, issue #25): examples/zero3_adamw.py, AdamW with
weights and moments sliced over the ranks (each rank updates its slice only, no all_gather):
`coconet as written` (the library reduce_scatter, then the update kernel) and `coconet
fuse(rs-c)` (one fused reduce-scatter + update kernel) beside `mpi4py Reduce_scatter + NumPy`
and `torch gloo reduce_scatter + AdamW(foreach)` on the shard (FSDP2's step: the gradient
reduce-scattered to each rank's shard, torch.optim.AdamW over the sharded parameter). Floor:
every rank's gradient read once (4N) and the slices of w, m, v read and written (24N/P).

The overlap table (`--tables overlap`, printed after the optimizer tables by default): what
pipelining a GEMM with the collective next to it buys on the cpu backend, per program, each
overlap schedule beside the same schedule without overlap (f32, sizes by `--overlap-size`):

* sequence_parallel_mlp (Megatron sequence parallelism): ol(ag,mm) (all_gather chunk k+1
  while chunk k multiplies), ol(mm,rs) (reduce_scatter chunk k while chunk k+1 multiplies) and
  both, against the block as written;
* model_parallel_mlp: ol(mm,fuse(rs-c-ag)) against fuse(rs-c-ag), and the library all_reduce
  pipelined with the matmul (`ol(mm,ar)+c`) against ar-c.

`vs base` is the base row's median over the row's (above 1: the overlap is faster). On the
cpu backend a chunk's collective progresses while the next chunk multiplies only as far as
MPI progresses between BLAS calls (the backend tests its requests after each chunk), and a
fused collective kernel on the communication stream runs on the rank's one thread: the table
measures what that buys, it does not assume it.

The model-parallel tables (`--tables mp ln`): examples/model_parallel_mlp.py's block (the MLP
output projection 4H -> H, + bias, dropout, residual; `--overlap-size`) and the attention
output + LayerNorm block at H = 4096 (examples/megatron_sp_layernorm.py with the projection
H -> H; `--ln-size`), under the schedules of MP_SCHEDULES the block is offered, beside
mpi4py + NumPy and torch gloo; the floor is the local matmul in NumPy plus 8N + 4N/P bytes.

The all_to_all tables (`--tables moe ulysses`, issue #28): examples/moe_layer.py (GShard
top-2, static capacity; sizes by `--moe-size`) and examples/ulysses_attention.py (sizes by
`--ulysses-size`), each a table of:

* `coconet as written` (library all_to_alls: MPI Alltoallv) and `coconet <schedule>` for
  every named schedule the program is offered and every other schedule of the autotuner's
  space (coconet.schedule.named_schedules, enumerate_scheduled_programs), one row per
  distinct scheduled program;
* `mpi4py Alltoallv + NumPy`: what an mpi4py user writes -- Alltoallv of packed buffers, the
  routing by argmax / cumsum / index arithmetic and the dispatch and combine by indexing
  (MoE), attention and the output projection as one [S/P, H*D] x [H*D, E] matmul (Ulysses);
* `torch gloo all_to_all_single + ops`: the same in torch ops, exchanged by
  `torch.distributed.all_to_all_single` with split sizes over gloo;
* the floor: this rank's essential matmuls (gating and its experts' FFN; scores, P x V and
  the projection) in NumPy, measured in the run, plus the all_to_alls' bytes (every rank's
  (p-1)/p of each exchanged buffer, read once and written once) at the triad's bandwidth.

Each row's output is checked against coconet as written's before anything is timed. `x floor`: the
row's median over the floor; `vs as written`: coconet as written's median over the row's.

Timings on a shared machine are noisy: repeat the run, and compare rows of one run.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

SCHEDULES = ("ar-c", "rs-c-ag", "fuse(rs-c-ag)")
ADAM = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "step": 1.0}
LAMB = {**ADAM, "weight_decay": 0.01}


Step = Callable[[], object]


def moments_update(p: dict, g1, m, v) -> None:
    """Adam's and LAMB's first and second moments, in place."""
    import numpy as np

    np.multiply(m, p["beta1"], out=m)
    np.add(m, (1 - p["beta1"]) * g1, out=m)
    np.multiply(v, p["beta2"], out=v)
    np.add(v, (1 - p["beta2"]) * g1 * g1, out=v)


def adam_update(p: dict, g1, w, m, v) -> None:
    """Adam in NumPy ufuncs, in place where NumPy allows."""
    import numpy as np

    moments_update(p, g1, m, v)
    denom = np.sqrt(v / (1 - p["beta2"] ** p["step"]))
    denom += p["eps"]
    np.subtract(w, p["lr"] * (m / (1 - p["beta1"] ** p["step"])) / denom, out=w)


def adamw_update(p: dict, g1, w, m, v) -> None:
    """AdamW in NumPy (examples/zero3_adamw.py's update, on this rank's slices)."""
    import numpy as np

    moments_update(p, g1, m, v)
    r = np.sqrt(v / (1 - p["beta2"] ** p["step"]))
    r += p["eps"]
    np.divide(m / (1 - p["beta1"] ** p["step"]), r, out=r)
    r += p["weight_decay"] * w
    np.subtract(w, p["lr"] * r, out=w)


def lamb_update(p: dict, g1, w, m, v) -> None:
    """LAMB in NumPy (examples/lamb.py's update): Adam's direction plus weight decay, scaled
    by the trust ratio ||w|| / ||r||."""
    import numpy as np

    moments_update(p, g1, m, v)
    r = np.sqrt(v / (1 - p["beta2"] ** p["step"]))
    r += p["eps"]
    np.divide(m / (1 - p["beta1"] ** p["step"]), r, out=r)
    r += p["weight_decay"] * w
    trust = np.linalg.norm(w) / np.linalg.norm(r)
    np.subtract(w, p["lr"] * trust * r, out=w)


def torch_lamb(params, lr, betas, eps, weight_decay, step):
    """LAMB as a PyTorch user writes it (torch.optim has none): the same update in torch ops
    on the parameter's state, in place."""
    import torch

    (p,) = params
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    b1, b2 = betas

    class Lamb:
        @torch.no_grad()
        def step(self) -> None:
            g = p.grad
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            r = (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt_().add_(eps))
            r.add_(p, alpha=weight_decay)
            trust = p.norm() / r.norm()
            p.sub_(lr * trust * r)

    return Lamb()


@dataclass(frozen=True)
class Optimizer:
    """One data-parallel optimizer table: the example (a build(n) of examples/NAME.py), its
    scalars, how a NumPy and a PyTorch user would write the update, and its memory floor:
    `floor` = (a, b) for a N + b N / P bytes per rank."""

    title: str
    example: str
    scalars: dict
    numpy_update: Callable
    torch_label: str
    floor: tuple[int, int]
    floor_why: str
    # ZeRO-3: w, m and v sliced over the ranks, the gradient reduce-scattered to the slices;
    # its own schedules (as written: "")
    sliced: bool = False
    schedules: tuple[str, ...] | None = None

    def floor_bytes(self, n: int, size: int) -> int:
        a, b = self.floor
        return size * (a * n + b * n // size)


OPTIMIZERS = {
    "adam": Optimizer(
        "Adam",
        "adam",
        ADAM,
        adam_update,
        "torch gloo + Adam(foreach)",
        (8, 20),
        "8N + 20N/P bytes per rank",
    ),
    "lamb": Optimizer(
        "LAMB",
        "lamb",
        LAMB,
        lamb_update,
        "torch gloo + LAMB (torch ops)",
        (8, 32),
        "8N + 32N/P bytes per rank: Adam's, and a second pass over the slice's m, v and w "
        "once the norms are known",
    ),
    "zero3": Optimizer(
        "ZeRO-3 / FSDP AdamW (w, m, v sliced)",
        "zero3_adamw",
        LAMB,
        adamw_update,
        "torch gloo reduce_scatter + AdamW(foreach)",
        (4, 24),
        "4N + 24N/P bytes per rank: every rank's gradient slice read once, the slices of w, "
        "m and v read and written",
        sliced=True,
        schedules=("", "fuse(rs-c)"),
    ),
}


def timed(comm, fn: Step, warmup: int, iters: int, before: Step | None = None) -> list[float]:
    """The slowest rank's time of each of `iters` steps of `fn` (after `warmup` steps);
    `before` runs untimed before each step."""
    from mpi4py import MPI

    for _ in range(warmup):
        if before is not None:
            before()
        fn()
    times = []
    for _ in range(iters):
        if before is not None:
            before()
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return times


def stream_triad(comm, n: int) -> Step:
    """A step of STREAM's triad on every rank's own arrays of n floats (all ranks at once)."""
    import ctypes

    import numpy as np

    from coconet.toolchain.host_compiler import compile_host
    from coconet.tune.machine_probe import STREAM_SOURCE  # the probe's triad: both measure one loop

    lib = compile_host(STREAM_SOURCE)
    kernel = lib.kernel(
        "stream_triad", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float,
        ctypes.c_int64,
    )  # fmt: skip
    a = np.zeros(n, np.float32)
    b = np.ones(n, np.float32)
    c = np.full(n, 2.0, np.float32)
    return lambda: kernel(64, 256, a, b, c, 3.0, n)


def optimizer_inputs(plan, rank: int, n: int, scalars: dict) -> dict[str, object]:
    """This rank's pieces of the optimizer's arguments: its own gradient, the shared state."""
    import numpy as np

    from coconet.core import values as V

    coords = V.coords_of(rank, plan.grid_shape)
    shared = np.random.default_rng(1)  # the same replicated state on every rank
    mine = np.random.default_rng(100 + rank)  # this rank's own gradient
    inputs: dict[str, object] = {}
    for arg, buf in plan.arguments.items():
        if buf.shape == ():
            inputs[arg] = scalars[arg]
        elif arg == "g":
            inputs[arg] = mine.standard_normal(buf.shape, dtype=np.float32)
        else:
            full = shared.random(n, dtype=np.float32) * (0.01 if arg == "v" else 1.0)
            inputs[arg] = V.piece_of(full, buf.type, coords, plan.grid_shape)
    return inputs


def coconet_steps(
    comm, opt: Optimizer, n: int, schedules: list[str]
) -> list[tuple[str, Step, object]]:
    """(label, step, the compiled program) of each schedule, its arrays bound."""
    import runpy
    from pathlib import Path

    from coconet.compile import compile as coco_compile

    example = Path(__file__).resolve().parents[1] / "examples" / f"{opt.example}.py"
    program = runpy.run_path(str(example))["build"](n)
    out = []
    variants = [(name, program, "") for name in schedules]
    if FUSED in schedules:
        # w kept in symmetric memory: the fused all_gather assembles it in place
        variants.append((FUSED, symmetric_w(program), SYMMETRIC_W))
    for name, prog, suffix in variants:
        compiled = coco_compile(prog, schedule=name or None, backend="cpu", pieces=True)
        compiled(**optimizer_inputs(compiled.plan, comm.Get_rank(), n, opt.scalars))  # binds
        out.append((f"coconet {name or 'as written'}{suffix}", compiled.step, compiled))
    return out


FUSED = "fuse(rs-c-ag)"
SYMMETRIC_W = ", w symmetric"


def symmetric_w(program):
    """`program` with its argument w marked `{coco.symmetric}` (the caller keeps it there)."""
    from coconet.core.program import mark_symmetric

    marked = program.clone()
    mark_symmetric(marked.func, [a.value.index for a in marked.arguments if a.name == "w"])
    return marked


def numpy_step(comm, opt: Optimizer, n: int) -> Step:
    """mpi4py's Allreduce, then the update in NumPy (in place where NumPy allows)."""
    import numpy as np
    from mpi4py import MPI

    g = np.random.default_rng(100 + comm.Get_rank()).standard_normal(n, dtype=np.float32)
    k = n // comm.Get_size() if opt.sliced else n  # ZeRO-3: this rank's slice
    w = np.random.default_rng(1).random(k, dtype=np.float32)
    m = np.zeros(k, np.float32)
    v = np.zeros(k, np.float32)
    g1 = np.empty(k, np.float32)
    p = {k: np.float32(x) for k, x in opt.scalars.items()}

    def step() -> None:
        if opt.sliced:
            comm.Reduce_scatter_block(g, g1, op=MPI.SUM)
        else:
            comm.Allreduce(g, g1, op=MPI.SUM)
        opt.numpy_update(p, g1, w, m, v)

    return step


def torch_step(comm, opt: Optimizer, n: int) -> tuple[Step, Step] | None:
    """torch.distributed's all_reduce over gloo, then torch.optim.Adam(foreach=True) (or LAMB in
    torch ops); and the untimed refill of the gradient (backward's work) before each step."""
    if not _torch_group(comm):
        return None
    import torch
    import torch.distributed as dist

    shard = n // comm.Get_size() if opt.sliced else n  # FSDP2: this rank's shard
    p = torch.nn.Parameter(torch.rand(shard, generator=torch.Generator().manual_seed(1)))
    grad = torch.randn(n, generator=torch.Generator().manual_seed(100 + comm.Get_rank()))
    full = grad.clone()
    p.grad = torch.empty(shard) if opt.sliced else full
    k = opt.scalars
    betas = (k["beta1"], k["beta2"])
    if opt.example == "lamb":
        optim = torch_lamb([p], k["lr"], betas, k["eps"], k["weight_decay"], k["step"])
    elif opt.sliced:
        optim = torch.optim.AdamW(
            [p], lr=k["lr"], betas=betas, eps=k["eps"], weight_decay=k["weight_decay"],
            foreach=True,
        )  # fmt: skip
    else:
        optim = torch.optim.Adam([p], lr=k["lr"], betas=betas, eps=k["eps"], foreach=True)
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)

    def step() -> None:
        if opt.sliced:
            scatter(p.grad, full)
        else:
            dist.all_reduce(p.grad)
        optim.step()

    return step, lambda: full.copy_(grad)


# (program, [(label, schedule: a named schedule or a pipeline)]): the first row is the base.
OVERLAP_ROWS = [
    (
        "sequence_parallel_mlp",
        [
            ("as written", ""),
            ("ol(ag,mm)", "ol(ag,mm)"),
            ("ol(mm,rs)", "ol(mm,rs)"),
            ("ol(ag,mm)+ol(mm,rs)", "ol(ag,mm)+ol(mm,rs)"),
        ],
    ),
    ("model_parallel_mlp", [("fuse(rs-c-ag)", "fuse(rs-c-ag)"), ("ol(mm,fuse(rs-c-ag))", None)]),
    (
        "model_parallel_mlp",
        [("ar-c", "ar-c"), ("ol(mm,ar)+c", "coco-overlap{ops=layer},coco-fuse{mode=elementwise}")],
    ),
    # FSDP's layer step: the weight's all_gather pipelined with the forward GEMM (chunks of
    # the reduction dim), the gradient GEMM with its reduce_scatter, both
    (
        "fsdp_step",
        [
            ("as written", ""),
            ("ol(ag,mm)", "ol(ag,mm)"),
            ("ol(mm,rs)", "ol(mm,rs)"),
            ("ol(ag,mm)+ol(mm,rs)", "ol(ag,mm)+ol(mm,rs)"),
        ],
    ),
]


def overlap_program(name: str, build: Callable, batch: int, seq: int, hidden: int):
    """`name`'s program at the table's sizes: the MLPs' [batch, seq, hidden]; FSDP's layer
    with batch x seq tokens, the weight [4 hidden, hidden] (an MLP's output projection)."""
    from coconet.frontend import F32

    if name == "fsdp_step":
        return build(b=batch * seq, k=4 * hidden, n=hidden)
    return build(F32, batch=batch, seq=seq, hidden=hidden)


def overlap_steps(comm, sizes: tuple[int, int, int]) -> list[tuple[str, list]]:
    """Per OVERLAP_ROWS entry: its title and (label, step, compiled) rows, arrays bound."""
    import runpy
    from pathlib import Path

    import numpy as np

    from coconet.compile import compile as coco_compile
    from coconet.dialects.coco import LocalAttr

    batch, seq, hidden = sizes
    examples = Path(__file__).resolve().parents[1] / "examples"
    out = []
    for name, rows in OVERLAP_ROWS:
        build = runpy.run_path(str(examples / f"{name}.py"))["build"]
        program = overlap_program(name, build, batch, seq, hidden)
        steps = []
        for label, schedule in rows:
            spec = label if schedule is None else schedule
            compiled = coco_compile(program, schedule=spec or None, backend="cpu", pieces=True)
            # Local arguments differ between ranks; the others are one value everywhere (a
            # replicated one must be: the first call checks).
            inputs = {}
            for i, (arg, buf) in enumerate(compiled.plan.arguments.items()):
                local = any(isinstance(lay, LocalAttr) for lay in buf.type.layouts.data)
                rng = np.random.default_rng([10, i, comm.Get_rank() if local else 0])
                inputs[arg] = rng.standard_normal(buf.shape, dtype=np.float32)
            # (FSDP's AdamW: its hyperparameters, a non-negative second moment)
            for arg, buf in compiled.plan.arguments.items():
                if buf.shape == ():
                    inputs[arg] = np.asarray(ADAM.get(arg, 0.01), np.float32)
                elif arg == "v":
                    inputs[arg] = np.abs(inputs[arg]) * 0.01
            compiled(**inputs)  # binds the arrays
            steps.append((label, compiled.step, compiled))
        shape = f"[{batch * seq}, {4 * hidden}] x [{4 * hidden}, {hidden}]"
        out.append((f"{name} {shape if name == 'fsdp_step' else [batch, seq, hidden]} f32", steps))
    return out


MP_SCHEDULES = ("ar-c", "rs-c-ag", "fuse(rs-c-ag)", "ol(mm,fuse(rs-c-ag))")
# The model-parallel tables: the MLP's output projection (4H -> H) + bias, dropout, residual;
# and the attention output projection (H -> H) + the same + LayerNorm (examples/
# megatron_sp_layernorm.py), whose fused form reduces, normalizes and gathers in one kernel.
MP_BLOCKS = {
    "mp": ("model_parallel_mlp", 4, False),
    "ln": ("megatron_sp_layernorm", 1, True),
}


def mp_steps(
    comm, sizes: tuple[int, int, int], block: str = "mp"
) -> tuple[list, Step, Step | None, Step]:
    """A model-parallel block (MP_BLOCKS, f32) at `sizes`: coconet's schedules (those offered);
    mpi4py + NumPy and torch gloo as their users write it (matmul of the local pieces,
    all_reduce of the partial sums, bias, dropout, residual, and LayerNorm where the block has
    it); and the local matmul alone in NumPy (the BLAS part of the floor)."""
    import runpy
    from pathlib import Path

    import numpy as np
    from mpi4py import MPI

    from coconet.compile import compile as coco_compile
    from coconet.frontend import F32
    from coconet.schedule import named_schedules

    batch, seq, hidden = sizes
    stem, widen, norm = MP_BLOCKS[block]
    example = Path(__file__).resolve().parents[1] / "examples" / f"{stem}.py"
    build = runpy.run_path(str(example))["build"]
    if norm:
        program = build(F32, batch=batch, seq=seq, k=widen * hidden, hidden=hidden)
    else:
        program = build(F32, batch=batch, seq=seq, hidden=hidden)
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(10 + rank)
    compiled = []
    offered = named_schedules(program, ranks=size)
    for name in (s for s in MP_SCHEDULES if s in offered):
        c = coco_compile(program, schedule=name, backend="cpu", pieces=True)
        same = np.random.default_rng(10)  # replicated arguments: the same value on every rank
        c(
            **{
                a: same.standard_normal(b.shape, dtype=np.float32)
                for a, b in c.plan.arguments.items()
            }
        )
        compiled.append((f"coconet {name}", c.step, c))
    k = widen * hidden // size
    x = rng.standard_normal((batch, seq, k), dtype=np.float32)
    w = rng.standard_normal((k, hidden), dtype=np.float32)
    b = rng.standard_normal(hidden, dtype=np.float32)
    r = rng.standard_normal((batch, seq, hidden), dtype=np.float32)
    gamma = rng.standard_normal(hidden, dtype=np.float32)
    beta = rng.standard_normal(hidden, dtype=np.float32)
    y = np.empty((batch, seq, hidden), np.float32)
    total = np.empty_like(y)
    drop = np.random.default_rng(2)

    def numpy_step() -> None:
        np.matmul(x, w, out=y)
        comm.Allreduce(y, total, op=MPI.SUM)
        np.add(total, b, out=total)
        keep = drop.random(total.shape, dtype=np.float32) >= np.float32(0.1)
        np.multiply(total, keep / np.float32(0.9), out=total)
        np.add(total, r, out=total)
        if norm:
            mean = total.mean(-1, keepdims=True)
            centred = total - mean
            var = np.mean(centred * centred, -1, keepdims=True)
            (centred / np.sqrt(var + np.float32(1e-5))) * gamma + beta

    def blas() -> None:
        np.matmul(x, w, out=y)

    torch_row = None
    try:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        if dist.is_initialized():
            tx, tw, tb, tr, tg, tbeta = (torch.from_numpy(a) for a in (x, w, b, r, gamma, beta))

            def torch_row() -> None:
                t = tx @ tw
                dist.all_reduce(t)
                h = F.dropout(t + tb, 0.1) + tr
                if norm:
                    F.layer_norm(h, (hidden,), tg, tbeta)

    except ImportError:
        pass
    return compiled, numpy_step, torch_row, blas


def mp_worker(comm, args: argparse.Namespace, block: str = "mp") -> None:
    """A model-parallel block's table: every row in rounds, the floor measured in the run."""
    size_arg = args.ln_size if block == "ln" else args.overlap_size
    sizes = tuple(int(x) for x in size_arg.split(","))
    batch, seq, hidden = sizes
    stem, widen, norm = MP_BLOCKS[block]
    size = comm.Get_size()
    torch_up = _torch_group(comm)
    compiled, numpy_step, torch_row, blas = mp_steps(comm, sizes, block)  # type: ignore[arg-type]
    rows: list[tuple[str, Step]] = [(label, s) for label, s, _ in compiled]
    rows.append(("mpi4py + NumPy", numpy_step))
    if torch_row is not None:
        rows.append(("torch gloo (matmul, all_reduce, ops)", torch_row))
    n = batch * seq * hidden
    floor_bytes = size * (8 * n + 4 * n // size)
    triad_n = 1 << 25
    triad = stream_triad(comm, triad_n)
    times: dict[str, list[float]] = {label: [] for label, _ in rows}
    floors: list[float] = []
    for _ in range(args.rounds):
        bandwidth = size * 12 * triad_n / min(timed(comm, triad, 1, 3))
        matmul = statistics.median(timed(comm, blas, 1, 5))
        floors.append(matmul + floor_bytes / bandwidth)
        for label, step in rows:
            times[label] += timed(comm, step, args.warmup, args.iters)
    for _, _, c in compiled:
        c.close()
    if torch_up:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    if comm.Get_rank() != 0:
        return
    floor = statistics.median(floors)
    what = "+ bias, dropout, residual" + (", LayerNorm" if norm else "")
    print(
        f"\nModel-parallel block (examples/{stem}.py, [{batch}, {seq}, {widen * hidden}] "
        f"x [{widen * hidden}, {hidden}] f32 sliced over {size} rank(s), {what}), "
        f"cpu backend, {os.cpu_count()} core(s): median of {args.rounds * args.iters} step(s)"
    )
    print(
        "  floor = this rank's matmul in NumPy (BLAS, measured in the run) + "
        f"{floor_bytes / 2**20:.0f} MiB (8N + 4N/P bytes per rank, N = {n}) at the triad's "
        f"bandwidth = {floor * 1e3:.2f} ms"
    )
    fused = times.get("coconet fuse(rs-c-ag)") or times["coconet ar-c"]
    width = max(len(label) for label in times) + 2
    print(f"  {'':<{width}}{'median':>10}{'min':>10}{'x floor':>9}{'fuse(rs-c-ag) is':>27}")
    for label, ts in times.items():
        med = statistics.median(ts)
        print(
            f"  {label:<{width}}{med * 1e3:>8.2f}ms{min(ts) * 1e3:>8.2f}ms{med / floor:>8.2f}x"
            f"{med / statistics.median(fused):>13.2f}x as fast"
        )
    print(f"  {'floor':<{width}}{floor * 1e3:>8.2f}ms{'':>10}{1.0:>8.2f}x")


# --------------------------------------------------------------------------------------------
# all_to_all: the MoE layer and the Ulysses block (examples/moe_layer.py,
# examples/ulysses_attention.py)
# --------------------------------------------------------------------------------------------


def parts(n: int, size: int) -> list[tuple[int, int]]:
    """[begin, end) of each rank's part of n (the first n % size ranks hold one more)."""
    base, extra = divmod(n, size)
    starts = [r * base + min(r, extra) for r in range(size + 1)]
    return list(itertools.pairwise(starts))


def alltoallv_numpy(comm, blocks: list, shapes: list[tuple[int, ...]]) -> list:
    """mpi4py's Alltoallv: blocks[j] to rank j (packed into one buffer, as its users write
    it); returns what each rank sent this one, shaped shapes[i]."""
    import numpy as np
    from mpi4py import MPI

    send = np.concatenate([b.reshape(-1) for b in blocks])
    counts = [b.size for b in blocks]
    rcounts = [math.prod(shape) for shape in shapes]
    recv = np.empty(sum(rcounts), np.float32)
    displs = [sum(counts[:j]) for j in range(len(counts))]
    rdispls = [sum(rcounts[:i]) for i in range(len(rcounts))]
    comm.Alltoallv([send, (counts, displs), MPI.FLOAT], [recv, (rcounts, rdispls), MPI.FLOAT])
    return [
        recv[d : d + c].reshape(shape) for d, c, shape in zip(rdispls, rcounts, shapes, strict=True)
    ]


def alltoallv_torch(blocks: list, shapes: list[tuple[int, ...]]) -> list:
    """torch.distributed's all_to_all_single over gloo with split sizes, on flat tensors."""
    import torch
    import torch.distributed as dist

    send = torch.cat([b.reshape(-1) for b in blocks])
    rcounts = [math.prod(shape) for shape in shapes]
    recv = torch.empty(sum(rcounts))
    dist.all_to_all_single(recv, send, rcounts, [b.numel() for b in blocks])
    return [piece.view(shape) for piece, shape in zip(recv.split(rcounts), shapes, strict=True)]


def ulysses_rows(comm, sizes: tuple[int, ...], torch_up: bool):
    """The Ulysses block's pieces on this rank, and (label, step, output) of mpi4py + NumPy
    and torch gloo as their users write it: all_to_all q, kt, v to head slices, attention,
    all_to_all back, the output projection as one [S/P, H*D] x [H*D, E] matmul."""
    import numpy as np

    h, s, d, e = sizes
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(3)  # the same logical tensors on every rank
    logical = {
        "q": rng.standard_normal((h, s, d), dtype=np.float32),
        "kt": rng.standard_normal((h, d, s), dtype=np.float32),
        "v": rng.standard_normal((h, s, d), dtype=np.float32),
        "wo": rng.standard_normal((h, d, e), dtype=np.float32) / np.float32(math.sqrt(h * d)),
    }
    heads, seq = parts(h, size), parts(s, size)
    (h0, h1), (s0, s1) = heads[rank], seq[rank]
    q, kt, v = logical["q"][:, s0:s1], logical["kt"][:, :, s0:s1], logical["v"][:, s0:s1]
    q, kt, v = (np.ascontiguousarray(a) for a in (q, kt, v))
    wo = logical["wo"]
    mask = np.where(np.arange(s)[None, :] <= np.arange(s)[:, None], 0, -np.inf)
    mask = mask.astype(np.float32)
    scale = np.float32(1 / math.sqrt(d))
    mine, here = h1 - h0, s1 - s0

    def attention_numpy(qh, kh, vh):
        scores = qh @ kh
        scores *= scale
        scores += mask
        scores -= scores.max(-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(-1, keepdims=True)
        return scores @ vh

    out_np = np.empty((here, e), np.float32)

    def numpy_step() -> None:
        to_heads = [(mine, b - a, d) for a, b in seq]
        qh = np.concatenate(alltoallv_numpy(comm, [q[a:b] for a, b in heads], to_heads), 1)
        kh = np.concatenate(
            alltoallv_numpy(comm, [kt[a:b] for a, b in heads], [(mine, d, b - a) for a, b in seq]),
            2,
        )
        vh = np.concatenate(alltoallv_numpy(comm, [v[a:b] for a, b in heads], to_heads), 1)
        o = attention_numpy(qh, kh, vh)
        back = alltoallv_numpy(
            comm, [o[:, a:b] for a, b in seq], [(b - a, here, d) for a, b in heads]
        )
        full = np.concatenate(back, 0)  # [H, S/P, D]
        np.matmul(full.transpose(1, 0, 2).reshape(here, h * d), wo.reshape(h * d, e), out=out_np)

    rows = [("mpi4py Alltoallv + NumPy", numpy_step, lambda: out_np)]
    if torch_up:
        import torch

        tq, tkt, tv, two = (torch.from_numpy(a) for a in (q, kt, v, wo))
        tmask, result = torch.from_numpy(mask), {}

        def torch_step() -> None:
            to_heads = [(mine, b - a, d) for a, b in seq]
            qh = torch.cat(alltoallv_torch([tq[a:b] for a, b in heads], to_heads), 1)
            kh = torch.cat(
                alltoallv_torch([tkt[a:b] for a, b in heads], [(mine, d, b - a) for a, b in seq]),
                2,
            )
            vh = torch.cat(alltoallv_torch([tv[a:b] for a, b in heads], to_heads), 1)
            o = torch.softmax(qh @ kh * float(scale) + tmask, -1) @ vh
            back = alltoallv_torch(
                [o[:, a:b] for a, b in seq], [(b - a, here, d) for a, b in heads]
            )
            full = torch.cat(back, 0)
            result["out"] = full.transpose(0, 1).reshape(here, h * d) @ two.reshape(h * d, e)

        rows.append(
            ("torch gloo all_to_all_single + ops", torch_step, lambda: result["out"].numpy())
        )

    def blas() -> None:  # the block's matmuls on this rank's shapes
        qh, kh = np.ones((mine, s, d), np.float32), np.ones((mine, d, s), np.float32)
        np.matmul(np.matmul(qh, kh), qh)
        np.matmul(np.ones((here, h * d), np.float32), wo.reshape(h * d, e))

    return logical, rows, blas


def moe_rows(comm, sizes: tuple[int, ...], torch_up: bool):
    """The MoE layer's pieces on this rank, and (label, step, output) of mpi4py + NumPy and
    torch gloo as their users write it: GShard's top-2 routing with argmax, cumsum and index
    arithmetic, the tokens scattered into the dispatch buffers by index, all_to_all, each
    local expert's FFN, all_to_all back, the gates times the gathered outputs, residual."""
    import numpy as np

    g, s, m, e, c, f = sizes
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(4)

    def dyadic(shape):  # exact logits: the routing agrees with coconet's to the bit
        return (rng.integers(-64, 65, size=shape) / 64).astype(np.float32)

    logical = {
        "x": dyadic((g, s, m)),
        "wg": dyadic((m, e)),
        "w1": rng.standard_normal((e, m, f), dtype=np.float32) / np.float32(math.sqrt(m)),
        "w2": rng.standard_normal((e, f, m), dtype=np.float32) / np.float32(math.sqrt(f)),
    }
    groups, experts = parts(g, size), parts(e, size)
    (g0, g1), (e0, e1) = groups[rank], experts[rank]
    x, wg = np.ascontiguousarray(logical["x"][g0:g1]), logical["wg"]
    w1, w2 = np.ascontiguousarray(logical["w1"][e0:e1]), np.ascontiguousarray(logical["w2"][e0:e1])
    here, mine = g1 - g0, e1 - e0

    def route_numpy():
        logits = x @ wg  # [G/P, S, E]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        left, filled, routes = logits.copy(), np.zeros((here, 1, e), np.int64), []
        for _ in range(2):
            best = left.argmax(-1)  # the first expert of the row max
            onehot = best[..., None] == np.arange(e)
            position = np.cumsum(onehot, 1) - 1 + filled
            slot = np.take_along_axis(position, best[..., None], -1)[..., 0]
            gate = np.take_along_axis(probs, best[..., None], -1)[..., 0]
            routes.append((best, slot, slot < c, gate))
            filled = np.minimum(filled + onehot.sum(1, keepdims=True), c)
            np.put_along_axis(left, best[..., None], -np.inf, -1)
        total = routes[0][3] + routes[1][3]
        return [(b, sl, k, gate / total) for b, sl, k, gate in routes]

    out_np = np.empty_like(x)

    def numpy_step() -> None:
        routes = route_numpy()
        buffers = np.zeros((e, here, c, m), np.float32)
        for best, slot, keep, _ in routes:
            gg, ss = np.nonzero(keep)
            buffers[best[gg, ss], gg, slot[gg, ss]] = x[gg, ss]
        got = alltoallv_numpy(
            comm, [buffers[a:b] for a, b in experts], [(mine, b - a, c, m) for a, b in groups]
        )
        tokens = np.concatenate(got, 1).reshape(mine, g * c, m)
        y = (np.maximum(tokens @ w1, 0) @ w2).reshape(mine, g, c, m)
        back = alltoallv_numpy(
            comm, [y[:, a:b] for a, b in groups], [(b - a, here, c, m) for a, b in experts]
        )
        returned = np.concatenate(back, 0)  # [E, G/P, C, M]
        out_np[...] = x
        for best, slot, keep, gate in routes:
            gg, ss = np.nonzero(keep)
            out_np[gg, ss] += gate[gg, ss, None] * returned[best[gg, ss], gg, slot[gg, ss]]

    rows = [("mpi4py Alltoallv + NumPy", numpy_step, lambda: out_np)]
    if torch_up:
        import torch

        tx, twg, tw1, tw2 = (torch.from_numpy(a) for a in (x, wg, w1, w2))
        result = {}

        def torch_step() -> None:
            logits = tx @ twg
            probs = torch.softmax(logits, -1)
            left, filled, routes = logits.clone(), torch.zeros(here, 1, e, dtype=torch.long), []
            for _ in range(2):
                best = left.argmax(-1)
                onehot = torch.nn.functional.one_hot(best, e)
                position = onehot.cumsum(1) - 1 + filled
                slot = position.gather(-1, best[..., None])[..., 0]
                gate = probs.gather(-1, best[..., None])[..., 0]
                routes.append((best, slot, slot < c, gate))
                filled = (filled + onehot.sum(1, keepdim=True)).clamp(max=c)
                left.scatter_(-1, best[..., None], float("-inf"))
            total = routes[0][3] + routes[1][3]
            buffers = torch.zeros(e, here, c, m)
            for best, slot, keep, _ in routes:
                gg, ss = keep.nonzero(as_tuple=True)
                buffers[best[gg, ss], gg, slot[gg, ss]] = tx[gg, ss]
            got = alltoallv_torch(
                [buffers[a:b] for a, b in experts], [(mine, b - a, c, m) for a, b in groups]
            )
            tokens = torch.cat(got, 1).reshape(mine, g * c, m)
            y = (torch.relu(tokens @ tw1) @ tw2).reshape(mine, g, c, m)
            back = alltoallv_torch(
                [y[:, a:b] for a, b in groups], [(b - a, here, c, m) for a, b in experts]
            )
            returned = torch.cat(back, 0)
            out = tx.clone()
            for best, slot, keep, gate in routes:
                gg, ss = keep.nonzero(as_tuple=True)
                weight = (gate / total)[gg, ss, None]
                out[gg, ss] += weight * returned[best[gg, ss], gg, slot[gg, ss]]
            result["out"] = out

        rows.append(
            ("torch gloo all_to_all_single + ops", torch_step, lambda: result["out"].numpy())
        )

    def blas() -> None:  # the layer's essential matmuls on this rank: gating, its experts' FFN
        np.matmul(x, wg)
        np.matmul(np.matmul(np.ones((mine, g * c, m), np.float32), w1), w2)

    return logical, rows, blas


A2A_TABLES = {
    "moe": ("moe_layer", moe_rows, "moe_size"),
    "ulysses": ("ulysses_attention", ulysses_rows, "ulysses_size"),
}


def a2a_worker(comm, table: str, args: argparse.Namespace) -> None:
    """The MoE layer's or the Ulysses block's table: coconet as written and under every named
    schedule the program is offered, mpi4py + NumPy, torch gloo, and the floor -- every row in
    rounds, the floor measured in the run; each baseline checked against coconet's output
    first."""
    import runpy
    from pathlib import Path

    import numpy as np

    from coconet.compile import CompiledProgram, compile as coco_compile
    from coconet.core import values as V
    from coconet.runtime.executor import plan_traffic
    from coconet.schedule import apply_schedule, enumerate_scheduled_programs, named_schedules

    example, make_rows, option = A2A_TABLES[table]
    sizes = tuple(int(x) for x in getattr(args, option).split(","))
    size, rank = comm.Get_size(), comm.Get_rank()
    torch_up = _torch_group(comm)
    build = runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / f"{example}.py"))[
        "build"
    ]
    program = build(*sizes)
    logical, baselines, blas = make_rows(comm, sizes, torch_up)
    rows: list[tuple[str, Step]] = []
    # coconet's schedules: as written, the named ones the program is offered, the rest of the
    # autotuner's space; one row per distinct scheduled program
    space = [(name, q) for name, _, q in enumerate_scheduled_programs(program)]
    named = [(name, apply_schedule(program, name)) for name in named_schedules(program)]
    compiled: list[CompiledProgram] = []
    seen: set[str] = set()
    reference = None
    for name, q in [space[0], *named, *space[1:]]:  # the space starts with as-written
        if q.print() in seen:
            continue
        seen.add(q.print())
        c = coco_compile(q, backend="cpu", pieces=True)
        assert isinstance(c, CompiledProgram)
        coords = V.coords_of(rank, c.plan.grid_shape)
        pieces = {
            arg: V.piece_of(logical[arg], buf.type, coords, c.plan.grid_shape)
            for arg, buf in c.plan.arguments.items()
        }
        out = np.array(next(iter(c(**pieces).values())))
        if reference is None:
            reference = out
        elif not np.allclose(out, reference, rtol=1e-3, atol=1e-4):
            raise SystemExit(f"{table}: coconet {name} on rank {rank} differs from as written")
        compiled.append(c)
        rows.append((f"coconet {'as written' if name == 'as-written' else name}", c.step))
    assert reference is not None
    for label, step, output in baselines:
        step()
        got = np.asarray(output())
        if not np.allclose(got, reference, rtol=1e-3, atol=1e-4):
            raise SystemExit(
                f"{table}: '{label}' on rank {rank} differs from coconet's output by "
                f"{np.abs(got - reference).max():.3g}"
            )
        rows.append((label, step))
    # Every rank's all_to_all traffic, read from the sender's memory and written to the
    # receiver's: the plan as written's (p-1)/p of each exchanged buffer, twice.
    exchange = 2 * sum(plan_traffic(compiled[0].plan, r) for r in range(size))
    triad_n = 1 << 25
    triad = stream_triad(comm, triad_n)
    times: dict[str, list[float]] = {label: [] for label, _ in rows}
    floors: list[float] = []
    for _ in range(args.rounds):
        bandwidth = size * 12 * triad_n / min(timed(comm, triad, 1, 3))
        floors.append(statistics.median(timed(comm, blas, 1, 5)) + exchange / bandwidth)
        for label, step in rows:
            times[label] += timed(comm, step, args.warmup, args.iters)
    for c in compiled:
        c.close()
    if torch_up:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return
    floor = statistics.median(floors)
    base = statistics.median(times["coconet as written"])
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in logical.items())
    print(
        f"\n{example} ({shapes} f32), {size} rank(s) of the cpu backend, {os.cpu_count()} "
        f"core(s): median of {args.rounds * args.iters} step(s) ({args.rounds} round(s) of "
        f"{args.iters} after {args.warmup} warm-up), slowest rank per step"
    )
    print(
        f"  floor = this rank's essential matmuls in NumPy (BLAS, measured in the run) + the "
        f"all_to_alls' {exchange / 2**20:.1f} MiB (every rank's (p-1)/p of each exchanged "
        f"buffer, read and written once) at the triad's bandwidth = {floor * 1e3:.2f} ms"
    )
    width = max(len(label) for label in times) + 2
    print(f"  {'':<{width}}{'median':>10}{'min':>10}{'x floor':>9}{'vs as written':>15}")
    for label, ts in times.items():
        med = statistics.median(ts)
        print(
            f"  {label:<{width}}{med * 1e3:>8.2f}ms{min(ts) * 1e3:>8.2f}ms{med / floor:>8.2f}x"
            f"{base / med:>14.2f}x"
        )
    print(f"  {'floor':<{width}}{floor * 1e3:>8.2f}ms{'':>10}{1.0:>8.2f}x{base / floor:>14.2f}x")
    print(
        "  x floor: median over the floor; vs as written: coconet as written's median over the "
        "row's (above 1: faster)"
    )


def _torch_group(comm) -> bool:
    """A gloo process group over the job's ranks (False: no PyTorch)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return False
    import socket

    torch.set_num_threads(1)  # one core per rank, as the other rows
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{comm.bcast(port, root=0)}",
        rank=comm.Get_rank(),
        world_size=comm.Get_size(),
    )
    return True


def overlap_worker(comm, args: argparse.Namespace) -> None:
    sizes = tuple(int(x) for x in args.overlap_size.split(","))
    tables = overlap_steps(comm, sizes)  # type: ignore[arg-type]
    times: dict[tuple[int, str], list[float]] = {}
    for _ in range(args.rounds):
        for t, (_, rows) in enumerate(tables):
            for label, step, _ in rows:
                times.setdefault((t, label), []).extend(timed(comm, step, args.warmup, args.iters))
    for _, rows in tables:
        for _, _, c in rows:
            c.close()
    if comm.Get_rank() != 0:
        return
    steps = args.rounds * args.iters
    print(
        f"\nOverlap, {comm.Get_size()} rank(s) of the cpu backend, {os.cpu_count()} core(s): "
        f"median of {steps} step(s) ({args.rounds} round(s) of {args.iters} after "
        f"{args.warmup} warm-up), slowest rank per step"
    )
    width = max(len(label) for _, rows in tables for label, _, _ in rows) + 2
    for t, (title, rows) in enumerate(tables):
        base_label = rows[0][0]
        base = statistics.median(times[(t, base_label)])
        print(f"  {title}")
        print(f"    {'':<{width}}{'median':>10}{'min':>10}{'vs ' + base_label:>28}")
        for label, _, _ in rows:
            ts = times[(t, label)]
            med = statistics.median(ts)
            print(
                f"    {label:<{width}}{med * 1e3:>8.2f}ms{min(ts) * 1e3:>8.2f}ms"
                f"{base / med:>27.2f}x"
            )
    print("  vs base: the base row's median over the row's (above 1: faster than the base)")


# ---------------------------------------------------------------------------------------------
# fp8 on the wire (issue #31.6): each fp8 example beside its f32 and bf16 forms
# ---------------------------------------------------------------------------------------------


def fp8_programs(log2n: int) -> list[tuple[str, list[str | None], list[tuple[str, object]]]]:
    """(title, schedules, [(form, program)]) per fp8 example (examples/*.py's build()), the f32
    form first: it is the base of the ratios. n = 2^log2n elements in the tensor that moves:
    Adam's parameters; the epilogue's [n / 4096, 4096] activations; the FSDP weight
    [n / 2048, 2048] (times 16 tokens of activations)."""
    import runpy
    from pathlib import Path

    from coconet.frontend import BF16, F8E4M3FN, F32

    examples = Path(__file__).resolve().parents[1] / "examples"

    def build(name: str) -> Callable:
        return runpy.run_path(str(examples / f"{name}.py"))["build"]

    n = 1 << log2n
    adam, rms, gather = (
        build(e) for e in ("adam_fp8_wire", "allreduce_rmsnorm_fp8", "fp8_allgather_matmul")
    )
    tokens, k = max(1, n // 4096), max(1, n // 2048)
    return [
        (
            f"adam_fp8_wire: Adam over n = 2^{log2n} f32 parameters, the gradient arriving as",
            ["ar-c", "fuse(rs-c-ag)"],
            [
                ("f32", adam(n, F32)),
                ("bf16 (cast)", adam(n, BF16)),
                ("fp8 e4m3 (cast)", adam(n, F8E4M3FN)),
            ],
        ),
        (
            f"allreduce_rmsnorm_fp8: [{tokens}, 4096] all_reduce + residual + RMSNorm, in/out",
            ["ar-c", "fuse(rs-c-ag)"],
            [
                ("f32/f32", rms(F32, None, tokens, 4096)),
                ("bf16/bf16", rms(BF16, None, tokens, 4096)),
                ("bf16/fp8 e4m3", rms(BF16, F8E4M3FN, tokens, 4096)),
            ],
        ),
        (
            f"fp8_allgather_matmul: [16, {k}] x all_gather([{k}, 2048] f32 slices), gathered as",
            [None, "fuse(ag)", "ol(fuse(ag),mm)"],
            [
                ("f32", gather(F32, 16, k, 2048)),
                ("bf16 (cast)", gather(BF16, 16, k, 2048)),
                ("fp8 e4m3 (amax, quantize)", gather(F8E4M3FN, 16, k, 2048)),
            ],
        ),
    ]


def fp8_inputs(plan, rank: int) -> dict[str, object]:
    """This rank's pieces: Adam's scalars, the epilogue's scale (1/64), values of each
    argument's element type otherwise (local ones this rank's own, the rest alike on every
    rank, so replicated arguments agree)."""
    import numpy as np

    from coconet.core import values as V
    from coconet.dialects.coco import LocalAttr

    out: dict[str, object] = {}
    for i, (arg, buf) in enumerate(plan.arguments.items()):
        if buf.shape == ():
            out[arg] = np.asarray(ADAM.get(arg, 1 / 64), V.numpy_dtype(buf.type))
            continue
        local = any(isinstance(lay, LocalAttr) for lay in buf.type.layouts.data)
        rng = np.random.default_rng([i, rank if local else 0])
        values = rng.standard_normal(buf.shape, dtype=np.float32)
        out[arg] = (np.abs(values) * 0.01 if arg == "v" else values).astype(V.numpy_dtype(buf.type))
    return out


def fp8_worker(comm, args: argparse.Namespace) -> None:
    """The fp8 table: every (example, schedule, form) row, in rounds, with its bytes per rank
    (the plan's traffic, lowering/traffic.py plan_traffic: what the rank sends per step, as
    coco-run --bench counts it) and both ratios against the f32 form under the same schedule."""
    from coconet.compile import compile as coco_compile
    from coconet.schedule.errors import ScheduleError

    tables = []
    for title, schedules, forms in fp8_programs(args.log2n):
        groups = []
        for schedule in schedules:
            rows = []
            for form, program in forms:
                try:
                    c = coco_compile(program, schedule=schedule, backend="cpu", pieces=True)
                except ScheduleError:  # nothing to fuse in this form (the f32 gather)
                    c = coco_compile(program, schedule=None, backend="cpu", pieces=True)
                    form = f"{form} (as written)"
                c(**fp8_inputs(c.plan, comm.Get_rank()))  # binds the arrays
                rows.append((form, c.step, c))
            groups.append((schedule or "as written", rows))
        tables.append((title, groups))
    times: dict[tuple[int, int, str], list[float]] = {}
    for _ in range(args.rounds):
        for t, (_, groups) in enumerate(tables):
            for g, (_, rows) in enumerate(groups):
                for form, step, _ in rows:
                    times.setdefault((t, g, form), []).extend(
                        timed(comm, step, args.warmup, args.iters)
                    )
    traffic = {
        (t, g, form): c.bytes_per_rank
        for t, (_, groups) in enumerate(tables)
        for g, (_, rows) in enumerate(groups)
        for form, _, c in rows
    }
    for _, groups in tables:
        for _, rows in groups:
            for _, _, c in rows:
                c.close()
    if comm.Get_rank() != 0:
        return
    print(
        f"\nfp8 on the wire, {comm.Get_size()} rank(s) of the cpu backend, {os.cpu_count()} "
        f"core(s): median of {args.rounds * args.iters} step(s) ({args.rounds} round(s) of "
        f"{args.iters} after {args.warmup} warm-up), slowest rank per step"
    )
    width = 2 + max(
        len(f"{label}  {form}")
        for _, groups in tables
        for label, rows in groups
        for form, *_ in rows
    )
    for t, (title, groups) in enumerate(tables):
        print(f"  {title}")
        print(
            f"    {'':<{width}}{'median':>10}{'min':>10}{'bytes/rank':>13}"
            f"{'bytes vs f32':>14}{'time vs f32':>13}"
        )
        for g, (label, rows) in enumerate(groups):
            base_form = rows[0][0]
            base = statistics.median(times[(t, g, base_form)])
            base_bytes = traffic[(t, g, base_form)]
            for form, _, _ in rows:
                ts = times[(t, g, form)]
                med = statistics.median(ts)
                sent = traffic[(t, g, form)]
                bytes_ratio = f"{sent / base_bytes:.2f}x" if base_bytes else "-"
                print(
                    f"    {label + '  ' + form:<{width}}{med * 1e3:>8.2f}ms{min(ts) * 1e3:>8.2f}ms"
                    f"{sent / 2**20:>9.2f} MiB{bytes_ratio:>14}{base / med:>12.2f}x"
                )
    print(
        "  bytes vs f32: the row's bytes/rank over the f32 form's under the same schedule (below "
        "1: fewer bytes);\n  time vs f32: the f32 form's median over the row's (above 1: faster "
        "than f32)"
    )


def worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    for table in OPTIMIZERS:
        if table in args.tables:
            optimizer_worker(comm, OPTIMIZERS[table], args)
    for block in MP_BLOCKS:
        if block in args.tables:
            mp_worker(comm, args, block)
    for table in A2A_TABLES:
        if table in args.tables:
            a2a_worker(comm, table, args)
    if "overlap" in args.tables:
        overlap_worker(comm, args)
    if "fp8" in args.tables:
        fp8_worker(comm, args)


def optimizer_worker(comm, opt: Optimizer, args: argparse.Namespace) -> None:
    size = comm.Get_size()
    n = 1 << args.log2n
    triad = stream_triad(comm, max(n, 1 << 25))
    schedules = list(opt.schedules) if opt.schedules is not None else args.schedules
    compiled = coconet_steps(comm, opt, n, schedules)
    rows: list[tuple[str, Step, Step | None]] = [(label, s, None) for label, s, _ in compiled]
    rows.append(("mpi4py + NumPy", numpy_step(comm, opt, n), None))
    with_torch = torch_step(comm, opt, n)
    if with_torch is not None:
        rows.append((opt.torch_label, *with_torch))
    # Rounds of every row in turn, so that a change in the load of a shared machine falls on
    # every row alike; each row's steps right after a triad, since the memory bandwidth a VM
    # gets changes with its neighbours' load too.
    floor_bytes = opt.floor_bytes(n, size)
    times: dict[str, list[float]] = {label: [] for label, _, _ in rows}
    ratios: dict[str, list[float]] = {label: [] for label, _, _ in rows}
    bandwidths: list[float] = []
    for _ in range(args.rounds):
        for label, step, before in rows:
            bandwidth = size * 12 * max(n, 1 << 25) / min(timed(comm, triad, 1, 3))
            ts = timed(comm, step, args.warmup, args.iters, before)
            bandwidths.append(bandwidth)
            times[label] += ts
            ratios[label].append(statistics.median(ts) / (floor_bytes / bandwidth))
    for _, _, c in compiled:
        c.close()
    if with_torch is not None:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    if comm.Get_rank() == 0:
        report(args, opt, size, n, floor_bytes, times, ratios, bandwidths)


def report(
    args: argparse.Namespace,
    opt: Optimizer,
    size: int,
    n: int,
    floor_bytes: int,
    times: dict[str, list[float]],
    ratios: dict[str, list[float]],
    bandwidths: list[float],
) -> None:
    bandwidth = statistics.median(bandwidths)
    floor = floor_bytes / bandwidth
    steps = args.rounds * args.iters
    print(
        f"\n{opt.title}, n = 2^{args.log2n} = {n} f32 parameters, {size} rank(s) of the cpu "
        f"backend, {os.cpu_count()} core(s): median of {steps} step(s) ({args.rounds} round(s) of "
        f"{args.iters} after {args.warmup} warm-up), slowest rank per step"
    )
    print(
        f"  memory: STREAM triad (all ranks at once, before each row's steps) "
        f"{min(bandwidths) / 1e9:.1f}-{max(bandwidths) / 1e9:.1f} GB/s, median "
        f"{bandwidth / 1e9:.1f}; floor = {floor_bytes / 2**20:.0f} MiB ({opt.floor_why}) at "
        f"{bandwidth / 1e9:.1f} GB/s = {floor * 1e3:.2f} ms"
    )
    best = opt.schedules[-1] if opt.schedules else FUSED  # the fused schedule the table is about
    fused = times.get(f"coconet {best}")
    width = max(len(label) for label in times) + 2
    head = f"  {'':<{width}}{'median':>10}{'min':>10}{'x floor':>9}"
    if fused:
        head += f"{best + ' is':>27}"
    print(head)
    for label, ts in times.items():
        med = statistics.median(ts)
        ratio = statistics.median(ratios[label])
        line = f"  {label:<{width}}{med * 1e3:>8.2f}ms{min(ts) * 1e3:>8.2f}ms{ratio:>8.2f}x"
        if fused:
            line += f"{med / statistics.median(fused):>13.2f}x as fast"
        print(line)
    print(f"  {'memory floor':<{width}}{floor * 1e3:>8.2f}ms{'':>10}{1.0:>8.2f}x")
    print(
        "  x floor: the median over the rounds of the row's median over the floor at the "
        "bandwidth measured just before it"
    )
    if fused and opt.example == "adam":
        for marked, why in (
            (False, "on several ranks its all_gather stores the updated slice twice"),
            (True, "w symmetric: assembled in place, each element stored once"),
        ):
            t, f = fused_traffic(opt, size, n, marked)
            print(
                f"  fuse(rs-c-ag){SYMMETRIC_W if marked else ''}'s plan moves {t / n:.1f}N "
                f"bytes per rank, {t / f:.2f}x the program's floor of {f / n:.1f}N "
                f"(lowering/traffic.py; {why})"
            )


def fused_traffic(opt: Optimizer, size: int, n: int, marked: bool) -> tuple[int, int]:
    """T and F of the fused schedule's plan on rank 0 (lowering/traffic.py), from the plan
    itself: the bytes its steps move and the floor its program sets; `marked`: w kept in
    symmetric memory."""
    import runpy
    from pathlib import Path

    from coconet.lowering.lower_to_plan import lower
    from coconet.lowering.traffic import floor_total, plan_total
    from coconet.schedule import apply_schedule

    example = Path(__file__).resolve().parents[1] / "examples" / f"{opt.example}.py"
    program = runpy.run_path(str(example))["build"](n)
    program = apply_schedule(symmetric_w(program) if marked else program, FUSED)
    plan = lower(program, size)
    return plan_total(plan, 0), floor_total(program.func, plan.grid_shape, 0)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--np", type=int, default=2, help="MPI ranks (default 2)")
    p.add_argument("--log2n", type=int, default=24, help="parameters = 2^LOG2N (default 24)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per row and round")
    p.add_argument("--iters", type=int, default=5, help="timed steps per row and round")
    p.add_argument("--rounds", type=int, default=4, help="rounds over the rows (default 4)")
    p.add_argument("--schedules", nargs="+", default=list(SCHEDULES))
    p.add_argument(
        "--tables",
        nargs="+",
        choices=("adam", "lamb", "zero3", "mp", "ln", "overlap", "moe", "ulysses", "fp8"),
        default=["adam", "lamb", "zero3", "mp", "ln", "overlap", "moe", "ulysses", "fp8"],
        help="which tables to measure and print (default all)",
    )
    p.add_argument(
        "--overlap-size",
        default="4,256,256",
        help="batch,seq,hidden of the model-parallel and overlap tables' programs (default "
        "4,256,256)",
    )
    p.add_argument(
        "--ln-size",
        default="1,64,4096",
        help="batch,seq,hidden of the attention output + LayerNorm table's block "
        "(examples/megatron_sp_layernorm.py build with k = hidden; default 1,64,4096)",
    )
    p.add_argument(
        "--moe-size",
        default="8,128,128,8,32,256",
        help="G,S,M,E,C,F of the MoE table's layer (examples/moe_layer.py build: token groups, "
        "tokens a group, model dim, experts, capacity, FFN dim; default 8,128,128,8,32,256)",
    )
    p.add_argument(
        "--ulysses-size",
        default="8,512,64,512",
        help="H,S,D,E of the Ulysses table's block (examples/ulysses_attention.py build: heads, "
        "sequence, head dim, model dim; default 8,512,64,512)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    code = run_workers(
        args.np,
        __file__,
        "--worker",
        "--log2n",
        str(args.log2n),
        "--warmup",
        str(args.warmup),
        "--iters",
        str(args.iters),
        "--rounds",
        str(args.rounds),
        "--overlap-size",
        args.overlap_size,
        "--ln-size",
        args.ln_size,
        "--moe-size",
        args.moe_size,
        "--ulysses-size",
        args.ulysses_size,
        "--tables",
        *args.tables,
        "--schedules",
        *args.schedules,
    )
    sys.exit(code)


def run_workers(ranks: int, script: str, *argv: str) -> int:
    """`mpiexec -n RANKS python SCRIPT ARGV...` with the cpu backend's rank environment (one
    thread a rank; MPICH throttled when the ranks outnumber the cores); its exit status."""
    from coconet.runtime.cpu import apply_rank_env_defaults
    from coconet.runtime.launcher import find_mpiexec

    env = apply_rank_env_defaults(dict(os.environ))
    if ranks > (os.cpu_count() or 1):
        env.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")
    cmd = [find_mpiexec(), "-n", str(ranks), sys.executable, os.path.abspath(script), *argv]
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    main()
