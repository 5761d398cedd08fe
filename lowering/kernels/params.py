"""An elementwise kernel's parameters (inputs, stores, a fused collective's peer tables,
flags and reductions, extents, strides and bases, dropout streams and seeds) and the
statements that give the element its coordinates and global index."""

from __future__ import annotations

import math

from coconet.dialects import coco
from coconet.dialects.coco import tensor_type_of
from coconet.lowering.kernel_ir import Cast, ConstArray, Decl, Expr, Lit, Param, Var, sum_of
from coconet.lowering.kernels.builder_state import BuilderState, Gather
from coconet.lowering.kernels.elements import C_COMPUTE, C_STORAGE, c_float, int_literal, is_float
from coconet.lowering.kernels.statements import value_hint
from coconet.lowering.signature import F64, I32, I64, U32, U64, ParamKind


class ParamBuilder(BuilderState):
    """The parameters and the element's coordinates."""

    def build_params(self) -> None:
        k, it = self.k, self.k.iteration
        # An update writes the buffer of an argument the kernel may also read (so does a
        # gathered value assembled in an argument): no pointer of such a kernel can promise
        # it is the only way to its memory.
        restrict = not any(s.target is not None for s in k.stores) and not k.gather_targets
        for n, v in enumerate(k.inputs):
            ctype = C_STORAGE[tensor_type_of(v).elt].ptr(const=True, restrict=restrict)
            p = self.param(ctype, value_hint(v, "_in"), f"in{n}", ParamKind.IN, value=v)
            self.operands[v] = k.operand_of(v, p, v.name_hint)
        for op in k.ops:
            if isinstance(op, coco.ConstantOp) and op.is_dense:
                self.dense_constant(op)
        outs = updates = 0
        for s in k.stores:
            if s.target is None:
                hint, fallback, outs = value_hint(s.value, "_out"), f"out{outs}", outs + 1
            else:
                hint, fallback, updates = value_hint(s.target, "_out"), f"upd{updates}", updates + 1
            ctype = C_STORAGE[s.type.elt].ptr(restrict=restrict)
            self.out_params.append(self.param(ctype, hint, fallback, ParamKind.OUT, value=s.value))
        table = U64.ptr(const=True, restrict=True)
        for n, (res, (src, _kind)) in enumerate(k.peer_reductions.items()):
            p = self.param(
                table, value_hint(src, "_peers"), f"rs{n}", ParamKind.PEERS_IN, value=src
            )
            self.peer_operands[res] = k.operand_of(src, p, src.name_hint)
        for n, (v, gathered) in enumerate(k.all_gathers):
            hint = value_hint(gathered, "_peers")
            p = self.param(table, hint, f"ag{n}", ParamKind.PEERS_OUT, value=gathered)
            operand = k.operand_of(gathered, p, gathered.name_hint)
            bases = self.param(
                I64.ptr(const=True, restrict=True),
                value_hint(gathered, "_bases"),
                f"ag{n}_bases",
                ParamKind.PEER_BASES,
                value=gathered,
            )
            dest = None
            target = k.gather_targets.get(gathered)
            if target is not None:
                # Not restrict: the kernel may read the argument too (its own piece).
                ctype = C_STORAGE[tensor_type_of(target).elt].ptr()
                dest = self.param(
                    ctype,
                    value_hint(target, "_out"),
                    f"ag{n}_out",
                    ParamKind.GATHER_OUT,
                    value=target,
                )
            piece_only = gathered in k.staged
            in_place = gathered in k.in_place
            assert dest is not None or not (piece_only or in_place), "no destination"
            self.gathers.append(
                Gather(v, operand, bases, dest, piece_only=piece_only, in_place=in_place)
            )
        for n, (_v, received) in enumerate(k.sends):
            hint = value_hint(received, "_peers")
            received_peers = self.param(
                table, hint, f"send{n}", ParamKind.SEND_PEERS, value=received
            )
            self.send_params.append(received_peers)
        if k.sends:
            self.send_to = self.param(I32, None, "send_to", ParamKind.SEND_TO)
            self.receives = self.param(I32, None, "receives", ParamKind.RECEIVES)
        self.counts: Param | None = None
        if k.uneven and k.all_gathers:
            self.counts = self.param(
                I64.ptr(const=True, restrict=True), None, "counts", ParamKind.PEER_COUNTS
            )
        for n, (_v, _kind, out) in enumerate(k.reductions):
            ctype = C_STORAGE[tensor_type_of(out).elt].ptr(restrict=True)
            self.red_params.append(
                self.param(ctype, value_hint(out, "_out"), f"red{n}", ParamKind.RED_OUT, value=out)
            )
        if k.reductions:
            self.partials = self.param(F64.ptr(restrict=True), None, "partials", ParamKind.PARTIALS)
            self.counter = self.param(U32.ptr(restrict=True), None, "counter", ParamKind.COUNTER)
            self.exchange = self.param(table, None, "exchange", ParamKind.EXCHANGE)
        if k.is_collective:
            self.flags = self.param(table, None, "flags", ParamKind.FLAGS)
            self.epoch_at = self.param(U32.ptr(restrict=True), None, "epoch_at", ParamKind.EPOCH)
            self.epoch = Var(U32, None, "epoch")
            self.me = self.param(I32, None, "me", ParamKind.ME)
            self.nranks = self.param(I32, None, "nranks", ParamKind.NRANKS)
        self.begin = self.param(I64, None, "begin", ParamKind.BEGIN)
        self.end = self.param(I64, None, "end", ParamKind.END)

        mapped = [*self.operands.values(), *self.peer_operands.values()]
        mapped += self.constants.values()
        mapped += [g.operand for g in self.gathers]
        self.need_coords = (
            any(not o.identity and not o.scalar and not o.linear for o in mapped)
            or self.need_global
            or any(not k.coincides(s.type, it) for s in k.stores)
        )
        groups = k.dim_groups()
        if self.need_coords:
            # The extent of every collapsed dim but the first (which no coordinate divides
            # by): a literal unless the rank's piece of it depends on the rank.
            self.dims = [None]
            for first, last in groups[1:]:
                if k.literal_shapes and not k.group_sliced((first, last)):
                    self.dims.append(Lit(str(math.prod(it.get_shape()[first : last + 1]))))
                else:
                    self.dims.append(
                        self.param(
                            I64,
                            None,
                            f"dim{first}",
                            ParamKind.DIM,
                            dim=first,
                            span=last - first + 1,
                        )
                    )
        # Uneven slices, strided pull: member q's element coordinates come from q's sizes.
        self.peer_dims: dict[int, Param] = {}
        if self.counts is not None and self.need_coords:
            table = I64.ptr(const=True, restrict=True)
            self.peer_dims = {
                g: self.param(
                    table,
                    None,
                    f"dims{first}",
                    ParamKind.PEER_DIMS,
                    dim=first,
                    span=last - first + 1,
                )
                for g, (first, last) in enumerate(groups)
                if g > 0 and isinstance(self.dims[g], Param)
            }
        for o in mapped:
            if o.identity or o.scalar:
                continue
            self.params += [s for s in o.strides if isinstance(s, Param)]
            self.params += [b[1] for b in o.blocks if b is not None and isinstance(b[1], Param)]
            assert o.base is not None
            self.params.append(o.base)
        if self.need_global:
            self.gstarts = [
                self.param(
                    I64, None, f"gstart{first}", ParamKind.GSTART, dim=first, span=last - first + 1
                )
                if k.group_sliced((first, last))
                else None
                for first, last in groups
            ]
        elif self.dropouts and self.dim0_iteration:
            self.goffset = self.param(I64, None, "goffset", ParamKind.GOFFSET)
        for n, op in enumerate(self.dropouts):
            self.streams.append(
                self.param(
                    U64,
                    value_hint(op.result, "_stream"),
                    f"stream{n}",
                    ParamKind.STREAM,
                    value=op.input,
                )
            )
            # The seed is an argument, not a literal: the layers of a deep model differ in
            # their dropouts' seeds only, and share one kernel.
            self.seeds.append(
                self.param(
                    U64, value_hint(op.result, "_seed"), f"seed{n}", ParamKind.SEED, value=op.result
                )
            )

    def dense_constant(self, op: coco.ConstantOp) -> None:
        """A dense constant's values become an array in the kernel's text (in the compute
        type, each value rounded to the element type), read at the element's position in
        the constant like an operand in memory: a slice or broadcast of it reads the
        matching values."""
        res = op.result
        elt = res.type.elt
        if is_float(elt):
            values = [c_float(v, elt) for v in op.values()]
        elif elt == "i1":
            values = [Lit("true" if v else "false") for v in op.values()]
        else:
            values = [int_literal(v, elt) for v in op.values()]
        array = Var(C_COMPUTE[elt], value_hint(res, "_values"), f"const{len(self.constants)}_")
        self.hoisted.append(ConstArray(array, tuple(values)))
        self.constants[res] = self.k.operand_of(res, array, res.name_hint)

    # -- the element's coordinates and global index -------------------------------------------

    def build_indices(self) -> None:
        it = self.k.iteration
        groups = self.k.dim_groups()
        if self.need_coords:
            self.coords = [Var(I64, None, f"c{first}") for first, _ in groups]
            self.index_stmts = self.coordinates(self.i, self.coords, self.dims)
            self.body += self.index_stmts
        if not self.dropouts:
            return
        self.gidx = Var(U64, None, "gidx_")
        if self.need_global:
            gshape = it.get_shape()
            terms: list[Expr] = []
            for (_first, last), c, start in zip(groups, self.coords, self.gstarts):
                gstride = math.prod(gshape[last + 1 :])
                at: Expr = c if start is None else c + start
                terms.append(Cast(U64, at) * Lit(f"{gstride}ull"))
            self.body.append(Decl(self.gidx, sum_of(terms)))
        elif self.dim0_iteration:
            assert self.goffset is not None
            self.body.append(Decl(self.gidx, Cast(U64, self.goffset + self.i)))
        else:
            self.body.append(Decl(self.gidx, Cast(U64, self.i)))
