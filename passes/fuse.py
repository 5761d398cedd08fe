"""`coco-fuse`: group computation (and a reduce_scatter/all_gather chain) into one
`comm.fused` region, i.e. one kernel (CoCoNet's `fuse`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set as AbstractSet
from dataclasses import dataclass
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from coconet.dialects import coco, comm
from coconet.dialects.coco import ReplicatedAttr, SlicedAttr, TensorType
from coconet.dialects.layout_rules import precedes_in_block
from coconet.passes.common import (
    OrderInfo,
    ancestor_in,
    body_block,
    check_groups_acyclic,
    combine_partials,
    derived_name,
    fail,
    find_named_ops,
    functions,
    grid_rank,
    op_name,
    partial_reduction,
    plan_contiguous,
    set_name,
    wrap_in_region,
)

RULE = "fuse"
MODES = ("auto", "elementwise", "all_reduce", "send", "all_to_all")
FORMS = ("two_shot", "one_shot")

Space = tuple[tuple[int, ...], tuple[Attribute, ...]] | None

# The kind of a one-shot fused all_reduce's plan (`comm.fused all_reduce one_shot`).
ONE_SHOT = "one_shot"


def function_of(block: Block) -> func.FuncOp:
    """The function whose body `block` is (fused chains are found in function bodies)."""
    fn = block.parent_op()
    assert isinstance(fn, func.FuncOp), "a fused chain's block is a function body"
    return fn


def _space(v: SSAValue) -> Space:
    """The iteration space a value occupies in a kernel: its shape and layouts (element type
    aside); None for a scalar, which fits any space."""
    t = v.type
    if not isinstance(t, TensorType) or t.rank == 0:
        return None
    return (t.get_shape(), tuple(t.layouts.data))


def _op_space(op: Operation) -> Space | str:
    spaces = {_space(r) for r in op.results} - {None}
    if len(spaces) > 1:
        return "mixed"
    return spaces.pop() if spaces else None


def _row_space(space: Space) -> Space:
    """The space of a keepdims reduction over the last dim of `space` (its rows), when no
    grid axis slices that dim (each rank then holds whole rows); None otherwise."""
    if space is None:
        return None
    shape, layouts = space
    last = len(shape) - 1
    if any(isinstance(lay, SlicedAttr) and lay.dim.data == last for lay in layouts):
        return None
    return ((*shape[:-1], 1), layouts)


def _row_reduction_of(u: Operation, space: Space) -> bool:
    """Whether `u` reduces the rows of `space` (a coco.reduce_dims over its last dim, keeping
    it), which a fused collective kernel finishes inside one block per row."""
    return (
        isinstance(u, coco.ReduceDimsOp)
        and space is not None
        and u.reduced_dims == (len(space[0]) - 1,)
        and u.keeps_dims
        and _space(u.input) == space
        and _row_space(space) is not None
        and _space(u.result) == _row_space(space)
    )


def _meet(a: Space, b: Space | str) -> Space | str:
    """The common iteration space of `a` and `b`, `b` itself when it is a mark (`"mixed"`),
    "mismatch" when they differ."""
    if a is None:
        return b
    if b is None or a == b:
        return a
    return "mismatch"


def _in_order(members: set[Operation]) -> list[Operation]:
    """Members in program order (so refusals name the same op every run)."""
    by_block: dict[Block | None, list[Operation]] = {}
    for m in members:
        by_block.setdefault(m.parent_block(), []).append(m)
    out: list[Operation] = []
    for block, ops in by_block.items():
        if block is None:
            out.extend(ops)
            continue
        index = {op: i for i, op in enumerate(block.ops)}
        out.extend(sorted(ops, key=index.__getitem__))
    return out


def _make_fused(kind: str):
    def make(body: Region, types: list[Attribute]) -> comm.RegionOp:
        if kind == ONE_SHOT:
            return comm.FusedOp("all_reduce", body, types, one_shot=True)
        return comm.FusedOp(kind, body, types)

    return make


def _absorb_updates(block: Block, members: set[Operation], info: OrderInfo) -> set[Operation]:
    """Add the updates that store a member's result, each only if that keeps the set acyclic
    (found through the members' uses: no scan of the block)."""
    updates = {
        use.operation
        for m in members
        for r in m.results
        for use in r.uses
        if isinstance(use.operation, coco.UpdateOp)
        and use.index == 1
        and use.operation.parent_block() is block
    }
    updates -= members
    if not updates:
        return members
    if any(u not in info.index for u in updates) or any(m not in info.index for m in members):
        info = OrderInfo.spanning(block, members | updates)
    for op in sorted(updates, key=info.index.__getitem__):
        try:
            plan_contiguous(block, members | {op}, RULE, "", info)
        except PassFailedException:
            continue
        members = members | {op}
    return members


def _absorb_feeders(block: Block, members: set[Operation]) -> set[Operation]:
    """Add slices and constants read only by members, and what feeds those only (the
    constant under a slice of it): they move no data, and inside the region the kernel sees
    them as a pointer offset, an immediate or its own array of values (found through the
    members' operands: no scan of the block)."""
    members = set(members)
    work = list(members)
    while work:
        m = work.pop()
        for o in m.walk():
            for v in o.operands:
                op = v.owner
                if (
                    not isinstance(op, coco.SliceOp | coco.ConstantOp)
                    or op in members
                    or op.parent_block() is not block
                ):
                    continue
                users = {ancestor_in(block, use.operation) for use in op.results[0].uses}
                if users and users <= members:
                    members.add(op)
                    work.append(op)
    return members


class _GrowingPlan:
    """`plan_contiguous`'s state for a component that the greedy elementwise fusion grows in
    program order: the positions from its first member up to `scanned` classified, the
    values and arguments its members and sunk ops (those depending on it) define and read,
    and those its sunk ops alone do. A new member (always later than every op looked at)
    classifies only the ops since `scanned`, so a component costs its extent once, not once
    per member (a long elementwise chain made `ar-c` quadratic). The decisions are
    `plan_contiguous`'s: an op sinks when a member or sunk op before it precedes it, and a
    member that a sunk op before it precedes closes a cycle."""

    __slots__ = ("defined", "first", "read", "scanned", "sunk_defs", "sunk_reads")

    def __init__(self, first: int):
        self.first = first
        self.scanned = first - 1
        self.defined: set[SSAValue] = set()
        self.read: set[SSAValue] = set()
        self.sunk_defs: set[SSAValue] = set()
        self.sunk_reads: set[SSAValue] = set()

    @classmethod
    def of(cls, info: OrderInfo, u: Operation) -> _GrowingPlan:
        """The plan of the component {u}."""
        plan = cls(info.index[u])
        plan._scan(info, plan, plan.first, plan.first, lambda x: x is u)
        plan.scanned = plan.first
        return plan

    @classmethod
    def join(
        cls,
        info: OrderInfo,
        plans: list[_GrowingPlan | None],
        parts: list[int],
        comp_of: dict[Operation, int],
        u: Operation,
    ) -> _GrowingPlan | None:
        """The plan of the components `parts` and the op `u` (after all of them) as one, or
        None if that set would close a cycle. The plan of the component that starts first
        is kept as the union's up to where the next one starts, when it has looked no
        further (it is extended there: its own plan up to that point whatever the answer);
        the rest is classified again."""
        found = [plans[i] for i in parts]
        assert all(p is not None for p in found)
        ordered = sorted((p for p in found if p is not None), key=lambda p: p.first)
        head = ordered[0]
        end = info.index[u]
        rest = ordered[1].first if len(ordered) > 1 else end
        if head.scanned < rest:
            head._scan(info, head, head.scanned + 1, rest - 1, lambda x: False)
            head.scanned = rest - 1
            base, start = head, rest
        else:  # the components interleave: plan the union from its first op
            base, start = cls(head.first), head.first
        wanted = set(parts)
        delta = cls(head.first)
        if not delta._scan(
            info, base, start, end, lambda x: x is u or comp_of.get(x, -1) in wanted
        ):
            return None
        if base is head:
            head.defined |= delta.defined
            head.read |= delta.read
            head.sunk_defs |= delta.sunk_defs
            head.sunk_reads |= delta.sunk_reads
            head.scanned = end
            return head
        delta.scanned = end
        return delta

    def _scan(
        self,
        info: OrderInfo,
        base: _GrowingPlan,
        start: int,
        stop: int,
        is_member: Callable[[Operation], bool],
    ) -> bool:
        """Classify the ops at positions start..stop into this plan, on top of `base`'s (the
        same plan, or the one before `start`); False at a member that a sunk op precedes."""
        layers = (self,) if base is self else (base, self)
        for x in info.ops[start : stop + 1]:
            defs, uses, reads, writes = info.facts(x)
            if is_member(x):
                if any(
                    not p.sunk_defs.isdisjoint(uses) or not p.sunk_reads.isdisjoint(writes)
                    for p in layers
                ):
                    return False
            elif all(p.defined.isdisjoint(uses) and p.read.isdisjoint(writes) for p in layers):
                continue  # hoisted
            else:
                self.sunk_defs |= defs
                self.sunk_reads |= reads
            self.defined |= defs
            self.read |= reads
        return True


@dataclass(frozen=True)
class FusePass(ModulePass):
    """Group ops into one `comm.fused KIND` region (one kernel, or one fused collective). The
    region keeps the original ops, runs in place (it reads outer values directly), and yields
    the values used outside it; ops between the grouped ones move above the region if they do
    not depend on it, below if they do.

    Modes (`mode` option):
    * `elementwise`: a connected set of elementwise ops -> `comm.fused elementwise`. Greedy:
      every maximal connected set (grown in program order, an op joining only where it keeps
      the set acyclic and in one iteration space) of two or more ops with a tensor result,
      plus the slices and constants only it reads. Targeted (`ops` names the ops): exactly
      those. Updates storing a fused value join the region when that keeps it acyclic (the
      kernel writes the buffer).
    * `all_reduce`: a reduce_scatter, the sliced computation consuming it and the all_gathers
      of its results -> `comm.fused all_reduce` (CoCoNet's FusedAllReduce). From the
      reduce_scatter, the chain grows in program order over: elementwise ops with a result in
      the reduce_scatter's iteration space (same shape and layouts) or scalar; reductions of
      chain values (partial norms) and all_reduces of scalar partials; row reductions over
      the last dim (keepdims) of a slice that keeps whole rows, and elementwise ops on their
      row values (RMSNorm, LayerNorm: one block per row); all_gathers of chain
      values over the reduce_scatter's axes; and the updates storing chain or gathered
      values. Then ops feeding only the chain (slices of arguments, constants, scalar
      arithmetic, elementwise ops in the chain's space) are pulled in, and so is scalar
      arithmetic the chain both feeds and reads (LAMB's trust ratio ||w|| / ||r||).
      Targeted: `ops` names reduce_scatters (their maximal chain), or names the exact set
      to fuse (one reduce_scatter, at least one all_gather; updates of its values join).
    * `send`: the elementwise computation feeding a `comm.send` (in the send's iteration
      space, walking back from its input) and the send -> `comm.fused send` (CoCoNet's fused
      computation + P2P). Targeted: `ops` names sends (their maximal feeding computation), or
      the exact set (one send plus elementwise ops).
    * `all_to_all`: a `comm.all_to_all`, the elementwise computation of its input (ops in
      the input's iteration space, walking back from it: a scale, a cast to bf16 before
      dispatch) and of its result (ops in the result's space reading it, in program order,
      none waiting for a value computed from it outside the set: a weighted combine, a
      residual add, a cast back) -> `comm.fused all_to_all`, one kernel: the sender
      computes its piece into symmetric memory, the receiver pulls its part from each peer
      and computes on it (lowering/fused_all_to_all.py). Where producers and consumers
      together would close a cycle, the consumers alone, then the producers alone, then the
      all_to_all alone. Targeted: `ops` names all_to_alls (their maximal computation), or
      the exact set (one all_to_all plus elementwise ops).
    * `auto` (default): `all_reduce` on every reduce_scatter, then `send` on every send,
      then `all_to_all` on every all_to_all, then `elementwise` on the rest.

    Forms of a fused all_reduce (`form` option, with `mode=all_reduce`):
    * `two_shot` (default): the reduce_scatter chains above (split and reordered programs).
    * `one_shot`: a tensor `comm.all_reduce` as written and the computation on its whole
      result -> `comm.fused all_reduce one_shot`: each rank reduces every peer's whole input
      from symmetric memory in rank order and computes the rest locally (one handshake, no
      all_gather: the form of small tensors, where latency wins). From the all_reduce, the
      chain grows in program order over elementwise ops in its result's iteration space (or
      scalar), row reductions over the last dim (keepdims) and elementwise ops on their row
      values (AR + residual + RMSNorm/LayerNorm), and the updates storing chain values
      (except one of the all_reduce's own input, which peers read: it stays a copy after
      the region); an op that waits for a value computed from the chain outside it does
      not join (a full norm and what reads it). Then slices, constants and elementwise ops
      feeding only the chain are pulled in. Targeted: `ops` names all_reduces (their
      maximal chain), or the exact set (one all_reduce plus computation).

    Legality (refusals name the rule; greedy mode skips what they refuse):
    * [fuse-cycle]       no op outside the set depends on the set and feeds back into it.
    * [fuse-chain]       an all_reduce fusion holds exactly one reduce_scatter and at least
                         one all_gather of its chain (one collective chain per region), or,
                         for ZeRO-3's step (sliced parameters and state), none where every
                         result of the chain updates sliced state; a
                         send fusion holds exactly one send, fed by elementwise computation;
                         an all_to_all fusion exactly one all_to_all and elementwise ops.
    * [fuse-sizes]       tensors computed in the region share one iteration space (the
                         reduce_scatter's, for all_reduce; for all_to_all, the input's before
                         the exchange and the result's after it); scalars fit any, and so do the
                         rows of a fused all_reduce (keepdims reductions over the last dim
                         of a space that no grid axis slices there, and ops on them).
                         Rows of any length: a row kernel keeps what a later phase
                         reads in shared memory where it fits and streams it otherwise
                         (lowering/row_collective.py).
    * [fuse-elementwise] an elementwise fusion holds only elementwise ops (and updates).
    * [fuse-connected]   a targeted set is connected through its own values.
    * [fuse-block]       named ops sit in one function body, not inside regions.
    * [fuse-mode]        `mode` is one of auto, elementwise, all_reduce, send, all_to_all.
    * [fuse-form]        `form` is two_shot or one_shot; one_shot goes with mode=all_reduce.
    * [fuse-one-shot]    a one-shot fusion starts at a comm.all_reduce of a tensor as written
                         (a scalar's is a norm's partials; a split all_reduce is the two-shot
                         form's, and sliced values -- as-slice'd optimizer state, ZeRO-3's
                         sliced parameters -- never join: each rank computes the whole
                         tensor); a named set holds one all_reduce and, besides, only
                         elementwise ops, constants, slices, row reductions over the last dim
                         and updates, in the all_reduce's iteration space or its rows.
    """

    name = "coco-fuse"

    # Ops the reduce_scatter chain scans looked at, over all runs (a test checks it grows
    # linearly with the program).
    chain_visits: ClassVar[int] = 0

    mode: str = "auto"
    ops: tuple[str, ...] = ()
    form: str = "two_shot"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.mode not in MODES:
            raise fail(f"{RULE}-mode", f"unknown mode '{self.mode}': use one of {', '.join(MODES)}")
        if self.form not in FORMS:
            raise fail(f"{RULE}-form", f"unknown form '{self.form}': use one of {', '.join(FORMS)}")
        if self.form == ONE_SHOT:
            if self.mode != "all_reduce":
                raise fail(
                    f"{RULE}-form",
                    f"form=one_shot is a form of a fused all_reduce: use it with "
                    f"mode=all_reduce, not mode={self.mode}",
                )
            self._apply_one_shot(op)
            return
        if self.ops:
            self._apply_targeted(op)
            return
        for fn in functions(op):
            block = body_block(fn)
            if self.mode in ("auto", "all_reduce"):
                scatters = [o for o in block.ops if isinstance(o, comm.ReduceScatterOp)]
                if not _computes_scalars_of_tensors(block):
                    # No chain can hold scalar arithmetic, so none couples with another:
                    # each is grown on what earlier fusions left, in program order (growing
                    # every chain first, on the untouched block, cost the sum of their
                    # extents: quadratic where each layer's chain runs on along a sliced
                    # residual stream to the end of the function).
                    for rs in scatters:
                        try:
                            self._fuse(block, self._chain(block, rs), "all_reduce")
                        except PassFailedException:
                            continue
                    scatters = []
                chains: list[set[Operation]] = []
                for rs in scatters:
                    try:
                        chains.append(self._chain(block, rs))
                    except PassFailedException:
                        continue
                for members in _merge_coupled(chains):
                    scatters = [m for m in members if isinstance(m, comm.ReduceScatterOp)]
                    try:
                        if len(scatters) == 1:
                            # A chain of its own is grown again around what earlier
                            # fusions left at the top level.
                            members = self._chain(block, scatters[0])
                        self._fuse(block, members, "all_reduce")
                    except PassFailedException:
                        continue
            if self.mode in ("auto", "send"):
                for send in [o for o in block.ops if isinstance(o, comm.SendOp)]:
                    if send.parent_block() is not block:
                        continue
                    try:
                        self._fuse(block, self._send_chain(block, send), "send")
                    except PassFailedException:
                        continue
            if self.mode in ("auto", "all_to_all"):
                for a2a in [o for o in block.ops if isinstance(o, comm.AllToAllOp)]:
                    try:
                        self._fuse(block, self._exchange_chain(block, a2a), "all_to_all")
                    except PassFailedException:
                        continue
            if self.mode in ("auto", "elementwise"):
                for members in self._components(block):
                    try:
                        self._fuse(block, members, "elementwise")
                    except PassFailedException:
                        continue

    # -- the one-shot form ------------------------------------------------------------------

    def _apply_one_shot(self, module: ModuleOp) -> None:
        if not self.ops:
            for fn in functions(module):
                block = body_block(fn)
                for ar in [o for o in block.ops if isinstance(o, comm.AllReduceOp)]:
                    if ar.parent_block() is not block or _scalar(ar):
                        continue
                    try:
                        self._fuse(block, self._one_shot_chain(block, ar), ONE_SHOT)
                    except PassFailedException:
                        continue
            return
        sites = find_named_ops(module, self.ops, f"{RULE}-block", "op")
        named = [s for _, s in sites]
        plans: list[tuple[Block, set[Operation], str]] = []
        if all(isinstance(s, comm.AllReduceOp) for s in named):
            # In program order, each chain without the ops an earlier one took (a residual
            # stream that every layer's chain reaches is the first one's).
            taken: set[Operation] = set()
            for fn, ar in sorted(sites, key=lambda site: _position(site[1])):
                assert isinstance(ar, comm.AllReduceOp)  # checked just above
                block = body_block(fn)
                members = self._one_shot_chain(block, ar, taken)
                taken |= members
                plans.append((block, members, ONE_SHOT))
        else:
            if len({fn for fn, _ in sites}) != 1:
                raise fail(f"{RULE}-block", "the named ops are in different functions")
            block = body_block(sites[0][0])
            members = set(named)
            self._check_one_shot_set(members)
            self._check_connected(members)
            members = _absorb_updates(block, members, OrderInfo(block))
            plans.append((block, members, ONE_SHOT))
        self._fuse_plans(plans)

    def _one_shot_chain(
        self, block: Block, ar: comm.AllReduceOp, taken: AbstractSet[Operation] = frozenset()
    ) -> set[Operation]:
        """The maximal one-shot fused all_reduce around `ar` (before the cycle check), without
        the ops in `taken` (an earlier chain's)."""
        if ar in taken:
            raise _shared(ar)
        if ar.parent_block() is not block:
            raise fail(f"{RULE}-block", f"{op_name(ar)} is not in a function body", at=ar)
        _refuse_scalar(ar)
        space = _space(ar.result)
        members: set[Operation] = {ar}
        chain: set[SSAValue] = {ar.result}
        # Values computed from the chain by ops that did not join (a full norm): an op
        # reading one waits for the region, so it cannot join it.
        outside: set[SSAValue] = set()
        pending: set[Operation] = set()

        def watch(v: SSAValue) -> None:
            pending.update(u.operation for u in v.uses if u.operation.parent_block() is block)

        watch(ar.result)
        u = ar.next_op
        while pending and u is not None:
            FusePass.chain_visits += 1
            read = {v for o in (u.walk() if u.regions else (u,)) for v in o.operands}
            joined = None
            if u in pending:
                pending.discard(u)
                if not read & outside and u not in taken:
                    joined = self._one_shot_step(u, ar, space, chain)
            if joined is not None:
                members.add(u)
                for v in joined:
                    watch(v)
            elif read & (chain | outside):
                outside.update(u.results)
                for v in u.results:
                    watch(v)
            u = u.next_op
        self._check_rows(members, space)
        members = self._pull_feeders(block, members, space)
        for m in _in_order(members & set(taken)):
            raise _shared(m)
        return members

    @staticmethod
    def _one_shot_step(
        u: Operation, ar: comm.AllReduceOp, space: Space, chain: set[SSAValue]
    ) -> tuple[SSAValue, ...] | None:
        """Whether `u` joins the one-shot chain of `ar`: None if not, else its results."""
        if isinstance(u, coco.UpdateOp):
            # peers read the all_reduce's input: writing it stays a copy after the region
            return () if u.value in chain and u.target is not ar.input else None
        if not any(v in chain for v in u.operands):
            return None
        if isinstance(u, coco.ElementwiseOp) and (
            _meet(space, _space(u.results[0])) == space
            or (_space(u.results[0]) is not None and _space(u.results[0]) == _row_space(space))
        ):
            chain.add(u.results[0])
            return (u.results[0],)
        if _row_reduction_of(u, space):
            chain.add(u.results[0])
            return (u.results[0],)
        return None

    def _check_one_shot_set(self, members: set[Operation]) -> None:
        """A named one-shot set: one tensor all_reduce, the rest computation in its space."""
        reduces = [m for m in _in_order(members) if isinstance(m, comm.AllReduceOp)]
        if len(reduces) != 1:
            raise fail(
                f"{RULE}-one-shot",
                f"a one-shot fused all_reduce holds exactly one comm.all_reduce; the named ops "
                f"hold {len(reduces)}",
            )
        ar = reduces[0]
        _refuse_scalar(ar)
        space = _space(ar.result)
        rows = _row_space(space)
        for m in _in_order(members - {ar}):
            ok = isinstance(m, coco.ElementwiseOp | coco.ConstantOp | coco.SliceOp) or (
                _row_reduction_of(m, space)
            )
            if not ok:
                raise fail(
                    f"{RULE}-one-shot",
                    f"{op_name(m)} cannot be part of a one-shot fused all_reduce (its "
                    "all_reduce, elementwise computation, row reductions over the last dim)",
                    at=m,
                )
            s = _op_space(m)
            if isinstance(m, coco.ElementwiseOp) and s not in (space, rows, None):
                raise fail(
                    f"{RULE}-one-shot",
                    f"{op_name(m)} computes over a different iteration space than the "
                    "all_reduce's result (each rank computes the whole tensor)",
                    at=m,
                )

    # -- targeted ------------------------------------------------------------------------

    def _apply_targeted(self, module: ModuleOp) -> None:
        sites = find_named_ops(module, self.ops, f"{RULE}-block", "op")
        fns = {fn for fn, _ in sites}
        named = [s for _, s in sites]
        kind = self.mode
        if kind == "auto":
            kind = (
                "all_reduce"
                if any(isinstance(s, comm.ReduceScatterOp) for s in named)
                else "elementwise"
            )
        plans: list[tuple[Block, set[Operation], str]] = []
        if kind == "all_reduce" and all(isinstance(s, comm.ReduceScatterOp) for s in named):
            chains: dict[Block, list[set[Operation]]] = {}
            # Per block where no chains can couple (see _computes_scalars_of_tensors): the
            # ops the chains so far hold. Sharing one refuses the set, so a chain stops there
            # (growing each of a residual stream's chains to its end first was quadratic).
            claimed: dict[Block, dict[Operation, None] | None] = {}
            for fn, rs in sites:
                assert isinstance(rs, comm.ReduceScatterOp)  # checked just above
                block = body_block(fn)
                if block not in claimed:
                    claimed[block] = None if _computes_scalars_of_tensors(block) else {}
                held = claimed[block]
                chain = self._chain(block, rs, held)
                if held is not None:
                    held.update(dict.fromkeys(chain))
                chains.setdefault(block, []).append(chain)
            for block, found in chains.items():
                plans += [(block, members, "all_reduce") for members in _merge_coupled(found)]
        elif kind == "send" and all(isinstance(s, comm.SendOp) for s in named):
            for fn, send in sites:
                assert isinstance(send, comm.SendOp)  # checked just above
                block = body_block(fn)
                plans.append((block, self._send_chain(block, send), "send"))
        elif kind == "all_to_all" and all(isinstance(s, comm.AllToAllOp) for s in named):
            # In program order, each chain without the ops an earlier one took (the
            # computation between two exchanges is the first one's consumers).
            taken: set[Operation] = set()
            for fn, a2a in sorted(sites, key=lambda site: _position(site[1])):
                assert isinstance(a2a, comm.AllToAllOp)  # checked just above
                block = body_block(fn)
                members = self._exchange_chain(block, a2a, taken)
                taken |= members
                plans.append((block, members, "all_to_all"))
        else:
            if len(fns) != 1:
                raise fail(f"{RULE}-block", "the named ops are in different functions")
            block = body_block(next(iter(fns)))
            members = set(named)
            if kind == "elementwise":
                self._check_elementwise(members)
            elif kind == "send":
                self._check_send(members)
            elif kind == "all_to_all":
                self._check_exchange(members)
            else:
                self._check_chain(members)
            self._check_connected(members)
            if kind == "all_to_all":
                self._check_exchange_sizes(members)
            else:
                self._check_sizes(members, kind)
            members = _absorb_updates(block, members, OrderInfo(block))
            plans.append((block, members, kind))
        self._fuse_plans(plans)

    def _fuse_plans(self, plans: list[tuple[Block, set[Operation], str]]) -> None:
        """Fuse each planned set, after checking every region before building any."""
        for block, members, _ in plans:
            plan_contiguous(block, members, f"{RULE}-cycle", "fusing " + self._describe(members))
        if len(plans) > 1:
            self._check_disjoint(plans)
            for block in {b for b, _, _ in plans}:
                check_groups_acyclic(
                    block,
                    [m for b, m, _ in plans if b is block],
                    f"{RULE}-cycle",
                    "fusing these sets",
                )
        for block, members, kind in plans:
            self._fuse(block, members, kind)

    def _describe(self, members: set[Operation]) -> str:
        names = [op_name(m) for m in members if m.results and m.results[0].name_hint]
        return "{" + ", ".join(sorted(names)[:6]) + (", ...}" if len(names) > 6 else "}")

    def _check_disjoint(self, plans: list[tuple[Block, set[Operation], str]]) -> None:
        seen: set[Operation] = set()
        for _, members, _ in plans:
            if seen & members:
                raise _shared(next(iter(seen & members)))
            seen |= members

    def _check_elementwise(self, members: set[Operation]) -> None:
        for m in _in_order(members):
            if not isinstance(m, coco.ElementwiseOp):
                raise fail(
                    f"{RULE}-elementwise",
                    f"{op_name(m)} is not elementwise: an elementwise fusion holds elementwise "
                    "ops only (use mode=all_reduce for a reduce_scatter chain)",
                    at=m,
                )

    def _check_chain(self, members: set[Operation]) -> None:
        scatters = [m for m in members if isinstance(m, comm.ReduceScatterOp)]
        gathers = [m for m in members if isinstance(m, comm.AllGatherOp)]
        if len(scatters) != 1:
            raise fail(
                f"{RULE}-chain",
                f"a fused all_reduce holds exactly one reduce_scatter; the named ops hold "
                f"{len(scatters)}",
            )
        if not gathers:
            raise fail(
                f"{RULE}-chain",
                "a fused all_reduce needs an all_gather re-replicating its chain; the named ops "
                "hold none",
            )
        for m in _in_order(members):
            ok = isinstance(
                m,
                coco.ElementwiseOp
                | coco.ReduceOp
                | coco.ReduceDimsOp
                | coco.SliceOp
                | coco.ConstantOp
                | coco.UpdateOp
                | comm.ReduceScatterOp
                | comm.AllGatherOp,
            ) or (isinstance(m, comm.AllReduceOp) and m.input.type.rank == 0)
            if not ok:
                raise fail(
                    f"{RULE}-chain",
                    f"{op_name(m)} cannot be part of a fused all_reduce (one collective chain: "
                    "reduce_scatter, computation, all_gathers, scalar all_reduces of partials)",
                    at=m,
                )

    def _check_send(self, members: set[Operation]) -> None:
        sends = [m for m in members if isinstance(m, comm.SendOp)]
        if len(sends) != 1:
            raise fail(
                f"{RULE}-chain",
                f"a fused send holds exactly one comm.send; the named ops hold {len(sends)}",
            )
        self._check_elementwise(members - set(sends))

    def _send_chain(self, block: Block, send: comm.SendOp) -> set[Operation]:
        """The elementwise computation feeding `send` (in its iteration space), and the send."""
        if send.parent_block() is not block:
            raise fail(f"{RULE}-block", f"{op_name(send)} is not in a function body", at=send)
        space = _space(send.input)
        producer = send.input.owner
        if not (isinstance(producer, coco.ElementwiseOp) and producer.parent_block() is block):
            raise fail(
                f"{RULE}-chain",
                f"the input of {op_name(send)} is not computed by an elementwise op: there is "
                "no computation to fuse into the send",
                at=send,
            )
        members: set[Operation] = {producer}
        work = [producer]
        while work:
            op = work.pop()
            for v in op.operands:
                p = v.owner
                if (
                    isinstance(p, coco.ElementwiseOp)
                    and p.parent_block() is block
                    and p not in members
                    and _meet(space, _op_space(p)) == space
                ):
                    members.add(p)
                    work.append(p)
        members = _absorb_feeders(block, members | {send})
        plan_contiguous(
            block, members, f"{RULE}-cycle", f"fusing the computation of {op_name(send)}"
        )
        return members

    # -- all_to_all: the exchange and the computation on either side ----------------------

    def _check_exchange(self, members: set[Operation]) -> None:
        exchanges = [m for m in members if isinstance(m, comm.AllToAllOp)]
        if len(exchanges) != 1:
            raise fail(
                f"{RULE}-chain",
                f"a fused all_to_all holds exactly one comm.all_to_all; the named ops hold "
                f"{len(exchanges)}",
            )
        for m in _in_order(members - set(exchanges)):
            if not isinstance(m, coco.ElementwiseOp):
                raise fail(
                    f"{RULE}-chain",
                    f"{op_name(m)} cannot be part of a fused all_to_all (its all_to_all and "
                    "elementwise computation of its input and result only)",
                )

    def _check_exchange_sizes(self, members: set[Operation]) -> None:
        """Ops computed from the all_to_all's result run on the receiver's piece (the
        result's space), the others on the sender's (the input's); scalars fit either."""
        a2a = next(m for m in members if isinstance(m, comm.AllToAllOp))
        after = _downstream(a2a, members)
        for m in _in_order(members - {a2a}):
            s = _op_space(m)
            want = _space(a2a.result) if m in after else _space(a2a.input)
            if s is not None and s != want:
                side = "result" if m in after else "input"
                raise fail(
                    f"{RULE}-sizes",
                    f"{op_name(m)} computes over a different iteration space than the "
                    f"all_to_all's {side} (the kernel computes each side on one piece)",
                )

    def _exchange_chain(
        self, block: Block, a2a: comm.AllToAllOp, taken: AbstractSet[Operation] = frozenset()
    ) -> set[Operation]:
        """`a2a` with the elementwise computation of its input (producers) and of its
        result (consumers), plus the slices, constants and updates only they need: the
        largest of {producers and consumers, consumers, producers, none} that closes no
        cycle. Ops in `taken` (an earlier exchange's) are not taken again."""
        if a2a.parent_block() is not block:
            raise fail(f"{RULE}-block", f"{op_name(a2a)} is not in a function body")
        before = _exchange_producers(block, a2a, taken)
        after = _exchange_consumers(block, a2a, taken)
        tried: list[set[Operation]] = []
        for chosen in (before | after, after, before):
            if not chosen or chosen in tried:
                continue
            tried.append(chosen)
            members = _absorb_feeders(block, chosen | {a2a})
            try:
                plan_contiguous(
                    block, members, f"{RULE}-cycle", f"fusing the computation of {op_name(a2a)}"
                )
            except PassFailedException:
                continue
            return _absorb_updates(block, members, OrderInfo.spanning(block, members))
        return _absorb_updates(block, {a2a}, OrderInfo.spanning(block, {a2a}))

    def _check_connected(self, members: set[Operation]) -> None:
        groups = comm.linked_groups(list(members), lambda _v: True)
        if len(groups) > 1:
            raise fail(
                f"{RULE}-connected",
                "the named ops are not connected through their own values: they form "
                f"{len(groups)} separate groups",
            )

    def _check_sizes(self, members: set[Operation], kind: str) -> None:
        space: Space = None
        if kind == "all_reduce":
            rs = next(m for m in members if isinstance(m, comm.ReduceScatterOp))
            space = _space(rs.result)
        rows = _row_space(space) if kind == "all_reduce" else None
        for m in _in_order(members):
            if isinstance(m, comm.AllGatherOp | coco.UpdateOp | comm.SendOp):
                continue
            s = _op_space(m)
            if rows is not None and s == rows:
                continue  # row values of a fused row kernel
            met = s if s == "mixed" else _meet(space, s)
            if isinstance(met, str):
                raise fail(
                    f"{RULE}-sizes",
                    f"{op_name(m)} computes over a different iteration space than the rest of "
                    "the fused set (one kernel runs one space)",
                    at=m,
                )
            space = met

    # -- greedy: the chain of a reduce_scatter ---------------------------------------------

    def _chain(
        self,
        block: Block,
        rs: comm.ReduceScatterOp,
        held: dict[Operation, None] | None = None,
    ) -> set[Operation]:
        """The maximal fused all_reduce around `rs` (before the cycle check). `held`: ops of
        other chains fused with this one, which cannot couple with it: the chain is refused
        at the first it would take ([fuse-chain], as the check of disjoint chains refuses)."""
        if rs.parent_block() is not block:
            raise fail(f"{RULE}-block", f"{op_name(rs)} is not in a function body", at=rs)
        space = _space(rs.result)
        span = set(rs.span())
        members: set[Operation] = {rs}
        chain: set[SSAValue] = {rs.result}
        gathered: set[SSAValue] = set()
        # Only ops of the block that read a chain value (or update with a gathered one) can
        # join, so the scan follows those uses and stops after the last one: it costs the
        # chain's extent, not the rest of the function (linear over every reduce_scatter).
        pending: set[Operation] = set()

        def watch(v: SSAValue, updates_only: bool = False) -> None:
            for use in v.uses:
                user = use.operation
                if user.parent_block() is block and (
                    not updates_only or isinstance(user, coco.UpdateOp)
                ):
                    pending.add(user)

        # Ops outside the chain computed from its gathered values (the next layer's matmul
        # on this layer's output, a norm of gathered rows): an op reading one of them cannot
        # join, as the chain would then wait for itself (a residual stack after coco-reorder:
        # the next layer's sliced residual reads this layer's slice and that layer's output).
        after_gather: set[Operation] = set()

        def waits_for_gather(u: Operation) -> bool:
            ops = u.walk() if u.regions else (u,)
            return any(v in gathered or v.owner in after_gather for o in ops for v in o.operands)

        watch(rs.result)
        u = rs.next_op
        while pending and u is not None:
            FusePass.chain_visits += 1
            waits = waits_for_gather(u)
            joined = None
            if u in pending:
                pending.discard(u)
                # (an update joins with a gathered value: the kernel writes it)
                if not waits or isinstance(u, coco.UpdateOp):
                    joined = self._chain_step(u, space, span, chain, gathered)
            if joined is not None:
                if held is not None and u in held:
                    raise _shared(u)
                members.add(u)
                for v in joined:
                    watch(v, updates_only=v in gathered)
            elif waits:
                after_gather.add(u)
            u = u.next_op
        if not any(isinstance(m, comm.AllGatherOp) for m in members) and not _stays_sliced(members):
            raise fail(
                f"{RULE}-chain",
                f"no all_gather of the chain of {op_name(rs)} over its axes: a fused all_reduce "
                "needs reduce_scatter, computation and all_gather (or, ZeRO-3's, computation "
                "whose every result updates sliced state)",
                at=rs,
            )
        self._check_rows(members, space)
        members = self._pull_feeders(block, members, space)
        if held is not None:
            for m in members:
                if m in held:
                    raise _shared(m)
        # scalar arithmetic between chain values (e.g. a trust ratio of two norms) that the
        # chain both feeds and reads belongs in the chain too
        info = OrderInfo.spanning(block, members)
        while True:
            try:
                plan_contiguous(
                    block, members, f"{RULE}-cycle", f"fusing the chain of {op_name(rs)}", info
                )
                return members
            except PassFailedException:
                bridge = self._bridges(info, members)
                if not bridge:
                    raise
                members |= bridge

    @staticmethod
    def _chain_step(
        u: Operation,
        space: Space,
        span: set[int],
        chain: set[SSAValue],
        gathered: set[SSAValue],
    ) -> tuple[SSAValue, ...] | None:
        """Whether `u` (an op after the reduce_scatter reading the chain, or updating with a
        chain or gathered value) joins the chain: None if not, else the values it adds (to
        `chain` or, for an all_gather, to `gathered`)."""
        if isinstance(u, coco.UpdateOp):
            return () if u.value in chain or u.value in gathered else None
        if not any(v in chain for v in u.operands):
            return None
        if isinstance(u, comm.AllGatherOp):
            if set(u.span()) == span and _space(u.input) == space:
                gathered.add(u.result)
                return (u.result,)
            return None
        if isinstance(u, coco.ElementwiseOp) and _meet(space, _space(u.results[0])) == space:
            chain.add(u.results[0])
            return (u.results[0],)
        if _row_reduction_of(u, space) or (
            isinstance(u, coco.ElementwiseOp)
            and _space(u.results[0]) is not None
            and _space(u.results[0]) == _row_space(space)
        ):
            # rows of the slice: one block per row finishes them in the kernel
            chain.add(u.results[0])
            return (u.results[0],)
        if isinstance(u, coco.ReduceOp) or (
            isinstance(u, comm.AllReduceOp) and u.input.type.rank == 0
        ):
            chain.add(u.result)
            return (u.result,)
        return None

    @staticmethod
    def _pull_feeders(block: Block, members: set[Operation], space: Space) -> set[Operation]:
        """Add the ops that only feed the chain (slices, constants, elementwise ops in its
        space), to a fixpoint: a candidate is an operand's producer, looked at again each time
        one of its users joins (no rescan of the block)."""
        members = set(members)
        work = [v.owner for m in members for o in m.walk() for v in o.operands]
        while work:
            p = work.pop()
            if not isinstance(p, Operation) or p in members or p.parent_block() is not block:
                continue
            if not p.results or not isinstance(
                p, coco.SliceOp | coco.ConstantOp | coco.ElementwiseOp
            ):
                continue
            # slices and splat constants move no data, so any shape may join
            if isinstance(p, coco.ElementwiseOp) and _meet(space, _op_space(p)) != space:
                continue
            users = {ancestor_in(block, use.operation) for r in p.results for use in r.uses}
            if users and users <= members:
                members.add(p)
                work.extend(v.owner for o in p.walk() for v in o.operands)
        return members

    def _check_rows(self, members: set[Operation], space: Space) -> None:
        """A chain with row reductions is one kernel with a block per row: no full
        reduction (those finish across blocks). Rows of any length: the row kernel streams
        what does not fit in shared memory."""
        rows = [m for m in members if isinstance(m, coco.ReduceDimsOp)]
        if not rows or space is None:
            return
        if any(isinstance(m, coco.ReduceOp) for m in members):
            raise fail(
                f"{RULE}-chain",
                "a fused all_reduce with row reductions cannot also finish full reductions",
            )

    def _bridges(self, info: OrderInfo, members: set[Operation]) -> set[Operation]:
        """Scalar elementwise ops outside the set that depend on it and feed it."""
        order = sorted(members, key=info.index.__getitem__)
        span = info.ops[info.index[order[0]] : info.index[order[-1]] + 1]
        after = info.reached(members, span)
        feeding = info.first_dependents(after, members, span)
        bridges: set[Operation] = {
            op for op in feeding if isinstance(op, coco.ElementwiseOp) and _op_space(op) is None
        }
        return bridges

    # -- greedy: elementwise components --------------------------------------------------

    def _components(self, block: Block) -> list[set[Operation]]:
        info = OrderInfo(block)
        comps: list[set[Operation]] = []
        spaces: list[Space] = []
        # each component's contiguity plan, kept as it grows (None once merged away)
        plans: list[_GrowingPlan | None] = []
        comp_of: dict[Operation, int] = {}
        for u in info.ops:
            if not isinstance(u, coco.ElementwiseOp):
                continue
            s = _op_space(u)
            neighbours = sorted(
                {comp_of[v.owner] for v in u.operands if v.owner in comp_of}  # type: ignore[index]
            )
            placed = False
            if neighbours:
                merged = {u}.union(*(comps[i] for i in neighbours))
                space: Space | str = s
                for i in neighbours:
                    space = space if isinstance(space, str) else _meet(space, spaces[i])
                if (
                    not isinstance(space, str)
                    and (plan := _GrowingPlan.join(info, plans, neighbours, comp_of, u)) is not None
                ):
                    keep = neighbours[0]
                    for i in neighbours[1:]:
                        for m in comps[i]:
                            comp_of[m] = keep
                        comps[i] = set()
                        plans[i] = None
                    comps[keep] = merged
                    spaces[keep] = space
                    plans[keep] = plan
                    comp_of[u] = keep
                    placed = True
                else:
                    for i in neighbours:
                        sp = _meet(spaces[i], s) if not isinstance(s, str) else "mismatch"
                        if isinstance(sp, str):
                            continue
                        plan = _GrowingPlan.join(info, plans, [i], comp_of, u)
                        if plan is None:
                            continue
                        comps[i] = comps[i] | {u}
                        spaces[i] = sp
                        plans[i] = plan
                        comp_of[u] = i
                        placed = True
                        break
            if not placed:
                comp_of[u] = len(comps)
                comps.append({u})
                spaces.append(None if isinstance(s, str) else s)
                plans.append(_GrowingPlan.of(info, u))
        result: list[set[Operation]] = []
        for c, sp in zip(comps, spaces, strict=True):
            if len(c) < 2 or sp is None:
                continue
            c = _absorb_feeders(block, c)
            result.append(_absorb_updates(block, c, info))
        return result

    # -- building ------------------------------------------------------------------------

    def _fuse(self, block: Block, members: set[Operation], kind: str) -> comm.RegionOp:
        if any(m.parent_block() is not block for m in members):
            raise fail(f"{RULE}-block", "a fused set lies partly inside another region")
        if kind == "all_reduce":
            members = _absorb_whole_reductions(block, members)
        hoisted, order = plan_contiguous(
            block, members, f"{RULE}-cycle", "fusing " + self._describe(members)
        )
        return wrap_in_region(block, hoisted, order, _make_fused(kind))


def _scalar(ar: comm.AllReduceOp) -> bool:
    return ar.input.type.rank == 0


def _refuse_scalar(ar: comm.AllReduceOp) -> None:
    """[fuse-one-shot]: a one-shot fused all_reduce starts at an all_reduce of a tensor."""
    if _scalar(ar):
        raise fail(
            f"{RULE}-one-shot",
            f"{op_name(ar)} reduces a scalar (a norm's partials): a one-shot fused "
            "all_reduce reduces a tensor",
            at=ar,
        )


def _position(op: Operation) -> tuple[int, int]:
    """Where `op` stands: its function's place in the module, its own in the function."""
    fn = op.parent_op()
    block = op.parent_block()
    assert fn is not None
    assert block is not None
    module = fn.parent_block()
    outer = module.get_operation_index(fn) if module is not None else 0
    return outer, block.get_operation_index(op)


def _downstream(a2a: comm.AllToAllOp, members: set[Operation]) -> set[Operation]:
    """The members computed (transitively) from the all_to_all's result."""
    reached: set[SSAValue] = {a2a.result}
    out: set[Operation] = set()
    for m in _in_order(members - {a2a}):
        if any(v in reached for o in m.walk() for v in o.operands):
            out.add(m)
            reached.update(m.results)
    return out


def _exchange_producers(
    block: Block, a2a: comm.AllToAllOp, taken: AbstractSet[Operation]
) -> set[Operation]:
    """The elementwise ops computing the all_to_all's input in its iteration space (shape and
    layouts; the element type may differ: a cast to bf16 before dispatch), walking back from
    it through their operands (not into `taken`)."""
    space = _space(a2a.input)
    members: set[Operation] = set()
    work: list[SSAValue] = [a2a.input]
    while work:
        p = work.pop().owner
        if (
            isinstance(p, coco.ElementwiseOp)
            and p.parent_block() is block
            and p not in members
            and p not in taken
            and space is not None
            and _op_space(p) == space
        ):
            members.add(p)
            work.extend(p.operands)
    return members


def _exchange_consumers(
    block: Block, a2a: comm.AllToAllOp, taken: AbstractSet[Operation]
) -> set[Operation]:
    """The elementwise ops in the all_to_all result's iteration space computed from it, in
    program order: an op joins when it reads the result or a joined op's, and nothing
    computed from them outside the set (which would then run between the set's ops), and
    it is not in `taken`. Only the users of those values are looked at, up to the last one
    (no scan of the rest of the function)."""
    space = _space(a2a.result)
    members: set[Operation] = set()
    chain: set[SSAValue] = {a2a.result}
    waiting: set[SSAValue] = set()  # computed from the chain outside it
    pending: set[Operation] = set()

    def watch(values: Sequence[SSAValue]) -> None:
        for v in values:
            for use in v.uses:
                user = ancestor_in(block, use.operation)
                if user is not None:
                    pending.add(user)

    watch([a2a.result])
    u = a2a.next_op
    while pending and u is not None:
        if u in pending:
            pending.discard(u)
            reads = {v for o in u.walk() for v in o.operands}
            if (
                isinstance(u, coco.ElementwiseOp)
                and u not in taken
                and space is not None
                and _op_space(u) == space
                and reads & chain
                and not reads & waiting
            ):
                members.add(u)
                chain.update(u.results)
            else:
                waiting.update(u.results)
            watch(list(u.results))
        u = u.next_op
    return members


def _stays_sliced(members: set[Operation]) -> bool:
    """Whether a chain without an all_gather is ZeRO-3's step: computation on the slice
    whose results only its own updates read (sliced parameters and state stay sliced), at
    least one of them. Where a result leaves the chain (a send of the slice, a value the
    program returns), the chain is not fused as an all_reduce."""
    updates = [m for m in members if isinstance(m, coco.UpdateOp)]
    return bool(updates) and all(
        use.operation in members
        for m in members
        if not isinstance(m, coco.UpdateOp)
        for r in m.results
        for use in r.uses
    )


def _shared(op: Operation) -> PassFailedException:
    return fail(
        f"{RULE}-chain", f"the named chains share {op_name(op)}: fuse them one at a time", at=op
    )


def _merge_coupled(chains: list[set[Operation]]) -> list[set[Operation]]:
    """Chains of several reduce_scatters that share scalar arithmetic (a global norm over
    several tensors, read back by each tensor's update: gradient clipping) as ONE region:
    neither can be fused without the other. Chains sharing a tensor op stay apart (the
    disjointness check then refuses them, naming the op)."""
    merged: list[set[Operation] | None] = []  # None: merged into a later one
    # The merged chains holding each op (an index into `merged`): the chains a new one
    # meets, found without intersecting it with every chain so far.
    holders: dict[Operation, list[int]] = {}
    for chain in chains:
        chain = set(chain)
        met = sorted({i for op in chain for i in holders.get(op, ()) if merged[i] is not None})
        for i in met:
            other = merged[i]
            assert other is not None
            if all(_scalar_only(op) for op in other & chain):
                merged[i] = None
                chain |= other
        index = len(merged)
        merged.append(chain)
        for op in chain:
            holders.setdefault(op, []).append(index)
    return [m for m in merged if m is not None]


def _computes_scalars_of_tensors(block: Block) -> bool:
    """Whether an op of `block` (or one nested in it) computes a scalar from a tensor: a full
    reduction, a matmul of vectors, a region yielding a scalar. Without one, every scalar of
    the block comes from arguments and constants, so a reduce_scatter's chain holds scalar
    arithmetic only as feeders of its own tensor ops (a scalar value of the chain needs a
    reduction of a chain tensor): two chains then share a scalar op only where they share a
    tensor op too, and `_merge_coupled` merges none of them."""
    for top in block.ops:
        for op in top.walk():
            if not any(_is_scalar(r) for r in op.results):
                continue
            if op.regions or any(
                isinstance(v.type, TensorType) and v.type.rank > 0 for v in op.operands
            ):
                return True
    return False


def _is_scalar(v: SSAValue) -> bool:
    return isinstance(v.type, TensorType) and v.type.get_shape() == ()


def _scalar_only(op: Operation) -> bool:
    return bool(op.results) and all(
        isinstance(r.type, TensorType) and r.type.get_shape() == () for r in op.results
    )


def _absorb_whole_reductions(block: Block, members: set[Operation]) -> set[Operation]:
    """Full reductions of a tensor every rank of the group holds whole, read only by the
    chain (LAMB's norm(w) of a replicated w, a clipping's norm), join the chain computed on
    the chain's slice: a partial per rank and an all_reduce of the partials (a norm: of the
    squares, then a square root), as coco-reorder rewrites a reduction of a gathered value.
    The fused kernel then finishes them with the chain's own reductions, instead of every
    rank reducing the whole tensor in kernels of its own before the region. The sum is
    reassociated (per slice, then across ranks): equal within the reductions' tolerance."""
    scatters = [m for m in members if isinstance(m, comm.ReduceScatterOp)]
    if len(scatters) != 1:
        return members
    rs = scatters[0]
    sliced: TensorType = rs.result.type
    span = set(rs.span())
    rank = grid_rank(function_of(block))
    # The candidates are the reductions the chain reads: found from the members' operands,
    # not by a scan of the function (each fusion costs its chain, not the program).
    candidates = _reductions_read_by(block, members)
    if not candidates:
        return members
    # Their order in the block, and where the tensors they reduce are computed.
    inputs = [
        r.input.owner
        for r in candidates
        if isinstance(r.input.owner, Operation) and r.input.owner.parent_block() is block
    ]
    info = OrderInfo.spanning(block, {rs, *candidates, *inputs})
    members = set(members)
    for r in sorted(candidates, key=info.index.__getitem__):
        if r.kind.data not in ("sum", "max", "min", "norm"):
            continue
        # Its slice is taken right after the reduce_scatter: the tensor must exist there.
        owner = r.input.owner
        if isinstance(owner, Operation) and (
            owner not in info.index or info.index[owner] >= info.index[rs]
        ):
            continue
        x: TensorType = r.input.type
        users = {ancestor_in(block, use.operation) for use in r.result.uses}
        if not users or not users <= members or _updated_outside(block, r.input, members):
            continue
        if x.get_shape() != sliced.get_shape():
            continue
        # The whole tensor on every group member, laid out as the slice off the group's axes.
        if not all(
            x.layout_on(a) == (ReplicatedAttr() if a in span else sliced.layout_on(a))
            for a in range(rank)
        ):
            continue
        piece = x.with_layouts(list(sliced.layouts))
        members |= _reduce_on_slice(block, r, rs, piece, members)
    return members


def _reductions_read_by(block: Block, members: set[Operation]) -> list[coco.ReduceOp]:
    """The `coco.reduce` ops of `block`, outside `members`, whose results a member (or an op
    nested in one) reads."""
    found: dict[coco.ReduceOp, None] = {}
    for m in members:
        for o in m.walk():
            for v in o.operands:
                r = v.owner
                if isinstance(r, coco.ReduceOp) and r not in members and r.parent_block() is block:
                    found[r] = None
    return list(found)


def _updated_outside(block: Block, v: SSAValue, members: set[Operation]) -> bool:
    """Whether a top-level `coco.update` of `block` outside `members` writes `v`."""
    return any(
        isinstance(u := use.operation, coco.UpdateOp)
        and u.target is v
        and u not in members
        and u.parent_block() is block
        for use in v.uses
    )


def _reduce_on_slice(
    block: Block,
    r: coco.ReduceOp,
    rs: comm.ReduceScatterOp,
    piece: TensorType,
    members: set[Operation],
) -> set[Operation]:
    """Rewrites `r` as its partial on this rank's slice (right after `rs`; the chain's slice
    of the tensor where `members` hold one) and an all_reduce
    over `rs`'s axes; a norm's square root goes just before its first reader, so that the
    kernel reading the partial's all_reduce is not cut before the chain's other work."""
    kind = r.kind.data
    rank = grid_rank(function_of(block))
    new_ops: list[Operation] = []
    # The chain's own slice of the tensor, if it has one, moves up to serve both.
    existing = [
        s
        for s in members
        if isinstance(s, coco.SliceOp) and s.input is r.input and s.result.type == piece
    ]
    if existing:
        piece_of = existing[0]
        block.detach_op(piece_of)
    else:
        piece_of = coco.SliceOp(r.input, piece)
        set_name(piece_of.result, derived_name(r.input, "s"))
    new_ops.append(piece_of)
    partial, part = partial_reduction(r, piece_of.result)
    axes = rs.axes.get_values() if rs.axes is not None else None
    total = combine_partials(r, part.result, axes, rank)
    new_ops += [*partial, total]
    at = rs
    for op in new_ops:
        block.insert_op_after(op, at)
        at = op
    final = total.result
    if kind == coco.ReductionKind.NORM:
        root = coco.SqrtOp(total.result)
        readers = [ancestor_in(block, use.operation) for use in r.result.uses]
        first: Operation | None = None
        for op in readers:
            if op is not None and (first is None or precedes_in_block(op, first)):
                first = op
        assert first is not None
        block.insert_op_before(root, first)
        new_ops.append(root)
        final = root.result
    set_name(final, r.result.name_hint)
    r.result.replace_all_uses_with(final)
    block.erase_op(r)
    return set(new_ops)
