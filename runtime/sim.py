"""The sim backend: the reference interpreter of coco/comm programs, and so the oracle of
their meaning. All ranks run in this one process; each SSA value is held as the list of every
rank's piece (core/values.py), each op computes every rank's piece of its result.

Numerics are those the dialects document: each op computes in f32 (f64, int64) and rounds its
result to its element type; collectives and full reductions accumulate in f64 in rank order
and round once. Schedule regions (`comm.fused`, `comm.overlap`) run their bodies in place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import Float32Type, Float64Type, ModuleOp
from xdsl.ir import Operation, SSAValue

from coconet.core import values as V
from coconet.core.counter_rng import dropout_keep
from coconet.core.elementwise import COMPARISONS, ELEMENTWISE
from coconet.core.program import (
    CocoError,
    Program,
    argument_name,
    check_program_on_grid,
    load,
    memory_for,
    output_name,
)
from coconet.dialects import coco, comm
from coconet.dialects.coco import TensorType, is_float_type
from coconet.dialects.reduction import Reduction

Pieces = list[np.ndarray]


@dataclass
class SimResult:
    """Outputs of one run: `outputs` holds logical values (core/values.py), `per_rank` what
    each rank holds, by output name (updated arguments under their own name)."""

    outputs: dict[str, np.ndarray]
    per_rank: list[dict[str, np.ndarray]]
    grid_shape: tuple[int, ...]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.outputs[name]


def as_program(program: Program | ModuleOp | str, entry: str | None = None) -> Program:
    if isinstance(program, Program):
        return program
    if isinstance(program, ModuleOp):
        return Program(program, entry)
    if hasattr(program, "program"):  # a front-end object carrying its program
        return getattr(program, "program")
    return load(program, entry)


def prepare_inputs(
    program: Program,
    inputs: Mapping[str, object] | None,
    grid_shape: Sequence[int],
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Check given inputs (logical values) against the signature; generate the missing ones
    when `inputs` is None. Unknown or missing names are errors."""
    args = program.arguments
    names = [a.name for a in args]
    check_program_on_grid(program, grid_shape)
    if inputs is None:
        if seed < 0:
            raise CocoError(f"the input seed must be at least 0, got {seed}")
        rng = np.random.default_rng(seed)
        positive = arguments_kept_positive(program)
        with memory_for(f"the seeded inputs of @{program.name}"):
            return {
                a.name: V.random_input(a.type, grid_shape, rng, signed=a.name not in positive)
                for a in args
            }
    V.check_input_names(program.name, inputs, names)
    return {a.name: V.coerce_input(a.name, inputs[a.name], a.type, grid_shape) for a in args}


# Ops whose operand (a power: its base) must not be negative for a finite result.
NEEDS_NON_NEGATIVE = (coco.SqrtOp, coco.RsqrtOp, coco.LogOp)


def arguments_kept_positive(program: Program) -> set[str]:
    """The arguments seeded inputs keep positive: those whose value reaches a square root, a
    logarithm, a power's base or a divisor through sums, differences, scalings, collectives,
    casts and slices -- optimizer state such as Adam's v, decay rates and epsilon (a signed
    epsilon would put a denominator near zero). A product of two values that both derive
    from one argument is taken as its square (Adam's (1 - b2) g * g), and a norm is
    non-negative: neither makes the argument positive, so gradients, weights, moments and
    activations get negative values."""
    positive: set[str] = set()
    for arg in program.arguments:
        reached: set[SSAValue] = {arg.value}
        for op in program.func.walk():
            derived = [v for v in op.operands if v in reached]
            if not derived:
                continue
            if isinstance(op, NEEDS_NON_NEGATIVE) or (
                isinstance(op, coco.PowOp | coco.DivOp)
                and op.operands[0 if isinstance(op, coco.PowOp) else 1] in reached
            ):
                positive.add(arg.name)
                break
            if isinstance(op, coco.MulOp) and len(derived) == 2:
                continue  # a square: non-negative whatever the argument's sign
            if isinstance(op, coco.ReduceOp) and op.kind.data == Reduction.NORM:
                continue  # non-negative whatever the argument's sign
            reached.update(op.results)
    return positive


