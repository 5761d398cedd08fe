"""The growing plan of a greedy elementwise component: `plan_contiguous`'s answer kept up to
date as the component grows in program order, so that a component costs its extent once."""

from __future__ import annotations

from collections.abc import Callable

from xdsl.ir import Operation, SSAValue

from coconet.passes.common import OrderInfo


class GrowingPlan:
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
    def of(cls, info: OrderInfo, u: Operation) -> GrowingPlan:
        """The plan of the component {u}."""
        plan = cls(info.index[u])
        plan._scan(info, plan, plan.first, plan.first, lambda x: x is u)
        plan.scanned = plan.first
        return plan

    @classmethod
    def join(
        cls,
        info: OrderInfo,
        plans: list[GrowingPlan | None],
        parts: list[int],
        comp_of: dict[Operation, int],
        u: Operation,
    ) -> GrowingPlan | None:
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
        base: GrowingPlan,
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
