"""Shared machinery of coconet's schedule passes.

Every pass plans first and mutates second: legality is checked on the untouched IR, and a
refusal raises `PassFailedException` (`Refusal`, carrying the op it is about) with a message
`[rule] ...` before anything changes, so a refused targeted request never leaves
half-rewritten IR behind.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import Float32Type, ModuleOp
from xdsl.ir import Attribute, Block, BlockArgument, Operation, Region, SSAValue
from xdsl.pattern_rewriter import PatternRewriter
from xdsl.rewriter import InsertPoint
from xdsl.traits import IsTerminator
from xdsl.transforms.dead_code_elimination import result_only_effects
from xdsl.utils.exceptions import PassFailedException

from coconet.dialects import coco, comm
from coconet.dialects.layout_rules import grid_of, value_name
from coconet.dialects.reduction import Reduction

# --------------------------------------------------------------------------------------------
# Errors and names
# --------------------------------------------------------------------------------------------


class Refusal(PassFailedException):
    """A pass's refusal, `[rule] message`, and the op it is about (None when it is about no
    one op: a name found nowhere, an option). coco-opt reports it at that op's location."""

    def __init__(self, message: str, op: Operation | None = None):
        super().__init__(message)
        self.op = op


def fail(rule: str, message: str, at: Operation | None = None) -> Refusal:
    """The one exception a pass raises for an illegal request: `[rule] message`, about the op
    `at` (the op the rule judges: the one a FileCheck test expects the diagnostic on)."""
    return Refusal(f"[{rule}] {message}", at)


# --------------------------------------------------------------------------------------------
# Remarks: what a greedy pass skipped, and why
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Remark:
    """A note a pass makes without failing (MLIR's `remark:`): in greedy mode, an op it left
    alone and the refusal its targeted form gives for that op (`[rule] message`)."""

    pass_name: str
    message: str
    op: Operation | None = None

    def __str__(self) -> str:
        return f"{self.pass_name}: {self.message}"


_REMARKS: ContextVar[list[Remark] | None] = ContextVar("coco_remarks", default=None)


@contextmanager
def collecting_remarks() -> Generator[list[Remark]]:
    """Collect the remarks passes make inside the block (coco-opt's `--remarks`); outside
    such a block a remark costs nothing and goes nowhere."""
    sink: list[Remark] = []
    token = _REMARKS.set(sink)
    try:
        yield sink
    finally:
        _REMARKS.reset(token)


def remarks_wanted() -> bool:
    """Whether anyone collects remarks (a pass may skip working them out otherwise)."""
    return _REMARKS.get() is not None


def remark_skipped(pass_name: str, refusal: PassFailedException, skipped: Operation) -> None:
    """A greedy pass left `skipped` alone: record the refusal its targeted form would give,
    at the op that refusal is about (as coco-opt reports the refusal)."""
    sink = _REMARKS.get()
    if sink is not None:
        about = getattr(refusal, "op", None)
        where = about if isinstance(about, Operation) else skipped
        sink.append(Remark(pass_name, f"skipped {op_name(skipped)}: {refusal}", where))


name_of = value_name  # how refusals point at a value: the verifier's own spelling


def op_name(op: Operation) -> str:
    """`%x (coco.add)`: how refusals point at an op."""
    named = [r for r in op.results if r.name_hint]
    if named:
        return f"{name_of(named[0])} ({op.name})"
    return op.name


def set_name(v: SSAValue, name: str | None) -> None:
    if name:
        v.name_hint = name


def derived_name(v: SSAValue, suffix: str) -> str | None:
    return f"{v.name_hint}_{suffix}" if v.name_hint else None


def _normalize(name: str) -> str:
    # xDSL drops a `_N` suffix from name hints (`%x_1` parses as `x`); compare the same way.
    try:
        return SSAValue.extract_valid_name(name)
    except ValueError:
        return name


def functions(module: ModuleOp) -> list[func.FuncOp]:
    return [op for op in module.ops if isinstance(op, func.FuncOp)]


def body_block(fn: func.FuncOp) -> Block:
    return fn.body.block


def grid_rank(fn: func.FuncOp) -> int:
    return grid_of(fn).rank


