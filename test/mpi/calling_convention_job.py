"""One rank of test_calling_convention.py: an Adam training loop written once against `ar-c`
(each rank holds w, m and v whole, as the program as written declares them replicated) runs
unchanged under every sliced schedule, and equals the sim oracle's loop bit for bit (exact
collectives); then the `pieces=True` opt-in, and wrong shapes refused under each convention.

Run: mpiexec -n RANKS python calling_convention_job.py N SCHEDULE...
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import coconet

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from adam import build

STEPS = 3
HYPER = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}


def grad(rank: int, t: int, n: int) -> np.ndarray:
    return np.random.default_rng(100 * t + rank).standard_normal(n).astype(np.float32)


def train(step, n: int, rank: int, size: int, *, logical: bool = False, strided: bool = False):
    """The loop, written once: every rank's own gradient, the whole replicated state
    (`strided`: as every other element of a larger array, which no piece can view
    contiguously: copied in and gathered through scratch)."""
    w, m, v = (
        np.zeros(2 * n, np.float32)[::2] if strided else np.zeros(n, np.float32) for _ in "wmv"
    )
    w[...] = np.linspace(-1, 1, n, dtype=np.float32)
    for t in range(1, STEPS + 1):
        g = np.stack([grad(r, t, n) for r in range(size)]) if logical else grad(rank, t, n)
        out = step(g=g, w=w, m=m, v=v, step=float(t), **HYPER)
        if not logical:  # coco.update: the caller's arrays are updated and returned
            for name, mine in zip("wmv", (w, m, v), strict=True):
                assert out[name] is mine, f"{name} is updated in place"
        w, m, v = out["w"], out["m"], out["v"]
    return w, m, v


def refused(compiled, rank: int, **bad) -> str:
    try:
        compiled(**bad)
    except coconet.CocoError as e:
        return str(e)
    raise SystemExit(f"rank {rank}: a wrong shape was not refused")


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    n = int(sys.argv[1])
    program = build(n)
    want = train(coconet.compile(program, backend="sim", ranks=size), n, rank, size, logical=True)
    for schedule in sys.argv[2:]:
        step = coconet.compile(program, schedule=schedule, backend="cpu", exact_collectives=True)
        shapes = step.input_shapes()
        assert shapes["m"][0] == (n,), shapes
        assert shapes["g"][0] == (n,), shapes
        assert set(step.resliced) == ({"m", "v"} if "rs-c" in schedule else set())
        got = train(step, n, rank, size, strided=schedule == "rs-c-ag")
        for name, a, b in zip("wmv", got, want, strict=True):
            if not np.array_equal(a, b):
                raise SystemExit(f"rank {rank} [{schedule}]: {name} differs from the sim")
        bad = {k: np.ones(n, np.float32) for k in "gwv"}
        msg = refused(step, rank, **bad, m=np.ones(n // 2, np.float32), step=1.0, **HYPER)
        assert f"input 'm' of type !coco.tensor<{n}xf32>" in msg, msg
        assert f"must pass its value of shape [{n}]" in msg or f"piece of shape [{n}]" in msg, msg
        msg = refused(step, rank, **bad, m=np.ones(n), step=1.0, **HYPER)
        assert f"input 'm' of type !coco.tensor<{n}xf32>: expected dtype f32" in msg, msg
        step.close()

    # Replicas are compared as the caller passes them: m whole, though the schedule slices it.
    step = coconet.compile(program, schedule="fuse(rs-c-ag)", backend="cpu")
    ones = {k: np.ones(n, np.float32) for k in "gwv"}
    msg = refused(step, rank, **ones, m=np.full(n, rank, np.float32), step=1.0, **HYPER)
    assert "input 'm' is replicated, but rank 1 passed another value than rank 0" in msg, msg
    step.close()

    # The opt-in: each rank passes and gets back its pieces of the sliced state.
    step = coconet.compile(program, schedule="fuse(rs-c-ag)", backend="cpu", pieces=True)
    q, r = divmod(n, size)
    mine = q + (rank < r)  # the first n % size ranks hold one element more
    start = rank * q + min(rank, r)
    assert step.input_shapes()["m"][0] == (mine,), step.input_shapes()
    w = np.linspace(-1, 1, n, dtype=np.float32)
    m, v = np.zeros(mine, np.float32), np.zeros(mine, np.float32)
    out = step(g=grad(rank, 1, n), w=w, m=m, v=v, step=1.0, **HYPER)
    assert out["m"] is m, "the piece is updated in place"
    np.testing.assert_allclose(
        m, 0.1 * sum(grad(k, 1, n) for k in range(size))[start : start + mine], rtol=1e-5, atol=1e-6
    )
    ones = {k: np.ones(n, np.float32) for k in "gwmv"}
    msg = refused(step, rank, **ones, step=1.0, **HYPER)
    assert f"input 'm' of type !coco.tensor<{n}xf32, sliced<0>>" in msg, msg
    # every rank raises the first refused rank's error: rank 0's piece is q + 1 when uneven
    assert f"rank 0 must pass its piece of shape [{q + (r > 0)}], got [{n}]" in msg, msg
    step.close()
    comm.Barrier()
    if rank == 0:
        print("CONVENTION OK")


if __name__ == "__main__":
    main()
