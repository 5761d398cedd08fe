"""The plan's library collectives, written once for every backend over a `Transport`
(runtime/transport.py).

A collective step names its source and destination buffers, the grid axes it spans and, for
reductions, a kind. Turning that into transport calls is the same on every backend: which
member region of the source goes to which rank (packing regions that are not one contiguous
run), when the library may reduce and when the pieces are gathered and combined here in rank
order in f64 (int64) and rounded once -- the sim's semantics, bit for bit --, what a root's
peers keep, and which neighbours a `comm.send` pairs.

`collective_ops` is a generator: it yields each transport request it must wait on and then
finishes locally, so the cpu backend can leave MPI requests in flight while it computes, and
the cuda backend (whose NCCL calls are stream-ordered) simply runs it to the end.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coconet.core import values as V
from coconet.core.program import CocoError
from coconet.dialects.reduction import Reduction
from coconet.lowering.plan import Collective
from coconet.runtime.executor import consecutive_blocks, group_of, member_region
from coconet.runtime.transport import Request, Transport, is_bf16

CollectiveOps = Generator[Request, None, None]


@dataclass
class CollectiveContext:
    """What a collective needs of the rank that runs it."""

    xp: Any  # the array module of the buffers (NumPy, CuPy)
    rank: int
    grid_shape: tuple[int, ...]
    exact: bool  # reduce floats in rank order here, never in the library
    # the group over these grid axes, or its part (core/values.py GROUP_PARTS)
    transport: Callable[[tuple[int, ...], str], Transport]
    world: Callable[[], Transport]  # every rank, in rank order (for send)
    empty: Callable[[tuple[int, ...], np.dtype], Any]  # a scratch array like the buffers
    nodes: tuple[int, ...] = ()  # the node of every rank (the plan's)
    # what a step computes of the plan alone or keeps between calls, by id(step)
    # (`_per_step`: its regions, its scratch): a context lives as long as its backend's
    # plan, whose steps it is keyed by
    memo: dict[Any, Any] = field(default_factory=dict)
    # the backend's compiled `combine` (host_combine.HostCombine): None where it does not
    # cover the types, then `combine` in the array module
    combiner: Callable[..., Any] | None = None

    def combine(
        self,
        kind: Reduction,
        pieces: Any,
        src: np.dtype,
        dst: np.dtype,
        storage: np.dtype,
        acc: Any,
    ) -> Any:
        if self.combiner is not None:
            out = self.combiner(kind, pieces, src, dst, storage, acc)
            if out is not None:
                return out
        return combine(self.xp, kind, pieces, src, dst, storage, acc)


# ---------------------------------------------------------------------------------------------
# Exact combination: the sim's accumulation, on any array module
# ---------------------------------------------------------------------------------------------


def widen(xp: Any, a: Any, logical: np.dtype) -> Any:
    """Values of `a` in the sim's accumulation type: bool for i1, f64 for floats, int64 for
    integers. bf16 and fp8 may be stored as their bit patterns (device arrays)."""
    if logical == np.bool_:
        return a.astype(xp.bool_)
    bits = V.bits_dtype(logical)
    if bits is not None and a.dtype == bits:
        if is_bf16(logical):
            return (a.astype(xp.uint32) << xp.uint32(16)).view(xp.float32).astype(xp.float64)
        return xp.asarray(_FP8_VALUES[np.dtype(logical).name])[a]
    if logical.kind == "f" or bits is not None:
        return a.astype(xp.float64)
    return a.astype(xp.int64)


# Every fp8 code's value, to widen bit patterns by lookup.
_FP8_VALUES = {
    V.NUMPY_DTYPES[elt].name: np.arange(256, dtype=np.uint8)
    .view(V.NUMPY_DTYPES[elt])
    .astype(np.float64)
    for elt in ("f8E4M3FN", "f8E5M2")
}


def bf16_bits(xp: Any, x: Any) -> Any:
    """f64 values rounded ONCE to bf16 (nearest even), as uint16 bit patterns."""
    bits = V.odd_f32_bits(xp, x)
    one = xp.uint32(1)
    rounded = (
        (bits + xp.uint32(0x7FFF) + ((bits >> xp.uint32(16)) & one)) >> xp.uint32(16)
    ).astype(xp.uint16)
    quiet_nan = ((bits >> xp.uint32(16)) | xp.uint32(0x40)).astype(xp.uint16)
    return xp.where((bits & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000), quiet_nan, rounded)


# coco_device.h's coco_f32_to_f8_bits parameters: mantissa bits, bias, the f32 bits of the
# smallest normal, the addend that rounds subnormals, the overflow code, the NaN code.
_FP8_ENCODING = {
    "float8_e4m3fn": (3, 7, 0x3C800000, 16384.0, 0x7F, 0x7F),
    "float8_e5m2": (2, 15, 0x38800000, 128.0, 0x7C, 0x7E),
}


def fp8_bits(xp: Any, x: Any, logical: np.dtype) -> Any:
    """f64 values rounded ONCE to fp8 `logical` (nearest even; e4m3fn overflows to NaN, e5m2
    to inf), as uint8 bit patterns: coco_device.h's conversion, on any array module."""
    man, bias, min_normal, sub_add, over, nan = _FP8_ENCODING[np.dtype(logical).name]
    u32 = xp.uint32
    bits = V.odd_f32_bits(xp, x)
    sign = (bits >> u32(24)) & u32(0x80)
    ax = bits & u32(0x7FFFFFFF)
    shift = u32(23 - man)
    # Below the smallest normal this wraps around (the subnormal path is taken there): NumPy
    # warns of that on a 0-d array (a scalar all_reduce), never on a larger one.
    with np.errstate(over="ignore"):
        normal = ((ax + u32((1 << (22 - man)) - 1) + ((ax >> shift) & u32(1))) >> shift) - u32(
            (127 - bias) << man
        )
    add = xp.float32(sub_add)
    subnormal = (ax.view(xp.float32) + add).view(u32) - add.view(u32)
    mag = xp.where(ax < u32(min_normal), subnormal, normal)
    mag = xp.minimum(mag, u32(over))
    mag = xp.where(ax > u32(0x7F800000), u32(nan), mag)
    return (sign | mag).astype(xp.uint8)