def find_named_ops(
    module: ModuleOp, names: Sequence[str], rule: str, what: str
) -> list[tuple[func.FuncOp, Operation]]:
    """The top-level ops (in function bodies) producing a value named by `names`, in program
    order per function. A name found nowhere is a refusal naming `rule`."""
    wanted = {_normalize(n): n for n in names}
    found: list[tuple[func.FuncOp, Operation]] = []
    seen: set[str] = set()
    for fn in functions(module):
        for op in body_block(fn).ops:
            hits = {r.name_hint for r in op.results if r.name_hint in wanted}
            if hits:
                found.append((fn, op))
                seen |= hits
    missing = [wanted[n] for n in wanted if n not in seen]
    if missing:
        raise fail(
            rule,
            "no " + what + " named " + ", ".join("%" + m for m in missing) + " in the program",
        )
    return found


def find_named_args(
    module: ModuleOp, names: Sequence[str], rule: str
) -> list[tuple[func.FuncOp, BlockArgument]]:
    wanted = {_normalize(n): n for n in names}
    found: list[tuple[func.FuncOp, BlockArgument]] = []
    seen: set[str] = set()
    for fn in functions(module):
        for a in body_block(fn).args:
            if a.name_hint in wanted:
                found.append((fn, a))
                seen.add(a.name_hint)
    missing = [wanted[n] for n in wanted if n not in seen]
    if missing:
        raise fail(
            rule,
            "no function argument named " + ", ".join("%" + m for m in missing) + " in the program",
        )
    return found


# --------------------------------------------------------------------------------------------
# Collectives
# --------------------------------------------------------------------------------------------
# Result types come from the dialect's one statement of the rules,
# `comm.collective_result_type`, through the ops' constructors (`grid_rank=` the function's).


# Element types whose partial sums are carried in f32: rounding each rank's partial to the
# narrow type moved the total by an ulp of it where the program rounds its sum once (a
# schedule's f16 norm off by one f16 ulp, amplified by the ops after it).
NARROW_FLOATS = frozenset({"f16", "bf16", "f8E4M3FN", "f8E5M2"})


def widens(r: coco.ReduceOp) -> bool:
    """Whether `r`'s partials are carried in f32 (a sum, norm or product of a narrow float:
    max and min are exact in any type)."""
    return (
        r.kind.data != Reduction.MAX
        and r.kind.data != Reduction.MIN
        and (coco.tensor_type_of(r.input).elt in NARROW_FLOATS)
    )


def partial_reduction(r: coco.ReduceOp, piece: SSAValue) -> tuple[list[Operation], coco.ReduceOp]:
    """The ops computing this rank's partial of reduction `r` from its `piece` of the input
    (widened to f32 first where `widens`, the square for a norm, then the reduction: a sum of
    squares for a norm), and the last of them, whose result is the partial.
    `combine_partials` all-reduces it, `finish_partials` gives the reduction's value."""
    norm = r.kind.data == Reduction.NORM
    ops: list[Operation] = []
    if widens(r):
        wide = coco.CastOp(piece, Float32Type())
        set_name(wide.result, derived_name(r.result, "wide"))
        ops.append(wide)
        piece = wide.result
    if norm:
        sq = coco.MulOp(piece, piece)
        set_name(sq.result, derived_name(r.result, "sq"))
        ops.append(sq)
        piece = sq.result
    part = coco.ReduceOp(Reduction.SUM if norm else r.kind.data, piece)
    set_name(part.result, derived_name(r.result, "part"))
    return [*ops, part], part


def combine_partials(
    r: coco.ReduceOp, part: SSAValue, axes: Sequence[int] | None, rank: int
) -> comm.AllReduceOp:
    """The all_reduce over `axes` of `partial_reduction`'s partials: the reduction's value, or
    a norm's sum of squares (named `<r>_sumsq`; its square root is the caller's to place)."""
    norm = r.kind.data == Reduction.NORM
    total = comm.AllReduceOp(part, Reduction.SUM if norm else r.kind.data, axes, grid_rank=rank)
    if norm:
        set_name(total.result, derived_name(r.result, "sumsq"))
    return total


def finish_partials(r: coco.ReduceOp, total: SSAValue) -> list[Operation]:
    """The ops after `combine_partials` giving `r`'s value from the total (the square root
    of a norm's sum of squares; the cast back to `r`'s type of a widened partial), the last
    of them holding it; none where the total is the value."""
    ops: list[Operation] = []
    wide = widens(r)
    if r.kind.data == Reduction.NORM:
        ops.append(coco.SqrtOp(total))
        total = ops[-1].results[0]
        if wide:
            set_name(total, derived_name(r.result, "root"))
    elif wide:
        set_name(total, derived_name(r.result, "total"))
    if wide:
        ops.append(coco.CastOp(total, coco.tensor_type_of(r.result).element_type))
        set_name(ops[-1].results[0], r.result.name_hint)
    return ops


