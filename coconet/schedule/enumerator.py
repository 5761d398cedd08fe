"""The enumerator: which named schedules a program is offered (each one dropped, with why),
and every legal schedule of the autotuner's space."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, overload

from xdsl.ir import Block, SSAValue

from coconet.core.program import CocoError, Program, check_program_on_grid
from coconet.dialects import coco, comm
from coconet.dialects.coco import TensorType
from coconet.schedule.errors import VERIFY_RULE, ScheduleError, schedule_error
from coconet.schedule.named import (
    NAMED_SCHEDULES,
    resolve_schedule_name,
    structure_refusal,
    try_named,
)
from coconet.schedule.recipes import EXCHANGE_CHUNKS
from coconet.schedule.steps import ScheduleSteps, as_program
from coconet.schedule.structure import (
    Structure,
    auto_split_dim,
    computed_gather,
    exchange_feeds_matmul,
    feeds_exchange,
)
from coconet.schedule.targets import top_level_named

# The rank counts a schedule is offered for when its caller names none: those of these at
# which the program as written launches (a node of 8 GPUs and its halves; see
# structure.PREFERRED_GROUP). A caller running at other counts names them (`ranks=`).
DEFAULT_RANKS: tuple[int, ...] = (1, 2, 4, 8)


class ScheduleOffers(NamedTuple):
    """`named_schedules(program, explain=True)`: the named schedules offered for a program
    (name -> coco-opt pipeline), those dropped (name -> why: the structure the schedule
    needs and the program lacks, the refused step with its `[rule] message`, or the rank
    count it cannot launch at) and the rank counts the offered ones launch at."""

    offered: dict[str, str]
    dropped: dict[str, str]
    ranks: tuple[int, ...] = ()


def launch_refusal(program: Program, ranks: int) -> str | None:
    """Why `program` cannot launch on `ranks` ranks (None: it can): its grid does not take
    that many, or a rank would hold no element of a sliced value (`[empty-slice]`): the
    checks `lower` and the sim make before anything runs."""
    try:
        shape = program.grid.bind(ranks)
    except ValueError as e:
        return f"@{program.name}: {e}"
    try:
        check_program_on_grid(program, shape)
    except CocoError as e:
        return str(e)
    return None


def launch_ranks(program: Any, candidates: Iterable[int] = DEFAULT_RANKS) -> tuple[int, ...]:
    """The rank counts among `candidates` at which `program` launches (`launch_refusal`)."""
    p = as_program(program)
    return tuple(n for n in candidates if launch_refusal(p, n) is None)


def _offer_ranks(p: Program, ranks: int | Iterable[int] | None) -> tuple[int, ...]:
    """The rank counts schedules of `p` must launch at to be offered: `ranks` as given, or
    the DEFAULT_RANKS the program as written launches at."""
    if ranks is None:
        return launch_ranks(p)
    counts = (ranks,) if isinstance(ranks, int) else tuple(ranks)
    for n in counts:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise schedule_error("schedule-ranks", f"rank counts are positive integers, got {n!r}")
    return counts


def _ranks_refusal(scheduled: Program, counts: Sequence[int]) -> str | None:
    """`[schedule-ranks] ...` where the scheduled program cannot launch at one of `counts`."""
    for n in counts:
        why = launch_refusal(scheduled, n)
        if why is not None:
            runs = [m for m in counts if launch_refusal(scheduled, m) is None]
            return (
                f"[schedule-ranks] it cannot launch on {n} rank(s)"
                + (f" (only on {', '.join(map(str, runs))} of them)" if runs else "")
                + f": {why}"
            )
    return None


Ranks = int | Iterable[int] | None


@overload
def named_schedules(
    program: Any, *, explain: Literal[False] = False, ranks: Ranks = None
) -> dict[str, str]: ...


@overload
def named_schedules(
    program: Any, *, explain: Literal[True], ranks: Ranks = None
) -> ScheduleOffers: ...


def named_schedules(
    program: Any, *, explain: bool = False, ranks: Ranks = None
) -> dict[str, str] | ScheduleOffers:
    """The named schedules that fit `program` (by its structure: an all_reduce; a matmul
    feeding one; a send of a value computed from one), each with its coco-opt pipeline, in a
    fixed order. A schedule is listed only if its passes all apply and the scheduled program
    launches at every rank count of `ranks` (an int or several; default: those of
    DEFAULT_RANKS the program as written launches at): a split of a dim too small for the
    ranks is not offered. `explain=True`: a ScheduleOffers, which also holds every schedule
    dropped, with the reason (nothing is dropped silently), and the rank counts checked."""
    p = as_program(program)
    counts = _offer_ranks(p, ranks)
    info = Structure(p)
    out: dict[str, str] = {}
    dropped: dict[str, str] = {}
    fitting = [n for n, ns in NAMED_SCHEDULES.items() if ns.applies(info)]
    for name in fitting:  # first those the structure admits: their refusals are the steps'
        why = _why_not(p, info, name, counts)
        if isinstance(why, str):
            dropped[name] = why
        else:
            out[name] = why.pipeline
    for name in NAMED_SCHEDULES:  # the others name what applies: those just offered
        if name not in fitting:
            dropped[name] = str(structure_refusal(p, info, name, applying=list(out)))
    dropped = {n: dropped[n] for n in NAMED_SCHEDULES if n in dropped}  # the fixed order
    return ScheduleOffers(out, dropped, counts) if explain else out


def _why_not(p: Program, info: Structure, name: str, counts: Sequence[int]) -> str | ScheduleSteps:
    """Why the structurally fitting `name` is not offered at `counts`, or its schedule."""
    s = try_named(p, info, name)
    if not isinstance(s, ScheduleSteps):
        return str(s)
    return _ranks_refusal(s.program, counts) or s


def why_not_offered(program: Any, name: str, *, ranks: Ranks = None) -> str | None:
    """Why `named_schedules(program, ranks=ranks)` does not offer the named schedule `name`
    (any accepted spelling): its refusal's `[rule] message`; None if it is offered."""
    p = as_program(program)
    canonical = resolve_schedule_name(name)
    info = Structure(p)
    if NAMED_SCHEDULES[canonical].applies(info):  # its own steps decide: try it alone
        why = _why_not(p, info, canonical, _offer_ranks(p, ranks))
        return why if isinstance(why, str) else None
    # a structure refusal names the schedules offered instead
    return named_schedules(p, explain=True, ranks=ranks).dropped.get(canonical)


