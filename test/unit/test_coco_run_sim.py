"""coco-run on the sim backend as a user drives it: seeded inputs, --inputs/--output round trip,
and every bad input ending in one `coco-run: error:` line with exit status 1."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# SGD on a static grid of 3 ranks over 2 elements: no split leaves every rank an element
SGD3 = Path(__file__).parent / "programs" / "sgd3.mlir"


def coco_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coconet.tools.coco_run", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_summary_and_output_round_trip(tmp_path: Path):
    out = tmp_path / "out.npz"
    r = coco_run(str(EXAMPLES / "sgd.mlir"), "--np", "2", "--backend", "sim", "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert "@sgd on 2 rank(s), backend sim" in r.stdout
    assert "rank 1:" in r.stdout
    saved = np.load(out)
    assert saved["w"].shape == (4096,)
    assert saved["w"].dtype == np.float32
    # The same inputs given explicitly give the same outputs.
    rng = np.random.default_rng(3)
    inputs = {
        "g": rng.random((2, 4096), dtype=np.float32),
        "w": rng.random(4096, dtype=np.float32),
        "lr": np.float32(0.5),
    }
    np.savez(tmp_path / "in.npz", **inputs)
    r = coco_run(
        str(EXAMPLES / "sgd.mlir"),
        "--np",
        "2",
        "--backend",
        "sim",
        "--inputs",
        str(tmp_path / "in.npz"),
        "--output",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    want = inputs["w"] - np.float32(0.5) * (inputs["g"][0] + inputs["g"][1])
    np.testing.assert_array_equal(np.load(out)["w"], want.astype(np.float32))


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            {"g": np.zeros((3, 4096), np.float32)},
            "input 'g' of type !coco.tensor<4096xf32, local>: expected shape [2, 4096]",
        ),
        (
            {"w": np.zeros(4096, np.float64)},
            "input 'w' of type !coco.tensor<4096xf32>: expected dtype f32",
        ),
        ({"bogus": np.zeros(1, np.float32)}, "@sgd has no argument(s) bogus"),
    ],
)
def test_bad_inputs_are_one_clear_error(tmp_path: Path, inputs: dict, message: str):
    good = {
        "g": np.zeros((2, 4096), np.float32),
        "w": np.zeros(4096, np.float32),
        "lr": np.float32(1),
    }
    np.savez(tmp_path / "in.npz", **(good | inputs))
    r = coco_run(
        str(EXAMPLES / "sgd.mlir"),
        "--np",
        "2",
        "--backend",
        "sim",
        "--inputs",
        str(tmp_path / "in.npz"),
    )
    assert r.returncode == 1
    assert r.stderr.startswith("coco-run: error: "), r.stderr
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.mlir"], "no such file: missing.mlir"),
        (
            [str(EXAMPLES / "lamb_odd_sizes.py"), "--np", "8", "--schedule", "rs-c-ag"],
            "[empty-slice]",
        ),
        ([str(EXAMPLES / "pipeline_boundary.mlir"), "--np", "3"], "must be a multiple of 2"),
        ([str(EXAMPLES / "sgd.mlir"), "--inputs", "nothing.npz"], "nothing.npz"),
        ([str(EXAMPLES / "sgd.mlir"), "-p", "coco-nope"], "coco-nope"),
        # found by the fuzzer (test/fuzz): tracebacks or a silent no-op before
        ([str(EXAMPLES / "sgd.mlir"), "--seed", "-1"], "--seed must be at least 0, got -1"),
        (
            [str(EXAMPLES / "sgd.mlir"), "-p", "coco-split-allreduce{dim=9}"],
            "[split-allreduce-dim] dim=9: no comm.all_reduce in the module has a tensor dim 9",
        ),
        ([str(EXAMPLES)], "expected a .mlir or .py program"),
        # a named schedule the program is not offered says why (issue #25): a refused step
        # with its rule, or the structure the schedule needs
        (
            [str(SGD3), "--np", "3", "--schedule", "rs-c-ag"],
            "the schedule 'rs-c-ag' does not apply to @sgd3 (named_schedules does not offer "
            "it): coco-split-allreduce{ops=g1}: [split-allreduce-empty] the reduce_scatter of "
            "%g1",
        ),
        (
            [
                str(EXAMPLES / "allreduce_rmsnorm.mlir"),
                "--np",
                "2",
                "--schedule",
                "ol_MM_fuse_RS_C_AG",
            ],
            "[schedule-unknown] the schedule 'ol(mm,fuse(rs-c-ag))' needs a matmul whose only "
            "reader is an all_reduce, which @allreduce_rmsnorm lacks",
        ),
    ],
)
def test_bad_invocations_are_one_clear_error(args: list[str], message: str):
    r = coco_run(*args, "--backend", "sim")
    assert r.returncode == 1, r.stdout
    assert r.stderr.startswith("coco-run: error: "), r.stderr
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
