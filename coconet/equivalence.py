"""Translation validation: does a scheduled program mean what the unscheduled one meant?

`check_equivalence(before, after)` runs both programs in the sim oracle on the same seeded
random inputs (drawn from `before`'s signature, as logical values: core/values.py) for
several rank counts and seeds, and compares every output by name. Outputs are logical values,
so a schedule that keeps a replicated argument sliced (as-slice) still compares equal.

Matching. Updated arguments match by argument name. Returned values match by position in
`func.return` (a function's results are positional; the name a pass gives a new SSA value is
cosmetic) and are reported under `before`'s name. A missing or extra output is a mismatch.

Exactness (docs/architecture.md §3.4). The sim's collectives accumulate in f64 (int64) in rank
order and round once, whatever the schedule, and each op rounds to its element type exactly as the
unscheduled op did; so a schedule that keeps the order of every reduction computes
bit-identical results, and by default the check demands bit identity (any NaN equals any NaN;
-0.0 and 0.0 differ). One kind of schedule does change an order: a full sum or norm of a
value that reorder moves onto slices becomes per-rank partials (rounded to the element type)
combined by an all_reduce. Outputs downstream of such a reassociated reduction are compared
within the per-dtype tolerances of `TOLERANCES`, and the report names the reductions;
everything else stays bit-exact (`allow_reassociation=False` makes it all bit-exact). So are
outputs downstream of an op under the `fast` numerics policy (docs/architecture.md §3.4.2) in
either program, with at least f32's tolerance (such an op computes in f32, within a few f32
ulps of the exact result): the report names those ops (`fast`). With
`exact=False` every output gets the tolerances, for backends that reorder collectives (NCCL
rings, f32 accumulation).

Rank counts a program cannot take (a `[2, ?]` grid on 1 rank, a sliced dim that does not divide)
are skipped and listed in the report, not failed. A rank count that `before` takes but `after`
does not (a pass sliced a dim that does not divide on that many ranks, on a grid sized at
launch) is listed as narrowed: the schedule is not wrong where it runs, but runs in fewer places.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.utils.exceptions import DiagnosticException

from coconet.core.path_tolerances import downstream, loosest, path_tolerances, tightest
from coconet.core.program import CocoError, Program, argument_name, check_program_on_grid
from coconet.core.tolerances import EXACT, TOLERANCES, Tolerance
from coconet.core.values import bits_dtype
from coconet.dialects.coco import ScaleOp, TensorType
from coconet.dialects.reduction import Reduction

# -- bit patterns, for the exact comparison ----------------------------------------------------

_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _is_float(a: np.ndarray) -> bool:
    """NumPy's floats and ml_dtypes' (bf16, fp8: kind 'V' to NumPy)."""
    return a.dtype.kind == "f" or bits_dtype(a.dtype) is not None


def _isnan(a: np.ndarray) -> np.ndarray:
    if not _is_float(a):
        return np.zeros(a.shape, dtype=bool)
    return np.isnan(a.astype(np.float64))


def _bitwise_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise bit identity, except that any NaN equals any NaN (payloads and signs of
    NaNs are not part of a program's meaning)."""
    if a.dtype.kind == "b":
        return a == b
    if a.dtype.itemsize not in _BITS:
        return a == b
    bits = _BITS[a.dtype.itemsize]
    # ascontiguousarray would make a 0-d array 1-d: keep the shape
    a_bits = np.ascontiguousarray(a).view(bits).reshape(a.shape)
    b_bits = np.ascontiguousarray(b).view(bits).reshape(b.shape)
    same = a_bits == b_bits
    if _is_float(a):
        same |= _isnan(a) & _isnan(b)
    return same


def _close(a: np.ndarray, b: np.ndarray, tol: Tolerance) -> np.ndarray:
    """Where `a` (after) is within `tol` of `b` (before)."""
    if tol.exact or not _is_float(a):
        return _bitwise_equal(a, b) if tol.exact else (a == b)
    x, y = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(all="ignore"):
        ok = np.abs(x - y) <= tol.atol + tol.rtol * np.abs(y)
    ok |= x == y  # equal infinities
    ok |= np.isnan(x) & np.isnan(y)
    return ok


