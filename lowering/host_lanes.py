"""The host form of a row phase (`RowLanes`): the row walked a tile of lanes at a time.

On a GPU thread t of a block takes lane t and walks its elements t, t + lanes, ... (neighbouring
threads read neighbouring elements). Printed as it is for the host, each lane walks the row
alone in a scalar loop with a stride: a row kernel ran at ~10 ns an element. The host form
interchanges the loops: for each run of `lanes` consecutive elements, one loop over the lanes,
which the C++ compiler vectorizes. Each lane still takes its elements in the same order, so
every accumulator sees the same values in the same order: the bits do not change.

The compiler vectorizes a loop with no loop inside it, so the body is cut at its loops (the
peer loops of a reduction from peers: `for p in 1..nranks: acc = acc + x_p[i]`); each piece
becomes its own loop over the lanes (a peer loop runs the lanes inside it), and a value one
piece declares and a later one reads lives in a tile of one entry per lane (as do the lanes'
accumulators, which `before` declares).
"""

from __future__ import annotations

from typing import Any

from coconet.lowering.kernel_ir import (
    Assign,
    Binary,
    Cast,
    Decl,
    Expr,
    For,
    Index,
    LaneLoop,
    Lit,
    LocalArray,
    RowLanes,
    Select,
    Stmt,
    Unary,
    Unused,
    Var,
    rewrite,
    uses,
)
from coconet.lowering.signature import I32, I64


def host_row_lanes(phase: RowLanes) -> tuple[Stmt, ...]:
    """`phase` as block-level host statements with the same results (see the module)."""
    lanes = Lit(str(phase.lanes))
    run = Var(I64, None, "run_")  # the first element of the current run of lanes
    k = Var(I32, None, "k_")  # the lane within the run
    width = Var(I64, None, "width_")  # the run's lanes (fewer in the last, partial run)
    pieces = _pieces(phase.body)
    inside = {s.var for piece in pieces for s in piece if isinstance(s, Decl)}

    # Values one piece declares and a later one reads: index arithmetic is recomputed there
    # (a tile of indices would make every load through it a gather); anything else, and the
    # lanes' accumulators, lives in a tile.
    recomputed: dict[Var, Decl] = {}
    carried: list[Var] = [s.var for s in phase.before if isinstance(s, Decl)]
    for n, piece in enumerate(pieces):
        later = tuple(pieces[n + 1 :])
        for s in piece:
            if isinstance(s, Decl) and uses(later, s.var):
                if s.const and s.init is not None and _arithmetic(s.init, inside):
                    recomputed[s.var] = s
                else:
                    carried.append(s.var)
    tiles = {v: Var(v.ctype, v.hint and f"{v.hint}_t", f"{v.fallback}_t") for v in carried}
    lane_of = {phase.lane: Cast(I64, k), phase.element: Binary("+", run, Cast(I64, k))}

    def in_tiles(stmts: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        def fn(x: Any) -> Any | None:
            if isinstance(x, Var):
                return Index(tiles[x], k) if x in tiles else lane_of.get(x)
            if isinstance(x, Unused):  # names only variables, which a tile or lane is not
                return Unused(tuple(v for v in x.vars if v not in tiles and v not in lane_of))
            return None

        # what a later piece reads is declared again there; a tile's declaration becomes a
        # store to its lane's entry
        again = [d for v, d in recomputed.items() if uses(stmts, v) and d not in stmts]
        stores: list[Stmt] = []
        for s in (*again, *stmts):
            if isinstance(s, Decl) and s.var in tiles:
                if s.init is not None:
                    stores.append(Assign(s.var, s.init))
            else:
                stores.append(s)
        return rewrite(tuple(stores), fn)

    def over_lanes(piece: tuple[Stmt, ...]) -> Stmt:
        if len(piece) == 1 and isinstance(piece[0], For):
            loop = piece[0]  # the lanes inside the peer loop
            return For(loop.var, loop.begin, loop.end, (over_lanes(loop.body),), loop.step)
        return LaneLoop(k, width, in_tiles(piece))

    left = phase.count - run
    walk = (
        Decl(width, Select(Binary("<", left, lanes), left, lanes)),
        *(over_lanes(piece) for piece in pieces),
    )
    return (
        *(LocalArray(tile, lanes) for tile in tiles.values()),
        LaneLoop(k, lanes, in_tiles(phase.before)),
        For(run, Lit("0"), phase.count, walk, step=lanes),
        LaneLoop(k, lanes, in_tiles(phase.after)),
    )


def _pieces(body: tuple[Stmt, ...]) -> list[tuple[Stmt, ...]]:
    """`body` cut before and after each loop in it (a loop is a piece of its own)."""
    out: list[tuple[Stmt, ...]] = []
    current: list[Stmt] = []
    for s in body:
        if isinstance(s, For):
            out += [tuple(current), (s,)] if current else [(s,)]
            current = []
        else:
            current.append(s)
    if current:
        out.append(tuple(current))
    return out


def _arithmetic(e: Expr, inside: set[Var]) -> bool:
    """Whether `e` is integer-or-float arithmetic on variables declared outside the body (the
    row, the element, parameters): no load, no call, nothing another piece computes."""
    if isinstance(e, Var):
        return e not in inside
    if isinstance(e, Lit):
        return True
    if isinstance(e, Binary):
        return _arithmetic(e.lhs, inside) and _arithmetic(e.rhs, inside)
    if isinstance(e, Unary | Cast):
        return _arithmetic(e.operand, inside)
    return False