def narrow(xp: Any, x: Any, logical: np.dtype, storage: np.dtype) -> Any:
    """Accumulated values rounded once to `logical`, in `storage` (the bit patterns of bf16
    and fp8 on a device)."""
    bits = V.bits_dtype(logical)
    if bits is not None and storage in (bits, logical):
        x = x.astype(xp.float64)
        code = bf16_bits(xp, x) if is_bf16(logical) else fp8_bits(xp, x, logical)
        return code if storage == bits else code.view(storage)
    return x.astype(storage)


def round_to_acc(xp: Any, x: Any, acc: str | None) -> Any:
    """f64 values rounded once to the stated accumulation `acc` (comm.accumulation), as f64;
    unchanged where none is stated."""
    if acc is None or acc == "f64":
        return x
    if acc == "bf16":
        bits = bf16_bits(xp, x)
        return (bits.astype(xp.uint32) << xp.uint32(16)).view(xp.float32).astype(xp.float64)
    return x.astype(V.NUMPY_DTYPES[acc]).astype(xp.float64)  # f32, f16


def combine(
    xp: Any,
    kind: Reduction,
    pieces: Any,
    src: np.dtype,
    dst: np.dtype,
    storage: np.dtype,
    acc_elt: str | None = None,
) -> Any:
    """The rank-order combination of `pieces` (a sequence, or an array with one piece per
    row), rounded once to `dst` -- the sim's all_reduce of those pieces; with a stated
    accumulation `acc_elt`, each partial rounded to it after every step first."""
    acc = round_to_acc(xp, widen(xp, pieces[0], src), acc_elt)
    for p in list(pieces)[1:]:
        x = widen(xp, p, src)
        if kind == Reduction.SUM:
            acc = acc | x if src == np.bool_ else acc + x
        elif kind == Reduction.PROD:
            acc = acc & x if src == np.bool_ else acc * x
        elif kind == Reduction.MAX:
            acc = xp.maximum(acc, x)
        else:
            acc = xp.minimum(acc, x)
        acc = round_to_acc(xp, acc, acc_elt)
    return narrow(xp, acc, dst, storage)


