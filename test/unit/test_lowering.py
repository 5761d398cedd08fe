"""Every example under every schedule, lowered to a plan and one CUDA translation unit:

* the CUDA text compiles with NVRTC (the compiler CuPy uses) for sm_80 and sm_90, warning-free
  (the intermediate greedy pipelines to compute_90 PTX only, unless COCONET_FULL=1: NVRTC's
  front end and NVVM see all of their text, and ptxas, most of the compile time, runs on every
  example's unscheduled and named forms, whose kernels the greedy ones share; a text several
  pipelines lower to compiles once per suite run);
* the SAME text compiled for the host runs every rank (threads of this process, symmetric
  buffers shared) and reproduces the sim oracle on 1, 2 and 4 ranks, with launch shapes down to
  one thread per block: bit for bit (transcendentals too: both sides compute them in f64 and
  round once), except where a result depends on summation order (full reductions, BLAS
  matmuls), which is compared with a tolerance.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import HEAVY_EXAMPLES

import coconet
from coconet.core.program import Program
from coconet.dialects import coco, comm
from coconet.lowering.lower_to_plan import LaunchConfig, lower
from coconet.runtime.sim import prepare_inputs
from coconet.runtime.threaded import ThreadedExecutor
from coconet.schedule import apply_pipeline
from coconet.toolchain.nvrtc import compile_cuda, device_headers, nvrtc_available, nvrtc_version

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.mlir"))
FULL = os.environ.get("COCONET_FULL") == "1"

# Pass pipelines the examples are lowered under (in addition to their named schedules): each
# on every other example in CI, in turn (every example gets some, each pipeline half of them;
# those share much of their text with the named schedules); all of them under COCONET_FULL=1.
PIPELINES = {
    "unscheduled": "",
    "split": "coco-split-allreduce",
    "split-reorder": "coco-split-allreduce,coco-reorder",
    "rs-c-ag-greedy": "coco-split-allreduce,coco-reorder,coco-as-slice",
    "fused-greedy": "coco-split-allreduce,coco-reorder,coco-as-slice,coco-fuse",
    "ar-fused-greedy": "coco-fuse",
}

# The examples whose one-shot fused all_reduce (fuse(ar-c)) joins this matrix (host execution
# and NVRTC for sm_80/sm_90): its elementwise form and its row form (AR + residual + RMSNorm).
ONE_SHOT_EXAMPLES = ("adam", "allreduce_rmsnorm")

# Full reductions and BLAS matmuls sum in another order than NumPy.
INEXACT_OPS = (coco.ReduceOp, coco.MatmulOp)
TOLERANCE = {"f16": 4e-3, "bf16": 3e-2, "f32": 2e-5, "f64": 1e-12}


@functools.cache
def offered(path: Path) -> dict[str, str]:
    """The named schedules of an example (each listing costs ~0.2 s: listed once a process)."""
    from coconet.schedule import named_schedules

    return named_schedules(coconet.load(path))


@functools.cache
def final_pipelines() -> frozenset[str]:
    """The pipelines users run: the program as written and its named schedules."""
    found = {""}
    for path in EXAMPLES:
        found |= set(offered(path).values())
    return frozenset(found)


def schedules_of(path: Path) -> dict[str, str]:
    found = dict(PIPELINES)
    for name, pipeline in offered(path).items():
        if name == "fuse(ar-c)" and path.stem not in ONE_SHOT_EXAMPLES:
            continue  # the one-shot form: two examples here, the rest in test_one_shot.py
        found[f"named:{name}"] = pipeline
    return found


def scheduled(path: Path, pipeline: str) -> Program | None:
    from coconet.tools.coco_run import apply_pipeline

    program = coconet.load(path)
    if not pipeline:
        return program
    try:
        return apply_pipeline(program, pipeline)
    except coconet.CocoError:
        return None  # the pipeline does not apply to this program


def cases():
    for i, path in enumerate(EXAMPLES):
        for name, pipeline in schedules_of(path).items():
            pass_pipeline = name in PIPELINES and name != "unscheduled"
            in_turn = (i + list(PIPELINES).index(name)) % 2 == 0 if pass_pipeline else True
            # a heavy example (conftest): its fused schedule here, every offered schedule
            # against NumPy in its own test file
            if path.stem in HEAVY_EXAMPLES:
                in_turn = name == "named:fuse(rs-c-ag)"
            marks = () if in_turn else pytest.mark.slow
            yield pytest.param(path, pipeline, id=f"{path.stem}-{name}", marks=marks)


def rank_counts(program: Program) -> list[int]:
    return [2, 4] if program.grid.rank > 1 else [1, 2, 4]


def is_exact(program: Program) -> bool:
    return not any(isinstance(op, INEXACT_OPS) for op in program.func.walk())


def compare(program: Program, got: dict, want: dict, context: str) -> None:
    assert set(got) == set(want), context
    exact = is_exact(program)
    for name, b in want.items():
        a = got[name]
        assert a.shape == b.shape, f"{context}: {name}"
        assert a.dtype == b.dtype, f"{context}: {name}"
        if exact or a.dtype.kind in "biu":
            assert np.array_equal(a, b, equal_nan=True), f"{context}: {name} differs"
        else:
            rtol = TOLERANCE[program_dtype(a)]
            np.testing.assert_allclose(
                a.astype(np.float64),
                b.astype(np.float64),
                rtol=rtol,
                atol=rtol,
                err_msg=f"{context}: {name}",
            )


def program_dtype(a: np.ndarray) -> str:
    return {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}[a.dtype.name]


CONFIGS = [LaunchConfig(), LaunchConfig(block=1, max_blocks=3), LaunchConfig(block=3, max_blocks=7)]


@pytest.mark.parametrize(("path", "pipeline"), list(cases()))
def test_host_execution_matches_oracle(
    path: Path, pipeline: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if pipeline in final_pipelines() and (FULL or EXAMPLES.index(path) % 2 == 1):
        # the pipelines users run, built as users build them (-O3: what the optimizer may
        # assume -- restrict, aliasing, no overflow -- must hold), on every other example (the
        # ones whose NVRTC build is sm_80 PTX, not machine code; all under COCONET_FULL=1);
        # conftest's -O0 elsewhere
        monkeypatch.setenv("COCONET_HOST_OPT", "3")
    program = scheduled(path, pipeline)
    if program is None:
        pytest.skip("pipeline does not apply")
    for ranks in rank_counts(program):
        for config in CONFIGS if FULL or ranks == 2 else CONFIGS[:1]:
            try:
                plan = lower(program, ranks, config)
            except coconet.CocoError as e:
                if "empty-slice" in str(e):
                    continue
                raise
            if _ran_before(path, plan, ranks, config):
                continue
            inputs = prepare_inputs(program, None, plan.grid_shape, seed=ranks)
            want = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
            got = ThreadedExecutor(plan).run(inputs)
            compare(
                program, got, want, f"{path.stem} [{pipeline}] ranks={ranks} block={config.block}"
            )


def _suite_marker(kind: str, parts: list) -> Path:
    """A file in the suite's cache directory named by everything a result depends on: work
    that many pipelines repeat (they lower an example to the same text) is done once per
    suite run, by whichever xdist worker gets it first."""
    key = hashlib.sha256(repr(parts).encode()).hexdigest()
    marker = Path(os.environ["COCONET_CACHE_DIR"]) / kind / key
    marker.parent.mkdir(parents=True, exist_ok=True)
    return marker


def _compiled(source: str, arch: str) -> int:
    """NVRTC compiles `source` for `arch` without a warning, once per text and suite run."""
    parts = [arch, source, *sorted(device_headers().items()), str(nvrtc_version())]
    marker = _suite_marker("test-nvrtc-compiled", parts)
    if marker.exists():
        return int(marker.read_text())
    size = len(compile_cuda(source, arch, warnings_as_errors=True).binary)
    marker.write_text(str(size))
    return size


def _ran_before(path: Path, plan, ranks: int, config: LaunchConfig) -> bool:
    """Whether another pipeline of this example lowered to the same plan and kernels (a
    seventh of CI's matrix: split + reorder + as-slice is rs-c-ag, ...): running it again
    computes the same arrays from the same inputs. That the pipelines are equivalent is
    test_schedules_examples' concern."""
    parts = [path.stem, ranks, repr(config), plan.format(), plan.cuda_source]
    marker = _suite_marker("test-host-executed", [*parts, os.environ.get("COCONET_HOST_OPT")])
    if marker.exists():
        return True
    marker.touch()
    return False


@functools.cache
def machine_code_pipelines() -> frozenset[tuple[Path, str]]:
    """The (example, pipeline) pairs test_machine_code builds for sm_90 (a GPU build's text,
    ptxas included) when nvdisasm is there to read them: every example's ar-c and fuse(rs-c-ag)."""
    from coconet.lowering.machine_code import nvdisasm_path

    if nvdisasm_path() is None:
        return frozenset()
    return frozenset(
        (path, offered(path)[name])
        for path in EXAMPLES
        for name in ("ar-c", "fuse(rs-c-ag)")
        if name in offered(path)
    )


def nvrtc_archs(path: Path, pipeline: str) -> tuple[str, ...]:
    """What the NVRTC matrix builds `path` under `pipeline` for. The pipelines users run, to
    machine code for sm_90 (unless test_machine_code does) and, on every other example, sm_80
    (in turn: ptxas for sm_80 is 0.5 s a unit, and NVRTC's sm_80 front end still reads the
    rest as PTX); the others, and programs as written, to PTX. COCONET_FULL=1: every pipeline to machine code for both."""
    if FULL:
        return ("sm_80", "sm_90")
    if pipeline not in final_pipelines() or not pipeline:
        # (a program as written: one small kernel an op, each a kernel of the fused ones' kinds)
        return ("compute_90",)
    sm_80 = "sm_80" if EXAMPLES.index(path) % 2 == 0 else "compute_80"
    return (sm_80,) if (path, pipeline) in machine_code_pipelines() else (sm_80, "sm_90")


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
@pytest.mark.parametrize(("path", "pipeline"), list(cases()))
def test_cuda_compiles_with_nvrtc(path: Path, pipeline: str):
    program = scheduled(path, pipeline)
    if program is None:
        pytest.skip("pipeline does not apply")
    plan = None
    # the largest rank count's text: the same at any count of 2 or more (at one rank a fused
    # collective is a plain kernel: test_single_member_groups.py compiles those)
    for ranks in reversed(rank_counts(program)):
        try:
            plan = lower(program, ranks)
            break
        except coconet.CocoError as e:
            assert "empty-slice" in str(e)
    assert plan is not None
    for arch in nvrtc_archs(path, pipeline):
        assert _compiled(plan.cuda_source, arch) > 0


def test_cuda_text_is_rank_independent_and_deterministic():
    program = coconet.load(EXAMPLES[0])
    texts = {lower(program, r).cuda_source for r in (1, 2, 4)}
    assert len(texts) == 1
    assert lower(program, 2).format() == lower(coconet.load(EXAMPLES[0]), 2).format()


def test_reductions_of_every_kind_compile_and_match_oracle():
    """max/min (not only sums) inside and outside fused collective kernels, floats and ints:
    NVRTC compiles them for both archs and the host kernels reproduce the oracle exactly."""
    program = coconet.load(Path(__file__).parent / "programs" / "reductions.mlir")
    for ranks in (1, 2, 4):
        for config in CONFIGS:
            plan = lower(program, ranks, config)
            inputs = prepare_inputs(program, None, plan.grid_shape, seed=ranks)
            want = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
            got = ThreadedExecutor(plan).run(inputs)
            for name, value in want.items():
                assert np.array_equal(got[name], value), f"{name} at {ranks} ranks"
    if nvrtc_available():
        for arch in ("sm_80", "sm_90"):
            assert _compiled(plan.cuda_source, arch) > 0


# ---------------------------------------------------------------------------------------------
# Fused collective kernels: vector loop, element loop, all_gather by pull
# ---------------------------------------------------------------------------------------------


def _fused(example: str, *build_args) -> Program:
    """examples/<example>.py built with `build_args`, under the fuse(rs-c-ag) schedule."""
    import runpy

    from coconet.schedule import named_schedules
    from coconet.tools.coco_run import apply_pipeline

    path = Path(__file__).parents[2] / "examples" / f"{example}.py"
    program = runpy.run_path(str(path))["build"](*build_args)
    return apply_pipeline(program, named_schedules(program)["fuse(rs-c-ag)"])


def _fused_adam(n: int) -> Program:
    return _fused("adam", n)


@pytest.mark.parametrize(
    ("example", "n", "ranks", "vec_bytes", "peer_batch"),
    [
        ("adam", 4096, 2, None, None),  # every block's chunk in whole vectors
        ("adam", 4100, 4, None, None),  # slices of 1025: odd ranks' addresses are not aligned
        ("adam", 4096 + 40, 2, None, None),  # chunks with a tail of elements
        ("adam", 4096, 4, 16, None),  # the GPU's vectors (16 bytes) on the host: lanes of 4
        ("adam", 4100, 4, 16, None),
        # peers read in batches smaller than the group (a group larger than COCO_PEER_BATCH):
        # whole batches, and a last one that is not full
        ("adam", 4096, 4, 16, 2),
        ("adam", 4100, 4, None, 3),
        ("adam", 4096, 4, 16, 1),
        # LAMB's first kernel finishes a reduction: per-lane partials, then the elements
        ("lamb_scattered", 4096, 2, None, None),
        ("lamb_scattered", 4100, 4, None, None),
        ("lamb_scattered", 4100, 4, 16, None),
        ("lamb_scattered", 4100, 4, 16, 3),
    ],
)
def test_fused_vector_and_element_loops_match_oracle(example, n, ranks, vec_bytes, peer_batch):
    """The fused kernels' vector loop (whole aligned vectors, the peers' pieces pulled as
    vectors) and element loop (tails, unaligned addresses) both reproduce the oracle (bit for
    bit, but for LAMB's norms, summed in another order), at the host's vector width and at the
    GPU's, with the group's peers read in one batch or in several (the peers combined in rank
    order whatever the batches)."""
    import dataclasses

    program = _fused(example, n if example == "adam" else (n,))
    for config in CONFIGS:
        plan = lower(program, ranks, config)
        source = plan.cuda_source
        if vec_bytes is not None:
            source = f"#define COCO_VEC_BYTES {vec_bytes}\n" + source
        if peer_batch is not None:
            source = f"#define COCO_PEER_BATCH {peer_batch}\n" + source
        plan = dataclasses.replace(plan, cuda_source=source)
        inputs = prepare_inputs(program, None, plan.grid_shape, seed=ranks)
        want = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
        got = ThreadedExecutor(plan).run(inputs)
        context = (
            f"{example} n={n} ranks={ranks} vec={vec_bytes} batch={peer_batch} block={config.block}"
        )
        compare(program, got, want, context)


def test_fused_kernels_run_as_a_gpu_build_of_their_plan():
    """What a GPU build compiles (Plan.device_source: the plan's largest group as
    COCO_PEERS_MAX, so a vector holds registers for just the peers that exist) runs on the
    host as the plain text does, bit for bit."""
    import dataclasses

    program = _fused_adam(4096)
    for ranks in (1, 2, 4):
        plan = lower(program, ranks)
        if ranks == 1:  # a group of one member: no peers, a plain kernel
            assert plan.peers_max() == 0
            assert plan.device_source() == plan.cuda_source
        else:
            assert plan.peers_max() == ranks
            assert plan.device_source() == f"#define COCO_PEERS_MAX {ranks}\n" + plan.cuda_source
        built = dataclasses.replace(plan, cuda_source=plan.device_source())
        inputs = prepare_inputs(program, None, plan.grid_shape, seed=ranks)
        want = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
        compare(program, ThreadedExecutor(built).run(inputs), want, f"ranks={ranks}")
    # a program without fused collectives has no peers to bound
    unfused = lower(coconet.load(EXAMPLES[0]), 2)
    assert unfused.peers_max() == 0
    assert unfused.device_source() == unfused.cuda_source


def test_fused_adam_assembles_the_gathered_weights_in_the_argument():
    """The all_gather pulls every peer's piece straight into the updated argument: one launch,
    no copy after it, and each rank reads the peers' pieces at their offsets, from staging
    buffers sized to a piece (not the whole gathered value on every rank)."""
    from coconet.lowering.plan import ArgTable, Copy, Launch

    plan = lower(_fused_adam(4096), 4)
    assert not any(isinstance(s, Copy) for s in plan.steps)
    (launch,) = [s for s in plan.steps if isinstance(s, Launch)]
    assert "w" in launch.writes
    (bases,) = [a for a in launch.args if isinstance(a, ArgTable)]
    assert [int(b.table[0]) for b in bases.items] == [0, 1024, 2048, 3072]
    source = plan.cuda_source
    assert "coco_peers_done" in source
    assert "w_out[w1_bases[q_] + i]" in source
    # the symmetric buffer the peers pull from stages this rank's piece only (1024 of 4096),
    # the element at its index within the piece
    (staging,) = [b for b in plan.buffers if b.symmetric and b.kind == "temp"]
    assert staging.count == 1024
    assert "w1_mine[i] = w1_s;  // comm.all_gather" in source
    # loads first: every peer's piece of the gradient (the farthest), then the other inputs,
    # then the fence that keeps the math behind all of them (coco_loads_issued), then the math
    peers = "COCO_PEERS_VEC_IN(float, g1_rs_peers_v, lanes_, g_peers, g_base + i0_, 0, group_, me)"
    fence = "coco_loads_issued(begin, g1_rs_peers_v, m_v, v_v, w_v);"
    order = [peers, "COCO_VEC_IN(float, m_v", "COCO_VEC_IN(float, w_v", fence, "COCO_FOR_LANES"]
    at = [source.index(x) for x in order]
    assert at == sorted(at), order


@pytest.mark.skipif(not nvrtc_available(), reason="the nvidia-cuda-nvrtc wheel is not installed")
@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_fused_adam_gpu_form_moves_vectors_of_16_bytes(arch):
    """On a GPU the vector loop's accesses are 128-bit: the peers' gradients, the state, the
    weights and the gathered pieces (five vector stores: m, v, this rank's piece, w, and the
    pull's), with the lanes in registers (no local memory)."""
    import re

    plan = lower(_fused_adam(4096), 2)
    ptx = compile_cuda(plan.cuda_source, arch, warnings_as_errors=True).binary.decode()
    loads = re.findall(r"\bld(?:\.global)?(?:\.nc)?\.v4\.", ptx)
    stores = re.findall(r"\bst(?:\.global)?\.v4\.", ptx)
    assert len(loads) >= 6, (len(loads), len(stores))
    assert len(stores) >= 5, (len(loads), len(stores))
    assert ".local" not in ptx


def test_row_reductions_match_the_oracle_bit_for_bit():
    """coco.reduce_dims of every kind and element type, over the last, first and a middle
    run of dims, with partial sums of a slice all_reduced, and a reshape: the row kernel
    (a block per row, ROW_LANES lanes over the block's threads) sums in the oracle's fixed
    order, so the host kernels reproduce it exactly at any block size (1, 3, 256) and grid;
    NVRTC compiles the kernels for both archs."""
    program = coconet.load(Path(__file__).parent / "programs" / "row_reductions.mlir")
    for ranks in (1, 2, 4):
        for config in CONFIGS:
            plan = lower(program, ranks, config)
            inputs = prepare_inputs(program, None, plan.grid_shape, seed=ranks)
            want = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
            got = ThreadedExecutor(plan).run(inputs)
            for name, value in want.items():
                assert np.array_equal(got[name], value), f"{name} at {ranks} ranks"
    # the oracle itself against NumPy's own (differently ordered) reductions
    x = inputs["x"].astype(np.float64)
    np.testing.assert_allclose(want["mean"][:, 0], x.mean(axis=1), rtol=1e-6)
    assert np.array_equal(want["xmax"], inputs["x"].max(axis=1))
    assert np.array_equal(want["ksum"], inputs["k"].sum(axis=1, dtype=np.int32))
    np.testing.assert_allclose(want["csum"][:, 0], inputs["c"].sum(axis=1), rtol=1e-12)
    assert np.array_equal(want["xr"], inputs["x"].reshape(8, 7, 10))
    if nvrtc_available():
        for arch in ("sm_80", "sm_90"):
            assert _compiled(plan.cuda_source, arch) > 0


ROW_EXAMPLES = [
    pytest.param(EXAMPLES[0].parent / f"{name}.mlir", id=name)
    for name in ("allreduce_rmsnorm", "megatron_sp_layernorm", "softmax_rows")
]


@pytest.mark.parametrize("path", ROW_EXAMPLES)
def test_fused_row_collective_is_one_kernel_and_bit_exact(path: Path):
    """fuse(rs-c-ag) of AllReduce + residual + RMSNorm (LayerNorm) + AllGather: ONE kernel
    launch (the row form of the fused collective kernel; the Megatron block adds its
    matmul), no library collective, bit-identical to the oracle on the host kernels at
    1, 2 and 4 ranks and any block size (the Megatron block within the tolerances, its matmul
    summing in BLAS's order); NVRTC compiles it for sm_80 and sm_90."""
    from coconet.lowering.plan import Collective, Launch, Matmul
    from coconet.schedule import apply_schedule

    program = apply_schedule(coconet.load(path), "fuse(rs-c-ag)")
    regions = [op for op in program.func.walk() if isinstance(op, comm.FusedOp)]
    assert len(regions) == 1
    assert any(isinstance(op, coco.ReduceDimsOp) for op in regions[0].body.walk())
    for ranks in (1, 2, 4):
        for config in CONFIGS:
            plan = lower(program, ranks, config)
            launches = [s for s in plan.steps if isinstance(s, Launch)]
            assert len(launches) == 1
            assert "rows" in launches[0].kernel
            assert not any(isinstance(s, Collective) for s in plan.steps)
            assert len(plan.steps) == 1 + sum(isinstance(s, Matmul) for s in plan.steps)
            inputs = prepare_inputs(program, None, plan.grid_shape, seed=ranks)
            want = coconet.run(program, inputs, ranks=ranks, inplace=False).outputs
            got = ThreadedExecutor(plan).run(inputs)
            compare(program, got, want, f"{path.stem} ranks={ranks} block={config.block}")
    if nvrtc_available():
        for arch in ("sm_80", "sm_90"):
            assert _compiled(plan.cuda_source, arch) > 0


def test_a_value_nobody_reads_is_not_computed():
    """A pure op whose result nothing reads (left outside a fused region by coco-fuse) gets no
    kernel: one of it would compute a variable it never stores, which NVRTC warns about."""
    text = """
func.func @f(%a: !coco.tensor<64xf32>, %b: !coco.tensor<64xf32>) -> !coco.tensor<64xf32> {
  %c = coco.add %a, %b : !coco.tensor<64xf32>
  %d = coco.neg %a : !coco.tensor<64xf32>
  %k = coco.constant 2.0 : !coco.tensor<f32>
  %e = coco.mul %c, %b : !coco.tensor<64xf32>
  func.return %e : !coco.tensor<64xf32>
}
"""
    program = Program(coconet.parse_module(text))
    for scheduled in (program, apply_pipeline(program, "coco-fuse")):
        plan = lower(scheduled, 1)
        assert "neg" not in plan.format()
        assert "coco.neg" not in plan.cuda_source
        if nvrtc_available():
            assert compile_cuda(plan.cuda_source, "sm_90", warnings_as_errors=True).binary
        inputs = prepare_inputs(scheduled, None, plan.grid_shape, seed=0)
        want = coconet.run(program, inputs, inplace=False).outputs
        got = ThreadedExecutor(plan).run(inputs)
        np.testing.assert_array_equal(got["e"], want["e"])