def parameter_gathers(block: Block) -> list[comm.AllGatherOp]:
    """The all_gathers a fused all_gather choice is for: with elementwise computation of their
    input or result, their input not computed (through elementwise ops) from a
    reduce_scatter -- the gathers of a split all_reduce's chain are fuse(rs-c-ag)'s, whose one
    kernel holds them, and trying them as well grew the space by a fifth."""
    scattered: set[SSAValue] = set()
    found: list[comm.AllGatherOp] = []
    for op in block.ops:
        if isinstance(op, comm.ReduceScatterOp):
            scattered.add(op.result)
        elif isinstance(op, coco.ElementwiseOp) and any(v in scattered for v in op.operands):
            scattered.update(op.results)
        elif isinstance(op, comm.AllGatherOp) and computed_gather(op) and op.input not in scattered:
            found.append(op)
    return found


FUSE_CHOICES: tuple[tuple[str, ...], ...] = (
    ("all_reduce",),
    ("send",),
    ("elementwise",),
    ("all_to_all",),
    ("all_reduce", "elementwise"),
    ("send", "elementwise"),
    ("all_to_all", "elementwise"),
    ("all_reduce", "send"),
    ("all_reduce", "send", "elementwise"),
    ("all_reduce", "all_to_all", "elementwise"),
    ("all_gather",),
    ("all_gather", "elementwise"),
    ("all_reduce", "all_gather", "elementwise"),
    ("one_shot",),
    ("one_shot", "elementwise"),
    ("reduction", "elementwise"),
    ("all_gather", "reduction"),
)


@dataclass
class _Node:
    s: ScheduleSteps
    parts: list[str]
    ir: Hashable  # the scheduled program's structure (Program.structure)