# ---------------------------------------------------------------------------------------------
# The collectives
# ---------------------------------------------------------------------------------------------


def collective_ops(
    ctx: CollectiveContext, step: Collective, src: Any, dst: Any, src_dt: np.dtype, dst_dt: np.dtype
) -> CollectiveOps:
    """One collective step on this rank: `src`/`dst` are its whole buffers, `src_dt`/`dst_dt`
    their logical dtypes. A step with `rows` (one chunk of an overlap pipeline) works on those
    rows (flattened leading dims) of both buffers; a reduce_scatter's rows are rows of its
    result, an all_gather's rows of its input (see lowering/plan.py `Collective`)."""
    if step.rows is not None and step.op not in ("reduce_scatter", "all_gather"):
        src, dst = _rows_of(src, step.rows), _rows_of(dst, step.rows)
    if step.op == "send":
        return _send(ctx, step, src, dst)
    run = _COLLECTIVES.get(step.op)
    if run is None:
        raise CocoError(f"no library collective {step.op}")
    group = _group(tuple(ctx.grid_shape), step.axes, step.part, tuple(ctx.nodes), ctx.rank)
    return run(ctx, step, ctx.transport(step.axes, step.part), group, src, dst, src_dt, dst_dt)


@functools.lru_cache(maxsize=1024)
def _group(
    grid_shape: tuple[int, ...], axes: tuple[int, ...], part: str, nodes: tuple[int, ...], rank: int
) -> list[int]:
    """The rank's group (or its part), computed once: every step of every call asks (read
    only: the list is shared)."""
    group = group_of(grid_shape, axes, rank)
    return V.group_part(group, nodes, part, rank) if part != "all" else group


def _packed(step: Collective) -> bool:
    """A hierarchical collective's inter-node step works on buffers the lowering packed in
    member order (one block per member), whatever the types' layouts say."""
    return step.part != "all"


def _rows_of(a: Any, rows: tuple[int, int]) -> Any:
    return a.reshape(-1, a.shape[-1])[rows[0] : rows[1]]


def _region_rows(
    ctx: CollectiveContext, shape: tuple[int, ...], region: tuple[slice, ...], rows: tuple[int, int]
) -> tuple[Any, slice]:
    """Rows [b, e) of `region` of an array of `shape` (flattened leading dims, in the region's
    row order) as an index into the array's 2-D row view: a slice where they are one run of
    rows, else an index array; and the region's columns."""
    index = np.arange(int(np.prod(shape[:-1], dtype=np.int64)), dtype=np.int64)
    picked = index.reshape(shape[:-1])[region[:-1]].reshape(-1)[rows[0] : rows[1]]
    if picked.size and picked[-1] - picked[0] == picked.size - 1:
        return slice(int(picked[0]), int(picked[-1]) + 1), region[-1]
    return ctx.xp.asarray(picked), region[-1]


def _library(
    ctx: CollectiveContext, t: Transport, dtype: np.dtype, kind: Reduction, step: Collective
) -> bool:
    # A stated accumulation rounds every step in rank order: no library promises that.
    if step.acc is not None or not t.reduces(dtype, kind):
        return False
    return not ctx.exact or np.dtype(dtype).kind in "iub"


def _contiguous(ctx: CollectiveContext, a: Any) -> Any:
    return ctx.xp.ascontiguousarray(a)