def run(
    program: Program | ModuleOp | str,
    inputs: Mapping[str, object] | None = None,
    ranks: int = 1,
    *,
    seed: int = 0,
    entry: str | None = None,
    inplace: bool = True,
) -> SimResult:
    """Run `program` on `ranks` ranks. `inputs` maps argument names to logical values (None:
    seeded random ones). With `inplace`, updated arguments are written back into the caller's
    arrays, as the program's side effects are on the caller's buffers."""
    program = as_program(program, entry)
    try:
        grid_shape = program.grid.bind(ranks)
    except ValueError as e:
        raise CocoError(f"@{program.name}: {e}") from None
    given = prepare_inputs(program, inputs, grid_shape, seed)
    with memory_for(f"the sim's values of @{program.name} on {ranks} rank(s)"):
        result = Interpreter(program, grid_shape).run(given)
    result.inputs = given
    if inplace and inputs is not None:
        for out in program.outputs:
            target = inputs.get(out.name)
            if out.updated_argument and isinstance(target, np.ndarray):
                target[...] = result.outputs[out.name]
    return result


class Interpreter:
    def __init__(self, program: Program, grid_shape: Sequence[int]):
        self.program = program
        self.grid_shape = tuple(grid_shape)
        self.size = int(np.prod(self.grid_shape))
        self.coords = [V.coords_of(r, self.grid_shape) for r in range(self.size)]
        self.env: dict[SSAValue, Pieces] = {}
        self.updates: dict[str, Pieces] = {}

    # -- driver ---------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, np.ndarray]) -> SimResult:
        for arg in self.program.arguments:
            self.env[arg.value] = V.distribute(inputs[arg.name], arg.type, self.grid_shape)
        returned: Pieces | list[Pieces] = []
        for op in self.program.func.body.block.ops:
            if isinstance(op, func.ReturnOp):
                returned = [self.env[v] for v in op.arguments]
                break
            self.execute(op)
        per_rank: list[dict[str, np.ndarray]] = [{} for _ in range(self.size)]
        outputs: dict[str, np.ndarray] = {}
        ret = self.program.func.body.block.last_op
        named: list[tuple[str, TensorType, Pieces]] = []
        for out in self.program.outputs:
            if out.updated_argument:
                named.append((out.name, out.type, self.updates[out.name]))
        if isinstance(ret, func.ReturnOp):
            for i, (v, pieces) in enumerate(zip(ret.arguments, returned)):
                named.append((output_name(v, i), _tensor_type(v), pieces))
        for name, t, pieces in named:
            outputs[name] = V.assemble(pieces, t, self.grid_shape)
            for r in range(self.size):
                per_rank[r][name] = pieces[r]
        return SimResult(outputs, per_rank, self.grid_shape)

    def execute(self, op: Operation) -> None:
        handler = _HANDLERS.get(type(op))
        if handler is None:
            for cls, h in _HANDLERS.items():
                if isinstance(op, cls):
                    handler = h
                    break
        if handler is None:
            raise CocoError(f"the sim backend cannot run {op.name}")
        results = handler(self, op)
        for res, pieces in zip(op.results, results):
            self.env[res] = pieces

    def get(self, v: SSAValue) -> Pieces:
        return self.env[v]

    # -- helpers --------------------------------------------------------------------------

    def localize(
        self, piece: np.ndarray, src: TensorType, dst: TensorType, rank: int
    ) -> np.ndarray:
        """Cut `piece` (held under layout `src`) down to what this rank holds under `dst`,
        aligning trailing dims as broadcasting does (a replicated operand of a sliced result
        is sliced implicitly; a broadcast dim of size 1 is left alone). A dim of `src` that
        is neither 1 nor `dst`'s is a block scale's (coco.ScaleOp): its values are repeated
        over their blocks, each element taking that of the block of its global coordinate."""
        coords = self.coords[rank]
        gap = dst.rank - src.rank
        index = []
        blocks: list[tuple[int, np.ndarray]] = []
        for d in range(src.rank):
            size, whole = src.get_shape()[d], dst.get_shape()[d + gap]
            if size == 1 and whole != 1:
                index.append(slice(None))
                continue
            s_start, _ = V.piece_range(src, d, coords, self.grid_shape)
            d_start, d_len = V.piece_range(dst, d + gap, coords, self.grid_shape)
            if size != whole:
                block = whole // size
                at = np.arange(d_start, d_start + d_len) // block - s_start
                assert d_len == 0 or 0 <= at[0] <= at[-1] < piece.shape[d], "a block cut"
                blocks.append((d, at))
                index.append(slice(None))
                continue
            index.append(slice(d_start - s_start, d_start - s_start + d_len))
        local = piece[tuple(index)]
        for d, at in blocks:
            local = np.take(local, at, axis=d)
        return local

    def groups(self, span: Sequence[int]) -> list[list[int]]:
        return V.groups_of(self.grid_shape, span)


