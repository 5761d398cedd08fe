"""Bad inputs that once escaped as tracebacks, or were silently taken to mean something else
(issue #30, item 4): each ends in one message naming what was wrong and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import coconet
from coconet.core import env
from coconet.core.program import CocoError

ROOT = Path(__file__).resolve().parents[2]
SGD = str(ROOT / "examples" / "sgd.mlir")


def tool(name: str, *args: str, **environ: str) -> subprocess.CompletedProcess:
    import os

    # the installed script, so that argparse names the tool as users see it
    script = Path(sys.executable).parent / name.replace("_", "-")
    return subprocess.run(
        [str(script), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **environ},
    )


def one_error(r: subprocess.CompletedProcess, prog: str, says: str) -> None:
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith(f"{prog}: error:")]
    assert len(errors) == 1, r.stderr
    assert says in errors[0], r.stderr


@pytest.fixture(scope="module")
def huge(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("huge") / "huge.mlir"
    path.write_text(Path(SGD).read_text().replace("4096", str(1 << 40)))
    return str(path)


@pytest.mark.parametrize(
    ("args", "environ", "says"),
    [
        (("-p", "coco-fuse{"), {}, "bad pass pipeline 'coco-fuse{'"),
        (("--timeout", "0"), {}, "argument --timeout: expected a number of seconds > 0"),
        (("--timeout", "-5"), {}, "argument --timeout: expected a number of seconds > 0"),
        (("--step-timeout", "-1"), {}, "argument --step-timeout: expected a number of seconds"),
        (("--step-timeout", "nan"), {}, "argument --step-timeout: expected a number of seconds"),
        ((), {"COCONET_STEP_TIMEOUT": "abc"}, "COCONET_STEP_TIMEOUT='abc': expected a number"),
        ((), {"COCONET_STEP_TIMEOUT": "-1"}, "COCONET_STEP_TIMEOUT='-1': expected a number"),
        ((), {"COCONET_HOST_OPT": "fast"}, "COCONET_HOST_OPT='fast': expected one of 0, 1, 2, 3"),
    ],
)
def test_coco_run_refuses(args, environ, says):
    r = tool("coco_run", SGD, "--np", "2", "--backend", "cpu", "-q", *args, **environ)
    one_error(r, "coco-run", says)


def test_a_huge_tensor_is_one_message_on_the_sim_and_the_cpu_backend(huge):
    one_error(tool("coco_run", huge, "--backend", "sim", "-q"), "coco-run", "not enough memory")
    r = tool("coco_run", huge, "--np", "2", "--backend", "cpu", "-q")
    one_error(r, "coco-run", "the buffers of @sgd: not enough memory")
    with pytest.raises(CocoError, match="buffers of @sgd: not enough memory"):
        coconet.compile(huge, backend="cpu")
    with pytest.raises(CocoError, match="the seeded inputs of @sgd: not enough memory"):
        coconet.run(huge)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("-t", "plan{ranks=0}"), "a job needs at least 1 rank, but 0 were given"),
        (("-t", "cuda{ranks=-2}"), "a job needs at least 1 rank, but -2 were given"),
        (
            ("--verify-equivalence", "--equivalence-ranks", "0", "-p", "coco-split-allreduce"),
            "expected rank counts of at least 1",
        ),
    ],
)
def test_coco_opt_refuses(args, says):
    one_error(tool("coco_opt", SGD, *args), "coco-opt", says)


def test_coco_opt_plan_defaults_to_the_grid_s_size_without_ranks():
    r = tool("coco_opt", SGD, "-t", "plan")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("plan @sgd on grid [1]")


@pytest.mark.parametrize(
    ("raw", "want"),
    [("", env.DEFAULT_STEP_TIMEOUT), ("0", None), ("2.5", 2.5), (" 30 ", 30.0)],
)
def test_the_step_timeout_variable(monkeypatch, raw, want):
    monkeypatch.setenv(env.STEP_TIMEOUT_ENV, raw)
    assert env.step_timeout() == want
    assert env.step_timeout(7.0) == 7.0  # a value passed wins
    assert env.step_timeout(0.0) is None  # 0: off


@pytest.mark.parametrize("raw", ["abc", "-1", "inf", "nan", "1e400"])
def test_a_bad_step_timeout_variable_is_refused_by_compile(monkeypatch, raw):
    monkeypatch.setenv(env.STEP_TIMEOUT_ENV, raw)
    with pytest.raises(CocoError, match=f"COCONET_STEP_TIMEOUT={raw!r}: expected a number"):
        coconet.compile(SGD, backend="cpu")
    monkeypatch.delenv(env.STEP_TIMEOUT_ENV)
    with pytest.raises(CocoError, match="step timeout -1"):
        coconet.compile(SGD, backend="cpu", step_timeout=-1)


@pytest.mark.parametrize(("raw", "flag"), [("", "-O3"), ("0", "-O0"), ("1", "-O1"), (" 2 ", "-O2")])
def test_the_host_optimization_level_variable(monkeypatch, raw, flag):
    """COCONET_HOST_OPT sets the host build's -O level (users get -O3); being a flag, it is
    part of the kernel cache's key, so builds at two levels never stand in for each other."""
    from coconet.toolchain.host_compiler import HOST_OPT_ENV, host_cache_path, host_compile_flags

    monkeypatch.setenv(HOST_OPT_ENV, raw)
    flags = host_compile_flags()
    assert [f for f in flags if f.startswith("-O")] == [flag]
    path = host_cache_path("int x;")
    monkeypatch.setenv(HOST_OPT_ENV, "3" if flag != "-O3" else "1")
    assert host_cache_path("int x;") != path
    monkeypatch.setenv(HOST_OPT_ENV, "-O3")
    with pytest.raises(CocoError, match="COCONET_HOST_OPT='-O3': expected one of 0, 1, 2, 3"):
        host_compile_flags()