def _all_reduce(ctx, step, t, group, src, dst, src_dt, dst_dt) -> CollectiveOps:
    if _library(ctx, t, src_dt, step.kind, step) and src.dtype == dst.dtype:
        yield t.all_reduce(src, dst, step.kind, src_dt)
        return
    members = len(group)
    if members > 1 and src.nbytes >= EXACT_TWO_STEP_BYTES:
        yield from _exact_two_step(ctx, step, t, members, src, dst, src_dt, dst_dt)
        return
    gathered = _scratch(ctx, step, "gathered", (members, *src.shape), src.dtype)
    yield t.all_gather(_contiguous(ctx, src), gathered)
    dst[...] = ctx.combine(step.kind, gathered, src_dt, dst_dt, dst.dtype, step.acc)


# From this size an all_reduce the library cannot reduce takes two steps: every rank gathering
# every member's whole tensor combines all of it, members times the elements the two-step
# form combines and (members - 1) / members of the tensor more on the wire per rank; below,
# one collective is one latency.
EXACT_TWO_STEP_BYTES = 64 << 10


def _exact_two_step(ctx, step, t, members, src, dst, src_dt, dst_dt) -> CollectiveOps:
    """An exact all_reduce as a reduce_scatter then an all_gather (what NCCL's ring does):
    member m combines block m of every member's tensor in rank order -- the same members in
    the same order per element, so the same bits -- and the combined blocks are gathered.
    Its scratch is the step's own, kept between calls (`_scratch`)."""
    n = src.size
    width = -(-n // members)
    packed = _scratch(ctx, step, "packed", (members, width), src.dtype)
    flat = _bits(packed.reshape(-1))
    flat[:n] = _bits(src).reshape(-1)
    flat[n:] = 0
    received = _scratch(ctx, step, "received", (members, width), src.dtype)
    yield t.all_to_all(packed, received)
    mine = ctx.combine(step.kind, received, src_dt, dst_dt, dst.dtype, step.acc)
    gathered = _scratch(ctx, step, "gathered", (members, width), dst.dtype)
    yield t.all_gather(_contiguous(ctx, mine), gathered)
    _bits(dst)[...] = _bits(gathered).reshape(-1)[:n].reshape(dst.shape)


def _per_step(ctx: CollectiveContext, step: Collective, key: tuple[Any, ...], make) -> Any:
    """`make()` for `step` and `key`, made at the step's first call and kept (`ctx.memo`: a
    context lives as long as its backend's plan)."""
    full = (id(step), *key)
    hit = ctx.memo.get(full)
    if hit is None or hit[0] is not step:  # (the step itself: an id outlives its object)
        hit = ctx.memo[full] = (step, make())
    return hit[1]


def _scratch(ctx: CollectiveContext, step: Collective, role: str, shape, dtype) -> Any:
    """A scratch array of `step`'s, allocated at its first call and reused after: a fresh
    array of megabytes is fresh pages, faulted in on every call."""
    shape = tuple(shape)
    return _per_step(ctx, step, (role, shape, np.dtype(dtype)), lambda: ctx.empty(shape, dtype))


def _bits(a: Any) -> Any:
    """`a` viewed as unsigned integers of its width: copies move bytes (a copy of ml_dtypes'
    bf16 or fp8 goes element by element through the type's own copy function)."""
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else a


def blocking_call(
    ctx: CollectiveContext, step: Collective, src: Any, dst: Any, src_dt: np.dtype, dst_dt: np.dtype
) -> Callable[[], None] | None:
    """`step` on these whole buffers as one blocking library call, where it is one (an
    all_reduce the library may reduce, as `_all_reduce` decides): bound once, made at every
    blocking step instead of walking the collective's requests; None otherwise."""
    if step.op != "all_reduce" or step.rows is not None or step.kind is None:
        return None
    t = ctx.transport(step.axes, step.part)
    if not (_library(ctx, t, src_dt, step.kind, step) and src.dtype == dst.dtype):
        return None
    return t.all_reduce_call(src, dst, step.kind)


def _regions(
    ctx: CollectiveContext, step: Collective, outer: Any, inner: Any, group: list[int], shape: Any
) -> tuple[list[tuple[slice, ...]], bool]:
    """The member regions of `step` (member_region of each member's piece under `inner`
    within this rank's under `outer`) and whether they tile an array of `shape` as
    consecutive blocks: computed once per step and shape (`ctx.memo`), as every call of a
    compiled program would compute them again."""

    def make() -> tuple[list[tuple[slice, ...]], bool]:
        regions = [member_region(outer, ctx.rank, inner, m, ctx.grid_shape) for m in group]
        return regions, consecutive_blocks(regions, shape)

    return _per_step(ctx, step, ("regions", tuple(shape)), make)


def _count(region: tuple[slice, ...]) -> int:
    n = 1
    for s in region:
        n *= s.stop - s.start
    return n


def _padded(ctx: CollectiveContext, src: Any, regions: list[tuple[slice, ...]], width: int) -> Any:
    """The regions of `src`, one per row of a (members, width) array, zero-padded at the end
    (uneven slices: a transport moves equal counts)."""
    packed = ctx.empty((len(regions), width), src.dtype)
    for j, r in enumerate(regions):
        n = _count(r)
        packed[j, :n] = _contiguous(ctx, src[r]).reshape(-1)
        packed[j, n:] = 0
    return packed


def _reduce_scatter(ctx, step, t, group, src, dst, src_dt, dst_dt) -> CollectiveOps:
    tiled = False
    if _packed(step):
        regions = []
    else:
        regions, tiled = _regions(ctx, step, step.src.type, step.dst.type, group, src.shape)
    counts = [_count(r) for r in regions]
    if step.rows is None and len(set(counts)) > 1:
        # Uneven slices (MPI_Reduce_scatter with recvcounts): every member's region padded to
        # the largest, reduced as equal blocks; this rank keeps its own count of its block.
        width = max(counts)
        packed = _padded(ctx, src, regions, width)
        mine = dst.size
        if _library(ctx, t, src_dt, step.kind, step) and src.dtype == dst.dtype:
            block = ctx.empty((width,), dst.dtype)
            yield t.reduce_scatter(packed, block, step.kind, src_dt)
            dst[...] = block[:mine].reshape(dst.shape)
            return
        received = ctx.empty(tuple(packed.shape), packed.dtype)
        yield t.all_to_all(packed, received)
        combined = ctx.combine(step.kind, received[:, :mine], src_dt, dst_dt, dst.dtype, step.acc)
        dst[...] = combined.reshape(dst.shape)
        return
    if step.rows is not None:  # one chunk: every member's rows [b, e) of its part
        flat = src.reshape(-1, src.shape[-1])
        dst = _rows_of(dst, step.rows)
        packed = ctx.empty((len(group), dst.size), src.dtype)  # device memory on a GPU
        for j, r in enumerate(regions):
            i, c = _region_rows(ctx, tuple(src.shape), r, step.rows)
            packed[j] = flat[i, c].reshape(-1)
    elif _packed(step) or tiled:
        packed = src.reshape(len(group), -1)
    else:
        # Each member's region (e.g. a block of rows per batch index when an inner dim is
        # sliced) packed into scratch of the backend's: device memory on a GPU, which NCCL
        # needs (an array module's `stack` would give host memory to a CPU-side double).
        packed = ctx.empty((len(group), dst.size), src.dtype)
        for j, r in enumerate(regions):
            packed[j] = src[r].reshape(-1)
    if _library(ctx, t, src_dt, step.kind, step) and src.dtype == dst.dtype:
        yield t.reduce_scatter(packed, dst, step.kind, src_dt)
        return
    received = ctx.empty(tuple(packed.shape), packed.dtype)
    yield t.all_to_all(_contiguous(ctx, packed), received)
    combined = ctx.combine(step.kind, received, src_dt, dst_dt, dst.dtype, step.acc)
    dst[...] = combined.reshape(dst.shape)


def _all_gather(ctx, step, t, group, src, dst, src_dt, dst_dt) -> CollectiveOps:
    piece = _contiguous(ctx, src)
    if _packed(step):
        yield t.all_gather(piece, dst)
        return
    regions, tiled = _regions(ctx, step, step.dst.type, step.src.type, group, dst.shape)
    counts = [_count(r) for r in regions]
    if step.rows is None and len(set(counts)) > 1:
        # Uneven slices (MPI_Allgatherv): pieces padded to the largest, gathered as equal
        # blocks, each member's count placed.
        width = max(counts)
        padded = ctx.empty((width,), piece.dtype)
        padded[: piece.size] = piece.reshape(-1)
        padded[piece.size :] = 0
        gathered = ctx.empty((len(group), width), piece.dtype)
        yield t.all_gather(padded, gathered)
        for j, r in enumerate(regions):
            dst[r] = gathered[j, : counts[j]].reshape(dst[r].shape)
        return
    if step.rows is not None:  # one chunk: rows [b, e) of every member's piece
        piece = _contiguous(ctx, _rows_of(src, step.rows))
        gathered = ctx.empty((len(group), *piece.shape), piece.dtype)
        yield t.all_gather(piece, gathered)
        flat = dst.reshape(-1, dst.shape[-1])
        for j, r in enumerate(regions):
            i, c = _region_rows(ctx, tuple(dst.shape), r, step.rows)
            flat[i, c] = gathered[j]
        return
    if tiled:
        yield t.all_gather(piece, dst)
        return
    gathered = ctx.empty((len(group), *piece.shape), piece.dtype)
    yield t.all_gather(piece, gathered)
    for j, r in enumerate(regions):
        dst[r] = gathered[j]


def _root(step: Collective, group: list[int]) -> int:
    if step.root is None or step.root >= len(group):
        raise CocoError(
            f"{step.op} names root {step.root}, but its groups have {len(group)} rank(s)"
        )
    return step.root


def _broadcast(ctx, step, t, group, src, dst, src_dt, dst_dt) -> CollectiveOps:
    root = _root(step, group)
    if t.rank() == root and step.src.name != step.dst.name:
        dst[...] = src
    yield t.broadcast(dst, root)


def _reduce(ctx, step, t, group, src, dst, src_dt, dst_dt) -> CollectiveOps:
    root = _root(step, group)
    me = t.rank()
    in_place = step.src.name == step.dst.name
    piece = _contiguous(ctx, src)
    if _library(ctx, t, src_dt, step.kind, step) and src.dtype == dst.dtype:
        out = None
        if me == root:
            out = ctx.empty(tuple(dst.shape), dst.dtype) if in_place else dst
        yield t.reduce(piece, out, step.kind, src_dt, root)
        if me == root and out is not dst:
            dst[...] = out
    else:
        gathered = ctx.empty((len(group), *piece.shape), piece.dtype) if me == root else None
        yield t.gather(piece, gathered, root)
        if me == root:
            dst[...] = ctx.combine(step.kind, gathered, src_dt, dst_dt, dst.dtype, step.acc)
    if me != root and not in_place:
        dst[...] = src  # the sim: ranks other than the root keep their input


def _send(ctx: CollectiveContext, step: Collective, src: Any, dst: Any) -> CollectiveOps:
    """comm.send: every rank sends its piece `shift` steps along grid axis `along`; a rank with
    no sender gets zeros (the sim's semantics)."""
    coords = list(V.coords_of(ctx.rank, ctx.grid_shape))
    along, shift = step.along, step.shift
    # a send names its axis and its shift
    assert along is not None
    assert shift is not None
    to, frm = list(coords), list(coords)
    to[along] += shift
    frm[along] -= shift
    n = ctx.grid_shape[along]
    dest = V.rank_of(to, ctx.grid_shape) if 0 <= to[along] < n else None
    source = V.rank_of(frm, ctx.grid_shape) if 0 <= frm[along] < n else None
    piece = _contiguous(ctx, src) if dest is not None else None
    recv = None
    if source is None:
        dst[...] = 0
    elif dst.flags.c_contiguous and step.src.name != step.dst.name:
        recv = dst
    else:  # receiving in place would overwrite what is being sent
        recv = ctx.empty(tuple(dst.shape), dst.dtype)
    if piece is None and recv is None:
        return
    yield ctx.world().exchange(piece, dest, recv, source)
    if recv is not None and recv is not dst:
        dst[...] = recv


def _all_to_all(ctx, step, t, group, src, dst, src_dt, dst_dt) -> CollectiveOps:
    """comm.all_to_all. The dispatch form (local tensors): dim 0's blocks are equal runs of
    both buffers, moved as they are. The sliced form: what this rank holds of each member's
    result piece (a box of its own piece, strided in general) packed in member order, moved
    by an uneven all_to_all (MPI_Alltoallv: counts from the uneven cuts) and unpacked into
    the box of its result piece each member's run fills."""
    if step.rows is not None or _packed(step):
        raise CocoError("[all-to-all-rows] an all_to_all runs on whole buffers only")
    n = len(group)
    src_t, dst_t = step.src.type, step.dst.type
    if step.block is not None:
        # One chunk of an overlap: the all_to_all of the sub-block [b, e) of dim d, a dim it
        # neither splits nor gathers (whole in both buffers), so every region below is the
        # same box cut to that range (packed and unpacked through strided copies).
        d, lo, hi = step.block
        cut = (slice(None),) * d + (slice(lo, hi),)
        src, dst = src[cut], dst[cut]
    if set(step.axes) <= set(src_t.local_axes()):
        in_place = step.src.name == step.dst.name
        contiguous = step.block is None and not in_place
        out = dst if contiguous else ctx.empty(tuple(dst.shape), dst.dtype)
        yield t.all_to_all(_contiguous(ctx, src).reshape(n, -1), out.reshape(n, -1))
        if out is not dst:
            dst[...] = out
        return
    me = V.coords_of(ctx.rank, ctx.grid_shape)
    peers = [V.coords_of(m, ctx.grid_shape) for m in group]
    sends = [V.shared_region(src_t, me, dst_t, c, ctx.grid_shape)[0] for c in peers]
    recvs = [V.shared_region(src_t, c, dst_t, me, ctx.grid_shape)[1] for c in peers]
    if step.block is not None:
        d, lo, hi = step.block
        sends = [_within(r, d, hi - lo) for r in sends]
        recvs = [_within(r, d, hi - lo) for r in recvs]
    send_counts = [_count(r) for r in sends]
    recv_counts = [_count(r) for r in recvs]
    packed = ctx.empty((sum(send_counts),), src.dtype)
    offset = 0
    for region, count in zip(sends, send_counts):
        packed[offset : offset + count] = src[region].reshape(-1)
        offset += count
    received = ctx.empty((sum(recv_counts),), dst.dtype)
    yield t.all_to_all_v(packed, send_counts, received, recv_counts)
    offset = 0
    for region, count in zip(recvs, recv_counts):
        dst[region] = received[offset : offset + count].reshape(dst[region].shape)
        offset += count


def _within(region: tuple[slice, ...], d: int, extent: int) -> tuple[slice, ...]:
    """`region` (whole along dim d) on a sub-block holding `extent` of dim d."""
    return region[:d] + (slice(0, extent),) + region[d + 1 :]


_COLLECTIVES = {
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "all_to_all": _all_to_all,
}