# --------------------------------------------------------------------------------------------
# Elementwise computation
# --------------------------------------------------------------------------------------------


def _to_compute(x: np.ndarray, t: TensorType) -> np.ndarray:
    return x.astype(V.compute_dtype(t), copy=False)


def _round(x: np.ndarray, t: TensorType) -> np.ndarray:
    return V.round_f64(x, t.elt)


def _elementwise(
    it: Interpreter,
    op: Operation,
    fn: Callable[..., np.ndarray],
    compute_type: TensorType,
    transcendental: bool = False,
) -> list[Pieces]:
    res_t = _tensor_type(op.results[0])
    args = [it.get(v) for v in op.operands]
    types = [_tensor_type(v) for v in op.operands]
    out: Pieces = []
    with np.errstate(all="ignore"):  # inf/nan propagate as on a GPU; no warnings
        for r in range(it.size):
            operands = [
                _to_compute(it.localize(a[r], t, res_t, r), t if t.elt == "i1" else compute_type)
                for a, t in zip(args, types)
            ]
            if transcendental and operands[0].dtype == np.float32:
                operands = [x.astype(np.float64) for x in operands]
            out.append(_round(fn(*operands), res_t))
    return [out]


def run_arithmetic(it: Interpreter, op: coco.BinaryOp | coco.UnaryOp) -> list[Pieces]:
    # under the `fast` policy a transcendental computes in its compute type (NumPy's f32 loops
    # for f32, f16, bf16), under `exact` in f64, rounded once (docs/architecture.md §3.4.2)
    semantics = ELEMENTWISE[type(op)]
    in_f64 = semantics.transcendental and not coco.is_fast(op)
    return _elementwise(it, op, semantics.numpy, op.result.type, in_f64)


def run_cmp(it: Interpreter, op: coco.CmpOp) -> list[Pieces]:
    return _elementwise(it, op, COMPARISONS[op.predicate.data][0], op.lhs.type)


def run_select(it: Interpreter, op: coco.SelectOp) -> list[Pieces]:
    return _elementwise(it, op, np.where, op.result.type)


def _scale_compute_type(op: coco.ScaleOp) -> TensorType:
    """coco.quantize / dequantize compute in f64 where any of their types is f64, else f32."""
    elts = {_tensor_type(v).elt for v in (*op.operands, op.result)}
    return op.result.type.with_element_type(Float64Type() if "f64" in elts else Float32Type())


def run_quantize(it: Interpreter, op: coco.QuantizeOp) -> list[Pieces]:
    limit = coco.FP8_MAX[op.result.type.elt]
    return _elementwise(it, op, lambda x, s: np.clip(x / s, -limit, limit), _scale_compute_type(op))


def run_dequantize(it: Interpreter, op: coco.DequantizeOp) -> list[Pieces]:
    return _elementwise(it, op, lambda q, s: q * s, _scale_compute_type(op))


