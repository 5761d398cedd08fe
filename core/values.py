"""How a distributed tensor's logical value maps to what each rank holds.

The *logical value* of a tensor of global shape S is an array of shape `L + S`, where L lists
the sizes of the grid axes on which the tensor is `local` (outermost first): a replicated or
sliced tensor's logical value is just its global array; a tensor local on a 1-D grid of 4 ranks
is a `(4, *S)` stack of per-rank values. Every backend takes inputs and returns outputs in this
form, so results compare across backends and across schedules that change layouts.

A rank's *piece* is the part of the logical value it holds: indexed by its coordinates on the
local axes, then cut along every sliced dim. A dim sliced by several grid axes is cut in
mixed radix, outermost axis first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import ml_dtypes
import numpy as np

from coconet.core.program import CocoError
from coconet.dialects.coco import TensorType

NUMPY_DTYPES: dict[str, np.dtype] = {
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "f8E4M3FN": np.dtype(ml_dtypes.float8_e4m3fn),
    "f8E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "i1": np.dtype(np.bool_),
}

# The element types NumPy lacks (ml_dtypes'), stored in .npz files as their bit patterns
# (see NPZ_DTYPES_KEY below).
BITS_DTYPES: dict[str, np.dtype] = {
    "bf16": np.dtype(np.uint16),
    "f8E4M3FN": np.dtype(np.uint8),
    "f8E5M2": np.dtype(np.uint8),
}


def bits_dtype(dtype: np.dtype) -> np.dtype | None:
    """The unsigned integer dtype an ml_dtypes type (bf16, fp8) travels as where only NumPy's
    own types exist (device arrays, .npz files); None for NumPy's types."""
    for elt, bits in BITS_DTYPES.items():
        if np.dtype(dtype) == NUMPY_DTYPES[elt]:
            return bits
    return None


def numpy_dtype(t: TensorType) -> np.dtype:
    return NUMPY_DTYPES[t.elt]


def compute_dtype(t: TensorType) -> np.dtype:
    """The precision an op computes in before rounding to its element type."""
    return {
        "f16": np.dtype(np.float32),
        "bf16": np.dtype(np.float32),
        "f32": np.dtype(np.float32),
        "f64": np.dtype(np.float64),
        "f8E4M3FN": np.dtype(np.float32),
        "f8E5M2": np.dtype(np.float32),
        "i32": np.dtype(np.int64),
        "i64": np.dtype(np.int64),
        "i1": np.dtype(np.bool_),
    }[t.elt]


def odd_f32_bits(xp: Any, x: Any) -> Any:
    """f64 values rounded to odd in f32, as uint32 bits, on any array module `xp`: a further
    rounding to a type with fewer than half f32's bits (bf16, fp8) is then the single rounding
    of the f64 value (f32 has more than twice their bits, and their whole range)."""
    f = x.astype(xp.float32)
    back = f.astype(xp.float64)
    inexact = back != x
    away = xp.abs(back) > xp.abs(x)
    bits = f.view(xp.uint32)
    one = xp.uint32(1)
    # Rounded away from x: one ulp back toward it. Never 0 there (|f| > |x|), so the
    # subtraction never wraps, also for a NumPy scalar, whose wrap would warn.
    bits = bits - (inexact & away).astype(xp.uint32)
    return xp.where(inexact, bits | one, bits)


def round_f64(x: np.ndarray, elt: str) -> np.ndarray:
    """Round f64 values to element type `elt` ONCE, to nearest even. NumPy does so for f16 and
    f32, but ml_dtypes converts f64 to bf16 and fp8 through f32 (rounding twice): round to odd
    in f32 first, which makes the second rounding exact."""
    x = np.asarray(x)
    # A value beyond the type's range rounds to inf (NaN for e4m3fn, as ml_dtypes does):
    # IEEE's result, which NumPy computes but warns about (a product of f16 row sums).
    with np.errstate(over="ignore"):
        if elt not in BITS_DTYPES or x.dtype != np.float64:
            return x.astype(NUMPY_DTYPES[elt])
        return odd_f32_bits(np, x).view(np.float32).astype(NUMPY_DTYPES[elt])


def coords_of(rank: int, grid_shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(c) for c in np.unravel_index(rank, tuple(grid_shape)))


def rank_of(coords: Sequence[int], grid_shape: Sequence[int]) -> int:
    return int(np.ravel_multi_index(tuple(coords), tuple(grid_shape)))


