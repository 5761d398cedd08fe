"""Each output's tolerance from the numerics of the ops on its path (docs/architecture.md
§3.4.3), for translation validation (coconet/equivalence.py) and `coco-run --check`
(runtime/check.py).

What can move a result between the sim and a schedule or backend is a reduction whose order
is not fixed: a collective with the default accumulation (f64, rounded once -- a library may
accumulate in the element type in its own order), a full reduction and a matmul. Such a
reduction's difference is rounded by every element type its value passes through on its way
to the output (an f32 output of a bf16 all_reduce carries bf16's rounding), so the loosest of
those types' tolerances bounds it. A reduction that states its accumulation (`acc`) is
honoured in rank order, bit for bit, by the sim and every lowering: it moves nothing, so an
output whose path holds only such reductions compares exactly even where a comparison is
tolerant (a wrong accumulation there is a mismatch, not noise).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from coconet.core.program import Program, argument_name, output_name
from coconet.core.tolerances import EXACT, Tolerance
from coconet.dialects import coco, comm
from coconet.dialects.reduction import Reduction


def downstream(program: Program, roots: Sequence[Operation]) -> dict[str, set[str]]:
    """The output keys of `program` that the results of `roots` feed, each with the element
    types its values pass through on the way."""
    # Forward closure over uses; through a region's yield to the region's results. A value
    # is visited again when it is reached through an element type not yet seen on it.
    seen: dict[SSAValue, frozenset[str]] = {}
    work = [(r, frozenset[str]()) for op in roots for r in op.results]
    keys: dict[str, set[str]] = {}
    ret = program.func.body.block.last_op
    while work:
        v, elts = work.pop()
        elt = getattr(v.type, "elt", None)
        elts = elts | {elt} if isinstance(elt, str) else elts
        if v in seen and elts <= seen[v]:
            continue
        seen[v] = seen.get(v, frozenset()) | elts
        for use in v.uses:
            user = use.operation
            if isinstance(user, coco.UpdateOp):
                keys.setdefault(argument_name(user.target), set()).update(elts)
            elif user is ret and isinstance(ret, func.ReturnOp):
                keys.setdefault(output_name(v, use.index), set()).update(elts)
            elif isinstance(user, comm.YieldOp):
                region_op = user.parent_op()
                if region_op is not None:
                    work.append((region_op.results[use.index], elts))
            else:
                work.extend((r, elts) for r in user.results)
    return keys


def loosest(tols: Mapping[str, Tolerance], elts: Iterable[str]) -> Tolerance:
    """The widest of the element types' tolerances (EXACT for types without one)."""
    found = [tols[e] for e in elts if e in tols]
    return max(found, key=lambda t: (t.rtol, t.atol), default=EXACT)


def tightest(found: Iterable[Tolerance | None]) -> Tolerance | None:
    """The narrowest of the tolerances found (None where none is): two programs' paths to
    one output, compared within what both allow."""
    given = [t for t in found if t is not None]
    return min(given, key=lambda t: (t.rtol, t.atol)) if given else None


def reorderable(op: Operation) -> bool:
    """Whether a backend may combine `op`'s terms in another order than the sim: a sum or
    product collective with the default accumulation, a full sum, norm or product, a matmul.
    (Max and min do not depend on the order; a stated accumulation is honoured in rank
    order.)"""
    if isinstance(op, comm.CollectiveOp):
        kind = op.combining_kind()
        return kind in (Reduction.SUM, Reduction.PROD) and comm.accumulation(op) is None
    if isinstance(op, coco.ReduceOp):
        return op.kind.data in (Reduction.SUM, Reduction.NORM, Reduction.PROD)
    return isinstance(op, coco.MatmulOp)


def stated(op: Operation) -> bool:
    return isinstance(op, comm.CollectiveOp) and comm.accumulation(op) is not None


def path_tolerances(program: Program, tols: Mapping[str, Tolerance]) -> dict[str, Tolerance]:
    """For the output keys a reduction feeds: the tolerance its path allows (the loosest of
    the element types that round a reorderable reduction's value on the way; EXACT where only
    reductions with a stated accumulation feed it). Keys absent: no reduction on the path."""
    ops = list(program.func.walk())
    out: dict[str, Tolerance] = {
        key: EXACT for key in downstream(program, [op for op in ops if stated(op)])
    }
    for key, elts in downstream(program, [op for op in ops if reorderable(op)]).items():
        out[key] = loosest(tols, elts)
    # An op under the `fast` numerics policy (§3.4.2) computes within a few f32 ulps of the
    # exact result: what it feeds is at least f32's.
    for key, elts in downstream(program, [op for op in ops if coco.is_fast(op)]).items():
        if key in out:
            out[key] = max(out[key], loosest(tols, {"f32", *elts}), key=_width)
    return out


def _width(t: Tolerance) -> tuple[float, float]:
    return t.rtol, t.atol