def run_cast(it: Interpreter, op: coco.CastOp) -> list[Pieces]:
    res_t: TensorType = op.result.type
    out = []
    with np.errstate(all="ignore"):
        for piece in it.get(op.input):
            if res_t.elt == "i1":
                out.append(piece != 0)
            elif V.bits_dtype(piece.dtype) is not None and res_t.elt != "f32":
                # ml_dtypes' types hold exactly in f32; going through it gives every cast
                # (to an integer, between two of them) the kernels' semantics
                out.append(piece.astype(np.float32).astype(V.numpy_dtype(res_t)))
            else:
                out.append(piece.astype(V.numpy_dtype(res_t)))
    return [out]


def run_constant(it: Interpreter, op: coco.ConstantOp) -> list[Pieces]:
    t: TensorType = op.result.type
    values = op.values()
    if is_float_type(t.element_type):
        # each value rounded once, from the f64 it is stored as, to the element type; a
        # literal beyond the type's range is an infinity
        with np.errstate(over="ignore"):
            flat = np.array(values, dtype=np.float64).astype(V.numpy_dtype(t))
    elif t.elt == "i1":
        flat = np.array([v != 0 for v in values], dtype=np.bool_)
    else:
        # the verifier admits the unsigned reading of the type's bits (up to 2^width - 1):
        # wrapped to the signed value, as the kernels' literals are
        width = 32 if t.elt == "i32" else 64
        signed = [(int(v) + 2 ** (width - 1)) % 2**width - 2 ** (width - 1) for v in values]
        flat = np.array(signed, dtype=np.int64).astype(V.numpy_dtype(t))
    value = flat.reshape(t.get_shape())
    return [[value.copy() for _ in range(it.size)]]


def global_flat_index(it: Interpreter, t: TensorType, rank: int) -> np.ndarray:
    """Row-major index, in the global tensor, of every element of this rank's piece."""
    coords = it.coords[rank]
    shape = t.get_shape()
    index = np.zeros((), dtype=np.uint64)
    for d in range(t.rank):
        start, length = V.piece_range(t, d, coords, it.grid_shape)
        stride = int(np.prod(shape[d + 1 :], dtype=np.int64))
        axis = (np.arange(start, start + length, dtype=np.uint64) * np.uint64(stride)).reshape(
            [length if k == d else 1 for k in range(t.rank)]
        )
        index = index + axis
    return index


def run_dropout(it: Interpreter, op: coco.DropoutOp) -> list[Pieces]:
    t: TensorType = op.input.type
    prob = op.prob.value.data
    seed = op.seed.value.data
    cdt = V.compute_dtype(t)
    scale = cdt.type(1.0 / (1.0 - prob))
    out = []
    for r, piece in enumerate(it.get(op.input)):
        keep = dropout_keep(
            seed, global_flat_index(it, t, r), V.stream_index(t, it.coords[r], it.grid_shape), prob
        )
        keep = np.broadcast_to(keep, piece.shape)
        x = piece.astype(cdt)
        out.append(_round(np.where(keep, x * scale, cdt.type(0)), t))
    return [out]


def run_matmul(it: Interpreter, op: coco.MatmulOp) -> list[Pieces]:
    t: TensorType = op.result.type
    cdt = V.compute_dtype(t)
    out = []
    for a, b in zip(it.get(op.lhs), it.get(op.rhs)):
        out.append(_round(np.matmul(a.astype(cdt), b.astype(cdt)), t))
    return [out]


def _accumulate_dtype(t: TensorType) -> np.dtype:
    return np.dtype(np.float64) if coco.is_float_name(t.elt) else np.dtype(np.int64)


def run_reduce(it: Interpreter, op: coco.ReduceOp) -> list[Pieces]:
    t: TensorType = op.result.type
    kind = op.kind.data
    out = []
    for piece in it.get(op.input):
        x = piece.astype(_accumulate_dtype(op.input.type))
        if kind == Reduction.SUM:
            v = x.sum()
        elif kind == Reduction.MAX:
            v = x.max()
        elif kind == Reduction.MIN:
            v = x.min()
        else:
            v = np.sqrt((x * x).sum())
        out.append(_round(v, t))
    return [out]