def send_partner(
    coords: Sequence[int], grid_shape: Sequence[int], along: int, shift: int
) -> int | None:
    """The rank `shift` steps from the rank at `coords` along grid axis `along` (whom a
    `comm.send ... along A shift S` from it reaches), None past the axis' ends."""
    moved = list(coords)
    moved[along] += shift
    if not 0 <= moved[along] < grid_shape[along]:
        return None
    return rank_of(moved, grid_shape)


def groups_of(grid_shape: Sequence[int], span: Sequence[int]) -> list[list[int]]:
    """The groups a collective over grid axes `span` works in: ranks sharing their coordinates
    off those axes, each group in rank order (the order every reduction accumulates in), the
    groups in the order of their first rank. Vectorized: grids may hold many ranks."""
    shape = tuple(int(s) for s in grid_shape)
    inside = [a for a in range(len(shape)) if a in span]
    outside = [a for a in range(len(shape)) if a not in span]
    ranks = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)
    size = int(np.prod([shape[a] for a in inside], dtype=np.int64))
    return ranks.transpose(outside + inside).reshape(-1, size).tolist()


def group_of(grid_shape: Sequence[int], span: Sequence[int], rank: int) -> list[int]:
    """The group of `rank` over grid axes `span` (see groups_of), without listing the others."""
    shape = tuple(int(s) for s in grid_shape)
    coords = coords_of(rank, shape)
    strides = np.cumprod((1, *shape[:0:-1]), dtype=np.int64)[::-1]
    base = sum(int(c) * int(st) for a, (c, st) in enumerate(zip(coords, strides)) if a not in span)
    offsets = np.zeros(1, dtype=np.int64)
    for a in range(len(shape)):
        if a in span:
            offsets = (offsets[:, None] + np.arange(shape[a], dtype=np.int64) * strides[a]).reshape(
                -1
            )
    return (base + offsets).tolist()


def group_index(grid_shape: Sequence[int], span: Sequence[int], rank: int) -> int:
    """`rank`'s position in its group over `span`: its coordinates on those axes, row-major."""
    shape = tuple(int(s) for s in grid_shape)
    coords = coords_of(rank, shape)
    index = 0
    for a in range(len(shape)):
        if a in span:
            index = index * shape[a] + int(coords[a])
    return index


# Where a job's ranks live: `nodes[r]` is the node of rank r (ranks of one node share memory:
# symmetric buffers). An empty tuple is one node holding every rank. A collective's group
# splits into PARTS (docs/architecture.md §5.1): all of it, its members on this rank's node,
# or one member per node -- those with this rank's index among their node's members.
GROUP_PARTS = ("all", "node", "across")


def members_per_node(group: Sequence[int], nodes: Sequence[int]) -> list[list[int]]:
    """The group's members by node: nodes in the order of their first member, members in
    group order."""
    by_node: dict[int, list[int]] = {}
    for m in group:
        by_node.setdefault(int(nodes[m]) if nodes else 0, []).append(int(m))
    return list(by_node.values())


def spans_nodes(group: Sequence[int], nodes: Sequence[int]) -> bool:
    return len(members_per_node(group, nodes)) > 1


def even_over_nodes(group: Sequence[int], nodes: Sequence[int]) -> bool:
    """Whether every node holding members of the group holds as many of them."""
    return len({len(ms) for ms in members_per_node(group, nodes)}) == 1


def group_part(group: Sequence[int], nodes: Sequence[int], part: str, rank: int) -> list[int]:
    """`rank`'s members of `group` (which holds it) in `part` (GROUP_PARTS), in group order:
    within a node, or across nodes in node order."""
    if part == "all":
        return list(group)
    per_node = members_per_node(group, nodes)
    mine = next(ms for ms in per_node if rank in ms)
    if part == "node":
        return mine
    if part != "across":
        raise CocoError(f"unknown group part '{part}'")
    if not even_over_nodes(group, nodes):
        raise CocoError(
            f"[fused-across-nodes] the group {list(group)} has different numbers of ranks on "
            "its nodes: it has no members across nodes to pair"
        )
    local = mine.index(rank)
    return [ms[local] for ms in per_node]


def part_groups(
    grid_shape: Sequence[int], span: Sequence[int], nodes: Sequence[int], part: str
) -> list[list[int]]:
    """Every group of `part` of the groups over `span` (communicators are split by these)."""
    out: list[list[int]] = []
    for group in groups_of(grid_shape, span):
        seen: set[int] = set()
        for r in group:
            if r not in seen:
                sub = group_part(group, nodes, part, r)
                seen.update(sub)
                out.append(sub)
    return out