def _errors(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Max absolute and relative error of `a` against `b`. A NaN against a number, or an
    infinity against anything else, counts as an infinite error; a nonzero error against an
    exact zero is an infinite relative error."""
    if a.size == 0:
        return 0.0, 0.0
    x = a.astype(np.float64) if a.dtype.kind != "b" else a.astype(np.int64).astype(np.float64)
    y = b.astype(np.float64) if b.dtype.kind != "b" else b.astype(np.int64).astype(np.float64)
    with np.errstate(all="ignore"):
        err = np.abs(x - y)
        both_nan = np.isnan(x) & np.isnan(y)
        err = np.where(both_nan | (x == y), 0.0, err)
        err = np.where(np.isnan(err), np.inf, err)
        rel = np.where(err == 0, 0.0, err / np.abs(y))
        rel = np.where(np.isnan(rel), np.inf, rel)
    return float(err.max()), float(rel.max())


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------


@dataclass
class Mismatch:
    """One output that differs (or could not be compared) at one rank count and seed.

    `kind`: `value` (elements differ), `missing` (`after` lacks the output), `extra` (`after`
    has an output `before` lacks), `shape` / `dtype` (the logical values do not even have the
    same shape or element type), `signature` (`after` cannot take `before`'s inputs), `error`
    (`after` failed to run where `before` ran), `ambiguous` (two different outputs share a
    name, so they cannot be compared; `ranks` is 0: no run was made).
    """

    output: str
    ranks: int
    seed: int | None
    kind: str = "value"
    rank: int | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    num_different: int = 0
    num_elements: int = 0
    example: str = ""
    detail: str = ""

    def __str__(self) -> str:
        where = f" at {self.ranks} rank(s)" if self.ranks else ""
        where += "" if self.seed is None else f", seed {self.seed}"
        head = f"output '{self.output}'{where}: "
        if self.kind != "value":
            return head + self.detail
        parts = [f"{self.num_different} of {self.num_elements} element(s) differ"]
        if self.rank is not None:
            parts.append(f"first differing rank {self.rank}")
        parts.append(
            f"max abs error {self.max_abs_error:.6g}, max rel error {self.max_rel_error:.6g}"
        )
        if self.example:
            parts.append(self.example)
        if self.detail:
            parts.append(self.detail)
        return head + "; ".join(parts)


@dataclass
class Skip:
    """A rank count that was not compared, and why. `program` is `before` (the program itself
    cannot take that many ranks) or `after` (the schedule narrowed where it runs)."""

    ranks: int
    program: str
    reason: str

    def __str__(self) -> str:
        return f"{self.ranks} rank(s): {self.program} cannot run there: {self.reason}"


@dataclass
class EquivalenceReport:
    """The outcome for one function: `ok` when no output differs anywhere. `checked` lists
    the (rank count, seed) runs compared, `skipped` the rank counts not compared and why,
    `outputs` before's output names; `str(report)` is the human-readable report."""

    function: str
    exact: bool
    mismatches: list[Mismatch] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    checked: list[tuple[int, int | None]] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    # reductions the schedule reassociates (exact mode compares what they feed within tolerance)
    reassociated: list[str] = field(default_factory=list)
    # ops under the `fast` numerics policy (exact mode compares what they feed within tolerance)
    fast: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def narrowed(self) -> list[Skip]:
        """Rank counts `before` takes and `after` does not."""
        return [s for s in self.skipped if s.program == "after"]

    def mismatched_outputs(self) -> list[str]:
        return list(dict.fromkeys(m.output for m in self.mismatches))

    def summary(self) -> str:
        mode = "bit-exact" if self.exact else "within the tolerances of each output's path"
        ranks = sorted({r for r, _ in self.checked})
        runs = f"{len(self.checked)} run(s) on {', '.join(map(str, ranks)) or 'no'} rank count(s)"
        if self.exact and self.reassociated:
            mode += " except within tolerance downstream of reassociated " + ", ".join(
                self.reassociated
            )
        if self.exact and self.fast:
            mode += " except within tolerance downstream of fast-numerics " + ", ".join(self.fast)
        if self.ok:
            return f"@{self.function}: equivalent ({mode}; {runs})"
        return (
            f"@{self.function}: NOT equivalent ({mode}; {runs}): "
            f"{len(self.mismatches)} mismatch(es) in output(s) "
            + ", ".join(f"'{o}'" for o in self.mismatched_outputs())
        )

    def __str__(self) -> str:
        lines = [self.summary()]
        lines += [f"  {m}" for m in self.mismatches]
        if self.skipped:
            lines.append("  skipped:")
            lines += [f"    {s}" for s in self.skipped]
        return "\n".join(lines)

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise EquivalenceError(str(self))


class EquivalenceError(CocoError):
    """A schedule changed a program's meaning (the message is the report)."""


# --------------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------------

InputsArg = Mapping[str, np.ndarray] | Callable[[int, int | None], Mapping[str, np.ndarray]] | None


def _as_program(p: Program | ModuleOp) -> Program:
    return p if isinstance(p, Program) else Program(p)


def _tensor_values(program: Program) -> Iterable[tuple[str, TensorType]]:
    for i, a in enumerate(program.func.body.block.args):
        if isinstance(a.type, TensorType):
            yield f"argument %{a.name_hint or f'arg{i}'}", a.type
    for op in program.func.walk():
        for i, r in enumerate(op.results):
            if isinstance(r.type, TensorType):
                yield (f"%{r.name_hint}" if r.name_hint else f"result #{i} of {op.name}"), r.type


def _cannot_take(program: Program, ranks: int) -> str | None:
    """Why `program` cannot run on `ranks` ranks, or None if it can."""
    from coconet.dialects.layout_rules import check_block_cuts, check_bound_shapes

    try:
        grid_shape = program.grid.bind(ranks)
    except ValueError as e:
        return str(e)
    try:
        for what, t in _tensor_values(program):
            check_bound_shapes(t, grid_shape, what)
        for op in program.func.walk():
            if isinstance(op, ScaleOp):  # a block scale cut on a `?` axis
                s = op.scale.type
                check_block_cuts(s, op.result.type, grid_shape, f"{op.name} by {s}")
    except DiagnosticException as e:
        return str(e)
    try:  # what a launch checks too (an overlap's chunks need rows in every rank's piece)
        check_program_on_grid(program, grid_shape)
    except CocoError as e:
        return str(e)
    return None


@dataclass
class _Output:
    name: str  # the name to report (before's)
    key: str  # the name in the sim's result
    type: TensorType


def _outputs(program: Program) -> tuple[dict[str, _Output], list[_Output]]:
    """(updated arguments by name, returned values by position)."""
    updates: dict[str, _Output] = {}
    returns: list[_Output] = []
    for out in program.outputs:
        if out.updated_argument:
            updates[out.name] = _Output(out.name, out.name, out.type)
        else:
            returns.append(_Output(out.name, out.name, out.type))
    return updates, returns


def _partial_reductions(program: Program) -> list[Operation]:
    """Sums and norms over a sliced tensor: per-rank partials (which an all_reduce combines),
    so the order of the full reduction differs from one over the whole tensor."""
    from coconet.dialects.coco import ReduceOp, SlicedAttr

    return [
        op
        for op in program.func.walk()
        if isinstance(op, ReduceOp)
        and op.kind.data in (Reduction.SUM, Reduction.NORM)
        and any(isinstance(lay, SlicedAttr) for lay in op.input.type.layouts)
    ]


def _reassociations(before: Program, after: Program) -> tuple[list[str], dict[str, set[str]]]:
    """(the partial reductions `after` introduces, the output keys of `after` they feed, each
    with the element types its values pass through on the way: an f16 norm cast to an f32
    output carries f16's rounding, so the loosest of them bounds the difference).

    Max and min are order-independent and the sim's collectives keep rank order, so only a
    sum or norm split into partials changes how a result rounds. If `after` has no more
    partial reductions than `before`, nothing was reassociated."""
    partials = _partial_reductions(after)
    if len(partials) <= len(_partial_reductions(before)):
        return [], {}
    return [_op_label(op) for op in partials], downstream(after, partials)


def _op_label(op: Operation) -> str:
    return f"%{op.results[0].name_hint}" if op.results[0].name_hint else op.name


def _fast_ops(program: Program) -> list[Operation]:
    """The ops computing under the `fast` numerics policy (docs/architecture.md §3.4.2)."""
    from coconet.dialects.coco import is_fast

    return [op for op in program.func.walk() if is_fast(op)]


def _ambiguous_names(program: Program) -> list[str]:
    """Output names the sim cannot tell apart: it keys outputs by name, so two different
    values returned (or returned and updated) under one name would be compared wrongly."""
    from coconet.core.program import output_name
    from coconet.dialects.coco import UpdateOp

    sources: dict[str, set[int]] = {}
    for op in program.func.walk():
        if isinstance(op, UpdateOp):
            name = argument_name(op.target)
            sources.setdefault(name, set()).add(id(op.value))
    ret = program.func.body.block.last_op
    if isinstance(ret, func.ReturnOp):
        for i, v in enumerate(ret.arguments):
            sources.setdefault(output_name(v, i), set()).add(id(v))
    return [n for n, ids in sources.items() if len(ids) > 1]


def _copy_inputs(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.array(v, copy=True) for k, v in inputs.items()}


def _quiet_run(sim_run, program: Program, inputs: Mapping[str, np.ndarray], ranks: int):
    # NaNs and infinities are values like any other here (compared NaN == NaN); NumPy's
    # warnings about them, from the sim's own consistency checks, would only be noise.
    with np.errstate(all="ignore"):
        return sim_run(program, _copy_inputs(inputs), ranks=ranks, inplace=False)


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text if isinstance(e, CocoError | DiagnosticException) else f"{type(e).__name__}: {text}"


def check_equivalence(
    before: Program | ModuleOp,
    after: Program | ModuleOp,
    ranks: Sequence[int] = (1, 2, 4),
    seeds: Sequence[int] = (0, 1),
    inputs: InputsArg = None,
    *,
    exact: bool = True,
    tolerances: Mapping[str, Tolerance] | None = None,
    allow_reassociation: bool = True,
) -> EquivalenceReport:
    """Run `before` and `after` in the sim on the same inputs for every rank count in `ranks`
    and seed in `seeds`, and compare every output (see the module docstring).

    `before` is the reference: if it cannot run at a rank count (its grid or shapes do not
    fit, or the sim refuses it with a CocoError) that rank count is skipped; a crash of the
    sim on `before` is a bug and propagates. Anything `after` fails with is a mismatch.

    `inputs`: None draws seeded random logical inputs from `before`'s signature; a mapping of
    logical values is used as given (one run per rank count: seeds do not apply); a callable
    `(ranks, seed) -> mapping` supplies inputs per run.

    With `exact` (the default) outputs must be bit-identical where the schedule keeps the
    order of every reduction (docs/architecture.md §3.4). An output downstream of a reduction the
    schedule reassociates (a full sum or norm turned into per-slice partials and an
    all_reduce, as reorder does) is compared within `tolerances` instead, and the report
    names those reductions (`reassociated`); `allow_reassociation=False` demands bit
    identity there too. With `exact=False` every output is compared within `tolerances`
    (default `TOLERANCES`), for backends that reorder collectives.
    """
    from coconet.core.values import coords_of, piece_of
    from coconet.runtime.sim import prepare_inputs, run as sim_run

    before, after = _as_program(before), _as_program(after)
    tols = dict(TOLERANCES if tolerances is None else tolerances)
    report = EquivalenceReport(before.name, exact)
    b_updates, b_returns = _outputs(before)
    a_updates, a_returns = _outputs(after)
    report.outputs = [*b_updates, *(o.name for o in b_returns)]
    # after's output keys compared within tolerance in exact mode, with the element types
    # on their way from the reassociated reductions
    loosened: dict[str, set[str]] = {}
    if exact and allow_reassociation:
        report.reassociated, loosened = _reassociations(before, after)
    # outputs downstream of a `fast` op (of either program; docs/architecture.md §3.4.2): its
    # f32 result is within a few f32 ulps of the exact one, not equal to it
    fast_before: dict[str, set[str]] = {}
    fast_ops = _fast_ops(after)
    if exact:
        report.fast = list(dict.fromkeys(_op_label(op) for op in [*_fast_ops(before), *fast_ops]))
    # (tolerant comparisons too: a path that would otherwise compare exactly)
    fast_before = downstream(before, _fast_ops(before))
    for key, elts in downstream(after, fast_ops).items():
        loosened.setdefault(key, set()).update({"f32", *elts})

    # Tolerant comparisons (`exact=False`) take each output's tolerance from the ops on its
    # path in both programs (core/path_tolerances.py), the tighter where both have one: a
    # reduction whose accumulation either states is honoured bit for bit, so changing it is
    # a mismatch, not noise; an output no reduction feeds keeps its element type's.
    paths_before = path_tolerances(before, tols) if not exact else {}
    paths_after = path_tolerances(after, tols) if not exact else {}

    def tolerant(before_key: str, out: _Output) -> Tolerance:
        tol = tightest((paths_before.get(before_key), paths_after.get(out.key)))
        if tol is None:
            tol = loosest(tols, [out.type.elt])
        if out.key in loosened:  # a fast op on the path: at least f32's
            return max(tol, loosest(tols, loosened[out.key]), key=lambda t: (t.rtol, t.atol))
        return tol

    # Pairs (before's output, after's output or None); after's unmatched outputs are extra.
    pairs: list[tuple[_Output, _Output | None]] = []
    for name, out in b_updates.items():
        pairs.append((out, a_updates.get(name)))
    for i, out in enumerate(b_returns):
        pairs.append((out, a_returns[i] if i < len(a_returns) else None))
    extra = [o for n, o in a_updates.items() if n not in b_updates] + a_returns[len(b_returns) :]

    for which, p in (("original", before), ("transformed", after)):
        for name in _ambiguous_names(p):
            report.mismatches.append(
                Mismatch(
                    name,
                    0,
                    None,
                    "ambiguous",
                    detail=f"the {which} program has several different outputs named "
                    f"'{name}', which the sim cannot tell apart: rename one",
                )
            )
    if report.mismatches:
        return report

    run_seeds: Sequence[int | None] = [None] if isinstance(inputs, Mapping) else list(seeds)
    for n in ranks:
        if (why := _cannot_take(before, n)) is not None:
            report.skipped.append(Skip(n, "before", why))
            continue
        if (why := _cannot_take(after, n)) is not None:
            report.skipped.append(Skip(n, "after", why))
            continue
        grid_shape = before.grid.bind(n)
        for seed in run_seeds:
            try:
                if inputs is None:
                    given = prepare_inputs(before, None, grid_shape, seed or 0)
                elif isinstance(inputs, Mapping):
                    given = prepare_inputs(before, inputs, grid_shape)
                else:
                    given = prepare_inputs(before, inputs(n, seed), grid_shape)
                ref = _quiet_run(sim_run, before, given, n)
            except (CocoError, DiagnosticException) as e:
                # The program itself cannot run here (say, a root beyond a group's size).
                report.skipped.append(Skip(n, "before", _first_line(e)))
                break
            report.checked.append((n, seed))
            try:
                prepare_inputs(after, given, after.grid.bind(n))
            except (CocoError, DiagnosticException) as e:
                report.mismatches.append(
                    Mismatch(
                        "<inputs>",
                        n,
                        seed,
                        "signature",
                        detail=f"the transformed program cannot take the original's "
                        f"inputs: {_first_line(e)}",
                    )
                )
                continue
            try:
                got = _quiet_run(sim_run, after, given, n)
            except Exception as e:
                report.mismatches.append(
                    Mismatch(
                        "<run>",
                        n,
                        seed,
                        "error",
                        detail=f"the transformed program fails to run: {_first_line(e)}",
                    )
                )
                continue
            after_grid = got.grid_shape
            for b_out, a_out in pairs:
                if a_out is not None and b_out.key in fast_before:
                    loosened.setdefault(a_out.key, set()).update({"f32", *fast_before[b_out.key]})
                if a_out is None:
                    what = "updated argument" if b_out.name in b_updates else "returned value"
                    report.mismatches.append(
                        Mismatch(
                            b_out.name,
                            n,
                            seed,
                            "missing",
                            detail=f"the transformed program no longer produces this {what}",
                        )
                    )
                    continue
                m = _compare(
                    b_out.name,
                    ref.outputs[b_out.key],
                    got.outputs[a_out.key],
                    a_out.type,
                    [got.per_rank[r][a_out.key] for r in range(len(got.per_rank))],
                    after_grid,
                    n,
                    seed,
                    EXACT
                    if exact and a_out.key not in loosened
                    else loosest(tols, {a_out.type.elt, *loosened.get(a_out.key, ())})
                    if exact
                    else tolerant(b_out.key, a_out),
                    piece_of,
                    coords_of,
                )
                if m is not None:
                    if a_out.key in loosened and exact:
                        why = [
                            *(
                                ["the reassociated reduction(s) " + ", ".join(report.reassociated)]
                                if report.reassociated
                                else []
                            ),
                            *(
                                ["the fast-numerics op(s) " + ", ".join(report.fast)]
                                if report.fast
                                else []
                            ),
                        ]
                        m.detail = (m.detail + "; " if m.detail else "") + (
                            "beyond the tolerance allowed for " + " and ".join(why)
                        )
                    if a_out.name != b_out.name:
                        m.detail = (m.detail + "; " if m.detail else "") + (
                            f"compared with after's return value '{a_out.name}'"
                        )
                    report.mismatches.append(m)
            for o in extra:
                report.mismatches.append(
                    Mismatch(
                        o.name,
                        n,
                        seed,
                        "extra",
                        detail="the transformed program has an output the original lacks",
                    )
                )
    return report


def _fmt(x) -> str:
    if isinstance(x, np.bool_ | bool):
        return str(bool(x))
    if isinstance(x, np.integer | int):
        return str(int(x))
    return str(x)  # numpy's shortest round-trip text at the value's own precision


def _compare(
    name: str,
    want: np.ndarray,
    got: np.ndarray,
    got_type: TensorType,
    got_pieces: Sequence[np.ndarray],
    grid_shape: Sequence[int],
    ranks: int,
    seed: int | None,
    tol: Tolerance,
    piece_of,
    coords_of,
) -> Mismatch | None:
    if want.shape != got.shape:
        return Mismatch(
            name,
            ranks,
            seed,
            "shape",
            detail=f"logical shapes differ: before {list(want.shape)}, after {list(got.shape)} "
            "(a layout change that is not a relayout: local vs replicated/sliced?)",
        )
    if want.dtype != got.dtype:
        return Mismatch(
            name,
            ranks,
            seed,
            "dtype",
            detail=f"element types differ: before {want.dtype.name}, after {got.dtype.name}",
        )
    ok = _close(got, want, tol)
    if ok.all():
        return None
    bad = np.argwhere(~ok)
    idx = tuple(int(i) for i in bad[0])
    abs_err, rel_err = _errors(got[~ok], want[~ok])
    example = f"e.g. at {list(idx)}: before {_fmt(want[idx])}, after {_fmt(got[idx])}"
    detail = ""
    if abs_err == 0.0:
        detail = "values equal but bit patterns differ (signed zero?)"
    first_rank = None
    for r, piece in enumerate(got_pieces):
        expected = piece_of(want, got_type, coords_of(r, grid_shape), grid_shape)
        if piece.shape != expected.shape or not _close(piece, expected, tol).all():
            first_rank = r
            break
    return Mismatch(
        name,
        ranks,
        seed,
        "value",
        first_rank,
        abs_err,
        rel_err,
        int(bad.shape[0]),
        int(want.size),
        example,
        detail,
    )


# --------------------------------------------------------------------------------------------
# Whole modules (coco-opt --verify-equivalence)
# --------------------------------------------------------------------------------------------


def check_module_equivalence(
    before: ModuleOp,
    after: ModuleOp,
    ranks: Sequence[int] = (1, 2, 4),
    seeds: Sequence[int] = (0, 1),
    *,
    exact: bool = True,
    allow_reassociation: bool = True,
) -> list[EquivalenceReport]:
    """`check_equivalence` for every `func.func` of `before`, against the function of the same
    name in `after` (a function the pipeline removed is a mismatch)."""
    reports: list[EquivalenceReport] = []
    after_names = {f.sym_name.data for f in after.ops if isinstance(f, func.FuncOp)}
    for f in before.ops:
        if not isinstance(f, func.FuncOp) or f.is_declaration:
            continue
        name = f.sym_name.data
        if name not in after_names:
            report = EquivalenceReport(name, exact)
            report.mismatches.append(
                Mismatch(f"@{name}", 0, None, "missing", detail="the pipeline removed the function")
            )
            reports.append(report)
            continue
        reports.append(
            check_equivalence(
                Program(before, name),
                Program(after, name),
                ranks,
                seeds,
                exact=exact,
                allow_reassociation=allow_reassociation,
            )
        )
    return reports