def reduce_rows(
    x: np.ndarray, kind: Reduction, dims: Sequence[int], keepdims: bool, acc_dtype: np.dtype
) -> np.ndarray:
    """`x` reduced over the consecutive `dims` in the fixed order of `coco.ReduceDimsOp`: each
    result element accumulates in `ROW_LANES` lanes (lane l takes the reduced elements l,
    l + ROW_LANES, ... in order), then the lanes combine in lane order. Unrounded (f64 or
    int64); a mean is the f64 sum divided by the reduced count."""
    shape = x.shape
    outer = int(np.prod(shape[: dims[0]], dtype=np.int64))
    count = int(np.prod(shape[dims[0] : dims[-1] + 1], dtype=np.int64))
    inner = int(np.prod(shape[dims[-1] + 1 :], dtype=np.int64))
    rows = x.astype(acc_dtype).reshape(outer, count, inner)
    lanes = coco.ROW_LANES
    if kind in (Reduction.MAX, Reduction.MIN):
        # a NaN wins, as in the kernels
        combine = np.maximum if kind == Reduction.MAX else np.minimum
        total = combine.reduce(rows, axis=1)
    else:
        acc = np.zeros((outer, lanes, inner), dtype=acc_dtype)
        for start in range(0, count, lanes):
            chunk = rows[:, start : start + lanes]
            acc[:, : chunk.shape[1]] += chunk
        total = np.zeros((outer, inner), dtype=acc_dtype)
        for lane in range(lanes):
            total += acc[:, lane]
        if kind == Reduction.MEAN:
            total = total / acc_dtype.type(count)
    kept = [1 if d in dims else n for d, n in enumerate(shape)]
    if not keepdims:
        kept = [n for d, n in enumerate(shape) if d not in dims]
    return total.reshape(kept)


def run_reduce_dims(it: Interpreter, op: coco.ReduceDimsOp) -> list[Pieces]:
    t: TensorType = op.result.type
    acc = _accumulate_dtype(op.input.type)
    with np.errstate(all="ignore"):
        out = [
            _round(reduce_rows(p, op.kind.data, op.reduced_dims, op.keeps_dims, acc), t)
            for p in it.get(op.input)
        ]
    return [out]


def run_reshape(it: Interpreter, op: coco.ReshapeOp) -> list[Pieces]:
    # each rank's own piece shape: an uneven slice leaves ranks with different row counts
    shapes = V.rank_shapes(op.result.type, it.grid_shape)
    return [[p.reshape(s).copy() for p, s in zip(it.get(op.input), shapes, strict=True)]]


def run_slice(it: Interpreter, op: coco.SliceOp) -> list[Pieces]:
    src, dst = op.input.type, op.result.type
    return [
        [np.ascontiguousarray(it.localize(p, src, dst, r)) for r, p in enumerate(it.get(op.input))]
    ]


def _tensor_type(v: SSAValue) -> TensorType:
    """The !coco.tensor type of a value the verifier admitted into a coco function."""
    t = v.type
    assert isinstance(t, TensorType)
    return t


def run_update(it: Interpreter, op: coco.UpdateOp) -> list[Pieces]:
    name = argument_name(op.target)
    it.updates[name] = [p.copy() for p in it.get(op.value)]
    return []


# --------------------------------------------------------------------------------------------
# Collectives
# --------------------------------------------------------------------------------------------