def nodes_of(size: int, ranks_per_node: int) -> tuple[int, ...]:
    """The node of every rank of a job of `size` ranks, `ranks_per_node` consecutive ranks to a
    node (COCONET_RANKS_PER_NODE: a node split declared instead of the machine's)."""
    if ranks_per_node < 1:
        raise CocoError(f"[ranks-per-node] ranks per node must be positive, got {ranks_per_node}")
    return tuple(r // ranks_per_node for r in range(size))


def logical_shape(t: TensorType, grid_shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(grid_shape[a] for a in t.local_axes()) + t.get_shape()


def split_range(length: int, parts: int, index: int) -> tuple[int, int]:
    """(offset, length) of part `index` of `length` elements cut into `parts` contiguous
    parts as MPI and NCCL users cut uneven counts (np.array_split, MPI_Reduce_scatter's
    recvcounts): the first `length % parts` parts hold one element more."""
    q, r = divmod(length, parts)
    return index * q + min(index, r), q + (index < r)


def piece_range(
    t: TensorType, dim: int, coords: Sequence[int], grid_shape: Sequence[int]
) -> tuple[int, int]:
    """(start, length) in global coordinates of the part of dim `dim` this rank holds: cut by
    each slicing axis in turn (outermost first), unevenly where the size does not divide."""
    start, length = 0, t.get_shape()[dim]
    for a in t.slicing_axes(dim):
        offset, length = split_range(length, grid_shape[a], coords[a])
        start += offset
    return start, length


def shared_region(
    have: TensorType,
    have_coords: Sequence[int],
    want: TensorType,
    want_coords: Sequence[int],
    grid_shape: Sequence[int],
) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """The part of the logical tensor that a rank at `have_coords` holds under `have` and one
    at `want_coords` holds under `want` (a box: both pieces are), as an index region into
    each piece; empty ranges where they share nothing. What an all_to_all moves between two
    members (tensor dims only: ranks of one group share their local coordinates)."""
    in_have: list[slice] = []
    in_want: list[slice] = []
    for d in range(have.rank):
        h0, hn = piece_range(have, d, have_coords, grid_shape)
        w0, wn = piece_range(want, d, want_coords, grid_shape)
        lo, hi = max(h0, w0), min(h0 + hn, w0 + wn)
        hi = max(lo, hi)
        in_have.append(slice(lo - h0, hi - h0))
        in_want.append(slice(lo - w0, hi - w0))
    return tuple(in_have), tuple(in_want)


def piece_shape(t: TensorType, coords: Sequence[int], grid_shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of the piece this rank holds (ranks differ where a slice is uneven)."""
    return tuple(piece_range(t, d, coords, grid_shape)[1] for d in range(t.rank))


def rank_shapes(t: TensorType, grid_shape: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Every rank's piece shape, in rank order."""
    size = int(np.prod(grid_shape, dtype=np.int64))
    return tuple(piece_shape(t, coords_of(r, grid_shape), grid_shape) for r in range(size))


def is_uneven(t: TensorType, grid_shape: Sequence[int]) -> bool:
    """Whether some sliced dim of `t` does not divide by the ranks that cut it."""
    for d in range(t.rank):
        parts = 1
        for a in t.slicing_axes(d):
            parts *= grid_shape[a]
        if t.get_shape()[d] % parts:
            return True
    return False


def stream_index(t: TensorType, coords: Sequence[int], grid_shape: Sequence[int]) -> int:
    """The flat index of this rank's coordinates on the tensor's local axes (0 if none)."""
    idx = 0
    for a in t.local_axes():
        idx = idx * grid_shape[a] + coords[a]
    return idx


def piece_of(
    logical: np.ndarray, t: TensorType, coords: Sequence[int], grid_shape: Sequence[int]
) -> np.ndarray:
    value = logical
    for a in t.local_axes():
        value = value[coords[a]]
    index = tuple(
        slice(s, s + n) for s, n in (piece_range(t, d, coords, grid_shape) for d in range(t.rank))
    )
    return np.array(value[index], order="C")  # a copy; ascontiguousarray makes 0-d arrays 1-d


def distribute(logical: np.ndarray, t: TensorType, grid_shape: Sequence[int]) -> list[np.ndarray]:
    size = int(np.prod(grid_shape))
    return [piece_of(logical, t, coords_of(r, grid_shape), grid_shape) for r in range(size)]


def assemble(
    pieces: Sequence[np.ndarray], t: TensorType, grid_shape: Sequence[int], *, check: bool = True
) -> np.ndarray:
    """The logical value from every rank's piece. With `check`, ranks that must agree (those
    differing only on axes where the tensor is replicated) are verified to agree: a mismatch
    means a backend broke the program's semantics."""
    out = np.zeros(logical_shape(t, grid_shape), dtype=pieces[0].dtype)
    local = t.local_axes()
    filled: dict[tuple[int | tuple[int, int], ...], int] = {}
    for r, piece in enumerate(pieces):
        coords = coords_of(r, grid_shape)
        ranges = tuple(piece_range(t, d, coords, grid_shape) for d in range(t.rank))
        key = tuple(coords[a] for a in local) + ranges
        index = tuple(coords[a] for a in local) + tuple(slice(s, s + n) for s, n in ranges)
        if key in filled:
            # (a signalling NaN of a narrow float raises the invalid flag in isnan)
            with np.errstate(invalid="ignore"):
                agree = not check or np.array_equal(out[index], piece, equal_nan=True)
            if not agree:
                raise CocoError(
                    f"ranks {filled[key]} and {r} hold different values of a tensor of type {t} "
                    "that they should share: the backend broke the program's semantics"
                )
            continue
        filled[key] = r
        out[index] = piece
    return out


def check_input_names(program: str, given: Iterable[str], expected: Sequence[str]) -> None:
    """Every argument given, and nothing else: one clear error naming what is off."""
    given = set(given)
    unknown = sorted(given - set(expected))
    if unknown:
        raise CocoError(
            f"@{program} has no argument(s) {', '.join(unknown)}; its arguments are "
            + ", ".join(expected)
        )
    missing = [n for n in expected if n not in given]
    if missing:
        raise CocoError(f"@{program}: missing input(s) {', '.join(missing)}")


def _is_scalar(value: object) -> bool:
    return isinstance(value, (int, float, bool, np.number, np.bool_))


def coerce_input(name: str, value: object, t: TensorType, grid_shape: Sequence[int]) -> np.ndarray:
    """Check one user-given input against its declared type; one clear error if it is off."""
    want_shape = logical_shape(t, grid_shape)
    want_dtype = numpy_dtype(t)
    if _is_scalar(value) and not want_shape:
        return np.asarray(value, dtype=want_dtype)
    if isinstance(value, np.ndarray):
        array = cast(np.ndarray, value)  # isinstance leaves its shape and dtype unknown
    elif hasattr(value, "__array__") or hasattr(value, "__dlpack__"):
        array = np.asarray(value)
    else:
        raise CocoError(
            f"input '{name}': expected a NumPy array of shape {list(want_shape)} and dtype "
            f"{t.elt}, got a {type(value).__name__}"
        )
    if array.shape != want_shape:
        local = t.local_axes()
        hint = (
            f" ({len(local)} leading dim(s) for the ranks along its local grid axes, then the "
            f"global shape {list(t.get_shape())})"
            if local
            else " (the global shape)"
        )
        raise CocoError(
            f"input '{name}' of type {t}: expected shape {list(want_shape)}{hint}, got "
            f"{list(array.shape)}"
        )
    if array.dtype != want_dtype:
        raise CocoError(
            f"input '{name}' of type {t}: expected dtype {t.elt} ({want_dtype.name}), got "
            f"{array.dtype.name}"
        )
    return array


def random_input(
    t: TensorType, grid_shape: Sequence[int], rng: np.random.Generator, *, signed: bool = True
) -> np.ndarray:
    """Seeded inputs for a program with no given inputs: floats of magnitude uniform in
    [0.1, 1) with a random sign, integers in [-9, 10), booleans fair coins. `signed=False`
    (values a square root, a logarithm or a power's base reads: optimizer state) keeps floats
    in [0.1, 1) and integers in [0, 10). Deterministic in the generator's state."""
    shape = logical_shape(t, grid_shape)
    dtype = numpy_dtype(t)
    if t.elt == "i1":
        return rng.random(shape) < 0.5
    if t.elt in ("i32", "i64"):
        return rng.integers(-9 if signed else 0, 10, size=shape).astype(dtype)
    magnitude = rng.uniform(0.1, 1.0, size=shape)
    if signed:
        magnitude = np.where(rng.random(shape) < 0.5, -magnitude, magnitude)
    return magnitude.astype(dtype)


# ---------------------------------------------------------------------------------------------
# Arrays in .npz files (coco-run --inputs / --output)
# ---------------------------------------------------------------------------------------------

# NumPy has no bf16 or fp8: it writes ml_dtypes arrays as raw records ('V2', 'V1') that read
# back as bytes of no known type. coconet's encoding: such an array is stored as its bit
# patterns (uint16 for bf16, uint8 for f8E4M3FN / f8E5M2), and this entry (a JSON object as a
# 0-d string array, no pickle) maps its name to the type. Any tool can write it:
# np.savez(f, x=x.view(np.uint16), __coconet_dtypes__=np.array('{"x": "bf16"}')).
NPZ_DTYPES_KEY = "__coconet_dtypes__"
_BITS_HINT = (
    f"store such arrays as their bits, uint16 for bf16 and uint8 for fp8, named in "
    f"{NPZ_DTYPES_KEY} (see coco-run --help)"
)


def save_arrays(path: str, arrays: dict[str, np.ndarray]) -> str:
    """Write `arrays` to the .npz file `path` (bf16 and fp8 encoded as above), atomically: a reader
    or a failure midway never sees a half-written file. Returns the file written (`path`,
    with `.npz` added as np.savez would); a directory is refused, not written beside."""
    import json
    import os
    import tempfile
    from pathlib import Path

    stored: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for name, a in arrays.items():
        a = np.asarray(a)
        elt = next((e for e in BITS_DTYPES if NUMPY_DTYPES[e] == a.dtype), None)
        if elt is not None:
            stored[name] = a.view(BITS_DTYPES[elt])
            dtypes[name] = elt
        else:
            stored[name] = a
    if dtypes:
        stored[NPZ_DTYPES_KEY] = np.array(json.dumps(dtypes))
    target = Path(path)
    if target.is_dir():
        raise CocoError(f"cannot write {target}: Is a directory (name an .npz file)")
    if target.suffix != ".npz":
        target = target.with_name(target.name + ".npz")  # where np.savez would have written
    try:
        if target.is_dir():
            raise IsADirectoryError(21, "Is a directory", str(target))
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                # numpy's stub lets a `**` dict of arrays fill savez's `allow_pickle: bool`
                np.savez(f, **stored)  # pyright: ignore[reportArgumentType]
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as e:
        raise CocoError(f"cannot write {target}: {e.strerror or e}") from None
    return str(target)


def load_arrays(path: str) -> dict[str, np.ndarray]:
    """Read an .npz file of named arrays (bf16 and fp8 decoded from the encoding above)."""
    import json
    import zipfile

    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise CocoError(f"no such inputs file: {path}") from None
    except ValueError as e:
        # NumPy writes an fp8 array with a descriptor ('<f1') it cannot read back
        hint = f" (how NumPy saves fp8): {_BITS_HINT}" if "descr" in str(e) else ""
        raise CocoError(f"cannot read inputs from {path}: {e}{hint}") from None
    except (OSError, zipfile.BadZipFile) as e:
        raise CocoError(f"cannot read inputs from {path}: {e}") from None
    dtypes: dict[str, str] = {}
    if NPZ_DTYPES_KEY in arrays:
        try:
            dtypes = json.loads(str(arrays.pop(NPZ_DTYPES_KEY)))
            assert isinstance(dtypes, dict)
        except (ValueError, AssertionError):
            raise CocoError(f"{path}: {NPZ_DTYPES_KEY} is not a JSON object of dtypes") from None
    for name, a in arrays.items():
        want = dtypes.get(name)
        if want in BITS_DTYPES:
            bits = BITS_DTYPES[want]
            if a.dtype != bits:
                raise CocoError(
                    f"{path}: '{name}' is marked {want} but holds {a.dtype.name}, "
                    f"not {bits.name} bits"
                )
            arrays[name] = a.view(NUMPY_DTYPES[want])
        elif want is not None:
            raise CocoError(
                f"{path}: '{name}' has an unknown dtype mark {want!r} "
                f"(one of {', '.join(BITS_DTYPES)})"
            )
        elif a.dtype.kind == "V":
            raise CocoError(
                f"{path}: '{name}' holds raw {a.dtype.itemsize}-byte records (how NumPy saves "
                f"bf16): {_BITS_HINT}"
            )
    return arrays
