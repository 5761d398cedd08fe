"""An elementwise kernel's element body: its values (loaded on first use, reduced from every
peer for a reduce_scatter, computed by each op in program order, values that do not depend on
the element hoisted out of the loop) and its stores, all_gather stores and fused sends."""

from __future__ import annotations

import numpy as np
from xdsl.ir import Operation, SSAValue

from coconet.core.elementwise import COMPARISONS
from coconet.dialects import coco, comm
from coconet.dialects.coco import tensor_type_of
from coconet.dialects.reduction import Reduction
from coconet.lowering.kernel_ir import (
    BLOCK_IDX,
    Assign,
    Binary,
    Cast,
    Combine,
    Decl,
    Expr,
    For,
    If,
    Index,
    Lit,
    Select,
    SendPush,
    Var,
    all_of,
    binary,
    peer,
    product_of,
    sum_of,
)
from coconet.lowering.kernels.builder_state import BuilderState, PeerReduction, VecAccess
from coconet.lowering.kernels.elements import (
    C_COMPUTE,
    C_STORAGE,
    accumulate_step,
    accumulator,
    arithmetic,
    c_float,
    cast_to,
    in_double,
    int_literal,
    is_float,
    load_expr,
    peer_accumulator,
    round_expr,
    round_from_double,
    scaled,
    store_expr,
    store_from_double,
)
from coconet.lowering.kernels.statements import call, thread_zero, value_hint
from coconet.lowering.signature import I32