def _combine(
    kind: Reduction, pieces: Sequence[np.ndarray], t: TensorType, acc_elt: str | None = None
) -> np.ndarray:
    """The rank-order combination of `pieces`, unrounded (f64, int64, bool) -- or, where the
    collective states an accumulation `acc_elt`, each partial rounded to it (once, from the
    f64 step) after every step: values of `acc_elt` held in f64."""
    acc_dt = _accumulate_dtype(t) if t.elt != "i1" else np.dtype(np.bool_)

    def rounded(x: np.ndarray) -> np.ndarray:
        return x if acc_elt is None else V.round_f64(x, acc_elt).astype(np.float64)

    acc = rounded(pieces[0].astype(acc_dt))
    for p in pieces[1:]:
        x = p.astype(acc_dt)
        if kind == Reduction.SUM:
            acc = acc | x if acc_dt == np.bool_ else acc + x
        elif kind == Reduction.PROD:
            acc = acc & x if acc_dt == np.bool_ else acc * x
        elif kind == Reduction.MAX:
            acc = np.maximum(acc, x)
        else:
            acc = np.minimum(acc, x)
        acc = rounded(acc)
    return acc


# Collectives on every rank's piece at once. Plain parameters (not ops), so executors of
# lowered plans reuse exactly these semantics for their library-collective steps.


def all_reduce(
    it: Interpreter,
    pieces: Pieces,
    kind: Reduction,
    src: TensorType,
    dst: TensorType,
    span,
    acc: str | None = None,
) -> Pieces:
    out: Pieces = [None] * it.size  # type: ignore[list-item]
    for group in it.groups(span):
        total = _round(_combine(kind, [pieces[r] for r in group], src, acc), dst)
        for r in group:
            out[r] = total.copy()
    return out


def reduce_scatter(
    it: Interpreter,
    pieces: Pieces,
    kind: Reduction,
    src: TensorType,
    dst: TensorType,
    span,
    acc: str | None = None,
) -> Pieces:
    out: Pieces = [None] * it.size  # type: ignore[list-item]
    for group in it.groups(span):
        total = _round(_combine(kind, [pieces[r] for r in group], src, acc), dst)
        for r in group:
            out[r] = np.ascontiguousarray(it.localize(total, src, dst, r))
    return out


def all_gather(it: Interpreter, pieces: Pieces, src: TensorType, dst: TensorType, span) -> Pieces:
    out: Pieces = [None] * it.size  # type: ignore[list-item]
    for group in it.groups(span):
        for r in group:
            mine = np.empty(V.piece_shape(dst, it.coords[r], it.grid_shape), pieces[r].dtype)
            starts = [
                V.piece_range(dst, d, it.coords[r], it.grid_shape)[0] for d in range(dst.rank)
            ]
            for m in group:
                index = []
                for d in range(src.rank):
                    s, n = V.piece_range(src, d, it.coords[m], it.grid_shape)
                    index.append(slice(s - starts[d], s - starts[d] + n))
                mine[tuple(index)] = pieces[m]
            out[r] = mine
    return out


def _root_rank(name: str, root: int, group: list[int]) -> int:
    if root >= len(group):
        raise CocoError(f"{name} names root {root}, but its groups have {len(group)} rank(s)")
    return group[root]


def broadcast(it: Interpreter, pieces: Pieces, root: int, span) -> Pieces:
    out: Pieces = [None] * it.size  # type: ignore[list-item]
    for group in it.groups(span):
        source = _root_rank("comm.broadcast", root, group)
        for r in group:
            out[r] = pieces[source].copy()
    return out


def reduce(
    it: Interpreter,
    pieces: Pieces,
    kind: Reduction,
    root: int,
    src: TensorType,
    dst: TensorType,
    span,
    acc: str | None = None,
) -> Pieces:
    out: Pieces = [p.copy() for p in pieces]
    for group in it.groups(span):
        target = _root_rank("comm.reduce", root, group)
        out[target] = _round(_combine(kind, [pieces[r] for r in group], src, acc), dst)
    return out


def send(it: Interpreter, pieces: Pieces, along: int, shift: int) -> Pieces:
    out = []
    for r, c in enumerate(it.coords):
        source = list(c)
        source[along] -= shift
        if 0 <= source[along] < it.grid_shape[along]:
            out.append(pieces[V.rank_of(source, it.grid_shape)].copy())
        else:
            out.append(np.zeros_like(pieces[r]))
    return out