def axes_prop(op: comm.GroupCollectiveOp) -> tuple[int, ...] | None:
    """The op's written `over` axes (None: all axes)."""
    return None if op.axes is None else op.axes.get_values()


# --------------------------------------------------------------------------------------------
# Use and effect analysis of top-level ops
# --------------------------------------------------------------------------------------------


def replace_operand(rewriter: PatternRewriter, op: Operation, index: int, value: SSAValue) -> None:
    """Make operand `index` of `op` read `value`, through the rewriter (as
    `replace_uses_with_if` restricted to that use does, without looking at every other use of
    the old value: a value many ops read, each given its slice, made that quadratic)."""
    old = op.operands[index]
    if old is value:
        return
    op.operands[index] = value
    if value.name_hint is None:  # as xDSL's replace_uses_with_if carries the name over
        value.name_hint = old.name_hint
    rewriter.notify_op_modified(op)


def ancestor_in(block: Block, op: Operation) -> Operation | None:
    """The op of `block` that is `op` or holds it (None if `op` is not under `block`)."""
    return block.find_ancestor_op_in_block(op)


def find_root(parent: list[int], i: int) -> int:
    """The root of `i` in a union-find forest over indices (`parent[r] == r` at a root),
    halving the path on the way (near-constant depth)."""
    while parent[i] != i:
        parent[i] = i = parent[parent[i]]
    return i


def is_terminator(op: Operation) -> bool:
    """Whether `op` ends its block (a return, a region's yield)."""
    return op.has_trait(IsTerminator)


def used_values(op: Operation) -> set[SSAValue]:
    """Values `op` or ops nested in it read, excluding values defined inside it."""
    inner: set[SSAValue] = set()
    used: set[SSAValue] = set()
    for o in op.walk():
        used.update(o.operands)
        if o is not op:
            inner.update(o.results)
        for region in o.regions:
            for block in region.blocks:
                inner.update(block.args)
    return used - inner


def updated_targets(op: Operation) -> set[SSAValue]:
    return {o.target for o in op.walk() if isinstance(o, coco.UpdateOp)}


def read_arguments(op: Operation) -> set[SSAValue]:
    """Function arguments `op` (or a nested op) reads: every use except an update's target."""
    reads: set[SSAValue] = set()
    for o in op.walk():
        for i, v in enumerate(o.operands):
            if not isinstance(v, BlockArgument):
                continue
            if isinstance(o, coco.UpdateOp) and i == 0:
                continue
            reads.add(v)
    return reads


def reaches_effect(op: Operation) -> bool:
    """Whether a result of `op` is used, directly or through the ops computing from it, by
    an op with side effects (an update), a terminator (a return, a region's yield) or an op
    of another dialect: whether `op` is live. Follows the uses forward: linear in what
    `op` reaches."""
    seen: set[Operation] = {op}
    todo = [op]
    while todo:
        for r in todo.pop().results:
            for use in r.uses:
                user = use.operation
                if user in seen:
                    continue
                if user.has_trait(IsTerminator) or has_side_effects(user):
                    return True
                seen.add(user)
                todo.append(user)
    return False


def has_side_effects(op: Operation) -> bool:
    """Whether `op` (or an op nested in it) does more than compute its results, by xDSL's
    effect model: `coco.update` writes, schedule regions have their bodies' effects, and an op
    without effect traits (another dialect's) is assumed to have effects."""
    return not result_only_effects(op)


# (defs, uses, reads, writes) of a top-level op: the values it defines and uses, the function
# arguments it reads and the ones it updates
Facts = tuple[set[SSAValue], set[SSAValue], set[SSAValue], set[SSAValue]]