def _step(node: _Node, label: str, action: Callable[[ScheduleSteps], Any]) -> _Node | None:
    """`node` with one more step, or None if the step is refused or changes nothing."""
    s = node.s.copy(throwaway=True)  # dropped on a refusal: no undo clone per step
    try:
        action(s)
    except ScheduleError as e:
        if e.rule == VERIFY_RULE:
            raise  # a pass bug, not an illegal schedule: do not hide it
        return None
    ir = s.program.structure()
    if ir == node.ir:
        return None
    return _Node(s, [*node.parts, label], ir)


def _fuse_step(kind: str) -> Callable[[ScheduleSteps], None]:
    """The fusion step of a FUSE_CHOICES entry: a mode, or `one_shot` (the one-shot form of
    the fused all_reduce)."""
    if kind == "one_shot":
        return lambda s: s.fuse(mode="all_reduce", form="one_shot")
    return lambda s: s.fuse(mode=kind)


def _reorder_each(names: Sequence[str]) -> Callable[[ScheduleSteps], None]:
    def run(s: ScheduleSteps) -> None:
        s.reorder(list(names))  # one pass: see _split_reorder

    return run


def enumerate_schedules(
    program: Any,
    *,
    chunks: Sequence[int] = (2, 4),
    split_dims: str = "all",
    limit: int | None = None,
    max_independent: int = 2,
    max_as_slice_subsets: int = 3,
    ranks: Ranks = None,
) -> list[tuple[str, str]]:
    """Every legal schedule of `program` as `(name, pipeline)`: see
    `enumerate_scheduled_programs` (same options), which also returns the scheduled
    programs."""
    return [
        (n, pipe)
        for n, pipe, _ in enumerate_scheduled_programs(
            program,
            chunks=chunks,
            split_dims=split_dims,
            limit=limit,
            max_independent=max_independent,
            max_as_slice_subsets=max_as_slice_subsets,
            ranks=ranks,
        )
    ]