def all_to_all(it: Interpreter, pieces: Pieces, src: TensorType, dst: TensorType, span) -> Pieces:
    """Sliced form: each rank's result piece assembled from the parts of its group members'
    pieces that it holds under `dst`. Local form (dispatch): dim 0 cut into one equal block per
    member; member i's block j becomes member j's block i."""
    out: Pieces = [None] * it.size  # type: ignore[list-item]
    local = bool(src.local_axes()) and all(a in src.local_axes() for a in span)
    for group in it.groups(span):
        for i, r in enumerate(group):
            if local:
                blocks = [np.split(pieces[m], len(group))[i] for m in group]
                out[r] = np.concatenate(blocks)
                continue
            mine = np.empty(V.piece_shape(dst, it.coords[r], it.grid_shape), pieces[r].dtype)
            for m in group:
                have, want = V.shared_region(src, it.coords[m], dst, it.coords[r], it.grid_shape)
                mine[want] = pieces[m][have]
            out[r] = mine
    return out


def run_all_reduce(it: Interpreter, op: comm.AllReduceOp) -> list[Pieces]:
    src, dst, acc = op.input.type, op.result.type, comm.accumulation(op)
    return [all_reduce(it, it.get(op.input), op.kind.data, src, dst, op.span(), acc)]


def run_reduce_scatter(it: Interpreter, op: comm.ReduceScatterOp) -> list[Pieces]:
    src, dst, acc = op.input.type, op.result.type, comm.accumulation(op)
    return [reduce_scatter(it, it.get(op.input), op.kind.data, src, dst, op.span(), acc)]


def run_all_gather(it: Interpreter, op: comm.AllGatherOp) -> list[Pieces]:
    return [all_gather(it, it.get(op.input), op.input.type, op.result.type, op.span())]


def run_broadcast(it: Interpreter, op: comm.BroadcastOp) -> list[Pieces]:
    return [broadcast(it, it.get(op.input), op.root.value.data, op.span())]


def run_collective_reduce(it: Interpreter, op: comm.ReduceOp) -> list[Pieces]:
    return [
        reduce(
            it,
            it.get(op.input),
            op.kind.data,
            op.root.value.data,
            op.input.type,
            op.result.type,
            op.span(),
            comm.accumulation(op),
        )
    ]


def run_send(it: Interpreter, op: comm.SendOp) -> list[Pieces]:
    return [send(it, it.get(op.input), op.along.value.data, op.shift.value.data)]


def run_all_to_all(it: Interpreter, op: comm.AllToAllOp) -> list[Pieces]:
    return [all_to_all(it, it.get(op.input), op.input.type, op.result.type, op.span())]


def run_region(it: Interpreter, op: comm.RegionOp) -> list[Pieces]:
    for inner in op.body.block.ops:
        if isinstance(inner, comm.YieldOp):
            return [it.get(v) for v in inner.values]
        it.execute(inner)
    return []


# Each handler takes the op class it is listed under.
_HANDLERS: dict[type, Callable[[Interpreter, Any], list[Pieces]]] = {
    coco.BinaryOp: run_arithmetic,
    coco.UnaryOp: run_arithmetic,
    coco.CmpOp: run_cmp,
    coco.SelectOp: run_select,
    coco.CastOp: run_cast,
    coco.QuantizeOp: run_quantize,
    coco.DequantizeOp: run_dequantize,
    coco.ConstantOp: run_constant,
    coco.DropoutOp: run_dropout,
    coco.MatmulOp: run_matmul,
    coco.ReduceOp: run_reduce,
    coco.ReduceDimsOp: run_reduce_dims,
    coco.ReshapeOp: run_reshape,
    coco.SliceOp: run_slice,
    coco.UpdateOp: run_update,
    comm.AllReduceOp: run_all_reduce,
    comm.ReduceScatterOp: run_reduce_scatter,
    comm.AllGatherOp: run_all_gather,
    comm.BroadcastOp: run_broadcast,
    comm.ReduceOp: run_collective_reduce,
    comm.SendOp: run_send,
    comm.AllToAllOp: run_all_to_all,
    comm.RegionOp: run_region,
}