class OrderInfo:
    """Must-run-before edges between the top-level ops of one block: a def precedes its uses
    (also uses nested in regions), and every read of an argument precedes its update.

    An op's facts (what it defines, uses, reads and updates) are computed the first time an
    edge asks for them, and `OrderInfo.spanning` covers only the ops from the first to the last
    of a set (found by walking outwards from one of them): a rewrite that looks at a few
    neighbouring ops costs what it looks at, not a rescan of the function (compile time stays
    linear in the program). `OrderInfo.visits` counts the ops listed and the facts computed,
    over all instances (tests check it grows linearly)."""

    visits = 0

    def __init__(
        self,
        block: Block,
        ops: list[Operation] | None = None,
        facts: dict[Operation, Facts] | None = None,
    ):
        self.ops = list(block.ops) if ops is None else ops
        self.index = {op: i for i, op in enumerate(self.ops)}
        OrderInfo.visits += len(self.ops)
        # `facts`: shared by the orders a pass builds as it rewrites the block, where it
        # drops what a rewrite changes (wrap_in_region): a region op's facts walk its body,
        # and a fused region sits in the span of each later set around it
        self._facts = {} if facts is None else facts

    @classmethod
    def spanning(
        cls,
        block: Block,
        members: Iterable[Operation],
        facts: dict[Operation, Facts] | None = None,
    ) -> OrderInfo:
        """The ops of `block` from the first of `members` to the last (top-level ops of
        `block`), found by walking both ways from one member until all are seen."""
        wanted = set(members)
        start = next(iter(wanted))
        seen = {start}
        before: list[Operation] = []
        after: list[Operation] = []
        back, fwd = start.prev_op, start.next_op
        while len(seen) < len(wanted) and (back is not None or fwd is not None):
            if back is not None:
                before.append(back)
                if back in wanted:
                    seen.add(back)
                back = back.prev_op
            if fwd is not None:
                after.append(fwd)
                if fwd in wanted:
                    seen.add(fwd)
                fwd = fwd.next_op
        if len(seen) < len(wanted):
            raise ValueError("OrderInfo.spanning: an op of the set is not in the block")
        ops = [*reversed(before), start, *after]
        first = next(i for i, op in enumerate(ops) if op in wanted)
        last = max(i for i, op in enumerate(ops) if op in wanted)
        return cls(block, ops[first : last + 1], facts)

    def facts(self, op: Operation) -> Facts:
        """(defs, uses, reads, writes) of a top-level op."""
        got = self._facts.get(op)
        if got is None:
            OrderInfo.visits += 1
            defs: set[SSAValue] = set(op.results)
            got = (defs, used_values(op), read_arguments(op), updated_targets(op))
            self._facts[op] = got
        return got

    def precedes(self, a: Operation, b: Operation) -> bool:
        """Whether `a` must run before `b` (a direct edge)."""
        defs_a, _, reads_a, _ = self.facts(a)
        _, uses_b, _, writes_b = self.facts(b)
        return bool(defs_a & uses_b) or bool(reads_a & writes_b)

    def reached(self, sources: set[Operation], span: Sequence[Operation]) -> list[Operation]:
        """The ops of `span` (consecutive ops of this order) outside `sources` that an earlier
        source, or an earlier op already reached, precedes: `sources`' dependents within the
        span, in order. One pass that keeps the values those ops define and the arguments
        they read (the two kinds of `precedes` edges), not a test of every earlier op:
        linear in the span."""
        defined: set[SSAValue] = set()
        read: set[SSAValue] = set()
        out: list[Operation] = []
        for op in span:
            defs, uses, reads, writes = self.facts(op)
            if op not in sources:
                if defined.isdisjoint(uses) and read.isdisjoint(writes):
                    continue
                out.append(op)
            defined |= defs
            read |= reads
        return out

    def first_dependents(
        self, sources: Sequence[Operation], targets: set[Operation], span: Sequence[Operation]
    ) -> dict[Operation, Operation]:
        """For each op of `sources` that precedes a later op of `targets` (all in `span`,
        consecutive ops of this order), the first such target. One pass over the span that
        keeps which source defines each value and which sources read each argument, each
        source taken once: linear in the span."""
        wanted = set(sources)
        definer: dict[SSAValue, Operation] = {}
        readers: dict[SSAValue, list[Operation]] = {}
        first: dict[Operation, Operation] = {}
        for op in span:
            defs, uses, reads, writes = self.facts(op)
            if op in targets:
                for v in uses:
                    s = definer.get(v)
                    if s is not None and s not in first:
                        first[s] = op
                for a in writes:
                    for s in readers.pop(a, ()):
                        first.setdefault(s, op)
            if op in wanted:
                for v in defs:
                    definer[v] = op
                for a in reads:
                    readers.setdefault(a, []).append(op)
        return first


