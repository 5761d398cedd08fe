"""Lowering of a (scheduled) coco/comm function to an execution plan and its CUDA source.

Top-level ops map to plan steps:

* an elementwise op, or a `comm.fused elementwise` region: one kernel launch;
* `coco.reduce`: a partials kernel and a one-block finish kernel;
* `coco.reduce_dims`: one row-reduction kernel (a block per row); `coco.reshape`: a copy;
* `coco.matmul`: a library matmul; collectives and `comm.send`: library collectives;
* `comm.fused all_reduce`: ONE kernel over symmetric buffers (fused_collective.py), or node
  kernels around library collectives between nodes when its group spans nodes
  (hierarchical.py);
* `comm.fused send`: ONE kernel computing the sent slice and storing it into the receiver's
  buffer over symmetric memory (fused_send.py), a library send across nodes;
* `comm.fused all_to_all`: ONE kernel computing the producers into a symmetric staging
  buffer, pulling each peer's part and computing the consumers on it (fused_all_to_all.py),
  op by op across nodes;
* `comm.overlap`: its producer and consumer, chunked by rows and ordered on two streams;
* `coco.update`: a copy into the caller's buffer (or the kernel writes there directly);
* `coco.slice`: a kernel reading this rank's part (no communication).

Every rank-dependent number (slice offsets, dropout streams) is a `RankValue` table, so the
plan and the CUDA text are the same for every rank.

What depends on the machine or on where a value is computed is decided first, as IR
(decisions.py: `coco-choose-topology` writes each fused collective's `comm.topology`,
`coco-defer` each deferred op's `comm.deferral`; segments.py: `coco-segment` each op's
`comm.segment` in a fused region cut into kernels), on a copy of the program; the builder
reads those attributes. Its last step folds launches of one kernel text into table launches
(batching.py), a step over the plan alone (LaunchConfig.batch=False: the plan before it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import ClassVar, Literal, SupportsInt

import numpy as np
from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue
from xdsl.utils.exceptions import VerifyException

from coconet.core import values as V
from coconet.core.counter_rng import seed_word
from coconet.core.gc_pause import without_gc
from coconet.core.program import CocoError, Program, check_program_on_grid
from coconet.dialects import coco, comm
from coconet.dialects.coco import TensorType, tensor_type_of
from coconet.dialects.comm import deferral_of
from coconet.dialects.layout_rules import infer_elementwise
from coconet.lowering.batching import TableBatcher
from coconet.lowering.cuda_printer import kernel_signature, print_unit
from coconet.lowering.decisions import decided, default_ranks, node_map
from coconet.lowering.fused_all_to_all import lower_fused_all_to_all
from coconet.lowering.fused_collective import lower_fused_collective, lower_fused_reduction
from coconet.lowering.fused_send import lower_fused_send
from coconet.lowering.kernel_ir import Kernel, KernelKey, Param, structural_key
from coconet.lowering.kernel_site import KernelSite, SiteKey, kernel_site
from coconet.lowering.kernels.elements import reduce_accumulator
from coconet.lowering.kernels.elementwise import ElementwiseKernel
from coconet.lowering.kernels.encodings import share_encodings
from coconet.lowering.kernels.reductions import (
    column_form,
    column_reduction_kernel,
    reduction_kernels,
    row_reduction_kernel,
)
from coconet.lowering.kernels.spec import Store, iteration_values
from coconet.lowering.overlap import lower_overlap
from coconet.lowering.plan import (
    COMM_STREAM,
    COMPUTE_STREAM,
    Buffer,
    Collective,
    Copy,
    KernelArg,
    Launch,
    Matmul,
    Plan,
    RankValue,
    RecordEvent,
    Step,
    WaitEvent,
)
from coconet.lowering.plan_builder import LaunchConfig
from coconet.lowering.signature import F32, F64, ParamKind, range_positions
from coconet.lowering.traffic import pointer_width_errors


class Lowering:
    # Whether elementwise sites of one computation share one build (kernel_site.py); a test
    # lowers without it to check the plans are the same.
    memoize_kernels: ClassVar[bool] = True

    def __init__(
        self,
        program: Program,
        grid_shape: Sequence[int],
        config: LaunchConfig,
        nodes: Sequence[int] = (),
        in_place: bool = False,
    ):
        self.grid_shape = tuple(grid_shape)
        self.size = int(np.prod(self.grid_shape))
        # The node of every rank (core/values.py); () when one node holds them all.
        self.nodes = node_map(nodes, self.size)
        # The program with the lowering's decisions made for this machine (decisions.py:
        # topologies, deferrals; segments.py: segments), which the builder reads; a copy
        # unless `in_place`.
        # (the outputs in the program's order: coco-segment moves updates up in the copy)
        self.outputs = program.outputs
        program = decided(program, self.grid_shape, self.nodes, in_place)
        self.program = program
        self.coords = [V.coords_of(r, self.grid_shape) for r in range(self.size)]
        self._piece_ranges: dict[tuple[TensorType, int], tuple[tuple[int, int], ...]] = {}
        self._rank_tables: dict[tuple[str, Hashable], RankValue] = {}
        # a type's local shape and, where its slices are uneven, every rank's (new_buffer)
        self._buffer_shapes: dict[
            TensorType, tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]
        ] = {}
        self.config = config
        self.buffers: dict[SSAValue, Buffer] = {}
        self.all_buffers: list[Buffer] = []
        self.steps: list[Step] = []
        self.kernels: list[Kernel] = []
        self.kernel_names: set[str] = set()
        # A kernel's text up to its name, variable names and comments -> the name it was
        # added under.
        self.kernel_keys: dict[KernelKey, str] = {}
        # Kernels that can run in table form (not collective ones), by name.
        self.batchable_kernels: dict[str, Kernel] = {}
        # Elementwise kernels built so far, by what they compute (kernel_site): a site that
        # computes the same takes the kernel without building it again (a deep model's layers).
        self.built_kernels: dict[SiteKey, tuple[Kernel, KernelSite, str]] = {}
        # Fused collective kernels that can run in table form, by name -> their text up to
        # names and comments: launches of kernels of one text (the same region over tensors
        # of other sizes and names) fold into one launch of its table form.
        self.collective_kernels: dict[str, tuple[KernelKey, Kernel]] = {}
        self.names: set[str] = set()
        self.next_suffix: dict[str, int] = {}
        self.updated: dict[str, Buffer] = {}
        self.stream = COMPUTE_STREAM
        self.deferred: set[Operation] = set()
        # each op's position in the program, made when a kernel first rematerializes ops
        self.program_order: dict[Operation, int] | None = None

    # -- naming and buffers ----------------------------------------------------------------

    def fresh(self, base: str) -> str:
        base = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in base) or "v"
        # the first free `base_k`: every suffix below the last one handed out is taken
        name, k = base, self.next_suffix.get(base, 1)
        while name in self.names:
            name = f"{base}_{k}"
            k += 1
        self.next_suffix[base] = k
        self.names.add(name)
        return name

    def new_buffer(
        self,
        hint: str,
        t: TensorType,
        kind: Literal["arg", "temp", "scratch"] = "temp",
        symmetric: bool = False,
        elt: str = "",
        shape: Sequence[int] | None = None,
    ) -> Buffer:
        if shape is not None:
            local, ranks = tuple(shape), ()
        elif (got := self._buffer_shapes.get(t)) is not None:
            local, ranks = got
        else:
            uneven = V.is_uneven(t, self.grid_shape)
            local = t.local_shape(self.grid_shape)
            ranks = V.rank_shapes(t, self.grid_shape) if uneven else ()
            self._buffer_shapes[t] = (local, ranks)
        buf = Buffer(self.fresh(hint), t, local, kind, symmetric, elt, ranks)
        self.all_buffers.append(buf)
        return buf

    def buffer_for(self, v: SSAValue) -> Buffer:
        if v not in self.buffers:
            self.buffers[v] = self.new_buffer(v.name_hint or "tmp", tensor_type_of(v))
        return self.buffers[v]

    def make_symmetric(self, v: SSAValue) -> None:
        """Place `v` in symmetric memory (peers of its group can reach it)."""
        # Fused collectives only mark buffers (before any launch uses them): the executors
        # allocate a symmetric buffer in symmetric memory and copy a caller's input into it.
        self.value_buffer(v).symmetric = True

    def group_size(self, span: Sequence[int]) -> int:
        return int(np.prod([self.grid_shape[a] for a in span], dtype=np.int64))

    def group_index(self, rank: int, span: Sequence[int]) -> int:
        return V.group_index(self.grid_shape, span, rank)

    def rank_table(
        self,
        label: str,
        fn: Callable[[int], SupportsInt],
        key: Hashable = None,
        name: str | None = None,
    ) -> RankValue:
        """`fn(rank)` for every rank. `key`: what `fn` depends on besides the rank (types,
        dims), given where a deep program asks the same table of every layer: computed once
        per (label, key). `name`: the table's name in the plan where it is not `label` (a
        value's name: every layer names its own, and shares the table)."""
        name = name or label
        got = self._rank_tables.get((label, key)) if key is not None else None
        if got is None:
            got = RankValue(name, tuple(int(fn(r)) for r in range(self.size)))
            if key is not None:
                self._rank_tables[(label, key)] = got
        return got if got.label == name else RankValue(name, got.table)

    def per_rank(
        self, label: str, fn: Callable[[int], SupportsInt], key: Hashable = None
    ) -> int | RankValue:
        """`fn(rank)` as a plain number where every rank agrees, else a table (uneven
        slices: counts, sizes and strides of pieces differ between ranks)."""
        table = self.rank_table(label, fn, key)
        return table.table[0] if len(set(table.table)) == 1 else table

    def piece_ranges(self, t: TensorType, rank: int) -> tuple[tuple[int, int], ...]:
        """(start, length) per dim of rank `rank`'s piece of `t` (V.piece_range), computed
        once per type and rank: a program's tensors share a few types, which every kernel's
        counts, strides and offsets ask about."""
        key = (t, rank)
        got = self._piece_ranges.get(key)
        if got is None:
            coords = self.coords[rank]
            got = tuple(V.piece_range(t, d, coords, self.grid_shape) for d in range(t.rank))
            self._piece_ranges[key] = got
        return got

    def piece_shape(self, t: TensorType, rank: int) -> tuple[int, ...]:
        return tuple(length for _, length in self.piece_ranges(t, rank))

    def piece_count(self, t: TensorType, rank: int) -> int:
        return math.prod(self.piece_shape(t, rank))

    def add_kernel(self, kernel: Kernel, key: KernelKey | None = None) -> str:
        """Add a kernel to the translation unit; an identical kernel (the same computation
        under another kernel name, e.g. the same chain on tensors of other sizes or another
        layer's) is reused. Returns its name. `key`: the kernel's key, where the caller has it.

        Kernels are compared by structure up to naming (`structural_key` without comments:
        what they print with positional variable names), so the names of their parameters,
        inputs and the values their comments name do not matter (a kernel shared by several
        sites prints its first site's). Nothing is printed to compare them."""
        if key is None:
            key = structural_key(kernel, comments=False)
        if key in self.kernel_keys:
            return self.kernel_keys[key]
        if kernel.name not in self.kernel_names:
            self.kernel_names.add(kernel.name)
            self.kernels.append(share_encodings(kernel))
            self.kernel_keys[key] = kernel.name
        return kernel.name

    def emit(self, step: Step) -> None:
        step.stream = self.stream
        self.steps.append(step)

    # -- driver ------------------------------------------------------------------------------

    def run(self) -> Plan:
        arguments: dict[str, Buffer] = {}
        for arg in self.program.arguments:
            buf = self.new_buffer(arg.name, arg.type, kind="arg")
            buf.symmetric = arg.symmetric  # the caller keeps it there (input_buffer)
            self.buffers[arg.value] = buf
            arguments[arg.name] = buf
        outputs: dict[str, Buffer] = {}
        # ops computed where they are read (decisions.py `coco-defer`), not where they stand
        self.deferred = {op for op in self.program.func.walk() if deferral_of(op) is not None}
        for op in self.program.func.body.block.ops:
            if op in self.deferred:
                continue  # computed inside the kernels reading it (or where a buffer is asked)
            if _dead(op):
                continue  # a pure op nobody reads: a kernel of it would compute and store nothing
            if isinstance(op, func.ReturnOp):
                for i, v in enumerate(op.arguments):
                    outputs[v.name_hint or f"result{i}"] = self.value_buffer(v)
                continue
            self.lower_op(op)
        for out in self.outputs:
            if out.updated_argument:
                outputs[out.name] = arguments[out.name]
        outputs = {k: outputs[k] for k in [o.name for o in self.outputs]}
        if self.config.batch:
            self.steps = TableBatcher(
                self.batchable_kernels,
                self.collective_kernels,
                self.fresh,
                self.kernels,
                self.kernel_names,
            ).batch(self.steps)
        plan = Plan(
            self.program.name,
            self.grid_shape,
            self.all_buffers,
            self.steps,
            print_unit(self.kernels),
            arguments,
            outputs,
            {k.name: kernel_signature(k) for k in self.kernels},
            self.nodes,
        )
        # A kernel given a buffer of narrower elements than it accesses runs past it: never
        # run such a plan (a lowering bug, reported as one).
        if errors := pointer_width_errors(plan):
            raise CocoError(f"internal: the plan's buffers do not fit its kernels: {errors[0]}")
        return plan

    # -- scattered tensors -----------------------------------------------------------------

    def value_buffer(self, v: SSAValue) -> Buffer:
        if v not in self.buffers and isinstance(v.owner, Operation) and v.owner in self.deferred:
            # A deferred scalar some step reads from memory after all: computed here, before
            # that step (its operands are arguments or deferred scalars in turn).
            self.lower_op(v.owner)
        if v not in self.buffers:
            raise CocoError(f"internal: no buffer holds {v.name_hint or v}")
        return self.buffers[v]

    # -- scalars computed where they are read ------------------------------------------------

    def rematerialized(
        self, values: Sequence[SSAValue], computed: Collection[Operation] = ()
    ) -> list[Operation]:
        """The deferred ops (scalar arithmetic, slices of arguments) a kernel reading `values`
        computes itself: those not in memory already and not among the kernel's own ops
        (`computed`), in program order."""
        found: set[Operation] = set()

        def visit(v: SSAValue) -> None:
            op = v.owner
            if op in self.deferred and v not in self.buffers and op not in found:
                assert isinstance(op, Operation)
                if op in computed:
                    return
                found.add(op)
                for u in op.operands:
                    visit(u)

        for v in values:
            visit(v)
        if not found:
            return []
        if self.program_order is None:
            # once per lowering (the program does not change under it), not per kernel
            self.program_order = {op: i for i, op in enumerate(self.program.func.walk())}
        return sorted(found, key=self.program_order.__getitem__)

    def lower_op(self, op: Operation) -> None:
        match op:
            case coco.ElementwiseOp() | coco.ConstantOp():
                self.lower_elementwise([op], kernel_hint=op.name.split(".")[1])
            case comm.FusedOp() if op.kind.data == comm.FusionKind.ELEMENTWISE:
                self.lower_fused_elementwise(op)
            case comm.FusedOp() if op.kind.data == comm.FusionKind.SEND:
                lower_fused_send(self, op)
            case comm.FusedOp() if op.kind.data == comm.FusionKind.REDUCTION:
                lower_fused_reduction(self, op)
            case comm.FusedOp() if op.kind.data in (
                comm.FusionKind.ALL_TO_ALL,
                comm.FusionKind.ALL_GATHER,
            ):
                lower_fused_all_to_all(self, op)
            case comm.FusedOp():
                lower_fused_collective(self, op)
            case comm.OverlapOp():
                lower_overlap(self, op)
            case coco.ReduceOp():
                self.lower_reduction(op)
            case coco.ReduceDimsOp():
                self.lower_reduce_dims(op)
            case coco.ReshapeOp():
                # the same bytes under another shape: a copy keeps buffers single-typed
                self.emit(Copy(self.value_buffer(op.input), self.buffer_for(op.result)))
            case coco.MatmulOp():
                self.emit(
                    Matmul(
                        self.value_buffer(op.lhs),
                        self.value_buffer(op.rhs),
                        self.buffer_for(op.result),
                    )
                )
            case coco.SliceOp():
                self.lower_elementwise([op], kernel_hint="slice")
            case coco.UpdateOp():
                self.lower_update(op)
            case comm.CollectiveOp():
                self.lower_collective(op)
            case _:
                raise CocoError(f"cannot lower {op.name} to the plan")

    # -- elementwise kernels -----------------------------------------------------------------

    def iteration_type(
        self, ops: Sequence[Operation], types: Sequence[TensorType] | None = None
    ) -> TensorType:
        if types is None:
            types = [tensor_type_of(r) for op in ops for r in op.results]
        try:
            return infer_elementwise(types, same_element_type=False)
        except VerifyException as e:
            raise CocoError(
                f"[lower-fused-layouts] cannot compute {', '.join(o.name for o in ops)} in one "
                f"kernel: their results have incompatible layouts ({e})"
            ) from None

    def lower_elementwise(
        self,
        ops: Sequence[Operation],
        kernel_hint: str,
        stores: Sequence[SSAValue] | None = None,
        updates: Sequence[coco.UpdateOp] = (),
    ) -> None:
        """One kernel computing `ops`; stores the values used after it (or `stores`) and
        writes `updates` (inside a fused region) into the caller's buffers."""
        inside = {r for op in ops for r in op.results}
        inputs: list[SSAValue] = []
        for op in ops:
            for v in op.operands:
                if v not in inside and v not in inputs:
                    inputs.append(v)
        if stores is None:
            stores = [r for op in ops for r in op.results]
        # A fused region may compute nothing (everything in it was erased, or it only
        # yields or updates values from outside): iterate over what it stores, if anything.
        results = iteration_values([r for op in ops for r in op.results], ops)
        types = [tensor_type_of(r) for r in results]
        types = types or [tensor_type_of(v) for v in stores] + [u.target.type for u in updates]
        if not types:
            return
        iteration = self.iteration_type(ops, types)
        store_specs = [Store(v, tensor_type_of(v)) for v in stores]
        store_specs += [Store(u.value, u.target.type, u.target) for u in updates]
        store_buffers = [self.buffer_for(v) for v in stores]
        store_buffers += [self.value_buffer(u.target) for u in updates]
        name, kernel, params = self.elementwise_kernel(
            self.fresh(f"k_{kernel_hint}"), ops, iteration, inputs, store_specs
        )
        self.batchable_kernels.setdefault(name, kernel)
        n = int(np.prod(iteration.local_shape(self.grid_shape), dtype=np.int64))  # the largest
        args = self.kernel_args(params, iteration, store_buffers)
        self.emit(
            Launch(
                name,
                self.config.grid_for(n),
                self.config.block,
                args,
                writes=tuple(b.name for b in store_buffers),
                range_positions=range_positions(params),
                iteration_shape=iteration.local_shape(self.grid_shape),
                iteration_type=iteration,
            )
        )

    def elementwise_kernel(
        self,
        kernel_name: str,
        ops: Sequence[Operation],
        iteration: TensorType,
        inputs: Sequence[SSAValue],
        stores: Sequence[Store],
    ) -> tuple[str, Kernel, Sequence[Param]]:
        """The name of the kernel computing `ops` (built, or an earlier site's: kernel_site.py),
        the kernel, and its parameters pointed at this site's values."""
        site = kernel_site(ops, iteration, inputs, stores) if self.memoize_kernels else None
        built = self.built_kernels.get(site.key) if site is not None else None
        if site is not None and built is not None:
            kernel, first, name = built
            params = site.params_of(first, kernel.params)
            if params is not None:
                return name, kernel, params
        kernel = ElementwiseKernel(kernel_name, ops, iteration, inputs, stores).build()
        name = self.add_kernel(kernel)
        if site is not None:
            self.built_kernels[site.key] = (kernel, site, name)
        return name, kernel, kernel.params

    def kernel_args(
        self, params: Sequence[Param], iteration: TensorType, store_buffers: list[Buffer]
    ) -> list[KernelArg]:
        it = iteration
        args: list[KernelArg] = []
        outs = iter(store_buffers)
        for p in params:
            match p.kind:
                case ParamKind.IN:
                    assert p.value is not None
                    args.append(self.value_buffer(p.value))
                case ParamKind.OUT:
                    args.append(next(outs))
                case ParamKind.BEGIN:
                    args.append(0)
                case ParamKind.END:
                    args.append(self.per_rank("count", lambda r: self.piece_count(it, r), it))
                case ParamKind.DIM:
                    assert p.dim is not None
                    dims = slice(p.dim, p.dim + p.span)
                    args.append(
                        self.per_rank(
                            f"dim{p.dim}",
                            lambda r, dims=dims: math.prod(self.piece_shape(it, r)[dims]),
                            (it, p.span),
                        )
                    )
                case ParamKind.STRIDE:
                    assert p.value is not None
                    assert p.dim is not None
                    t = tensor_type_of(p.value)
                    first = p.dim - (it.rank - t.rank) + 1
                    args.append(
                        self.per_rank(
                            f"stride{p.dim}",
                            lambda r, t=t, first=first: math.prod(self.piece_shape(t, r)[first:]),
                            (t, first),
                        )
                    )
                case ParamKind.BASE:
                    v = p.value
                    assert v is not None
                    args.append(
                        self.rank_table(
                            "base",
                            lambda r, v=v: self.base_offset(tensor_type_of(v), it, r),
                            (tensor_type_of(v), it),
                            name=f"base_{v.name_hint or 'v'}",
                        )
                    )
                case ParamKind.BLOCK_START:
                    v, d = p.value, p.dim
                    assert v is not None
                    assert d is not None
                    t = tensor_type_of(v)
                    args.append(
                        self.per_rank(
                            f"bstart{d}",
                            lambda r, t=t, d=d: self.block_start(t, it, d, r),
                            (t, it, d),
                        )
                    )
                case ParamKind.GSTART:
                    d = p.dim
                    assert d is not None
                    # the collapsed dims after d are whole: a start along d is that many of
                    # their products along the collapsed dim
                    inner = math.prod(it.get_shape()[d + 1 : d + p.span])
                    args.append(
                        self.rank_table(
                            f"start{d}",
                            lambda r, d=d, inner=inner: self.piece_ranges(it, r)[d][0] * inner,
                            (it, inner),
                        )
                    )
                case ParamKind.GOFFSET:
                    stride0 = int(np.prod(it.get_shape()[1:], dtype=np.int64))
                    args.append(
                        self.rank_table(
                            "goffset",
                            lambda r, s0=stride0: self.piece_ranges(it, r)[0][0] * s0,
                            it,
                        )
                    )
                case ParamKind.SEED:
                    assert p.value is not None
                    dropout = p.value.owner
                    assert isinstance(dropout, coco.DropoutOp)
                    args.append(seed_word(dropout.seed.value.data))
                case ParamKind.STREAM:
                    assert p.value is not None
                    t = tensor_type_of(p.value)
                    args.append(
                        self.rank_table(
                            "stream",
                            lambda r, t=t: V.stream_index(t, self.coords[r], self.grid_shape),
                            t,
                        )
                    )
                case _:
                    # the fused-collective lowerings fill their own kinds of parameter (peers,
                    # flags, partials, ...) and hand this function the rest
                    pass
        return args

    def block_start(self, t: TensorType, it: TensorType, d: int, rank: int) -> int:
        """What a block scale `t` adds to the local coordinate along iteration dim d before
        dividing it by the block (kernels/spec.py Operand.blocks): the global start of rank
        `rank`'s iteration piece less block times that of its piece of `t`."""
        od = d - (it.rank - t.rank)
        block = it.get_shape()[d] // t.get_shape()[od]
        return self.piece_ranges(it, rank)[d][0] - block * self.piece_ranges(t, rank)[od][0]

    def base_offset(self, t: TensorType, it: TensorType, rank: int) -> int:
        """Offset into rank `rank`'s piece of `t` of the iteration piece's first element
        (along a block scale's block dims, block_start)."""
        gap = it.rank - t.rank
        local = self.piece_shape(t, rank)
        t_ranges, it_ranges = self.piece_ranges(t, rank), self.piece_ranges(it, rank)
        t_shape, it_shape = t.get_shape(), it.get_shape()
        offset = 0
        for d in range(t.rank):
            if t_shape[d] < it_shape[d + gap]:  # broadcast (1), or a block scale's block dim
                continue
            start_it, start_t = it_ranges[d + gap][0], t_ranges[d][0]
            offset += (start_it - start_t) * math.prod(local[d + 1 :])
        return offset

    def lower_fused_elementwise(self, op: comm.FusedOp) -> None:
        body = [o for o in op.body.block.ops if not isinstance(o, comm.YieldOp)]
        updates = [o for o in body if isinstance(o, coco.UpdateOp)]
        compute = [o for o in body if not isinstance(o, coco.UpdateOp)]
        yielded = list(op.yield_op.values)
        for res, v in zip(op.res, yielded):
            self.buffers[res] = self.buffer_for(v)
        # A value from outside the region is not computed here: a yielded one is the
        # region's result as it is (its buffer, set above), an update of one is a copy.
        inside = {r for o in compute for r in o.results}
        direct: list[coco.UpdateOp] = []
        copied: list[coco.UpdateOp] = []
        for u in updates:
            (direct if u.target.type == u.value.type and u.value in inside else copied).append(u)
        stored = [v for v in yielded if v in inside] + [
            u.value for u in copied if u.value in inside
        ]
        self.lower_elementwise(compute, "fused", stores=stored, updates=direct)
        for u in copied:
            self.emit(Copy(self.value_buffer(u.value), self.value_buffer(u.target)))
        for u in direct:
            self.updated[u.target.name_hint or ""] = self.value_buffer(u.target)

    # -- reductions, updates, collectives ---------------------------------------------------

    def lower_reduction(self, op: coco.ReduceOp) -> None:
        elt = op.input.type.elt
        kind = op.kind.data
        name = f"k_reduce_{kind}_{elt}"
        if name not in self.kernel_names:
            self.kernel_names.add(name)
            for kernel in reduction_kernels(name, kind, elt):
                self.add_kernel(kernel)
                self.batchable_kernels[kernel.name] = kernel
        x = self.value_buffer(op.input)
        grid = self.config.grid_for(x.count)  # the largest piece's
        n = self.per_rank("count", x.count_at)
        acc = {F32: "f32", F64: "f64"}.get(reduce_accumulator(elt, kind), "i64")
        partials = self.new_buffer(
            f"{op.result.name_hint or 'r'}_partials",
            op.result.type,
            kind="scratch",
            elt=acc,
            shape=(grid,),
        )
        out = self.buffer_for(op.result)
        acc_bytes = 4 if acc == "f32" else 8
        self.emit(
            Launch(
                f"{name}_partial",
                grid,
                self.config.block,
                [x, partials, n],
                shared_bytes=acc_bytes * self.config.block,
                writes=(partials.name,),
            )
        )
        self.emit(Launch(f"{name}_finish", 1, 1, [partials, grid, out], writes=(out.name,)))

    def lower_reduce_dims(self, op: coco.ReduceDimsOp) -> None:
        """One row-reduction kernel (kernels.reductions): a block per row, or a thread per row
        where rows are short or strided (`column_form`); the same bits either way."""
        elt = op.input.type.elt
        kind = op.kind.data
        first, last = op.reduced_dims[0], op.reduced_dims[-1]
        t = op.input.type

        def extents(rank: int) -> tuple[int, int, int]:
            """(rows, count, inner) of this rank's piece: an unevenly cut dim gives ranks
            pieces of different extents, so each reads its own (a literal of the largest
            piece made smaller ranks read past theirs)."""
            shape = self.piece_shape(t, rank)
            outer, inner = math.prod(shape[:first]), math.prod(shape[last + 1 :])
            return outer * inner, math.prod(shape[first : last + 1]), inner

        table = [extents(r) for r in range(self.size)]
        key = (t, first, last)
        rows, count, inner = (
            self.per_rank(label, lambda r, i=i: table[r][i], key)
            for i, label in enumerate(("rows", "count", "inner"))
        )
        most_rows = max(r for r, _, _ in table)
        out = self.buffer_for(op.result)
        column = column_form(most_rows, max(c for _, c, _ in table), max(i for _, _, i in table))
        make = column_reduction_kernel if column else row_reduction_kernel
        name = self.add_kernel(make(self.fresh(f"k_reduce_dims_{kind}_{elt}"), kind, elt))
        if column:
            block = self.config.block
            grid = max(1, min(self.config.max_blocks, -(-most_rows // block)))
        else:
            block, grid = coco.ROW_LANES, max(1, min(self.config.max_blocks, most_rows))
        self.emit(
            Launch(
                name,
                grid,
                block,
                [self.value_buffer(op.input), out, rows, count, inner],
                writes=(out.name,),
            )
        )

    def lower_update(self, op: coco.UpdateOp) -> None:
        target = self.value_buffer(op.target)
        self.emit(Copy(self.value_buffer(op.value), target))

    def lower_collective(self, op: comm.CollectiveOp, rows: tuple[int, int] | None = None) -> None:
        src = self.value_buffer(op.input)
        dst = self.buffer_for(op.result)
        step = Collective(
            op.name.split(".")[1],
            src,
            dst,
            kind=op.combining_kind(),
            axes=op.span(),
            root=op.root_rank(),
            rows=rows,
            acc=comm.accumulation(op),
        )
        if isinstance(op, comm.SendOp):
            step.axes = ()
            step.along = op.along.value.data
            step.shift = op.shift.value.data
        self.emit(step)


def _dead(op: Operation) -> bool:
    """A pure elementwise op or constant whose results nothing reads."""
    return isinstance(op, coco.ElementwiseOp | coco.ConstantOp) and all(
        not r.uses for r in op.results
    )


@without_gc
def lower(
    program: Program,
    ranks: int | None = None,
    config: LaunchConfig | None = None,
    nodes: Sequence[int] = (),
    in_place: bool = False,
) -> Plan:
    """The plan of `program` on `ranks` ranks (the grid's static size when omitted), whose
    rank r lives on node `nodes[r]` (runtime/symmetric.py `job_nodes`; () is one node):
    fused collectives over groups that span nodes run hierarchically. The lowering's
    decisions (decisions.py) are made on a copy of `program`, or on `program` itself where
    `in_place` says it was made for this call alone."""
    grid = program.grid
    if ranks is None:
        ranks = default_ranks(program)
    try:
        grid_shape = grid.bind(ranks)
    except ValueError as e:
        raise CocoError(f"@{program.name}: {e}") from None
    check_program_on_grid(program, grid_shape)
    return Lowering(program, grid_shape, config or LaunchConfig(), nodes, in_place).run()


__all__ = [
    "COMM_STREAM",
    "LaunchConfig",
    "Lowering",
    "RecordEvent",
    "WaitEvent",
    "default_ranks",
    "lower",
]
