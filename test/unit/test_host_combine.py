"""The compiled exact combination (runtime/host_combine.py, toolchain/coco_combine.h): bit for
bit the NumPy combination it replaces (collectives.combine, the sim's arithmetic) on every
float type, operator, stated accumulation and member count, with zeros of both signs, inf,
NaN, subnormals and overflow; strided pieces (an uneven reduce_scatter's blocks); what it
leaves to NumPy; and the cpu backend's collectives taking it."""

from __future__ import annotations

import numpy as np
import pytest
from compiled_ranks import runs_as_the_sim_computes

import coconet.runtime.cpu as cpu
from coconet import frontend
from coconet.core import values as V
from coconet.frontend import BF16, F16, F32, AllReduce, Local, ReduceScatter, Tensor
from coconet.runtime import collectives
from coconet.runtime.collectives import CollectiveContext, combine
from coconet.runtime.host_combine import HostCombine

FLOATS = ["f64", "f32", "f16", "bf16", "f8E4M3FN", "f8E5M2"]
KINDS = ["sum", "prod", "max", "min"]


def _pieces(elt: str, members: int, n: int = 3000, seed: int = 0) -> np.ndarray:
    """Values over the type's whole range and its edges, rounded to `elt`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((members, n)) * np.exp2(rng.uniform(-30, 30, (members, n)))
    x[:, :40] = 0.0
    x[0, :20] = -0.0  # ties of signed zeros (max/min)
    x[:, 40:50] = np.inf
    x[members - 1, 45:50] = -np.inf  # inf - inf
    x[:, 50:55] = np.nan
    x[0, 55:60] = -np.nan
    x[:, 60:160] = rng.integers(-3, 4, (members, 100)) * 2.0**-140  # subnormal in f32 and below
    x[:, 160:260] = rng.integers(-8, 9, (members, 100)) * 0.125  # exact sums, ties to even
    with np.errstate(over="ignore", invalid="ignore"):
        return V.round_f64(x, elt)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return a.shape == b.shape and np.array_equal(a.view(bits), b.view(bits))


def _numpy(kind, pieces, dt, acc=None):
    with np.errstate(all="ignore"):
        return combine(np, kind, pieces, dt, dt, dt, acc)


@pytest.mark.parametrize("elt", FLOATS)
@pytest.mark.parametrize("kind", KINDS)
def test_every_type_and_operator_bit_for_bit(elt: str, kind: str) -> None:
    dt = np.dtype(V.NUMPY_DTYPES[elt])
    hc = HostCombine()
    for members in (1, 2, 3, 7):
        pieces = _pieces(elt, members, seed=members)
        got = hc(kind, pieces, dt, dt, dt)
        assert got is not None
        assert got.dtype == dt
        assert _same_bits(got, _numpy(kind, pieces, dt)), (elt, kind, members)


@pytest.mark.parametrize("elt", ["bf16", "f16", "f8E4M3FN", "f32"])
@pytest.mark.parametrize("acc", ["f64", "f32", "f16", "bf16"])
def test_stated_accumulation_rounds_every_step(elt: str, acc: str) -> None:
    dt = np.dtype(V.NUMPY_DTYPES[elt])
    pieces = _pieces(elt, 7, seed=3)
    got = HostCombine()("sum", pieces, dt, dt, dt, acc)
    assert got is not None
    assert _same_bits(got, _numpy("sum", pieces, dt, acc))
    if acc != "f64" and (elt, acc) != ("f8E4M3FN", "f32"):  # (f32 holds those sums exactly)
        # the rounding is there: it differs from the unrounded sum somewhere
        assert not _same_bits(got, _numpy("sum", pieces, dt, None))


def test_bits_and_multidimensional_pieces() -> None:
    """bf16 and fp8 stored as their bit patterns (device arrays, buffers) combine the same;
    pieces of any shape give a result of the piece's shape."""
    dt = np.dtype(V.NUMPY_DTYPES["bf16"])
    pieces = _pieces("bf16", 3, n=4 * 5 * 30).reshape(3, 4, 5, 30)
    got = HostCombine()("sum", pieces.view(np.uint16), dt, dt, np.dtype(np.uint16))
    assert got is not None
    assert (got.shape, got.dtype) == ((4, 5, 30), np.uint16)
    assert _same_bits(got, _numpy("sum", pieces, dt).view(np.uint16))