def plan_contiguous(
    block: Block,
    members: set[Operation],
    rule: str,
    what: str,
    info: OrderInfo | None = None,
    facts: dict[Operation, Facts] | None = None,
) -> tuple[list[Operation], list[Operation]]:
    """Make `members` (top-level ops of `block`) contiguous: returns (hoisted, members in
    order). Ops between the members that depend on none of them are hoisted above; the rest
    sink below. An op that depends on a member and that a member depends on closes a cycle:
    refused under `rule`. Linear in the ops from the first member to the last (the edges are
    followed through the values and arguments each op defines and reads: see
    `OrderInfo.reached`), not in their pairs."""
    if info is None or any(m not in info.index for m in members):
        info = OrderInfo.spanning(block, members, facts)
    order = sorted(members, key=info.index.__getitem__)
    span = info.ops[info.index[order[0]] : info.index[order[-1]] + 1]
    sunk = info.reached(members, span)
    sunk_set = set(sunk)
    hoisted = [op for op in span if op not in members and op not in sunk_set]
    first = info.first_dependents(sunk, members, span)
    if first:
        # the first sunk op a later member depends on, and the first such member
        s = min(first, key=info.index.__getitem__)
        raise fail(
            rule,
            f"{what} would form a cycle: {op_name(s)} depends on the set and "
            f"{op_name(first[s])} in the set depends on it",
            at=s,
        )
    return hoisted, order


def outside_uses(
    values: Iterable[SSAValue], inside: set[Operation], block: Block
) -> list[SSAValue]:
    """Those of `values` used by a top-level op of `block` not in `inside`."""
    out: list[SSAValue] = []
    for v in values:
        for use in v.uses:
            top = ancestor_in(block, use.operation)
            if top is None or top not in inside:
                out.append(v)
                break
    return out


def wrap_in_region(
    block: Block,
    hoisted: Sequence[Operation],
    members: Sequence[Operation],
    make: Callable[[Region, list[Attribute]], comm.RegionOp],
    facts: dict[Operation, Facts] | None = None,
) -> comm.RegionOp:
    """Move `hoisted` above the first member, then the members (in order) into a new region op
    built by `make(body, result_types)`, yielding the member results used outside. `facts`
    (OrderInfo's, kept across a pass): the entries of the ops now reading the region's
    results are dropped."""
    anchor = members[0]
    rewriter = PatternRewriter(anchor)
    for h in hoisted:  # xDSL moves an op by detaching and inserting it
        h.detach()
        rewriter.insert(h, InsertPoint.before(anchor))
    member_set = set(members)
    yielded = outside_uses([r for m in members for r in m.results], member_set, block)
    body = Block()
    region_op = rewriter.insert(
        make(Region(body), [v.type for v in yielded]), InsertPoint.before(anchor)
    )
    for m in members:
        m.detach()
        rewriter.insert(m, InsertPoint.at_end(body))
    rewriter.insert(comm.YieldOp(yielded), InsertPoint.at_end(body))
    for v, r in zip(yielded, region_op.results, strict=True):
        set_name(r, v.name_hint)
        rewriter.replace_uses_with_if(
            v, r, lambda use: ancestor_in(block, use.operation) is not region_op
        )
        if facts is not None:
            for use in r.uses:
                facts.pop(ancestor_in(block, use.operation), None)  # type: ignore[arg-type]
    return region_op


def check_groups_acyclic(
    block: Block, groups: Sequence[set[Operation]], rule: str, what: str
) -> None:
    """Refuse (under `rule`) if contracting each group of top-level ops into one op would close
    a cycle: then building several regions one after the other would fail half-way."""
    info = OrderInfo(block)
    node: dict[Operation, object] = {op: op for op in info.ops}
    for i, g in enumerate(groups):
        for op in g:
            node[op] = ("group", i)
    succ: dict[object, set[object]] = {}
    # The edges of OrderInfo.precedes, from each op's facts rather than from every pair of
    # ops (linear in the block): a def precedes its uses, and every earlier read of an
    # argument precedes its update.
    readers: dict[SSAValue, list[Operation]] = {}
    for b in info.ops:
        _, uses, reads, writes = info.facts(b)
        sources = {ancestor_in(block, v.owner) for v in uses if isinstance(v.owner, Operation)}
        for target in writes:
            sources.update(readers.get(target, ()))
        for a in sources:
            if a is not None and a is not b and a in node and node[a] != node[b]:
                succ.setdefault(node[a], set()).add(node[b])
        for target in reads:
            readers.setdefault(target, []).append(b)
    # depth-first search with an explicit stack: a deep program's chains are thousands of
    # ops long, deeper than Python's recursion limit
    on_path, done = 1, 2
    state: dict[object, int] = {}
    for root in dict.fromkeys(node.values()):
        if root in state:
            continue
        state[root] = on_path
        stack = [(root, iter(succ.get(root, ())))]
        while stack:
            n, successors = stack[-1]
            for m in successors:
                if state.get(m) == on_path:
                    raise fail(rule, f"{what} would form a cycle between the requested regions")
                if m not in state:
                    state[m] = on_path
                    stack.append((m, iter(succ.get(m, ()))))
                    break
            else:
                state[n] = done
                stack.pop()