def enumerate_scheduled_programs(
    program: Any,
    *,
    chunks: Sequence[int] = (2, 4),
    split_dims: str = "all",
    limit: int | None = None,
    max_independent: int = 2,
    max_as_slice_subsets: int = 3,
    ranks: Ranks = None,
) -> list[tuple[str, str, Program]]:
    """Every legal schedule of `program` in the autotuner's space, as `(name, pipeline,
    scheduled program)`.

    The space, step by step (each choice tried by applying the pass; refused or no-op choices
    are dropped):
    1. split: for each all_reduce (by SSA name: all_reduces sharing a name are one choice, as
       a targeted pass acts on all of them), no split or a split on each tensor dim
       (`split_dims="auto"`: only the dim `auto_split_dim` picks);
    2. reorder: for each split, no reorder or the maximal reorder across its all_gather;
    3. as-slice: every subset of the arguments that can be sliced (with more than
       `max_as_slice_subsets` candidates: none, the optimizer state (see named schedules), or
       all of them);
    4. sliced-send: for each send of an all_gather, the sliced send or not;
    5. fusion: none, or greedy `all_reduce`, `send`, `all_to_all`, `all_gather`,
       `reduction` and `elementwise` fusion in the combinations of FUSE_CHOICES (in that
       order), or the one-shot fused all_reduce (`fuse(one_shot)`, with or without
       `elementwise` after it);
    6. overlap: for each matmul feeding a collective or reading an all_gather (as either
       operand), none or an overlap with each of `chunks`
       (and, where a fused send exists, the pipeline-boundary form through the send and the
       next stage's all_gather, `overlap(mm,chunks=N,send)`); the all_to_all forms (a matmul
       whose only reader is an all_to_all, an all_to_all only a matmul's left operand reads,
       through a reshape or not) with each of `chunks` and of the recipes' EXCHANGE_CHUNKS.
    With more than `max_independent` all_reduce names, steps 1-2 choose for all of them at
    once (no split; split all on their auto dims; split and reorder all), as CoCoNet's
    autotuner does: the per-collective product would grow as 3^n.

    Names are the choices made, e.g. `split(g1,dim=0)+reorder(g1)+as-slice(m,v)+
    fuse(all_reduce)`; the unscheduled program is `as-written` (pipeline `""`). The order is
    deterministic (depth first, "no" before "yes", choices in program order), and schedules
    whose IR equals an earlier one's are left out (the simpler pipeline is kept). `limit`
    stops after that many schedules.

    Only schedules that launch at every rank count of `ranks` are listed (as for
    `named_schedules`: default, the DEFAULT_RANKS the program as written launches at): one
    that splits a dim smaller than the ranks (`[empty-slice]` at launch) is left out.

    A pass that leaves IR that does not verify is a pass bug, not an illegal schedule: its
    ScheduleError (rule `schedule-verify`) propagates instead of pruning the branch.
    """
    p = as_program(program)
    counts = _offer_ranks(p, ranks)
    root = ScheduleSteps(p)
    root_node = _Node(root, [], root.program.structure())
    out: list[tuple[str, str, Program]] = []
    seen: set[Hashable] = set()

    class _Full(Exception):
        pass

    def emit(node: _Node) -> None:
        if node.ir in seen:
            return
        seen.add(node.ir)
        if _ranks_refusal(node.s.program, counts) is not None:
            return
        out.append(("+".join(node.parts) or "as-written", node.s.pipeline, node.s.program))
        if limit is not None and len(out) >= limit:
            raise _Full

    info = Structure(root.program)  # the program with its schedule targets named
    ar_names = list(info.unique_names(info.all_reduces))
    state = list(info.unique_names(info.state))

    def split_dims_of(node: _Node, name: str) -> list[int]:
        v = top_level_named(node.s.program.func, name)
        if v is None or not isinstance(v.owner, comm.AllReduceOp):
            return []
        if split_dims == "auto":
            return [auto_split_dim(v.owner)]
        return list(range(v.owner.input.type.rank))

    def splits(node: _Node, i: int, done: list[str]) -> Iterator[tuple[_Node, list[str]]]:
        if i == len(ar_names):
            yield node, done
            return
        name = ar_names[i]
        yield from splits(node, i + 1, done)
        for d in split_dims_of(node, name):
            nxt = _step(node, f"split({name},dim={d})", lambda s, n=name, d=d: s.split(n, dim=d))
            if nxt is not None:
                yield from splits(nxt, i + 1, [*done, name])

    def reorders(node: _Node, names: list[str], i: int) -> Iterator[_Node]:
        if i == len(names):
            yield node
            return
        yield from reorders(node, names, i + 1)
        nxt = _step(node, f"reorder({names[i]})", lambda s, n=names[i]: s.reorder(n))
        if nxt is not None:
            yield from reorders(nxt, names, i + 1)

    def joint(node: _Node) -> Iterator[_Node]:
        yield node
        split = _step(node, "split(all)", lambda s: s.split(*ar_names, dim="auto"))
        if split is None:
            return
        yield split
        both = _step(split, "reorder(all)", _reorder_each(ar_names))
        if both is not None:
            yield both

    def split_and_reorder() -> Iterator[_Node]:
        if len(ar_names) > max_independent:
            yield from joint(root_node)
            return
        for n1, split_names in splits(root_node, 0, []):
            yield from reorders(n1, split_names, 0)

    def as_slices(node: _Node) -> Iterator[_Node]:
        yield node
        fn = node.s.program.func
        cands = []
        for a in fn.body.block.args:
            if not a.name_hint or not isinstance(a.type, TensorType) or a.name_hint in cands:
                continue
            if any(isinstance(u.operation, coco.SliceOp) for u in a.uses):
                if _step(node, "", lambda s, n=a.name_hint: s.as_slice(n)) is not None:
                    cands.append(a.name_hint)
        if len(cands) <= max_as_slice_subsets:
            subsets = [
                c for k in range(1, len(cands) + 1) for c in itertools.combinations(cands, k)
            ]
        else:
            subsets = []
            legal_state = tuple(n for n in state if n in cands)
            if legal_state and len(legal_state) < len(cands):
                subsets.append(legal_state)
            subsets.append(tuple(cands))
        for subset in subsets:
            nxt = _step(node, f"as-slice({','.join(subset)})", lambda s, ns=subset: s.as_slice(*ns))
            if nxt is not None:
                yield nxt

    def sliced_sends(node: _Node) -> Iterator[_Node]:
        sends = Structure.unique_names(
            op
            for op in node.s.program.func.body.block.ops
            if isinstance(op, comm.SendOp)
            and isinstance(op.input.owner, comm.AllGatherOp)
            and op.result.name_hint
        )

        def rec(n: _Node, i: int) -> Iterator[_Node]:
            if i == len(sends):
                yield n
                return
            yield from rec(n, i + 1)
            nxt = _step(n, f"sliced-send({sends[i]})", lambda s, x=sends[i]: s.sliced_send(x))
            if nxt is not None:
                yield from rec(nxt, i + 1)

        yield from rec(node, 0)

    def fusions(node: _Node) -> Iterator[_Node]:
        yield node
        gathers = parameter_gathers(node.s.program.func.body.block)
        for choice in FUSE_CHOICES:
            if "all_gather" in choice and not gathers:
                continue
            cur: _Node | None = node
            for kind in choice:
                assert cur is not None
                cur = _step(cur, f"fuse({kind})", _fuse_step(kind))
                if cur is None:
                    break
            if cur is not None:
                yield cur

    def overlaps(node: _Node) -> Iterator[_Node]:
        block = node.s.program.func.body.block
        # matmuls next to a collective: feeding one, or reading an all_gather (the pass
        # refuses the pairs it cannot pipeline, and refused steps are dropped)
        feeding = []
        # the all_to_all forms' ops (through a reshape or not), named as their recipes name
        # them: tried at the chunk counts those choose too (MoE's capacity of 3 slots)
        exchanges = Structure.unique_names(
            op for op in block.ops if feeds_exchange(op) or exchange_feeds_matmul(op)
        )
        for op in block.ops:
            if exchange_feeds_matmul(op):
                feeding.append(op)
            elif isinstance(op, coco.MatmulOp) and op.result.name_hint:
                users = {block.find_ancestor_op_in_block(u.operation) for u in op.result.uses}
                if len(users) == 1:
                    (u,) = users
                    if isinstance(u, comm.CollectiveOp) or (
                        isinstance(u, comm.FusedOp) and u.kind.data != "elementwise"
                    ):
                        feeding.append(op)
                        continue
                gathered = any(
                    isinstance(v.owner, comm.AllGatherOp) or comm.is_fused_all_gather(v.owner)
                    for v in (op.lhs, op.rhs)
                )
                if gathered or feeds_exchange(op):
                    feeding.append(op)
        mms = Structure.unique_names(feeding)
        # the pipeline-boundary form (through a fused send and the next stage's all_gather)
        # is tried only where a fused send exists
        forms = [False]
        if any(isinstance(o, comm.FusedOp) and o.kind.data == "send" for o in block.ops):
            forms.append(True)
        exchange_chunks = tuple(dict.fromkeys((*chunks, *EXCHANGE_CHUNKS)))

        def rec(n: _Node, i: int) -> Iterator[_Node]:
            if i == len(mms):
                yield n
                return
            yield from rec(n, i + 1)
            counts = exchange_chunks if mms[i] in exchanges else chunks
            for c in counts:
                for send in forms:
                    nxt = _step(
                        n,
                        f"overlap({mms[i]},chunks={c}{',send' if send else ''})",
                        lambda s, m=mms[i], c=c, send=send: s.overlap(m, chunks=c, send=send),
                    )
                    if nxt is not None:
                        yield from rec(nxt, i + 1)

        yield from rec(node, 0)

    if limit is not None and limit <= 0:
        return out
    try:
        for n2 in split_and_reorder():
            for n3 in as_slices(n2):
                for n4 in sliced_sends(n3):
                    for n5 in fusions(n4):
                        for n6 in overlaps(n5):
                            emit(n6)
    except _Full:
        pass
    return out
