"""`coco-fuse-all-reduce`: a reduce_scatter, the sliced computation consuming it and the
all_gathers of its results -> one `comm.fused all_reduce` region (CoCoNet's FusedAllReduce);
with `form=one_shot`, an all_reduce as written and the computation on its result
(one_shot.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from coconet.dialects import coco, comm
from coconet.dialects.coco import TensorType
from coconet.passes.common import (
    OrderInfo,
    body_block,
    fail,
    find_named_ops,
    find_root,
    functions,
    op_name,
)
from coconet.passes.fuse.chain import (
    CoupledScalars,
    close_cycles,
    computes_scalars,
    is_scalar,
    reduce_scatter_chain,
)
from coconet.passes.fuse.checks import check_sizes, exact_set
from coconet.passes.fuse.one_shot import fuse_one_shot
from coconet.passes.fuse.region import ONE_SHOT, RULE, Plan, fuse, fuse_plans, in_order
from coconet.passes.fuse.spaces import space_of

KIND = "all_reduce"
FORMS = ("two_shot", "one_shot")


@dataclass(frozen=True)
class FuseAllReducePass(ModulePass):
    """Group a reduce_scatter, the sliced computation consuming it and the all_gathers of its
    results into one `comm.fused all_reduce` region (built as coco-fuse-elementwise builds its
    regions). From the reduce_scatter, the chain grows in program order over: elementwise ops with a
    result in the reduce_scatter's iteration space (same shape and layouts) or scalar; reductions of
    chain values (partial norms) and all_reduces of scalar partials; row reductions over the last
    dim (keepdims) of a slice that keeps whole rows, and elementwise ops on their row values
    (RMSNorm, LayerNorm: one block per row); all_gathers of chain values over the reduce_scatter's
    axes; and the updates storing chain or gathered values. Then ops feeding only the chain (slices
    of arguments, constants, scalar arithmetic, elementwise ops in the chain's space) are pulled in,
    and so is scalar arithmetic the chain both feeds and reads (LAMB's trust ratio ||w|| / ||r||).
    Full reductions of a whole tensor the chain reads are finished on its slice
    (whole_reductions.py). Greedy (no `ops`): every reduce_scatter's chain, chains sharing scalar
    arithmetic (a global norm) as one region. Targeted: `ops` names reduce_scatters (their maximal
    chain), or names the exact set to fuse (one reduce_scatter, at least one all_gather; updates of
    its values join). `coco-fuse{mode=all_reduce}` is this pass.

    Forms (`form` option):
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
    * [fuse-chain]       a fused all_reduce holds exactly one reduce_scatter and at least
                         one all_gather of its chain (one collective chain per region), or,
                         for ZeRO-3's step (sliced parameters and state), none where every
                         result of the chain updates sliced state; row reductions and full
                         reductions do not share a chain.
    * [fuse-sizes]       tensors computed in the region share the reduce_scatter's
                         iteration space; scalars fit any, and so do the rows of a fused
                         all_reduce (keepdims reductions over the last dim of a space that
                         no grid axis slices there, and ops on them). Rows of any length: a
                         row kernel keeps what a later phase reads in shared memory where it
                         fits and streams it otherwise (lowering/row_collective.py).
    * [fuse-form]        `form` is two_shot or one_shot.
    * [fuse-one-shot]    a one-shot fusion starts at a comm.all_reduce of a tensor as written
                         (a scalar's is a norm's partials; a split all_reduce is the two-shot
                         form's, and sliced values -- as-slice'd optimizer state, ZeRO-3's
                         sliced parameters -- never join: each rank computes the whole
                         tensor); a named set holds one all_reduce and, besides, only
                         elementwise ops, constants, slices, row reductions over the last dim
                         and updates, in the all_reduce's iteration space or its rows.
    * [fuse-connected], [fuse-cycle], [fuse-block] as for coco-fuse-elementwise.
    """

    name = "coco-fuse-all-reduce"

    ops: tuple[str, ...] = ()
    form: str = "two_shot"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.form not in FORMS:
            raise fail(f"{RULE}-form", f"unknown form '{self.form}': use one of {', '.join(FORMS)}")
        if self.form == ONE_SHOT:
            fuse_one_shot(op, self.ops)
        elif self.ops:
            _fuse_targeted(op, self.ops)
        else:
            for fn in functions(op):
                fuse_greedy(body_block(fn))


def fuse_greedy(block: Block) -> None:
    """Fuse every reduce_scatter chain of `block` that the rules admit."""
    scatters = [o for o in block.ops if isinstance(o, comm.ReduceScatterOp)]
    if not _computes_scalars_of_tensors(block):
        # No chain can hold scalar arithmetic, so none couples with another: each is
        # grown on what earlier fusions left, in program order (growing every chain
        # first, on the untouched block, cost the sum of their extents: quadratic where
        # each layer's chain runs on along a sliced residual stream to the end of the
        # function).
        for rs in scatters:
            try:
                fuse(block, reduce_scatter_chain(block, rs), KIND)
            except PassFailedException:
                continue
        return
    chains: list[set[Operation]] = []
    info = OrderInfo(block)  # every chain grows on the block as it is
    coupled = CoupledScalars()
    for rs in scatters:
        try:
            chains.append(reduce_scatter_chain(block, rs, info=info, close=False, coupled=coupled))
        except PassFailedException:
            continue
    plans = _merge_coupled(chains, block, info)
    for n, members in enumerate(plans):
        scatters = [m for m in members if isinstance(m, comm.ReduceScatterOp)]
        try:
            if len(scatters) == 1:
                # A chain of its own is grown again around what earlier fusions left at
                # the top level, leaving what the merge gave a later chain to it.
                members = reduce_scatter_chain(block, scatters[0])
                later = set[Operation]().union(*plans[n + 1 :]) & members
                if later and (members := _without(members, later)) is None:
                    continue
            else:
                members = close_cycles(block, members, _what(members, info.index))
            fuse(block, members, KIND)
        except PassFailedException:
            continue


def _fuse_targeted(module: ModuleOp, ops: tuple[str, ...]) -> None:
    sites = find_named_ops(module, ops, f"{RULE}-block", "op")
    if all(isinstance(s, comm.ReduceScatterOp) for _, s in sites):
        plans = _named_chains(sites)
    else:
        block, members = exact_set(sites, _check_chain, lambda members: check_sizes(members, KIND))
        plans = [(block, members, KIND)]
    fuse_plans(plans)


def _named_chains(sites: Sequence[tuple[func.FuncOp, Operation]]) -> list[Plan]:
    """The chains of the named reduce_scatters, coupled ones merged."""
    plans: list[Plan] = []
    chains: dict[Block, list[set[Operation]]] = {}
    # Per block where no chains can couple (see _computes_scalars_of_tensors): the
    # ops the chains so far hold. Sharing one refuses the set, so a chain stops there
    # (growing each of a residual stream's chains to its end first was quadratic).
    claimed: dict[Block, dict[Operation, None] | None] = {}
    orders: dict[Block, OrderInfo] = {}  # the blocks stay as they are until fuse_plans
    coupled: dict[Block, CoupledScalars] = {}
    for fn, rs in sites:
        assert isinstance(rs, comm.ReduceScatterOp)  # checked by the caller
        block = body_block(fn)
        if block not in claimed:
            claimed[block] = None if _computes_scalars_of_tensors(block) else {}
            orders[block] = OrderInfo(block)
            coupled[block] = CoupledScalars()
        held = claimed[block]
        chain = reduce_scatter_chain(
            block,
            rs,
            held,
            orders[block],
            close=False,
            coupled=coupled[block] if held is None else None,
        )
        if held is not None:
            held.update(dict.fromkeys(chain))
        chains.setdefault(block, []).append(chain)
    for block, found in chains.items():
        info = orders[block]
        plans += [
            (block, close_cycles(block, members, _what(members, info.index), info), KIND)
            for members in _merge_coupled(found, block, info)
        ]
    return plans


def _what(members: set[Operation], position: Mapping[Operation, int]) -> str:
    """What a refusal of fusing chains says it was doing: the chain of their first
    reduce_scatter (`position`: where each reduce_scatter stands)."""
    scatters = [m for m in members if isinstance(m, comm.ReduceScatterOp)]
    return f"fusing the chain of {op_name(min(scatters, key=position.__getitem__))}"


def _check_chain(members: set[Operation]) -> None:
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
    for m in in_order(members):
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


def _merge_coupled(
    chains: list[set[Operation]], block: Block, info: OrderInfo
) -> list[set[Operation]]:
    """Chains that meet, merged or kept apart so that each op is in one region:
    * chains of several reduce_scatters sharing scalar arithmetic only (a global norm over
      several tensors, read back by each tensor's update: gradient clipping; scalar state
      updated from all of them: a loss scale from a found-inf flag) are ONE region:
      neither can be fused without the other;
    * chains meeting in a tensor op (a cross-entropy's loss reads the row sums of two
      all_reduces) whose reduce_scatters share one iteration space and axes are ONE region,
      its kernel reading both from the peers, where the union closes no cycle;
    * otherwise the earlier chain leaves the shared ops (and what it computes from them) to
      the later one, whose reduce_scatter they wait for anyway, if it keeps an all_gather.
    Chains that still share an op stay apart (the disjointness check refuses them, naming
    the op). Chains of one iteration space and span that meet in tensor ops are merged
    first (`_merge_alike`), so the outcome does not hang on the order of the tensors."""

    def meet(other: set[Operation], chain: set[Operation]) -> Meeting:
        common = other & chain
        if not common:
            return other, chain  # trimmed off it by an earlier meeting
        if all(_scalar_only(op) for op in common):
            return None, _union(other, chain)
        if (joined := _one_kernel(block, other, chain, info)) is not None:
            return None, joined
        kept = _without(other, common)
        return (other if kept is None else kept), chain

    return _merged_in_order(_merge_alike(chains, block, info), meet)


def _merge_alike(
    chains: list[set[Operation]], block: Block, info: OrderInfo
) -> list[set[Operation]]:
    """Chains whose reduce_scatters share one iteration space and span, merged where they
    meet in a tensor op and make one kernel; the others as they are, in order. Same-shaped
    tensors under one global norm meet so: each one's chain takes the others' updates,
    which read the norm. Merged in program order, the chain of a tensor of another shape
    between them (a bias between two weights) had already joined the first through the
    norm, and the union of the three was then not one kernel: fuse(rs-c-ag) was refused
    for the usual interleaving of weights and biases.

    The chains of one space that meet, transitively, are tried as one union first, its
    cycle check run once (a model's same-shaped tensors all meet: checking the growing
    union at each meeting was quadratic); where that union is not one kernel, they are
    merged one meeting at a time, in order, as far as each union is. A merged set stands
    where its last chain stood."""
    keys = [_scatter_key(c) for c in chains]
    parent = list(range(len(chains)))
    first_holder: dict[tuple[Operation, object], int] = {}
    for i, chain in enumerate(chains):
        if keys[i] is None:
            continue
        for op in chain:
            if not _scalar_only(op):
                j = first_holder.setdefault((op, keys[i]), i)
                parent[find_root(parent, i)] = find_root(parent, j)
    components: dict[int, list[int]] = {}
    for i in range(len(chains)):
        components.setdefault(find_root(parent, i), []).append(i)
    placed: list[tuple[int, set[Operation]]] = []
    for members in components.values():
        if len(members) == 1:
            placed.append((members[0], chains[members[0]]))
            continue
        union = set[Operation]().union(*(chains[i] for i in members))
        try:
            placed.append((members[-1], close_cycles(block, union, "", info)))
            continue
        except PassFailedException:
            pass
        position = {s: i for i in members for s in chains[i] if isinstance(s, comm.ReduceScatterOp)}

        def meet(other: set[Operation], chain: set[Operation]) -> Meeting:
            if (joined := _one_kernel(block, other, chain, info)) is not None:
                return None, joined
            return other, chain

        for merged in _merged_in_order(
            [chains[i] for i in members], meet, lambda op: not _scalar_only(op)
        ):
            last = max(position[s] for s in merged if isinstance(s, comm.ReduceScatterOp))
            placed.append((last, merged))
    return [chain for _, chain in sorted(placed, key=lambda p: p[0])]


# What a meeting of an earlier (merged) chain and a new one leaves: the earlier one (None:
# merged into the new one) and the new one.
Meeting = tuple[set[Operation] | None, set[Operation]]


def _merged_in_order(
    chains: list[set[Operation]],
    meet: Callable[[set[Operation], set[Operation]], Meeting],
    shares: Callable[[Operation], bool] = lambda op: True,
) -> list[set[Operation]]:
    """Each chain in order meets the earlier ones it shares an op with (those ops for which
    `shares` holds), found through an index of the ops each chain held when it came, read
    through the merges since (`into`: where a merged chain went); `meet` says what each
    meeting leaves. A merge registers no op again: a chain meeting a union of many costs
    its own ops, not the union's (each tensor of a global norm meets the union of all the
    earlier ones)."""
    merged: list[set[Operation] | None] = []
    into: list[int] = []  # index -> the index it was merged into (itself while it stands)
    holders: dict[Operation, list[int]] = {}
    for chain in chains:
        here = len(merged)
        own = [op for op in chain if shares(op)]  # a merge may grow `chain` in place
        met = sorted({find_root(into, i) for op in own for i in holders.get(op, ())})
        for i in met:
            other = merged[i]
            if other is None:
                continue
            merged[i], chain = meet(other, chain)
            if merged[i] is None:
                into[i] = here
        for op in own:
            holders.setdefault(op, []).append(here)
        merged.append(chain)
        into.append(here)
    return [m for m in merged if m is not None]


def _union(a: set[Operation], b: set[Operation]) -> set[Operation]:
    """`a | b`, built in the larger of the two (the union of many chains grows one at a
    time: copying it at each merge was quadratic)."""
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    large |= small
    return large


def _scatter_key(chain: set[Operation]) -> tuple[object, ...] | None:
    """The iteration space and span all the chain's reduce_scatters share, if they do."""
    keys = {(space_of(m.result), m.span()) for m in chain if isinstance(m, comm.ReduceScatterOp)}
    return next(iter(keys)) if len(keys) == 1 else None


def _one_kernel(
    block: Block, a: set[Operation], b: set[Operation], info: OrderInfo
) -> set[Operation] | None:
    """Two chains meeting in a tensor op as one fused kernel, if they can be: every
    reduce_scatter of both has one result space and one span, and their union is acyclic
    once it holds the scalar arithmetic between them (`close_cycles`: a global norm's
    running sum, which only the first chain to reach it holds); None otherwise."""
    key = _scatter_key(a)
    if key is None or _scatter_key(b) != key:
        return None
    try:
        return close_cycles(block, a | b, "", info)
    except PassFailedException:
        return None


def _without(chain: set[Operation], common: set[Operation]) -> set[Operation] | None:
    """`chain` without the ops in `common` and those of its ops computed from them, or None
    where what is left re-replicates nothing (no all_gather)."""
    dropped = set(common)
    for m in in_order(chain):
        if m not in dropped and any(v.owner in dropped for o in m.walk() for v in o.operands):
            dropped.add(m)
    kept = chain - dropped
    if not any(isinstance(m, comm.AllGatherOp) for m in kept):
        return None
    return kept


def _computes_scalars_of_tensors(block: Block) -> bool:
    """Whether an op of `block` (or one nested in it) computes a scalar from a tensor: a full
    reduction, a matmul of vectors, a region yielding a scalar. Without one, every scalar of
    the block comes from arguments and constants, so a reduce_scatter's chain holds scalar
    arithmetic only as feeders of its own tensor ops (a scalar value of the chain needs a
    reduction of a chain tensor): two chains then share a scalar op only where they share a
    tensor op too, and `_merge_coupled` merges none of them."""
    for top in block.ops:
        for op in top.walk():
            if not any(is_scalar(r) for r in op.results):
                continue
            if op.regions or any(
                isinstance(v.type, TensorType) and v.type.rank > 0 for v in op.operands
            ):
                return True
    return False


def _scalar_only(op: Operation) -> bool:
    if isinstance(op, coco.UpdateOp):  # scalar state updated from the chains (a loss scale)
        return is_scalar(op.target)
    return computes_scalars(op)
