"""Hypothesis strategies for random *valid* coconet programs and random pass pipelines.

A program is built with the dialects' op constructors, which infer result types by the layout
rules; an illegal combination raises a `VerifyException` at construction and is simply not
emitted (rejected by construction), so every generated module verifies. Programs run on a
dynamic 1-D grid `[?]` (mostly) or on `[2, ?]`; every sliceable dim is at least 4, so the
rank counts 1, 2 and 4 all fit (a `[2, ?]` grid skips 1 rank); some (5, 6, 7) do not divide by
2 or 4, so slices are cut unevenly, as `np.array_split` cuts them.

What a program holds, at random: arguments of random legal layouts (replicated state, local
gradients, sliced tensors -- on `[2, ?]` a dim both axes cut, in grid order or with the inner
axis's cut outermost (`sliced<d, level L>`) -- scalars) in f32/f16/bf16 (and a few i32); elementwise binary and
unary ops, constants, casts, compare/select, dropout, matmul, full and row reductions
(`reduce_dims` over any run of dims, sliced ones too: their partials), all_reduce,
reduce_scatter/all_gather pairs, slice, broadcast, send (on `[2, ?]`), all_to_all (a sliced
value re-cut along another dim, or a local one's dim-0 blocks exchanged), quantize (by a scale
per tensor, row, element or block) and dequantize, expert-parallel exchanges (a matmul feeding
an all_to_all or an all_to_all feeding a matmul's left operand, through a reshape or not: what
the all_to_all overlaps chunk), FSDP's forward GEMM (a sharded weight, cast or not,
all-gathered for the matmul's right operand: what `ol(ag,mm)` chunks along the reduction
dim), Megatron's flat buffers (sliced on the inner axis, reduced
over the outer one: split, a mixed-radix cut), a quarter of the
float sums stating an accumulation (`acc`: the element type or one it widens to); then updates of
arguments (mostly replicated ones, as optimizers do) and returned values. Operands are drawn
with a bias to recent values, so chains like `all_reduce -> elementwise with replicated state
-> update` (what split/reorder/as-slice/fuse act on) are common.

Draws shrink toward shorter programs, earlier op kinds and the most recent operands, so a
failing case shrinks to a small program.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence

from hypothesis import strategies as st
from xdsl.builder import Builder
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DenseArrayBase,
    Float8E4M3FNType,
    Float8E5M2Type,
    FunctionType,
    IntegerAttr,
    ModuleOp,
    bf16,
    f16,
    f32,
    i1,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.printer import Printer
from xdsl.rewriter import InsertPoint
from xdsl.utils.exceptions import DiagnosticException

from coconet.core.program import Program, mark_symmetric
from coconet.dialects import coco, comm
from coconet.dialects.coco import (
    DYNAMIC,
    GRID_ATTR_NAME,
    LOCAL,
    REPLICATED,
    GridAttr,
    LayoutAttr,
    LocalAttr,
    ReplicatedAttr,
    SlicedAttr,
    TensorType,
    tensor_type_of,
)
from coconet.dialects.coco_types import element_type_of_name, exact_widening
from coconet.dialects.comm import ACC_TYPE_NAMES
from coconet.dialects.reduction import Reduction

ELEMENT_TYPES: dict[str, Attribute] = {
    "f32": f32,
    "f16": f16,
    "bf16": bf16,
    "f8E4M3FN": Float8E4M3FNType(),
    "f8E5M2": Float8E5M2Type(),
    "i32": i32,
    "i1": i1,
}
FLOATS = ("f32", "f16", "bf16", "f8E4M3FN", "f8E5M2")
SHAPES: tuple[tuple[int, ...], ...] = ((8,), (4,), (4, 8), (8, 4), (16,), ())
# cut unevenly at 2 and 4 ranks: where per-rank extents differ (a row reduction once read
# past smaller ranks' pieces)
SHAPES += ((5, 7), (6,), (7, 4, 5))
CONSTANTS = (0.5, 0.9, 2.0, -1.0, 0.0, 1e-3, 3.0)
INT_CONSTANTS = (1, 2, 0, -3, 7)

OP_KINDS = (
    "binary",
    "all_reduce",
    "unary",
    "constant",
    "reduce_scatter",
    "all_gather",
    "slice",
    "cast",
    "reduce",
    "cmp_select",
    "dropout",
    "matmul",
    "broadcast",
    "send",
    "reduce_dims",
    "all_to_all",
    "quantize",
)

MOTIFS = (
    "optimizer",
    "norm_rows",
    "clipped_optimizer",
    "sliced_optimizer",
    "megatron",
    "fsdp_layer",
    "flat_buffer",
    "boundary",
    "regather",
    "all_to_all",
    "expert_exchange",
)

GRIDS: tuple[tuple[int, ...], ...] = ((DYNAMIC,), (DYNAMIC,), (2, DYNAMIC))


class GeneratedProgram:
    """A generated module (one function) and its grid; prints as its IR text."""

    def __init__(self, module: ModuleOp, grid: tuple[int, ...]):
        self.module = module
        self.grid = grid

    @property
    def program(self) -> Program:
        return Program(self.module)

    @property
    def text(self) -> str:
        out = io.StringIO()
        Printer(stream=out).print_op(self.module)
        return out.getvalue() + "\n"

    def __repr__(self) -> str:
        return "GeneratedProgram:\n" + self.text

    def _repr_pretty_(self, p, cycle: bool) -> None:  # how hypothesis prints an example
        p.text(repr(self))


class _Gen:
    """Builds one function, drawing every decision from hypothesis."""

    def __init__(self, draw: Callable, grid: tuple[int, ...]):
        self.draw = draw
        self.grid = grid
        self.grid_rank = len(grid)
        self.block: Block | None = None
        self.builder: Builder | None = None
        self.func: func.FuncOp | None = None
        self.pool: list[SSAValue] = []
        self.counter = 0
        # arguments a motif computed a new value for: finish() updates them with it
        self.intended: dict[SSAValue, SSAValue] = {}
        # values a motif wants returned (after the updates, so they outlive them)
        self.wanted_returns: list[SSAValue] = []

    # -- types ---------------------------------------------------------------------------

    def layout_for_axis(self, shape: tuple[int, ...], allow_local: bool = True) -> LayoutAttr:
        choices: list[LayoutAttr] = [REPLICATED]
        if allow_local:
            choices.append(LOCAL)
        choices += [SlicedAttr(d) for d in range(len(shape))]
        return self.draw(st.sampled_from(choices))

    def tensor_type(
        self, shape: tuple[int, ...], elt: str, layouts: Sequence[LayoutAttr]
    ) -> TensorType:
        return TensorType(shape, ELEMENT_TYPES[elt], list(layouts))

    def draw_arg_type(self) -> TensorType:
        role = self.draw(st.sampled_from(("state", "grad", "any", "scalar", "sliced")))
        if role == "scalar":
            elt = self.draw(st.sampled_from(("f32", "f32", "f16", "i32")))
            return self.tensor_type((), elt, [])
        shape = self.draw(st.sampled_from([s for s in SHAPES if s]))
        elt = self.draw(st.sampled_from(("f32", "f32", "f16", "bf16", "i32", "f8E4M3FN", "f8E5M2")))
        if role == "state":
            lays: list[LayoutAttr] = [REPLICATED] * self.grid_rank
        elif role == "grad":
            lays = [LOCAL] * self.grid_rank
            if self.grid_rank == 2 and self.draw(st.booleans()):
                lays[0] = self.layout_for_axis(shape)
        elif role == "sliced":
            lays = [SlicedAttr(self.draw(st.integers(0, len(shape) - 1)))]
            if self.grid_rank == 2:
                lays = [self.layout_for_axis(shape), lays[0]]
        else:
            lays = [self.layout_for_axis(shape) for _ in range(self.grid_rank)]
        if self.grid_rank == 2 and lays[0] == lays[1] and isinstance(lays[0], SlicedAttr):
            # a dim both axes cut: in grid order or with the inner axis's cut outermost
            d = lays[0].dim.data
            if self.draw(st.booleans()):
                lays = [SlicedAttr(d, 1), SlicedAttr(d, 0)]
        return self.tensor_type(shape, elt, lays)

    # -- emitting ops --------------------------------------------------------------------

    def name(self, v: SSAValue, prefix: str = "v") -> None:
        self.counter += 1
        v.name_hint = f"{prefix}{self.counter}"

    def emit(self, make: Callable[[], Operation]) -> SSAValue | None:
        """Build an op with `make` (its constructor infers the result type); if the layout
        rules refuse it, emit nothing."""
        assert self.builder is not None
        try:
            op = make()
        except DiagnosticException:
            return None
        return self._insert(op)

    def _insert(self, op: Operation) -> SSAValue | None:
        assert self.builder is not None
        self.builder.insert(op)
        try:
            op.verify()
        except DiagnosticException:
            op.detach()
            op.erase()
            return None
        if not op.results:
            return None
        v = op.results[0]
        self.name(v)
        self.pool.append(v)
        return v

    def collective(
        self,
        cls: type[comm.CollectiveOp],
        x: SSAValue,
        kind: str | None = None,
        axes: Sequence[int] | None = None,
        root: int | None = None,
        dim: int = 0,
        along: int | None = None,
    ) -> SSAValue | None:
        """A collective whose result type the dialect infers on the function's grid.

        The op constructors infer before the op sits in a function, so on the default 1-D
        grid; on `[2, ?]` that can be the wrong type. So: build a probe with the input's type
        inside the function, let it infer its type by the dialect's own rules (`infer`), and
        build the real op with that type."""
        assert self.builder is not None
        props: dict[str, Attribute] = {}
        if kind is not None:
            props["kind"] = comm.CollectiveKindAttr(Reduction(kind))
        if cls is comm.ReduceScatterOp:
            props["dim"] = IntegerAttr(dim, i64)
        if axes is not None:
            props["axes"] = DenseArrayBase.from_list(i64, axes)
        acc = self.accumulation(cls, x, kind)
        if acc is not None:
            props["acc"] = element_type_of_name(acc)
        if root is not None:
            props["root"] = IntegerAttr(root, i64)
        if along is not None:
            props["along"] = IntegerAttr(along, i64)
            props["shift"] = IntegerAttr(1, i64)
        probe_type = x.type
        if cls is comm.AllToAllOp:
            # the declared result names the target dim: probe with the one the rule gives
            span = axes if axes is not None else range(self.grid_rank)
            try:
                probe_type = comm.collective_result_type(
                    cls, x.type, tuple(span), self.grid_rank, dim=dim
                )
            except DiagnosticException:
                return None
        probe = cls.build(operands=[x], result_types=[probe_type], properties=dict(props))
        self.builder.insert(probe)
        try:
            t = probe.infer()
        except DiagnosticException:
            t = None
        probe.detach()
        probe.erase()
        if t is None:
            return None
        return self._insert(cls.build(operands=[x], result_types=[t], properties=props))

    def accumulation(self, cls: type, x: SSAValue, kind: str | None) -> str | None:
        """Now and then a stated accumulation (`acc`) on a float sum: one the element type
        widens to exactly, the element type itself included (rounding every step)."""
        if kind != "sum" or cls not in (comm.AllReduceOp, comm.ReduceScatterOp, comm.ReduceOp):
            return None
        elt = tensor_type_of(x).elt
        legal = [
            a for a in ACC_TYPE_NAMES if a == elt or (elt in FLOATS and exact_widening(elt, a))
        ]
        if not legal or self.draw(st.integers(0, 3)):
            return None
        return self.draw(st.sampled_from(legal))

    def pick(self, pred: Callable[[SSAValue], bool] = lambda v: True) -> SSAValue | None:
        """A value from the pool, most recent first (so draws shrink toward chains)."""
        cands = [v for v in reversed(self.pool) if pred(v)]
        if not cands:
            return None
        # Skewed toward the front: most draws take one of the last few values.
        i = self.draw(st.integers(0, len(cands) - 1) | st.integers(0, min(2, len(cands) - 1)))
        return cands[i]

    def constant(
        self, elt: str, shape: tuple[int, ...] = (), zero: bool = False
    ) -> SSAValue | None:
        # Zero only where asked: a multiplication by zero hides whatever it multiplies.
        if elt in FLOATS:
            value: float | int = self.draw(
                st.sampled_from(CONSTANTS if zero else tuple(c for c in CONSTANTS if c))
            )
        elif elt == "i1":
            value = self.draw(st.booleans())
        else:
            value = self.draw(st.sampled_from(INT_CONSTANTS))
        t = self.tensor_type(shape, elt, [])
        return self.emit(lambda: coco.ConstantOp(value, t))

    def axes(self) -> list[int] | None:
        if self.grid_rank == 1:
            return None
        return self.draw(st.sampled_from([None, [1], [0], [0, 1]]))

    # -- one random op -------------------------------------------------------------------

    def step(self) -> None:
        if self.draw(st.integers(0, 3)) == 0:
            # On a [2, ?] grid, stage boundaries (sliced-send's input) come up twice as often.
            kind = self.draw(
                st.sampled_from(MOTIFS + (("boundary",) if self.grid_rank > 1 else ()))
            )
            getattr(self, f"motif_{kind}")()
            return
        kind = self.draw(st.sampled_from(OP_KINDS))
        getattr(self, f"op_{kind}")()

    # -- motifs: the shapes of CoCoNet's workloads, which the schedule passes act on -------

    def arg(self, t: TensorType, prefix: str) -> SSAValue:
        """An argument of type `t`: an existing one not yet meant for an update, or a new one."""
        assert self.block is not None
        for a in self.block.args:
            if a.type == t and a not in self.intended and self.draw(st.booleans()):
                return a
        a = self.block.insert_arg(t, len(self.block.args))
        a.name_hint = f"{prefix}{len(self.block.args) - 1}"
        self.pool.append(a)
        return a

    def float_elt(self) -> str:
        return self.draw(st.sampled_from(("f32", "f32", "f16", "bf16", "f8E4M3FN", "f8E5M2")))

    def span_axes(self) -> tuple[list[LayoutAttr], list[int] | None]:
        """(layouts of a local gradient, the axes its all_reduce spans)."""
        if self.grid_rank == 1:
            return [LOCAL], None
        which = self.draw(st.sampled_from(("all", "inner")))
        if which == "all":
            return [LOCAL, LOCAL], None
        return [LOCAL, LOCAL], [1]

    def motif_optimizer(self) -> None:
        """SGD / Adam-like: g1 = all_reduce(g); m1 = b m + (1 - b) g1; w1 = w - lr * m1
        (sometimes m1 scaled by 1 / (its global norm + 1), as LAMB and clipping do); update w
        (and m). What split, reorder, as-slice and fuse rewrite."""
        shape = self.draw(st.sampled_from(((16,), (8,), (8, 4))))
        elt = self.float_elt()
        lays, axes = self.span_axes()
        g = self.arg(self.tensor_type(shape, elt, lays), "g")
        if self.draw(st.integers(0, 2)) == 0:
            # already split: reorder's input
            rs = self.collective(comm.ReduceScatterOp, g, "sum", axes, dim=0)
            g1 = self.collective(comm.AllGatherOp, rs, axes=axes) if rs is not None else None
        else:
            g1 = self.collective(comm.AllReduceOp, g, "sum", axes)
        if g1 is None:
            return
        w_t = g1.type
        w = self.arg(w_t, "w")
        step = g1
        if self.draw(st.booleans()):
            m = self.arg(w_t, "m")
            b = self.constant(elt)
            c = self.constant(elt)
            bm = self.emit(lambda: coco.MulOp(b, m))
            cg = self.emit(lambda: coco.MulOp(c, g1))
            m1 = self.emit(lambda: coco.AddOp(bm, cg)) if bm and cg else None
            if m1 is not None:
                self.intended[m] = m1
                step = m1
                if self.draw(st.booleans()):
                    a = self.emit(lambda: coco.AbsOp(m1))
                    r = self.emit(lambda: coco.SqrtOp(a)) if a else None
                    step = self.emit(lambda: coco.DivOp(m1, r)) if r else m1
        if step is not None and self.draw(st.integers(0, 2)) == 0:
            # Scaled by a global norm (LAMB's trust ratio, clipping): fused, the norm's
            # all_reduce cuts the region in two, and m, updated at the end by finish(), is
            # computed in the first part.
            sq = self.emit(lambda: coco.MulOp(step, step))
            total = self.emit(lambda: coco.ReduceOp("sum", sq)) if sq else None
            root = self.emit(lambda: coco.SqrtOp(total)) if total else None
            t = self.tensor_type((), elt, [])
            one = self.emit(lambda: coco.ConstantOp(1.0, t))  # (a denominator of 1 at least)
            den = self.emit(lambda: coco.AddOp(root, one)) if root and one else None
            step = self.emit(lambda: coco.DivOp(step, den)) if den else step
        lr = (
            self.constant(elt)
            if self.draw(st.booleans())
            else self.arg(self.tensor_type((), elt, []), "lr")
        )
        d = self.emit(lambda: coco.MulOp(lr, step))
        w1 = self.emit(lambda: coco.SubOp(w, d)) if d is not None else None
        if w1 is not None:
            self.intended[w] = w1

    def motif_clipped_optimizer(self) -> None:
        """Global-norm clipping over several tensors (torch's clip_grad_norm_ before a step):
        g1_i = all_reduce(g_i); clip = 1 / (sqrt(sum_i ||g1_i||^2) + 1); w_i -= lr clip g1_i.
        Every tensor's chain is coupled to the others through the norm: what coco-fuse merges
        into one region and the lowering runs as table launches; past 16 tensors the norm is
        computed once, before the launch that reads it."""
        count = self.draw(st.sampled_from((2, 3, 5, 17, 20)))
        elt = "f32"
        lays, axes = self.span_axes()
        grads: list[SSAValue] = []
        total: SSAValue | None = None
        for i in range(count):
            shape = self.draw(st.sampled_from(((16,), (8,), (8, 4), (8 + i,))))
            g = self.arg(self.tensor_type(shape, elt, lays), "g")
            g1 = self.collective(comm.AllReduceOp, g, "sum", axes)
            sq = self.emit(lambda g1=g1: coco.MulOp(g1, g1)) if g1 is not None else None
            part = self.emit(lambda sq=sq: coco.ReduceOp("sum", sq)) if sq is not None else None
            if g1 is None or part is None:
                return
            grads.append(g1)
            if total is None:
                total = part
            else:
                total = self.emit(lambda a=total, b=part: coco.AddOp(a, b))
                if total is None:
                    return
        root = self.emit(lambda: coco.SqrtOp(total))
        one = self.constant(elt)
        den = self.emit(lambda: coco.AddOp(root, one)) if root and one else None
        if den is None:
            return
        lr = self.constant(elt)
        for g1 in grads:
            w = self.arg(g1.type, "w")
            if w in self.intended:
                continue
            scaled = self.emit(lambda g1=g1: coco.DivOp(g1, den))
            d = self.emit(lambda scaled=scaled: coco.MulOp(lr, scaled)) if scaled else None
            w1 = self.emit(lambda w=w, d=d: coco.SubOp(w, d)) if d is not None else None
            if w1 is not None:
                self.intended[w] = w1

    def motif_sliced_optimizer(self) -> None:
        """The optimizer after split + reorder: rs = reduce_scatter(g) (or, written naively,
        slice(all_reduce(g))); w1 = slice(w) - lr rs; update w with all_gather(w1). What
        canonicalize, as-slice and fuse (RS + C + AG) rewrite."""
        shape = self.draw(st.sampled_from(((16,), (8,), (8, 4))))
        elt = self.float_elt()
        lays, axes = self.span_axes()
        g = self.arg(self.tensor_type(shape, elt, lays), "g")
        if self.draw(st.integers(0, 2)) == 0:
            # ZeRO-3 written naively: the whole sum, then this rank's slice of it (what
            # canonicalization turns into the reduce_scatter)
            span = tuple(axes) if axes is not None else tuple(range(self.grid_rank))
            try:
                rs_t = comm.collective_result_type(
                    comm.ReduceScatterOp, g.type, span, self.grid_rank, dim=0
                )
            except DiagnosticException:
                return
            whole = self.collective(comm.AllReduceOp, g, "sum", axes)
            rs = self.emit(lambda: coco.SliceOp(whole, rs_t)) if whole is not None else None
        else:
            rs = self.collective(comm.ReduceScatterOp, g, "sum", axes, dim=0)
        if rs is None:
            return
        w = self.arg(self.tensor_type(shape, elt, [REPLICATED] * self.grid_rank), "w")
        ws = self.emit(lambda: coco.SliceOp(w, w.type.with_layouts(rs.type.layouts.data)))
        if ws is None:
            return
        lr = self.constant(elt)
        d = self.emit(lambda: coco.MulOp(lr, rs))
        w1 = self.emit(lambda: coco.SubOp(ws, d)) if d is not None else None
        if w1 is None:
            return
        w2 = self.collective(comm.AllGatherOp, w1, axes=axes)
        if w2 is not None and w2.type == w.type:
            self.intended[w] = w2
        if self.draw(st.integers(0, 3)) == 0:
            # The state's slice or new value escapes too: returned after w's update.
            self.wanted_returns.append(self.draw(st.sampled_from([v for v in (ws, w2) if v])))

    def motif_regather(self) -> None:
        """all_gather(slice(w)) used as w's new value and returned: what canonicalization
        folds to w, and what as-slice makes of w (values that alias an updated argument)."""
        shape = self.draw(st.sampled_from(((8,), (16,), (4, 8))))
        w = self.arg(self.tensor_type(shape, self.float_elt(), [REPLICATED] * self.grid_rank), "w")
        lays: list[LayoutAttr] = [REPLICATED] * self.grid_rank
        lays[-1] = SlicedAttr(0)
        ws = self.emit(lambda: coco.SliceOp(w, w.type.with_layouts(lays)))
        if ws is None:
            return
        axes = None if self.grid_rank == 1 else [self.grid_rank - 1]
        g = self.collective(comm.AllGatherOp, ws, axes=axes)
        if g is None:
            return
        if self.draw(st.booleans()):
            self.intended[w] = g
        if self.draw(st.booleans()):
            self.wanted_returns.append(self.draw(st.sampled_from((ws, g))))

    def motif_all_to_all(self) -> None:
        """Ulysses / MoE-like: a tensor sliced on one dim re-cut along another (uneven sizes,
        the innermost dim either way), computed on, maybe re-cut back; or a local dispatch
        buffer's blocks exchanged before an expert's elementwise work. Maybe computed on
        before the exchange too (a scale, a cast to bf16 before dispatch) and after it (a
        cast back, a residual add): what the fused all_to_all (`fuse(a2a)`) takes."""
        shape = self.draw(st.sampled_from(((8, 4), (5, 7), (7, 4, 5), (4, 8))))
        axis = self.grid_rank - 1
        axes = None if self.grid_rank == 1 else [axis]
        lays: list[LayoutAttr] = [REPLICATED] * self.grid_rank
        if self.draw(st.integers(0, 3)) == 0:
            shape = (8, *shape[1:])  # one block of dim 0 per rank, at 1, 2 and 4 ranks
            lays[axis] = LOCAL
            a = b = 0
        else:
            a, b = self.draw(st.permutations(range(len(shape))))[:2]
            lays[axis] = SlicedAttr(a)
        elt = self.float_elt()
        x = self.arg(self.tensor_type(shape, elt, lays), "x")
        sent: SSAValue | None = x
        before = self.draw(st.integers(0, 2))  # none, a scale, a scale and a narrowing cast
        if before:
            s = self.arg(self.tensor_type((), elt, []), "s")
            sent = self.emit(lambda: coco.MulOp(x, s))
        if sent is not None and before == 2 and elt != "bf16":
            narrow = sent
            sent = self.emit(lambda: coco.CastOp(narrow, ELEMENT_TYPES["bf16"]))
        if sent is None:
            return
        y = self.collective(comm.AllToAllOp, sent, axes=axes, dim=b)
        if y is None:
            return
        z = self.emit(lambda: coco.MulOp(y, y))
        if z is not None and y.type.elt != elt and self.draw(st.booleans()):
            wide = z
            z = self.emit(lambda: coco.CastOp(wide, ELEMENT_TYPES[elt]))
            if z is not None and self.draw(st.booleans()):
                r = self.arg(z.type, "r")
                summed = z
                z = self.emit(lambda: coco.AddOp(summed, r))
        if z is not None and self.draw(st.booleans()):
            z = self.collective(comm.AllToAllOp, z, axes=axes, dim=a)
        if z is not None and self.draw(st.booleans()):
            self.wanted_returns.append(z)

    def motif_expert_exchange(self) -> None:
        """Expert parallelism around an all_to_all: a matmul whose result only the exchange
        reads (MoE's dispatch buffers; the expert output [E, G*C, N] through a reshape), an
        exchange only a matmul's left operand reads (the experts' input, maybe through a
        reshape to [E, G*C, K]), or both in a row: what `ol(mm,a2a)` / `ol(a2a,mm)` pipeline.
        Experts E and token groups G are cut, unevenly at 2-4 ranks; the capacity C (2, 3, 4
        or 6 slots) is cut by no axis, the dim the forms chunk. Or a local dispatch buffer
        [8, C, K] whose dim-0 blocks are exchanged (its chunks cut C, never dim 0)."""
        e, g = self.draw(st.sampled_from(((5, 7), (4, 6), (8, 4))))
        c = self.draw(st.sampled_from((3, 4, 2, 6)))
        k, n = self.draw(st.sampled_from(((4, 8), (8, 4), (6, 6))))
        elt = self.draw(st.sampled_from(("f32", "f32", "f16", "bf16")))
        form = self.draw(st.sampled_from(("mm_a2a", "a2a_mm", "both")))
        axis = self.grid_rank - 1
        axes = None if self.grid_rank == 1 else [axis]

        def on_axis(lay: LayoutAttr) -> list[LayoutAttr]:
            lays: list[LayoutAttr] = [REPLICATED] * self.grid_rank
            lays[axis] = lay
            return lays

        dispatch = self.draw(st.integers(0, 3)) == 0
        # where the exchanged tensor is reshaped to [E, G*C, .] (sliced on experts): on the
        # matmul's side of the exchange, before (mm -> reshape -> a2a) or after it
        via = not dispatch and self.draw(st.booleans())
        if dispatch:
            src, dim, shape = LOCAL, 0, (8, c, k)
        elif via:  # experts' side sliced<0>, groups' side sliced<1>
            src, dim, shape = (
                (SlicedAttr(0), 1, (e, g, c, k))
                if form == "mm_a2a"
                else (SlicedAttr(1), 0, (e, g, c, k))
            )
        else:
            src, dim = self.draw(st.sampled_from(((SlicedAttr(1), 0), (SlicedAttr(0), 1))))
            shape = (e, g, c, k)

        def matmul(lhs: SSAValue) -> SSAValue | None:
            t = tensor_type_of(lhs)
            kk = t.get_shape()[-1]
            if t.rank == 3 and not dispatch and self.draw(st.booleans()):
                w_t = self.tensor_type((e, kk, n), elt, on_axis(SlicedAttr(0)))  # per expert
            else:
                w_t = self.tensor_type((kk, n), elt, [REPLICATED] * self.grid_rank)
            w = self.arg(w_t, "w")
            return self.emit(lambda: coco.MatmulOp(lhs, w))

        def reshaped(v: SSAValue, to: tuple[int, ...]) -> SSAValue | None:
            t = tensor_type_of(v)
            return self.emit(lambda: coco.ReshapeOp(v, t.with_shape(to)))

        flat = (e, g * c)
        x: SSAValue | None
        if form == "a2a_mm":
            x = self.arg(self.tensor_type(shape, elt, on_axis(src)), "x")
        elif (
            via and form == "mm_a2a"
        ):  # the expert output [E, G*C, N] regrouped to [E, G, C, N] for the exchange
            h = self.arg(self.tensor_type((*flat, k), elt, on_axis(SlicedAttr(0))), "x")
            out = matmul(h)
            x = reshaped(out, (e, g, c, n)) if out is not None else None
        else:
            x = matmul(self.arg(self.tensor_type(shape, elt, on_axis(src)), "x"))
        if x is None:
            return
        y = self.collective(comm.AllToAllOp, x, axes=axes, dim=dim)
        if y is not None and form != "mm_a2a":
            if via:
                y = reshaped(y, (*flat, tensor_type_of(y).get_shape()[-1]))
            y = matmul(y) if y is not None else None
        if y is not None:
            self.wanted_returns.append(y)

    def motif_flat_buffer(self) -> None:
        """Megatron's distributed optimizer over its flat buffers on a [dp, tp] grid: the
        gradient buffer sliced on tp (the inner axis) and all-reduced over dp, the parameters
        and state sliced on tp; an Adam-like step. Split, each tp piece is reduce-scattered
        over dp (a dim cut by both axes, tp's cut outermost: `sliced<0, level L>`)."""
        if self.grid_rank != 2:
            return self.motif_optimizer()
        n = self.draw(st.sampled_from((16, 12, 13, 7)))
        elt = self.float_elt()
        tp: list[LayoutAttr] = [REPLICATED, SlicedAttr(0)]
        g = self.arg(self.tensor_type((n,), elt, [LOCAL, SlicedAttr(0)]), "g")
        if self.draw(st.integers(0, 2)) == 0:
            rs = self.collective(comm.ReduceScatterOp, g, "sum", [0], dim=0)
            g1 = self.collective(comm.AllGatherOp, rs, axes=[0]) if rs is not None else None
        else:
            g1 = self.collective(comm.AllReduceOp, g, "sum", [0])
        if g1 is None:
            return
        w = self.arg(self.tensor_type((n,), elt, tp), "w")
        m = self.arg(self.tensor_type((n,), elt, tp), "m")
        b, c = self.constant(elt), self.constant(elt)
        bm = self.emit(lambda: coco.MulOp(b, m))
        cg = self.emit(lambda: coco.MulOp(c, g1))
        m1 = self.emit(lambda: coco.AddOp(bm, cg)) if bm and cg else None
        if m1 is None:
            return
        self.intended[m] = m1
        lr = self.constant(elt)
        d = self.emit(lambda: coco.MulOp(lr, m1))
        w1 = self.emit(lambda: coco.SubOp(w, d)) if d is not None else None
        if w1 is not None:
            self.intended[w] = w1

    def motif_megatron(self) -> None:
        """A tensor-parallel layer: local = matmul(x sliced on K, W sliced on K);
        out = dropout(all_reduce(local) + b) + r. What overlap (and split/reorder) rewrite."""
        elt = self.float_elt()
        m, k, n = 4, 8, self.draw(st.sampled_from((4, 8)))
        rest: list[LayoutAttr] = [REPLICATED] * (self.grid_rank - 1)
        x = self.arg(self.tensor_type((m, k), elt, [*rest, SlicedAttr(1)]), "x")
        wt = self.arg(self.tensor_type((k, n), elt, [*rest, SlicedAttr(0)]), "wt")
        y = self.emit(lambda: coco.MatmulOp(x, wt))
        if y is None:
            return
        axes = None if self.grid_rank == 1 else [1]
        s = self.collective(comm.AllReduceOp, y, "sum", axes)
        if s is None:
            return
        b = self.arg(self.tensor_type((n,), elt, []), "b")
        h = self.emit(lambda: coco.AddOp(s, b))
        if h is not None and self.draw(st.booleans()):
            h = self.emit(lambda: coco.DropoutOp(h, 0.1, self.draw(st.integers(0, 9)))) or h
        if h is not None:
            r = self.arg(self.tensor_type((m, n), elt, []), "r")
            self.emit(lambda: coco.AddOp(h, r))

    def motif_fsdp_layer(self) -> None:
        """FSDP's forward GEMM: a weight sharded by rows or columns on the last axis (a bf16
        copy of an f32 master, cast before the gather, now and then), all-gathered, and only
        the matmul's right operand reads it: what `ol(ag,mm)` chunks along the reduction dim.
        The left operand: each rank's own batch, or one batched over a leading dim."""
        elt = self.float_elt()
        k = self.draw(st.sampled_from((8, 12, 16)))
        n = self.draw(st.sampled_from((4, 8)))
        lays: list[LayoutAttr] = [REPLICATED] * self.grid_rank
        lays[-1] = self.draw(st.sampled_from((SlicedAttr(0), SlicedAttr(1))))
        master = "f32" if elt != "f32" and self.draw(st.booleans()) else elt
        w: SSAValue | None = self.arg(self.tensor_type((k, n), master, lays), "w")
        if master != elt:
            w = self.emit(lambda: coco.CastOp(w, ELEMENT_TYPES[elt]))
        wg = w and self.collective(comm.AllGatherOp, w, axes=[self.grid_rank - 1])
        if wg is None:
            return
        shape = self.draw(st.sampled_from(((4, k), (2, 4, k))))
        x = self.arg(
            self.tensor_type(shape, elt, [LOCAL] + [REPLICATED] * (self.grid_rank - 1)), "x"
        )
        y = self.emit(lambda: coco.MatmulOp(x, wg))
        if y is not None:
            self.wanted_returns.append(y)

    def motif_norm_rows(self) -> None:
        """A row-parallel layer's epilogue at a real row length: all_reduce of local [R, H]
        partials, + a residual, then an RMSNorm (mean of squares) or a softmax over each row:
        what `fuse(rs-c-ag)` makes one row kernel. H is drawn so that a block's chunk of whole
        rows need not start at a whole vector of the kernels (a pull once copied from the
        vector before the chunk and left its end out)."""
        elt = self.draw(st.sampled_from(("f32", "f32", "bf16", "f16")))
        rows = self.draw(st.sampled_from((8, 12)))  # (split along the rows: row kernels)
        hidden = self.draw(st.sampled_from((300, 500, 1003, 1024)))
        lays, axes = self.span_axes()
        x = self.arg(self.tensor_type((rows, hidden), elt, lays), "x")
        h = self.collective(comm.AllReduceOp, x, "sum", axes)
        if h is None:
            return
        if self.draw(st.booleans()):
            r = self.arg(self.tensor_type((rows, hidden), elt, [REPLICATED] * self.grid_rank), "r")
            h = self.emit(lambda: coco.AddOp(h, r)) or h
        if self.draw(st.booleans()):
            sq = self.emit(lambda: coco.MulOp(h, h))
            ms = sq and self.emit(lambda: coco.ReduceDimsOp("mean", sq, [1], True))
            d = ms and self.emit(lambda: coco.AddOp(ms, self.constant(elt)))
            a = d and self.emit(lambda: coco.AbsOp(d))  # a negative eps: NaNs hide differences
            rs = a and self.emit(lambda: coco.RsqrtOp(a))
            y = rs and self.emit(lambda: coco.MulOp(h, rs))
            if y is not None:
                self.wanted_returns.append(y)
            return
        m = self.emit(lambda: coco.ReduceDimsOp("max", h, [1], True))
        d = m and self.emit(lambda: coco.SubOp(h, m))
        e = d and self.emit(lambda: coco.ExpOp(d))
        s = e and self.emit(lambda: coco.ReduceDimsOp("sum", e, [1], True))
        y = e and s and self.emit(lambda: coco.DivOp(e, s))
        if y is not None:
            self.wanted_returns.append(y)

    def motif_boundary(self) -> None:
        """A pipeline-stage boundary on [2, ?]: all_gather within the stage, then send to
        the next stage. What sliced-send rewrites."""
        if self.grid_rank < 2:
            return self.motif_optimizer()
        elt = self.float_elt()
        shape = self.draw(st.sampled_from(((8,), (4, 8))))
        p = self.arg(self.tensor_type(shape, elt, [LOCAL, LOCAL]), "p")
        s = self.collective(comm.ReduceScatterOp, p, "sum", [1], dim=0)
        if s is None:
            return
        if self.draw(st.booleans()):
            s = self.emit(lambda: coco.AddOp(s, self.constant(elt))) or s
        ag = self.collective(comm.AllGatherOp, s, axes=[1])
        if ag is None:
            return
        self.collective(comm.SendOp, ag, along=0)

    def op_binary(self) -> None:
        # Not on i1: the sim cannot subtract or negate booleans (reported; the dialect lets
        # arithmetic take i1 operands).
        a = self.pick(lambda v: v.type.elt != "i1")
        if a is None:
            return
        cls = self.draw(st.sampled_from(coco.BINARY_OPS))
        if self.draw(st.integers(0, 3)) == 0:
            b = self.constant(a.type.elt)
        else:
            b = self.pick(lambda v: v is not a and _combines(a.type, v.type)) or a
        if b is None:
            return
        if cls is coco.PowOp and a.type.elt in FLOATS:
            a = self.emit(lambda: coco.AbsOp(a)) or a  # keep pow's base off the NaN half
        if self.draw(st.booleans()):
            a, b = b, a
        self.emit(lambda: cls(a, b))

    def op_unary(self) -> None:
        a = self.pick(lambda v: v.type.elt != "i1")
        if a is None:
            return
        cls = self.draw(st.sampled_from(coco.UNARY_OPS))
        if cls in (coco.SqrtOp, coco.RsqrtOp, coco.LogOp) and a.type.elt in FLOATS:
            a = self.emit(lambda: coco.AbsOp(a)) or a  # fewer NaNs: NaNs hide differences
        self.emit(lambda: cls(a))

    def op_constant(self) -> None:
        elt = self.draw(st.sampled_from(("f32", "f32", "f16", "bf16", "i32", "f8E5M2")))
        shape = self.draw(st.sampled_from(((), (), (8,), (4, 8))))
        self.constant(elt, shape, zero=True)

    def op_cast(self) -> None:
        a = self.pick(lambda v: v.type.elt in FLOATS or v.type.elt == "i1")
        if a is None:
            return
        to = self.draw(st.sampled_from([e for e in FLOATS if e != a.type.elt]))
        self.emit(lambda: coco.CastOp(a, ELEMENT_TYPES[to]))

    def op_quantize(self) -> None:
        """coco.quantize by a scale per tensor (a constant, or the amax of the value), per
        row (a keepdims amax), of any value that broadcasts, or per block: the amax of each
        1 x b block of the rows (a reshape, then a max over its last dim), or an argument of
        a block shape; often dequantized again."""
        a = self.pick(lambda v: v.type.elt in FLOATS)
        if a is None:
            return
        how = self.draw(
            st.sampled_from(("constant", "amax", "rows", "value", "blocks", "block", "block"))
        )
        if how == "rows" and a.type.rank > 0:
            m = self.emit(lambda: coco.ReduceDimsOp("max", a, [a.type.rank - 1], keepdims=True))
        elif how == "amax":
            m = self.emit(lambda: coco.ReduceOp("max", a))
        elif how == "value":
            m = self.pick(lambda v: v.type.elt in FLOATS and _combines(a.type, v.type))
        elif how == "blocks":
            m = self.block_amax(a)
        elif how == "block":
            m = self.block_scale_arg(a.type)
        else:
            m = self.constant(a.type.elt)
        if m is None:
            return
        fp8 = self.draw(st.sampled_from(("f8E4M3FN", "f8E5M2")))
        q = self.emit(lambda: coco.QuantizeOp(a, m, ELEMENT_TYPES[fp8]))
        if q is not None and self.draw(st.booleans()):
            to = self.draw(st.sampled_from(FLOATS))
            self.emit(lambda: coco.DequantizeOp(q, m, ELEMENT_TYPES[to]))

    def block_amax(self, a: SSAValue) -> SSAValue | None:
        """The max of each 1 x b block along `a`'s last dim (b a proper divisor of it): a
        reshape to [..., C / b, b] (refused where a grid axis cuts the last dim) and a
        reduce_dims over the new last dim."""
        t = tensor_type_of(a)
        if t.rank == 0:
            return None
        c = t.get_shape()[-1]
        divisors = [b for b in range(2, c) if c % b == 0]
        if not divisors:
            return None
        b = self.draw(st.sampled_from(divisors))
        shape = (*t.get_shape()[:-1], c // b, b)
        r = self.emit(lambda: coco.ReshapeOp(a, t.with_shape(shape)))
        if r is None:
            return None
        return self.emit(lambda: coco.ReduceDimsOp("max", r, [t.rank], keepdims=False))

    def block_scale_arg(self, t: TensorType) -> SSAValue | None:
        """An argument of a block shape of `t`: a proper divisor of `t`'s dim on one dim that
        has one, each other dim 1, `t`'s or a proper divisor of it; replicated, or laid out as
        `t` on an axis where its dim there has 4 blocks or more (so it is cut on block
        boundaries at 1, 2 and 4 ranks; at 3, [quantize-block-slices] refuses where it is
        not)."""
        dims = t.get_shape()
        blockable = [d for d, n in enumerate(dims) if any(n % b == 0 for b in range(2, n))]
        if not blockable:
            return None
        blocked = self.draw(st.sampled_from(blockable))
        shape = tuple(
            self.draw(
                st.sampled_from(
                    [*([] if d == blocked else [1, n]), *(b for b in range(2, n) if n % b == 0)]
                )
            )
            for d, n in enumerate(dims)
        )
        lays: list[LayoutAttr] = []
        for x in range(self.grid_rank):
            lay = t.layout_on(x)
            keep = not isinstance(lay, SlicedAttr) or shape[lay.dim.data] >= 4
            lays.append(lay if keep and self.draw(st.booleans()) else REPLICATED)
        elt = self.draw(st.sampled_from(("f32", "bf16", t.elt if t.elt in FLOATS else "f32")))
        return self.arg(self.tensor_type(shape, elt, lays), "bs")

    def op_all_reduce(self) -> None:
        if self.draw(st.integers(0, 3)):
            a = self.pick(lambda v: v.type.local_axes() != ())
        else:
            a = self.pick()
        if a is None:
            return
        kind = self.draw(st.sampled_from(("sum", "sum", "max", "min", "prod")))
        axes = self.axes()
        self.collective(comm.AllReduceOp, a, kind, axes)

    def op_reduce_scatter(self) -> None:
        a = self.pick(lambda v: v.type.rank > 0)
        if a is None:
            return
        kind = self.draw(st.sampled_from(("sum", "sum", "max", "min")))
        dim = self.draw(st.integers(0, a.type.rank - 1))
        axes = self.axes()
        self.collective(comm.ReduceScatterOp, a, kind, axes, dim=dim)

    def op_all_gather(self) -> None:
        a = self.pick(lambda v: any(isinstance(lay, SlicedAttr) for lay in v.type.layouts))
        if a is None:
            return
        axes = self.axes()
        self.collective(comm.AllGatherOp, a, axes=axes)

    def op_slice(self) -> None:
        a = self.pick(
            lambda v: (
                v.type.rank > 0
                and any(
                    isinstance(v.type.layout_on(x), ReplicatedAttr) for x in range(self.grid_rank)
                )
            )
        )
        if a is None:
            return
        t: TensorType = a.type
        lays = t.layout_list(self.grid_rank)
        repl = [x for x in range(self.grid_rank) if isinstance(lays[x], ReplicatedAttr)]
        axis = self.draw(st.sampled_from(repl))
        lays[axis] = SlicedAttr(self.draw(st.integers(0, t.rank - 1)))
        self.emit(lambda: coco.SliceOp(a, t.with_layouts(lays)))

    def op_reduce(self) -> None:
        a = self.pick(lambda v: v.type.elt != "i1")
        if a is None:
            return
        kind = self.draw(st.sampled_from(("sum", "max", "min", "norm")))
        r = self.emit(lambda: coco.ReduceOp(kind, a))
        if r is not None and r.type.local_axes() and kind != "norm" and self.draw(st.booleans()):
            # a slice's partial, combined as an fp8 scale's amax or a global norm's sum is
            # (what coco-fuse{mode=reduction} finishes in its kernel)
            axes = list(r.type.local_axes()) if self.grid_rank > 1 else None
            self.collective(comm.AllReduceOp, r, kind=kind, axes=axes)

    def op_reduce_dims(self) -> None:
        a = self.pick(lambda v: v.type.elt != "i1" and v.type.rank > 0)
        if a is None:
            return
        rank = a.type.rank
        first = self.draw(st.integers(0, rank - 1))
        last = self.draw(st.integers(first, rank - 1))
        kind = self.draw(st.sampled_from(("sum", "max", "min", "mean")))
        keep = self.draw(st.booleans())
        r = self.emit(lambda: coco.ReduceDimsOp(kind, a, list(range(first, last + 1)), keep))
        if r is not None and r.type.local_axes() and kind != "mean" and self.draw(st.booleans()):
            # a sliced dim's partials, combined as a vocab-parallel softmax combines them
            axes = list(r.type.local_axes()) if self.grid_rank > 1 else None
            self.collective(comm.AllReduceOp, r, kind=kind, axes=axes)

    def op_cmp_select(self) -> None:
        a = self.pick(lambda v: v.type.elt != "i1")
        if a is None:
            return
        b = self.pick(lambda v: v is not a and _combines(a.type, v.type))
        b = b or self.constant(a.type.elt)
        if b is None:
            return
        pred = self.draw(st.sampled_from(tuple(p.value for p in coco.CmpPredicate)))
        c = self.emit(lambda: coco.CmpOp(pred, a, b))
        if c is None or self.draw(st.integers(0, 3)) == 0:
            return
        self.emit(lambda: coco.SelectOp(c, a, b))

    def op_dropout(self) -> None:
        a = self.pick(lambda v: v.type.elt in FLOATS)
        if a is None:
            return
        p = self.draw(st.sampled_from((0.1, 0.5, 0.0)))
        seed = self.draw(st.integers(0, 3))
        self.emit(lambda: coco.DropoutOp(a, p, seed))

    def op_matmul(self) -> None:
        a = self.pick(lambda v: v.type.rank == 2)
        if a is None:
            return
        k = a.type.get_shape()[-1]
        b = self.pick(
            lambda v: v.type.rank == 2 and v.type.get_shape()[0] == k and v.type.elt == a.type.elt
        )
        if b is None:
            # A replicated weight argument is not in the pool mid-body; build one by slicing
            # or broadcasting a constant of the right shape.
            b = self.constant(a.type.elt, (k, self.draw(st.sampled_from((4, 8)))))
            if b is not None and self.draw(st.booleans()):
                lays = [REPLICATED] * self.grid_rank
                lays[-1] = self.draw(st.sampled_from((SlicedAttr(0), SlicedAttr(1))))
                b = self.emit(lambda: coco.SliceOp(b, b.type.with_layouts(lays))) or b
        if b is None:
            return
        self.emit(lambda: coco.MatmulOp(a, b))

    def op_broadcast(self) -> None:
        a = self.pick(lambda v: v.type.local_axes() != ())
        if a is None:
            return
        self.collective(comm.BroadcastOp, a, axes=self.axes(), root=0)

    def op_send(self) -> None:
        if self.grid_rank < 2:
            return self.op_all_reduce()
        # Not a value sliced along the send's axis: the dialect types the received value
        # local (full shape) while each rank receives a slice; the sim crashes (reported).
        a = self.pick(lambda v: not isinstance(v.type.layout_on(0), SlicedAttr))
        if a is None:
            return
        self.collective(comm.SendOp, a, along=0)

    def op_all_to_all(self) -> None:
        # a local value's dim 0 holds one block per rank: 4 | dim 0 runs at 1, 2 and 4 ranks
        a = self.pick(
            lambda v: (
                v.type.rank > 0
                and any(isinstance(lay, SlicedAttr | LocalAttr) for lay in v.type.layouts)
                and (not v.type.local_axes() or v.type.get_shape()[0] % 4 == 0)
            )
        )
        if a is None:
            return
        cut = {lay.dim.data for lay in a.type.layouts if isinstance(lay, SlicedAttr)}
        others = [d for d in range(a.type.rank) if d not in cut] or [0]
        dim = self.draw(st.sampled_from(others))
        self.collective(comm.AllToAllOp, a, axes=self.axes(), dim=dim)

    # -- outputs -------------------------------------------------------------------------

    def coerce(self, v: SSAValue, t: TensorType) -> SSAValue | None:
        """Turn `v` into a value of type `t` with collectives, slices and casts (or None)."""
        if v.type.get_shape() != t.get_shape():
            return None
        if v.type.element_type != t.element_type:
            if v.type.elt not in FLOATS or t.elt not in FLOATS:
                return None
            v = self.emit(lambda: coco.CastOp(v, t.element_type))
            if v is None:
                return None
        for axis in range(self.grid_rank):
            have, want = v.type.layout_on(axis), t.layout_on(axis)
            if have == want:
                continue
            axes = None if self.grid_rank == 1 else [axis]
            cur = v
            if isinstance(have, SlicedAttr) and isinstance(want, SlicedAttr):
                # re-cut in one exchange (or gather, then slice below)
                if self.draw(st.booleans()):
                    cur = self.collective(comm.AllToAllOp, cur, axes=axes, dim=want.dim.data)
                else:
                    cur = self.collective(comm.AllGatherOp, cur, axes=axes)
            elif isinstance(have, SlicedAttr):
                cur = self.collective(comm.AllGatherOp, cur, axes=axes)
            elif isinstance(have, LocalAttr):
                if isinstance(want, SlicedAttr):
                    cur = self.collective(comm.ReduceScatterOp, cur, "sum", axes, dim=want.dim.data)
                else:
                    cur = self.collective(comm.AllReduceOp, cur, "sum", axes)
            if cur is None:
                return None
            have = cur.type.layout_on(axis)
            if have != want and isinstance(have, ReplicatedAttr):
                if isinstance(want, SlicedAttr):
                    lays = cur.type.layout_list(self.grid_rank)
                    lays[axis] = want
                    new_t = cur.type.with_layouts(lays)
                    cur = self.emit(lambda x=cur, t=new_t: coco.SliceOp(x, t))
                elif isinstance(want, LocalAttr):
                    cur = self.collective(comm.ReduceOp, cur, "sum", axes, root=0)
            if cur is None:
                return None
            v = cur
        return v if v.type == t else None

    def finish(self, args: Sequence[SSAValue]) -> list[SSAValue]:
        """Updates of some arguments, then returned values; at least one output."""
        computed = [v for v in self.pool if v not in args]
        staged: list[tuple[SSAValue, SSAValue]] = []
        for a in args:
            t: TensorType = a.type
            if a in self.intended and self.draw(st.integers(0, 4)):
                staged.append((a, self.intended[a]))
                continue
            likely = t.is_replicated() and t.rank > 0
            if not self.draw(st.integers(0, 3 if likely else 9)) < (3 if likely else 2):
                continue
            shape = t.get_shape()
            src = self.pick(lambda v, s=shape: v not in args and v.type.get_shape() == s)
            if src is None:
                continue
            v = self.coerce(src, t)
            if v is not None:
                staged.append((a, v))
        # Every coercion is emitted before the first update: no op reads an updated
        # argument after its update (update-last-use).
        assert self.builder is not None
        for a, v in staged:
            self.builder.insert(coco.UpdateOp(a, v))
        updated = {a for a, _ in staged}
        returns: list[SSAValue] = list(dict.fromkeys(self.wanted_returns))
        n_ret = self.draw(st.integers(0, 2))
        cands = [v for v in reversed(computed)] + [a for a in args if a not in updated]
        for i in range(min(n_ret, len(cands))):
            j = self.draw(st.integers(0, len(cands) - 1) | st.just(0))
            if cands[j] not in returns:
                returns.append(cands[j])
        if not staged and not returns:
            returns.append(cands[0] if cands else args[0])
        return returns


def _combines(a: TensorType, b: TensorType) -> bool:
    from coconet.dialects.layout_rules import infer_elementwise

    try:
        infer_elementwise([a, b])
    except DiagnosticException:
        return False
    return True


@st.composite
def programs(
    draw,
    max_ops: int = 10,
    grids: Sequence[tuple[int, ...]] = GRIDS,
    motif: str | None = None,
    symmetric: bool = True,
) -> GeneratedProgram:
    """A random valid single-function program (see the module docstring); `motif` (a motif or
    an op kind) first, where given (a test of what one motif or op does); `symmetric`: some
    tensor arguments marked `{coco.symmetric}` (tests of what marking leaves alone -- the
    schedules offered -- draw programs without it)."""
    grid = draw(st.sampled_from(tuple(grids)))
    g = _Gen(draw, grid)
    n_args = draw(st.integers(1, 4))
    arg_types = [g.draw_arg_type() for _ in range(n_args)]
    block = Block(arg_types=arg_types)
    for i, a in enumerate(block.args):
        t: TensorType = a.type
        a.name_hint = (
            "s" if t.rank == 0 else "g" if t.local_axes() else "w" if t.is_replicated() else "x"
        ) + str(i)
    g.block = block
    # Ops go in before a placeholder terminator, so each verifies as it is emitted (a
    # single-block region must end in a terminator).
    placeholder = func.ReturnOp()
    block.add_op(placeholder)
    g.builder = Builder(InsertPoint.before(placeholder))
    fn = func.FuncOp("random", (arg_types, []), Region(block))
    if grid != (DYNAMIC,) or draw(st.booleans()):
        fn.attributes[GRID_ATTR_NAME] = GridAttr(list(grid))
    g.func = fn
    g.pool = list(block.args)
    if motif is not None:  # a motif's name, or an op kind's
        (getattr(g, f"motif_{motif}", None) or getattr(g, f"op_{motif}"))()
    for _ in range(draw(st.integers(0 if motif else 1, max_ops))):
        g.step()
    returns = g.finish(list(block.args))
    g.builder.insert(func.ReturnOp(*returns))
    placeholder.detach()
    placeholder.erase()
    # Motifs may have added arguments: the signature is the block's.
    fn.function_type = FunctionType.from_lists(
        [a.type for a in block.args], [v.type for v in returns]
    )
    # Some tensor arguments kept in symmetric memory by the caller (`{coco.symmetric}`): a
    # fused all_gather assembled in one pulls from it, no staging copy.
    tensors = [a.index for a in block.args if a.type.rank]
    if symmetric and tensors:
        mark_symmetric(fn, draw(st.sets(st.sampled_from(tensors))))
    module = ModuleOp([fn])
    module.verify()  # a generator bug (or a dialect bug) if this fails: let it raise
    return GeneratedProgram(module, grid)


def registered_pass_names() -> list[str]:
    """coconet's passes, as registered right now (new passes are picked up automatically)."""
    from coconet.schedule import get_all_passes

    names = []
    for name, factory in get_all_passes().items():
        try:
            factory()
        except ImportError:  # registered, but its module is not written yet
            continue
        names.append(name)
    return sorted(names)


# xDSL's generic cleanups also run in coconet pipelines; they must preserve meaning too.
XDSL_CLEANUPS = ("cse", "canonicalize", "dce")

# Passes with options that their defaults never reach, drawn as coconet passes are: the
# one-shot fused all_reduce (`fuse(ar-c)`'s fusion).
OPTION_VARIANTS = ("coco-fuse{mode=all_reduce form=one_shot}",)


def pipelines(
    max_len: int = 5, extra: Sequence[str] = XDSL_CLEANUPS
) -> st.SearchStrategy[list[str]]:
    """A random pipeline: registered coconet passes (with repeats) in random order, now and
    then one of xDSL's cleanups. The registry is read once, here, so that every draw sees
    the same passes (hypothesis needs deterministic strategies)."""
    names = registered_pass_names()
    if "coco-fuse" in names:
        names += list(OPTION_VARIANTS)
    pool = names + list(extra)
    if not pool:
        return st.just([])
    mostly = st.sampled_from(names) if names else st.sampled_from(pool)
    element = st.one_of(mostly, mostly, mostly, st.sampled_from(pool))
    return st.lists(element, min_size=1, max_size=max_len)
