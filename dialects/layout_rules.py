"""CoCoNet's layout rules: result types inferred from operand types, one grid axis at a time.

Every violation raises a `VerifyException` whose message starts with the rule's name in
brackets (`[elementwise-layouts]`, `[matmul-layouts]`, ...) and names the offending values,
so a user can find the rule in this file and the value in their program.

Rules (per grid axis; an axis a collective does not span keeps its layout):

* elementwise-layouts  equal layouts give that layout; `replicated (+) X -> X`; two different
                       non-replicated layouts are an error. A lower-rank operand broadcasts
                       over leading dims, so its `sliced<d>` means result dim d + (rank gap).
* broadcast-shapes     operand shapes broadcast as in NumPy.
* quantize-block       the scale of coco.quantize / dequantize (coco.ScaleOp) broadcasts as in
                       NumPy or holds one value per block: a scale dim that is neither 1 nor
                       the input's must divide the input's, into blocks of input dim / scale
                       dim elements (scale element (i // bR, j // bC) scales element (i, j)).
* quantize-block-slices a scale sliced along a block dim is cut by exactly the grid axes that
                       cut the result's dim, into a number of parts that divides the scale dim
                       (every rank's cut of the input then lands on a block boundary, uneven
                       cuts included); `?` axes are checked at launch (check_block_cuts).
* element-types        operands of one elementwise op share an element type (cast first).
* matmul-layouts       R x R -> R; sliced(row or batch dim) x R -> same (a batched R right
                       operand takes the same batch slice: sliced(batch) x sliced(batch) ->
                       sliced(batch); sliced(batch) x batched R is refused); R x sliced(cols)
                       -> sliced(cols); sliced(K) x sliced(K) -> local (partial sums); local x
                       (local | R) -> local; anything else is an error.
* reduction-layouts    replicated -> replicated; local -> local; sliced -> local (a partial
                       result); norm of a slice is refused (norm-of-slice).
* reduce-dims          coco.reduce_dims reduces a non-empty increasing run of consecutive dims.
* reduce-dims-layouts  a sliced dim that is not reduced stays sliced (renumbered without
                       keepdims); a reduced sliced dim gives a local partial (sum/max/min,
                       combined by an all_reduce); a partial mean is refused.
* reshape-layouts      a reshape keeps the element count, and dims 0..d of a tensor sliced
                       on dim d.
* all-reduce-input / reduce-scatter-input / all-gather-input / broadcast-input / reduce-input:
                       see comm.py.
* all-to-all-type / all-to-all-layouts / all-to-all-local: comm.all_to_all keeps shape and
                       element type; on every spanned axis sliced<a> -> sliced<b> (a != b: the
                       tensor is re-cut along b, each rank keeping its part of b and receiving
                       the whole of a that its group held) or local -> local (the dispatch
                       form: dim 0, unsliced, is cut into one equal block per group member);
                       every other axis keeps its layout (check_all_to_all).
* update-target / update-type / update-once / update-last-use: see coco.UpdateOp.
* empty-slice          a sliced dim holds at least one element per rank that cuts it (a dim
                       that does not divide is cut unevenly: the first `size % parts` ranks
                       hold one element more, as MPI_Reduce_scatter's recvcounts and
                       np.array_split do).
* layouts-per-axis     a type names one layout per grid axis (or none, for replicated).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import cast

from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerType, i1
from xdsl.ir import Attribute, Block, BlockArgument, Operation, OpResult, SSAValue
from xdsl.utils.exceptions import VerifyException

from coconet.dialects.coco_types import (
    DEFAULT_GRID,
    GRID_ATTR_NAME,
    LOCAL,
    REPLICATED,
    GridAttr,
    LayoutAttr,
    LocalAttr,
    ReplicatedAttr,
    SlicedAttr,
    TensorType,
    is_float_type,
    layout_str,
    memo,
    remember,
    same_cut,
)
from coconet.dialects.reduction import Reduction


def fail(rule: str, message: str) -> VerifyException:
    return VerifyException(f"[{rule}] {message}")


def value_name(v: SSAValue) -> str:
    """How a diagnostic points at a value: `%name`, else where it comes from."""
    if v.name_hint:
        return f"%{v.name_hint}"
    if isinstance(v, BlockArgument):
        return f"argument #{v.index}"
    return f"a result of {v.owner.name}" if isinstance(v, OpResult) else "a value"


def _as_tensor(t: Attribute, what: str) -> TensorType:
    if not isinstance(t, TensorType):
        raise fail("coco-types", f"{what} must be a !coco.tensor, got {t}")
    return t


# --------------------------------------------------------------------------------------------
# Grid
# --------------------------------------------------------------------------------------------


def enclosing_function(op: Operation) -> func.FuncOp | None:
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, func.FuncOp):
        parent = parent.parent_op()
    return parent


def grid_of(op: Operation) -> GridAttr:
    """The grid of the function `op` sits in (a 1-D world sized at launch by default)."""
    if isinstance(op, func.FuncOp):
        fn = op
    else:
        fn = enclosing_function(op)
    if fn is not None:
        grid = fn.attributes.get(GRID_ATTR_NAME)
        if isinstance(grid, GridAttr):
            return grid
        if grid is not None:
            raise fail("grid", f"'{GRID_ATTR_NAME}' must be a #coco.grid<[...]>, got {grid}")
    return DEFAULT_GRID


def check_type_fits_grid(t: TensorType, grid: GridAttr, what: str) -> None:
    lays = t.layouts.data
    if lays and len(lays) != grid.rank:
        raise fail(
            "layouts-per-axis",
            f"{what} has type {t} with {len(lays)} layout(s), but the grid {grid} has "
            f"{grid.rank} axis(es): write one layout per axis",
        )
    shape = t.get_shape()
    for d in range(t.rank):
        axes = t.slicing_axes(d)
        # An axis sized at launch has at least one rank: the static axes alone already cut
        # the dim into this many parts (the rest is checked when the grid is bound).
        parts = math.prod(grid.shape[a] for a in axes if grid.shape[a] > 0)
        if shape[d] < parts:
            at_least = "at least " if any(grid.shape[a] < 0 for a in axes) else ""
            raise fail(
                "empty-slice",
                f"{what} of type {t}: dim {d} of size {shape[d]} cannot be cut into "
                f"{at_least}{parts} parts (grid {grid}): some rank would hold no element of it",
            )


def check_signatures(module: Operation) -> None:
    """Function arguments and results fit their function's grid, used or not (ops check the
    values they touch; this catches an argument no op reads)."""
    for fn in module.walk():
        if not isinstance(fn, func.FuncOp):
            continue
        grid = grid_of(fn)
        for i, t in enumerate(fn.function_type.inputs):
            if isinstance(t, TensorType):
                arg = fn.body.block.args[i] if fn.body.blocks else None
                what = f"argument {value_name(arg)}" if arg is not None else f"argument #{i}"
                check_type_fits_grid(t, grid, f"{what} of @{fn.sym_name.data}")
        for i, t in enumerate(fn.function_type.outputs):
            if isinstance(t, TensorType):
                check_type_fits_grid(t, grid, f"result #{i} of @{fn.sym_name.data}")


# (type, grid) pairs that passed check_type_fits_grid: whether a type fits a grid depends on
# nothing else, and a program's ops name a few types thousands of times. Bounded (remember).
_FITTING: dict[tuple[TensorType, GridAttr], bool] = memo("types fitting grids")


def check_types_fit_grid(op: Operation) -> None:
    grid = grid_of(op)
    for i, v in enumerate(op.operands):
        t = v.type
        if isinstance(t, TensorType) and (t, grid) not in _FITTING:
            check_type_fits_grid(t, grid, f"operand #{i} ({value_name(v)}) of {op.name}")
            remember(_FITTING, (t, grid), True)
    for i, v in enumerate(op.results):
        t = v.type
        if isinstance(t, TensorType) and (t, grid) not in _FITTING:
            check_type_fits_grid(t, grid, f"result #{i} of {op.name}")
            remember(_FITTING, (t, grid), True)


def check_bound_shapes(t: TensorType, grid_shape: Sequence[int], what: str) -> None:
    """At launch: every rank holds at least one element of every sliced dim. A dim that does
    not divide by its parts is cut unevenly (the first `size % parts` ranks hold one more)."""
    shape = t.get_shape()
    for d in range(t.rank):
        parts = 1
        for a in t.slicing_axes(d):
            parts *= grid_shape[a]
        if shape[d] < parts:
            raise fail(
                "empty-slice",
                f"{what} of type {t}: dim {d} of size {shape[d]} cannot be cut into {parts} "
                f"parts on a grid of {list(grid_shape)} ranks: some rank would hold no element",
            )


def expect_result_type(op: Operation, declared: Attribute, inferred: TensorType) -> None:
    if declared != inferred:
        raise fail(
            "result-type",
            f"{op.name} produces {inferred} from its operands by the layout rules, "
            f"but its result is declared as {declared}",
        )


# --------------------------------------------------------------------------------------------
# Elementwise
# --------------------------------------------------------------------------------------------


def broadcast_shapes(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s):
            j = rank - len(s) + i
            if d == out[j] or d == 1:
                continue
            if out[j] != 1:
                raise fail(
                    "broadcast-shapes",
                    "operand shapes "
                    + ", ".join(str(list(x)) for x in shapes)
                    + " do not broadcast",
                )
            out[j] = d
    return tuple(out)


def _combine_axis(layouts: Sequence[LayoutAttr], describe: Callable[[], str]) -> LayoutAttr:
    result: LayoutAttr = REPLICATED
    for lay in layouts:
        if isinstance(lay, ReplicatedAttr) or lay == result:
            continue
        if isinstance(result, ReplicatedAttr):
            result = lay
            continue
        raise fail(
            "elementwise-layouts",
            f"{describe()}: layouts {layout_str(result)} and {layout_str(lay)} cannot meet in one "
            "elementwise op (only replicated combines with another layout)",
        )
    return result


# Elementwise results by operand types (and whether element types must agree): every
# elementwise op's verification infers its result, and a program's ops combine a few types
# again and again. Only successes are kept (names matter to the messages only). Bounded
# (remember).
_INFERRED_ELEMENTWISE: dict[tuple[tuple[Attribute, ...], bool], TensorType] = memo(
    "inferred elementwise results"
)


def infer_elementwise(
    types: Sequence[Attribute], *, same_element_type: bool = True, names: Sequence[str] = ()
) -> TensorType:
    """The result type of an elementwise op on operands of these types."""
    key = (tuple(types), same_element_type)
    got = _INFERRED_ELEMENTWISE.get(key)
    if got is None:
        got = remember(
            _INFERRED_ELEMENTWISE, key, _infer_elementwise(types, same_element_type, names)
        )
    return got


def _infer_elementwise(
    types: Sequence[Attribute],
    same_element_type: bool,
    names: Sequence[str],
    shown: Sequence[TensorType] = (),
) -> TensorType:
    """`shown`: the operand types messages name, where `types` stand for them (a block
    scale's expansion)."""
    tts = [_as_tensor(t, f"operand #{i}") for i, t in enumerate(types)]
    shown = shown or tts
    shape = broadcast_shapes([t.get_shape() for t in tts])
    rank = len(shape)
    if same_element_type:
        elts = {t.element_type for t in tts}
        if len(elts) > 1:
            raise fail(
                "element-types",
                "elementwise operands have different element types "
                + ", ".join(t.elt for t in tts)
                + ": insert a coco.cast",
            )

    def describe() -> str:
        return "operands " + ", ".join(
            f"{names[i] if i < len(names) else f'#{i}'} : {t}" for i, t in enumerate(shown)
        )

    grid_rank = max(len(t.layouts) for t in tts)
    layouts: list[LayoutAttr] = []
    for a in range(grid_rank):
        per_operand: list[LayoutAttr] = []
        for t in tts:
            lay = t.layout_on(a)
            if isinstance(lay, SlicedAttr):
                d = lay.dim.data
                gap = rank - t.rank
                if t.get_shape()[d] != shape[d + gap]:
                    raise fail(
                        "elementwise-layouts",
                        f"{describe()}: an operand sliced on dim {d} is broadcast along that dim",
                    )
                lay = SlicedAttr(d + gap)
            per_operand.append(lay)
        layouts.append(_combine_axis(per_operand, describe))
    return TensorType(shape, tts[0].element_type, _nest_like_operands(tts, layouts, describe))


def _nest_like_operands(
    tts: Sequence[TensorType], layouts: list[LayoutAttr], describe: Callable[[], str]
) -> list[LayoutAttr]:
    """The result's per-axis `layouts` with each dim's cuts nested as its operands nest
    them. A rank computes its piece of the result from its pieces of the operands, so each
    operand's piece must hold the result's: some operand cuts the dim by all the axes the
    result cuts it by, and every operand's cuts of it are the outermost of that one's, in
    the same order (a tp piece holds its dp sub-pieces; a dp piece of the whole does not)."""
    rank = max(t.rank for t in tts)
    for d in {lay.dim.data for lay in layouts if isinstance(lay, SlicedAttr)}:
        result_axes = {a for a, lay in enumerate(layouts) if _cuts_dim(lay, d)}
        orders = [t.slicing_axes(d - (rank - t.rank)) for t in tts if d >= rank - t.rank]
        full = max(orders, key=len)
        if set(full) != result_axes or any(o != full[: len(o)] for o in orders):
            raise fail(
                "elementwise-layouts",
                f"{describe()}: the operands cut dim {d} by grid axes "
                + " and ".join(str(list(o)) for o in orders if o)
                + " (outermost first), so no rank's piece of one holds its piece of the other: "
                "an operand cut by fewer axes must be cut by the outermost of the other's, in "
                "the same order (slice or gather one operand first)",
            )
        if len(full) > 1 and list(full) != sorted(full):
            for place, a in enumerate(full):
                layouts[a] = SlicedAttr(d, place)
    return layouts


def _cuts_dim(lay: LayoutAttr, d: int) -> bool:
    return isinstance(lay, SlicedAttr) and lay.dim.data == d


# Scaled results by (input, scale) types: as _INFERRED_ELEMENTWISE. Bounded (remember).
_INFERRED_SCALED: dict[tuple[Attribute, Attribute, GridAttr], TensorType] = memo(
    "inferred scaled results"
)


def infer_scaled(
    input: Attribute,
    scale: Attribute,
    *,
    op_name: str = "coco.quantize",
    names: Sequence[str] = (),
    grid: GridAttr = DEFAULT_GRID,
) -> TensorType:
    """The result type of a coco.ScaleOp: the elementwise result of the input and its scale,
    where a scale dim may also hold one value per block of the input's (`[quantize-block]`),
    read as if each value were repeated over its block (`block_expanded`). Only ScaleOps read
    a scale so; every other elementwise op broadcasts as in NumPy."""
    key = (input, scale, grid)
    got = _INFERRED_SCALED.get(key)
    if got is None:
        x, s = _as_tensor(input, "the input"), _as_tensor(scale, "the scale")
        expanded = block_expanded(x, s, op_name, names)
        got = _infer_elementwise([x, expanded], False, names, shown=[x, s])
        check_block_cuts(s, got, grid.shape, f"{op_name} of {_named(names, 1)} : {s}")
        got = remember(_INFERRED_SCALED, key, got)
    return got


def _named(names: Sequence[str], i: int) -> str:
    return names[i] if i < len(names) else f"operand #{i}"


def block_sizes(scale: TensorType, result: TensorType) -> tuple[int, ...]:
    """Per dim of `scale` (read by a ScaleOp whose result has type `result`): how many
    consecutive result elements along it one scale value covers -- 1 where the dims are
    equal or the scale is broadcast (size 1) there, else the block size."""
    gap = result.rank - scale.rank
    rs, ss = result.get_shape(), scale.get_shape()
    return tuple(
        1 if ss[d] in (1, rs[d + gap]) else rs[d + gap] // ss[d] for d in range(scale.rank)
    )


def block_expanded(
    x: TensorType, s: TensorType, op_name: str, names: Sequence[str] = ()
) -> TensorType:
    """`s` with every block dim widened to the input's: the type that broadcasts against `x`
    as the block scale reads. A dim that is neither 1, the input's nor a divisor of it is
    refused ([quantize-block])."""
    shape = list(s.get_shape())
    gap = x.rank - s.rank
    for d, size in enumerate(shape):
        n = x.get_shape()[d + gap] if d + gap >= 0 else 1
        if size == 1 or n == 1 or size == n:
            continue  # a NumPy broadcast
        if n % size:
            raise fail(
                "quantize-block",
                f"{op_name} of {_named(names, 0)} : {x} by {_named(names, 1)} : {s}: scale dim "
                f"{d} of size {size} does not divide the input's {n} (a scale dim is 1, the "
                "input's, or a divisor of it: one value per block of input / scale elements)",
            )
        shape[d] = n
    return s.with_shape(shape)


def check_block_cuts(
    s: TensorType, result: TensorType, grid_shape: Sequence[int], what: str
) -> None:
    """A scale sliced along a block dim is cut as the result's dim is, on block boundaries:
    by the same grid axes, into a number of parts that divides the scale dim. Then every
    rank's piece of the result is its piece of the scale's blocks, as an uneven cut of a
    block dim never is (with blocks of b > 1 elements, a cut of s blocks into p parts lands
    on block boundaries only where p divides s). Axes sized at launch (`grid_shape` entries
    < 0) are left to the launch's check (core/program.py check_program_on_grid)."""
    gap = result.rank - s.rank
    for d, block in enumerate(block_sizes(s, result)):
        axes = s.slicing_axes(d)
        if block == 1 or not axes:
            continue
        if axes != result.slicing_axes(d + gap):
            raise fail(
                "quantize-block-slices",
                f"{what}: the scale's block dim {d} is cut by grid axes {list(axes)}, the "
                f"result's dim {d + gap} by {list(result.slicing_axes(d + gap))}: a block "
                "scale is replicated or cut by the same axes as the tensor it scales",
            )
        sizes = [grid_shape[a] if a < len(grid_shape) else -1 for a in axes]
        if any(n < 0 for n in sizes):
            continue
        parts = math.prod(sizes)
        if s.get_shape()[d] % parts:
            raise fail(
                "quantize-block-slices",
                f"{what}: its {s.get_shape()[d]} blocks of {block} along dim {d} cannot be "
                f"cut into {parts} parts on block boundaries (the parts must divide the scale "
                "dim): replicate the scale, or use a rank count that divides it",
            )


def infer_unary(t: Attribute, float_only: bool, op_name: str) -> TensorType:
    tt = _as_tensor(t, "the operand")
    if float_only and not is_float_type(tt.element_type):
        raise fail("element-types", f"{op_name} needs a floating-point tensor, got {tt.elt}")
    check_not_boolean(tt, op_name)
    return tt


def check_not_boolean(t: TensorType, op_name: str) -> None:
    """i1 tensors are masks: compared, selected with, cast, but not computed with."""
    if t.elt == "i1":
        raise fail(
            "element-types",
            f"{op_name} does not compute on i1 tensors ({t}): cast the mask to a number first",
        )


def infer_compare(lhs: Attribute, rhs: Attribute, names: Sequence[str] = ()) -> TensorType:
    return infer_elementwise([lhs, rhs], names=names).with_element_type(i1)


def infer_select(
    cond: Attribute, a: Attribute, b: Attribute, names: Sequence[str] = ()
) -> TensorType:
    """`names`: of the condition and the two values, for messages."""
    ct = _as_tensor(cond, "the condition")
    if not (isinstance(elt := ct.element_type, IntegerType) and elt.bitwidth == 1):
        raise fail("element-types", f"coco.select's condition must be i1, got {ct.elt}")
    values = infer_elementwise([a, b], names=names[1:])
    cond_names = [names[0], "the selected values"] if names else ()
    full = infer_elementwise([ct, values], same_element_type=False, names=cond_names)
    return full.with_element_type(values.element_type)


# --------------------------------------------------------------------------------------------
# Matmul and reductions
# --------------------------------------------------------------------------------------------


def infer_matmul(lhs: Attribute, rhs: Attribute) -> TensorType:
    """The result type of `lhs x rhs` (remembered by operand types: a deep model's verifier
    asks for the same few thousands of times)."""
    got = _INFERRED_MATMULS.get((lhs, rhs))
    if got is None:
        got = remember(_INFERRED_MATMULS, (lhs, rhs), _infer_matmul(lhs, rhs))
    return got


_INFERRED_MATMULS: dict[tuple[Attribute, Attribute], TensorType] = memo("inferred matmuls")


def _infer_matmul(lhs: Attribute, rhs: Attribute) -> TensorType:
    a = _as_tensor(lhs, "the left operand")
    b = _as_tensor(rhs, "the right operand")
    if a.element_type != b.element_type:
        raise fail("element-types", f"matmul operands have element types {a.elt} and {b.elt}")
    if a.rank < 2 or b.rank < 2:
        raise fail("matmul-shapes", f"matmul needs operands of rank >= 2, got {a} and {b}")
    ash, bsh = a.get_shape(), b.get_shape()
    if ash[-1] != bsh[-2]:
        raise fail(
            "matmul-shapes",
            f"contracting dims differ: {list(ash)} x {list(bsh)} ({ash[-1]} != {bsh[-2]})",
        )
    if b.rank > 2 and bsh[:-2] != ash[:-2]:
        raise fail(
            "matmul-shapes",
            "a batched right operand must share the left one's batch dims: "
            f"{list(ash)} x {list(bsh)}",
        )
    shape = (*ash[:-1], bsh[-1])
    rank = len(shape)
    a_k, b_k, b_n = a.rank - 1, b.rank - 2, b.rank - 1
    layouts: list[LayoutAttr] = []
    for axis in range(max(len(a.layouts), len(b.layouts))):
        la, lb = a.layout_on(axis), b.layout_on(axis)
        ra, rb = isinstance(la, ReplicatedAttr), isinstance(lb, ReplicatedAttr)
        sa = la.dim.data if isinstance(la, SlicedAttr) else None
        sb = lb.dim.data if isinstance(lb, SlicedAttr) else None
        batch = sa is not None and sa < a.rank - 2  # A sliced on one of its batch dims
        if ra and rb:
            out: LayoutAttr = REPLICATED
        elif batch and rb and b.rank > 2:
            # each rank would multiply its slice of A's batch by B's whole batch
            raise fail(
                "matmul-layouts",
                f"the left operand is sliced on batch dim {sa} but the batched right operand "
                f"is replicated on grid axis {axis} ({a} x {b}): slice the right operand on "
                f"batch dim {sa} too (sliced(batch) x sliced(batch)), or multiply by an "
                "unbatched right operand",
            )
        elif batch and sa is not None and sb == sa and b.rank > 2:
            if la != lb:  # (the same dim, nested otherwise among its cuts: other batches)
                raise fail(
                    "matmul-layouts",
                    f"the operands slice batch dim {sa} on grid axis {axis} as "
                    f"{layout_str(la)} and {layout_str(lb)} ({a} x {b}): the batch's cuts "
                    "nest alike in both operands, or each rank multiplies other batches",
                )
            out = la  # the same batch slice of A and of B
        elif sa is not None and sa != a_k and rb:
            out = la  # rows or batch of A: same dim of the result
        elif ra and sb == b_n:
            out = cast(SlicedAttr, lb).with_dim(rank - 1)
        elif sa == a_k and sb == b_k:
            out = LOCAL  # each rank multiplies its K-slices: partial sums
        elif (isinstance(la, LocalAttr) or isinstance(lb, LocalAttr)) and sa is None and sb is None:
            out = LOCAL
        else:
            raise fail(
                "matmul-layouts",
                f"no matmul rule takes {layout_str(la)} x {layout_str(lb)} on grid axis {axis} "
                f"({a} x {b}); legal: R x R, sliced(rows) x R, R x sliced(cols), "
                "sliced(K) x sliced(K), local x (local | R)",
            )
        layouts.append(out)
    return TensorType(shape, a.element_type, layouts)


def infer_reduction(kind: str, t: Attribute) -> TensorType:
    tt = _as_tensor(t, "the operand")
    if kind == Reduction.NORM and not is_float_type(tt.element_type):
        raise fail("element-types", f"norm needs a floating-point tensor, got {tt.elt}")
    layouts: list[LayoutAttr] = []
    for axis, lay in enumerate(tt.layouts):
        if isinstance(lay, SlicedAttr):
            if kind == Reduction.NORM:
                raise fail(
                    "norm-of-slice",
                    f"the norm of a tensor sliced on grid axis {axis} ({tt}) would be a partial "
                    "norm that no collective combines: compute sqrt(all_reduce(sum(x * x)))",
                )
            layouts.append(LOCAL)  # this rank's partial result
        else:
            layouts.append(lay)
    return TensorType((), tt.element_type, layouts)


def infer_dim_reduction(
    kind: str,
    t: Attribute,
    dims: Sequence[int],
    keepdims: bool,
    name: str = "the operand",
) -> TensorType:
    """The result type of `coco.reduce_dims kind` of `t` over `dims`."""
    tt = _as_tensor(t, "the operand")
    dims = tuple(dims)
    if (
        not dims
        or any(not 0 <= d < tt.rank for d in dims)
        or any(b != a + 1 for a, b in pairwise(dims))
    ):
        raise fail(
            "reduce-dims",
            f"coco.reduce_dims of {name} : {tt} over dims {list(dims)}: the dims must be a "
            f"non-empty increasing run of consecutive dims of a rank-{tt.rank} tensor",
        )
    check_not_boolean(tt, "coco.reduce_dims")
    if kind == Reduction.MEAN and not is_float_type(tt.element_type):
        raise fail("element-types", f"a mean needs a floating-point tensor, got {tt.elt}")
    shape = tt.get_shape()
    if keepdims:
        out_shape = tuple(1 if d in dims else n for d, n in enumerate(shape))
    else:
        out_shape = tuple(n for d, n in enumerate(shape) if d not in dims)
    layouts: list[LayoutAttr] = []
    for axis, lay in enumerate(tt.layouts):
        if not isinstance(lay, SlicedAttr):
            layouts.append(lay)
            continue
        d = lay.dim.data
        if d not in dims:
            layouts.append(lay.with_dim(d if keepdims else d - sum(1 for r in dims if r < d)))
            continue
        if kind == Reduction.MEAN:
            raise fail(
                "reduce-dims-layouts",
                f"the mean of {name} : {tt} over dims {list(dims)} reduces dim {d}, which grid "
                f"axis {axis} slices: a mean of a slice is not a partial of the mean; reduce "
                "with sum, all_reduce the partial sums, then divide by the count",
            )
        layouts.append(LOCAL)  # this rank's partial result: an all_reduce combines them
    return TensorType(out_shape, tt.element_type, layouts)


def check_reshape(op: Operation, src: TensorType, dst: TensorType) -> None:
    name = value_name(op.operands[0])
    if src.element_type != dst.element_type:
        raise fail("reshape-layouts", f"coco.reshape keeps the element type: {src} -> {dst}")
    src_shape, dst_shape = src.get_shape(), dst.get_shape()
    if math.prod(src_shape) != math.prod(dst_shape):
        raise fail(
            "reshape-layouts",
            f"coco.reshape of {name} from {list(src_shape)} to {list(dst_shape)} changes the "
            "element count",
        )
    for axis in range(max(len(src.layouts), len(dst.layouts))):
        ls, ld = src.layout_on(axis), dst.layout_on(axis)
        if isinstance(ls, SlicedAttr):
            d = ls.dim.data
            if ld != ls or src_shape[: d + 1] != dst_shape[: d + 1]:
                raise fail(
                    "reshape-layouts",
                    f"coco.reshape of {name} : {src} to {dst}: grid axis {axis} slices dim {d}, "
                    f"so the result must keep dims 0..{d} ({list(src_shape[: d + 1])}) and be "
                    f"sliced<{d}> there; only the dims after it may regroup",
                )
        elif ld != ls:
            raise fail(
                "reshape-layouts",
                f"coco.reshape of {name} : {src} to {dst} changes grid axis {axis} from "
                f"{layout_str(ls)} to {layout_str(ld)}: a reshape moves no data",
            )


# --------------------------------------------------------------------------------------------
# All-to-all
# --------------------------------------------------------------------------------------------


def check_all_to_all(
    op: Operation, src: TensorType, dst: Attribute, span: Sequence[int], grid: GridAttr
) -> TensorType:
    """The result type of a `comm.all_to_all` over grid axes `span` of `src` declared as
    `dst` (the declared type names the dim each axis re-cuts), checked against the rules."""
    name = value_name(op.operands[0])
    if (
        not isinstance(dst, TensorType)
        or dst.get_shape() != src.get_shape()
        or dst.element_type != src.element_type
    ):
        raise fail(
            "all-to-all-type",
            f"comm.all_to_all of {name} : {src} to {dst}: an all_to_all keeps the shape and "
            "the element type, only the layouts of the grid axes it spans change",
        )
    forms: set[str] = set()
    for axis in range(max(grid.rank, len(src.layouts), len(dst.layouts))):
        ls, ld = src.layout_on(axis), dst.layout_on(axis)
        if axis not in span:
            if not same_cut(ls, ld):
                raise fail(
                    "all-to-all-layouts",
                    f"comm.all_to_all of {name} : {src} to {dst} changes grid axis {axis} "
                    f"({layout_str(ls)} -> {layout_str(ld)}), which it does not span",
                )
            continue
        if isinstance(ls, SlicedAttr) and isinstance(ld, SlicedAttr) and ls.dim != ld.dim:
            forms.add("sliced")
        elif isinstance(ls, LocalAttr) and isinstance(ld, LocalAttr):
            forms.add("local")
        else:
            raise fail(
                "all-to-all-layouts",
                f"comm.all_to_all of {name} : {src} to {dst} takes grid axis {axis} from "
                f"{layout_str(ls)} to {layout_str(ld)}: a spanned axis goes from sliced<a> to "
                "sliced<b> with a != b, or from local to local (the dispatch form)",
            )
    if len(forms) > 1:
        raise fail(
            "all-to-all-layouts",
            f"comm.all_to_all of {name} : {src} to {dst} mixes sliced and local spanned axes: "
            "every spanned axis is re-cut (sliced<a> -> sliced<b>), or every one is local",
        )
    if forms == {"local"}:
        if src.rank == 0 or src.slicing_axes(0):
            raise fail(
                "all-to-all-local",
                f"comm.all_to_all of the local {name} : {src}: the dispatch form cuts dim 0 "
                "into one block per group member, so the tensor needs a dim 0 that no grid "
                "axis slices",
            )
        parts = 1
        for a in span:
            parts = 0 if grid.shape[a] < 0 or parts == 0 else parts * grid.shape[a]
        if parts:
            check_all_to_all_blocks(src, parts, f"comm.all_to_all of {name}")
    # A dim several axes cut: the spanned ones must be the innermost, before and after, so
    # that the group holds the same part of the tensor before and after.
    check_innermost_slicing(op, src, span, dst)
    check_innermost_slicing(op, dst, span, src)
    return dst


def check_all_to_all_blocks(t: TensorType, parts: int, what: str) -> None:
    """The dispatch form's dim 0 holds one equal block per member of a group of `parts`."""
    if t.get_shape()[0] % parts:
        raise fail(
            "all-to-all-local",
            f"{what} : {t}: dim 0 of size {t.get_shape()[0]} does not cut into {parts} equal "
            "blocks, one per rank of the group (the dispatch form sends block j to member j)",
        )


# --------------------------------------------------------------------------------------------
# Slice and update
# --------------------------------------------------------------------------------------------


def check_innermost_slicing(
    op: Operation,
    sliced: TensorType,
    axes: Sequence[int],
    other: TensorType | None = None,
) -> None:
    """A dim cut by several grid axes is cut in mixed radix, outermost cut first
    (`SlicedAttr`); a gather, scatter, slice or re-cut that changes some of those axes keeps
    every piece one contiguous run only if they are the innermost ones. `other`, the type on
    the other side of the op, must nest the cuts the op keeps in the same order."""
    for d in range(sliced.rank):
        cutting = sliced.slicing_axes(d)
        changed = [a for a in cutting if a in axes]
        if changed and tuple(changed) != cutting[len(cutting) - len(changed) :]:
            kept = [a for a in cutting if a not in axes]
            hint = (
                "; to cut each piece of the others further, state the nesting: "
                + ", ".join(
                    f"axis {a}: sliced<{d}, level {place}>"
                    for place, a in enumerate(kept + changed)
                )
                if other is not None
                else ""
            )
            raise fail(
                "mixed-radix-order",
                f"{op.name} changes the slicing of dim {d} of {sliced} along grid axes "
                f"{changed}, but that dim is cut by axes {list(cutting)} (outermost first): "
                "only the innermost cutting axes can be gathered, scattered or sliced" + hint,
            )
        if other is not None:
            kept_here = [a for a in cutting if a not in axes]
            kept_there = [a for a in other.slicing_axes(d) if a not in axes]
            if kept_here != kept_there:
                raise fail(
                    "mixed-radix-order",
                    f"{op.name} keeps grid axes {kept_here} cutting dim {d}, but {sliced} "
                    f"nests them as {kept_here} and {other} as {kept_there} (outermost "
                    "first): an op that does not span an axis keeps how it cuts",
                )


def check_slice(op: Operation, src: TensorType, dst: TensorType) -> None:
    if src.get_shape() != dst.get_shape() or src.element_type != dst.element_type:
        raise fail("slice-type", f"coco.slice keeps shape and element type: {src} -> {dst}")
    for axis in range(max(len(src.layouts), len(dst.layouts))):
        ls, ld = src.layout_on(axis), dst.layout_on(axis)
        if same_cut(ls, ld):
            continue
        if isinstance(ls, ReplicatedAttr) and isinstance(ld, SlicedAttr):
            continue
        raise fail(
            "slice-layouts",
            f"coco.slice of {value_name(op.operands[0])} takes a replicated axis to sliced, but "
            f"grid axis {axis} goes {layout_str(ls)} -> {layout_str(ld)}",
        )
    changed = [
        a
        for a in range(max(len(src.layouts), len(dst.layouts)))
        if not same_cut(src.layout_on(a), dst.layout_on(a))
    ]
    check_innermost_slicing(op, dst, changed, src)


def runs_after(user: Operation, op: Operation) -> bool:
    """Whether `user` executes after `op` (both in one function, regions run in place)."""
    ancestors: dict[Block, Operation] = {}
    cur: Operation | None = op
    while cur is not None and (block := cur.parent_block()) is not None:
        ancestors[block] = cur
        cur = cur.parent_op()
    cur = user
    while cur is not None and (block := cur.parent_block()) is not None:
        if (mine := ancestors.get(block)) is not None:
            return mine is not cur and precedes_in_block(mine, cur)
        cur = cur.parent_op()
    return False


def precedes_in_block(a: Operation, b: Operation) -> bool:
    """Whether `a` stands before `b` in the block holding both, found by walking from `a`
    both ways at once: the cost is their distance, not the rest of the block (xDSL's
    `is_before_in_block` walks on to the block's end when `b` comes first, which made every
    update's last-use check cost the rest of the function)."""
    fwd, back = a.next_op, a.prev_op
    while fwd is not None or back is not None:
        if fwd is b:
            return True
        if back is b:
            return False
        if fwd is not None:
            fwd = fwd.next_op
        if back is not None:
            back = back.prev_op
    return False


def check_update(op: Operation) -> None:
    target, value = op.operands
    if not isinstance(target, BlockArgument) or not isinstance(
        target.block.parent_op(), func.FuncOp
    ):
        raise fail(
            "update-target",
            f"coco.update writes into {value_name(target)}, which is not an argument of the "
            "enclosing function: only the caller's buffers can be updated",
        )
    if target.type != value.type:
        raise fail(
            "update-type",
            f"coco.update of {value_name(target)} : {target.type} with a value of type "
            f"{value.type}: the types must match (gather or slice the value first)",
        )
    for use in target.uses:
        user = use.operation
        if user is op:
            continue
        # another update of the same target: an op of `op`'s own class (coco.update)
        if isinstance(user, type(op)) and user.operands[0] is target:
            raise fail("update-once", f"{value_name(target)} is updated more than once")
        if runs_after(user, op):
            raise fail(
                "update-last-use",
                f"{user.name} reads {value_name(target)} after its coco.update: read the "
                "updated value instead",
            )