def test_the_fault_hook_is_off_unless_a_test_enables_it(monkeypatch):
    """COCONET_FAULT is a test hook: a production job never honours it (a stray value used
    to fail every run with a traceback fragment), and where a test enables it, a bad value is
    one message."""
    from coconet.runtime.failures import injected_fault

    monkeypatch.delenv("COCONET_FAULT_INJECTION", raising=False)
    monkeypatch.setenv("COCONET_FAULT", "garbage")
    assert injected_fault() is None
    monkeypatch.setenv("COCONET_FAULT", "1:raise")
    assert injected_fault() is None
    monkeypatch.setenv("COCONET_FAULT_INJECTION", "1")
    assert injected_fault() == (1, "raise", 0, 1)
    monkeypatch.setenv("COCONET_FAULT", "garbage")
    with pytest.raises(CocoError, match="expected RANK:KIND"):
        injected_fault()


def test_a_stray_fault_variable_leaves_a_job_alone():
    r = tool("coco_run", SGD, "--np", "2", "--backend", "cpu", "-q", COCONET_FAULT="0:raise")
    assert r.returncode == 0, r.stderr


def test_an_enabled_bad_fault_spec_is_one_message():
    r = tool(
        "coco_run",
        SGD,
        "--np",
        "2",
        "--backend",
        "cpu",
        "-q",
        COCONET_FAULT="garbage",
        COCONET_FAULT_INJECTION="1",
    )
    one_error(r, "coco-run", "COCONET_FAULT='garbage': expected RANK:KIND")


def test_replicated_values_are_compared_by_their_bits():
    """The first call's replica check (coconet/compiled.py) sums bits: a NaN's payload and a
    signed zero count, and every replicated argument is summed, sliced ones are not."""
    from coconet.compiled import _check_replicas, replica_sums
    from coconet.lowering.lower_to_plan import lower

    plan = lower(coconet.load(SGD), 2)
    w = np.zeros(4096, np.float32)
    other = w.copy()
    other[7] = -0.0
    pieces = {"g": np.ones(4096, np.float32), "w": w, "lr": np.float32(0.5)}
    mine = replica_sums(plan, pieces)
    assert set(mine) == {"w", "lr"}  # g is local: each rank's own
    theirs = replica_sums(plan, pieces | {"w": other})
    _check_replicas(plan, [mine, mine])
    with pytest.raises(CocoError, match="input 'w' is replicated, but rank 1 passed another"):
        _check_replicas(plan, [mine, theirs])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "int32", "bool"])
def test_replica_sums_take_every_dtype_and_scalars(dtype):
    import ml_dtypes

    from coconet.compiled import _host_bytes

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    a = np.arange(6).astype(dt).reshape(2, 3)
    assert _host_bytes(a).nbytes == a.nbytes
    assert _host_bytes(a[:, ::2]).nbytes == a[:, ::2].nbytes  # strided: copied contiguous
    assert _host_bytes(np.asarray(a[0, 0])).nbytes == dt.itemsize