def test_strided_pieces() -> None:
    """An uneven reduce_scatter combines the first `mine` elements of each padded row."""
    dt = np.dtype(V.NUMPY_DTYPES["f16"])
    padded = _pieces("f16", 3, n=1001)
    view = padded[:, :998]
    got = HostCombine()("sum", view, dt, dt, dt)
    assert got is not None
    assert got.shape == (998,)
    assert _same_bits(got, _numpy("sum", view, dt))


def test_large_pieces_take_several_blocks() -> None:
    """Pieces longer than a block (and than a tile) are cut into blocks without a seam."""
    dt = np.dtype(V.NUMPY_DTYPES["bf16"])
    pieces = _pieces("bf16", 2, n=(1 << 17) + 12345)
    got = HostCombine()("max", pieces, dt, dt, dt)
    assert got is not None
    assert _same_bits(got, _numpy("max", pieces, dt))


def test_left_to_numpy() -> None:
    """Integers, i1 and a result in a storage of another width are NumPy's to combine."""
    hc = HostCombine()
    ints = np.arange(12, dtype=np.int32).reshape(2, 6)
    assert hc("sum", ints, ints.dtype, ints.dtype, ints.dtype) is None
    flags = np.zeros((2, 6), np.bool_)
    assert hc("sum", flags, flags.dtype, flags.dtype, flags.dtype) is None
    f16 = np.ones((2, 6), np.float16)
    assert hc("sum", f16, f16.dtype, f16.dtype, np.dtype(np.float32)) is None
    ctx = CollectiveContext(np, 0, (2,), True, None, None, np.empty, combiner=hc)  # type: ignore[arg-type]
    assert np.array_equal(
        ctx.combine("sum", ints, ints.dtype, ints.dtype, ints.dtype, None), ints.sum(0)
    )


@pytest.mark.parametrize("ranks", [2, 3])
def test_the_cpu_backend_combines_with_it(monkeypatch: pytest.MonkeyPatch, ranks: int) -> None:
    """bf16 collectives on the cpu backend (MPI has no bf16) combine through the compiled
    code -- an all_reduce, an uneven reduce_scatter, a max and a stated accumulation -- and
    give the sim's bits."""

    calls: list[tuple[str, str | None]] = []

    class Counting(HostCombine):
        def __call__(self, kind, pieces, src, dst, storage, acc_elt=None):
            out = super().__call__(kind, pieces, src, dst, storage, acc_elt)
            calls.append((kind, acc_elt if out is not None else "numpy"))
            return out

    @frontend.program(grid=[None])
    def bf16_collectives(x: Tensor(BF16, [7, 5], Local)):
        return (
            AllReduce("+", x),
            ReduceScatter("+", x, dim=0),
            AllReduce("max", x),
            AllReduce("+", x, acc=F32),
        )

    monkeypatch.setattr(cpu, "HostCombine", Counting)
    runs_as_the_sim_computes(bf16_collectives, "ar-c", ranks)
    assert set(calls) == {("max", None), ("sum", None), ("sum", "f32")}


@pytest.mark.parametrize(
    ("ranks", "elt", "kind"), [(2, BF16, "+"), (3, F16, "max"), (7, BF16, "+")]
)
def test_large_exact_all_reduce_takes_two_steps(
    monkeypatch: pytest.MonkeyPatch, ranks: int, elt, kind: str
) -> None:
    """From EXACT_TWO_STEP_BYTES an exact all_reduce is a reduce_scatter of blocks (padded:
    the size divides by no rank count here) then an all_gather, each member combining its
    block: the sim's bits, the two-step path taken."""
    taken: list[int] = []
    two_step = collectives._exact_two_step

    def counted(ctx, step, t, members, *args):
        taken.append(members)
        yield from two_step(ctx, step, t, members, *args)

    monkeypatch.setattr(collectives, "_exact_two_step", counted)
    rows, cols = 97, 701
    assert rows * cols * 2 >= collectives.EXACT_TWO_STEP_BYTES

    @frontend.program(grid=[None])
    def large_all_reduce(x: Tensor(elt, [rows, cols], Local)):
        return AllReduce(kind, x)

    runs_as_the_sim_computes(large_all_reduce, "ar-c", ranks)
    assert taken == [ranks] * ranks