class BodyBuilder(BuilderState):
    """The element body: values, then stores."""

    def ref(self, v: SSAValue) -> Var:
        """The variable holding `v` at this element, loading it on first use."""
        if v in self.local:
            return self.local[v]
        if v in self.peer_operands:
            return self.reduce_from_peers(v)
        if v in self.k.aliases:
            return self.alias(v)
        o = self.operands[v]
        var = Var(C_COMPUTE[tensor_type_of(v).elt], v.name_hint, f"x{len(self.local)}")
        decl = Decl(var, load_expr(tensor_type_of(v).elt, Index(o.param, self.index_of(o))))
        if o.scalar:
            self.hoisted.append(decl)
            self.invariant.add(var)
        else:
            self.body.append(decl)
            if self.contiguous(o):
                self.vec_loads[id(decl)] = VecAccess(
                    o.param,
                    self.index_of(o),
                    tensor_type_of(v).elt,
                    var.hint or var.fallback,
                    target=var,
                )
        self.local[v] = var
        return var

    def alias(self, res: SSAValue) -> Var:
        """A collective over a group of one member: its input's element, rounded to the
        result's type as the reduction over that one member rounds (reduce_from_peers)."""
        src = self.k.aliases[res]
        x = self.ref(src)
        elt, src_elt = tensor_type_of(res).elt, tensor_type_of(src).elt
        if elt == src_elt:
            self.local[res] = x
            return x
        owner = res.owner
        acc_elt = comm.accumulation(owner) if isinstance(owner, comm.CollectiveOp) else None
        var = Var(C_COMPUTE[elt], res.name_hint, f"x{len(self.local)}")
        rounded = load_expr(elt, store_from_double(elt, Cast(accumulator(src_elt, acc_elt), x)))
        self.body.append(Decl(var, rounded, comment=getattr(owner, "name", "")))
        self.local[res] = var
        return var

    def reduce_from_peers(self, res: SSAValue) -> Var:
        # A reduce_scatter computed in place: this rank's element, combined from every
        # peer's input in rank order in double (long long), rounded once, as in the sim.
        src, kind = self.k.peer_reductions[res]
        o = self.peer_operands[res]
        elt = tensor_type_of(src).elt
        owner = res.owner  # a reduce_scatter, or the one-shot form's all_reduce
        # A stated accumulation: float registers, each step rounded to it (the first peer's
        # value needs none: the verifier's [*-acc] makes the element type widen into it).
        acc_elt = comm.accumulation(owner) if isinstance(owner, Operation) else None
        acc_t = peer_accumulator(elt, acc_elt, Reduction(kind), self.k.group)
        fallback = f"x{len(self.local)}"
        acc = Var(acc_t, value_hint(res, "_acc"), f"{fallback}_acc")
        p = Var(I32, None, "p_")

        def item(rank: Expr) -> Expr:
            element = Index(peer(o.param, rank, C_STORAGE[elt], const=True), self.index_of(o))
            return Cast(acc_t, load_expr(elt, element))

        step = accumulate_step(acc_elt, Combine(Reduction(kind), acc_t, acc, item(p)))
        combine = Assign(acc, step)
        first = Decl(acc, item(Lit("0")), const=False)
        rest = For(p, Lit("1"), self.nranks, (combine,))
        self.body += [first, rest]
        self.peer_reads[id(first)] = PeerReduction(acc, Reduction(kind), o, elt, rest, acc_elt)
        var = Var(C_COMPUTE[tensor_type_of(res).elt], res.name_hint, fallback)
        # (a float accumulator widens exactly to the double this rounds from)
        rounded = load_expr(
            tensor_type_of(res).elt, store_from_double(tensor_type_of(res).elt, acc)
        )
        self.body.append(Decl(var, rounded, comment=getattr(owner, "name", "comm.reduce_scatter")))
        self.local[res] = var
        return var

    def build_ops(self) -> None:
        for n, op in enumerate(self.k.ops):
            self.compute(op, f"t{n}")

    def compute(self, op: Operation, fallback: str | None = None) -> Var:
        """Declare `op`'s result, rounded to its element type, named after its SSA name (or
        `fallback`, by default `t` and the count of values declared so far)."""
        args = [self.ref(v) for v in op.operands]
        res = op.results[0]
        elt = tensor_type_of(res).elt
        expr = self.expression(op, args)
        if isinstance(op, coco.SliceOp):
            # A re-indexing: the operand (of the same type) is on the type's grid already,
            # and the sim copies its bits (rounding again would quiet a signaling NaN).
            rounded = expr
        elif in_double(op):
            rounded = round_from_double(elt, expr)
        else:
            rounded = round_expr(elt, expr)
        var = Var(C_COMPUTE[elt], res.name_hint, fallback or f"t{len(self.local)}")
        comment = op.name + (f" %{res.name_hint}" if res.name_hint else "")
        decl = Decl(var, rounded, comment=comment)
        # Values that do not depend on the element (scalars: bias corrections, constants)
        # are computed once per block (per thread on a GPU), outside the element loop.
        element_wise = isinstance(op, coco.DropoutOp) or (
            res in self.constants and not self.constants[res].scalar
        )
        if not element_wise and all(a in self.invariant for a in args):
            self.hoisted.append(decl)
            self.invariant.add(var)
        else:
            self.body.append(decl)
        self.local[res] = var
        return var

    def expression(self, op: Operation, args: list[Var]) -> Expr:
        match op:
            case coco.BinaryOp() | coco.UnaryOp():
                return arithmetic(op, args)
            case coco.CmpOp():
                return Binary(COMPARISONS[op.predicate.data][1], args[0], args[1])
            case coco.SelectOp():
                return Select(args[0], args[1], args[2])
            case coco.SliceOp():
                # A re-indexing, not a computation: the operand is read at the slice's
                # coordinates by the iteration's index map.
                return args[0]
            case coco.CastOp():
                return cast_to(op.result.type.elt, args[0])
            case coco.ScaleOp():
                return scaled(op, args)
            case coco.ConstantOp() if op.is_dense:
                o = self.constants[op.result]
                return Index(o.param, self.index_of(o))
            case coco.ConstantOp():
                elt = op.result.type.elt
                if is_float(elt):
                    return c_float(op.number, elt)
                if elt == "i1":
                    return Lit("true" if op.number else "false")
                return int_literal(op.number, elt)
            case coco.DropoutOp():
                from coconet.core.counter_rng import dropout_threshold

                assert self.gidx is not None
                n = self.dropouts.index(op)
                stream, seed = self.streams[n], self.seeds[n]
                elt = op.result.type.elt
                prob = op.prob.value.data
                scale = np.array(
                    1.0 / (1.0 - prob), dtype=np.float64 if elt == "f64" else np.float32
                )
                sfx = "" if elt == "f64" else "f"
                keep = call(
                    "coco_dropout_keep",
                    seed,
                    self.gidx,
                    stream,
                    Lit(f"{dropout_threshold(prob)}u"),
                )
                return Select(keep, args[0] * Lit(scale.item().hex() + sfx), Lit(f"0.0{sfx}"))
            case _:
                raise NotImplementedError(f"no CUDA lowering for {op.name}")

    # -- stores and pushes -------------------------------------------------------------------

    def build_stores(self) -> None:
        it = self.k.iteration
        for s, p in zip(self.k.stores, self.out_params):
            var = self.ref(s.value)
            value = store_expr(s.type.elt, var)
            t = s.type
            if self.k.coincides(t, it):
                store = Assign(Index(p, self.i), value)
                self.body.append(store)
                self.vec_stores[id(store)] = VecAccess(
                    p, self.i, t.elt, p.hint or p.fallback, value=value
                )
                continue
            # A smaller (broadcast) result: written once, by the elements at coordinate 0 of
            # every (collapsed) dim it is broadcast along.
            kept = [not self.k.broadcast(t, it, last) for _first, last in self.k.dim_groups()]
            if not any(kept) and var in self.invariant:
                # A value of no element (a scale computed from an amax): stored once, by
                # thread 0 of block 0 outside the loops -- a guarded store in the element
                # loop kept the host compiler from vectorizing it (a quantize ran 4x slower).
                once = Assign(Index(p, Lit("0")), value)
                self.hoisted.append(thread_zero(once, also=binary("==", BLOCK_IDX, 0)))
                continue
            guards: list[Expr] = [
                binary("==", c, 0) for c, keep in zip(self.coords, kept) if not keep
            ]
            terms: list[Expr] = []
            for g, c in enumerate(self.coords):
                if not kept[g]:
                    continue
                inner: list[Expr] = []
                for e in range(g + 1, len(self.coords)):
                    extent = self.dims[e]
                    if kept[e] and extent is not None:
                        inner.append(extent)
                terms.append(product_of([c, *inner]))
            index = sum_of(terms) if terms else Lit("0")
            self.body.append(If(all_of(guards), (Assign(Index(p, index), value),)))
        for g in self.gathers:
            # all_gather: this rank's element goes to its place in its own symmetric gathered
            # buffer, where the peers pull it from after the done-flags (and into the
            # updated argument the gathered value is assembled in, if any).
            o = g.operand
            t = tensor_type_of(o.value)
            value = store_expr(t.elt, self.ref(g.value))
            index = self.index_of(o)
            # This rank's own gathered buffer, found once per block (a table lookup left in
            # the vector loop would be a load between its math and its stores).
            name = o.value.name_hint or o.param.fallback
            if not g.in_place:
                mine = Var(C_STORAGE[t.elt].ptr(), f"{name}_mine", "mine_")
                self.hoisted.append(Decl(mine, peer(o.param, self.me, C_STORAGE[t.elt])))
                g.mine = mine
                at = g.staged(self.i, index)
                own = Assign(Index(mine, at), value, comment="comm.all_gather")
                self.body.append(own)
                self.vec_stores[id(own)] = VecAccess(mine, at, t.elt, name, value=value)
            if g.dest is not None:
                # (in place: the argument peers pull from, so the gather's one store)
                comment = "comm.all_gather, in place" if g.in_place else ""
                store = Assign(Index(g.dest, index), value, comment=comment)
                self.body.append(store)
                dest = g.dest.hint or g.dest.fallback
                self.vec_stores[id(store)] = VecAccess(g.dest, index, t.elt, dest, value=value)

        for (v, received), table in zip(self.k.sends, self.send_params):
            # comm.send: the element goes straight into the receiver's buffer (between the
            # entry flags -- the receiver no longer reads its previous content -- and the
            # done flags, after which it may); a rank nobody sends to receives zeros.
            if not self.k.coincides(tensor_type_of(received), it):
                raise ValueError(f"a fused send of {received.type} over {it}")
            elt = tensor_type_of(received).elt
            storage = C_STORAGE[elt]
            value = store_expr(elt, self.ref(v))
            self.body.append(SendPush(table, self.send_to, self.i, value, storage))
            zero = store_expr(elt, c_float(0.0, elt) if is_float(elt) else Lit("0"))
            mine = Index(peer(table, self.me, storage), self.i)
            self.body.append(
                If(binary("==", self.receives, 0), (Assign(mine, zero, comment="no sender"),))
            )
