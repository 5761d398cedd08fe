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
    member that a sunk op before it precedes closes a cycle.

    A `log` of what each classified position added lets the plan be rolled back to an
    earlier position: where a component it joins starts before the last op it looked at
    (`v_new = bv + gg`, with `bv` computed between `gg` and its reader), the union is
    planned from there on top of the rolled-back state, not again from the first member (a
    global norm's component holds every same-shaped tensor's step: planning it again from
    the norm at each tensor was quadratic)."""

    __slots__ = ("defined", "first", "log", "read", "scanned", "sunk_defs", "sunk_reads")

    def __init__(self, first: int):
        self.first = first
        self.scanned = first - 1
        self.defined: set[SSAValue] = set()
        self.read: set[SSAValue] = set()
        self.sunk_defs: set[SSAValue] = set()
        self.sunk_reads: set[SSAValue] = set()
        # (position, sunk, defs, reads it added, sunk reads it added), in position order
        self.log: list[tuple[int, bool, set[SSAValue], list[SSAValue], list[SSAValue]]] = []

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
        is kept as the union's up to where the next one starts: extended there when it has
        looked no further, rolled back there when it has (and planned again as its own past
        it, if the union closes a cycle); the rest is classified again."""
        found = [(plans[i], i) for i in parts]
        ordered = sorted(((p, i) for p, i in found if p is not None), key=lambda t: t[0].first)
        assert len(ordered) == len(parts)
        head, head_index = ordered[0]
        end = info.index[u]
        rest = ordered[1][0].first if len(ordered) > 1 else end
        looked = head.scanned
        if looked < rest:
            head._scan(info, head, looked + 1, rest - 1, lambda x: False)
        else:
            head._roll_back(rest)
        head.scanned = rest - 1
        wanted = set(parts)
        delta = cls(head.first)
        if delta._scan(info, head, rest, end, lambda x: x is u or comp_of.get(x, -1) in wanted):
            head._absorb(delta)
            head.scanned = end
            return head
        if looked >= rest:  # head's own plan again, as far as it had looked
            head._scan(info, head, rest, looked, lambda x: comp_of.get(x, -1) == head_index)
            head.scanned = looked
        return None

    def _roll_back(self, position: int) -> None:
        """The state before `position`: what the positions from it on added, removed."""
        while self.log and self.log[-1][0] >= position:
            _, sunk, defs, reads, sunk_reads = self.log.pop()
            self.defined -= defs
            self.read.difference_update(reads)
            if sunk:
                self.sunk_defs -= defs
                self.sunk_reads.difference_update(sunk_reads)

    def _absorb(self, later: GrowingPlan) -> None:
        """`later` (a plan of the positions right after this one's, on top of it) added."""
        for entry in later.log:
            _, sunk, defs, reads, sunk_reads = entry
            self.log.append(entry)
            self.defined |= defs
            self.read.update(reads)
            if sunk:
                self.sunk_defs |= defs
                self.sunk_reads.update(sunk_reads)

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
        for position in range(start, stop + 1):
            x = info.ops[position]
            defs, uses, reads, writes = info.facts(x)
            if is_member(x):
                if any(
                    not p.sunk_defs.isdisjoint(uses) or not p.sunk_reads.isdisjoint(writes)
                    for p in layers
                ):
                    return False
                sunk = False
            elif all(p.defined.isdisjoint(uses) and p.read.isdisjoint(writes) for p in layers):
                continue  # hoisted
            else:
                sunk = True
            # what this position adds that the plan (with its base) did not hold before
            new_reads = [a for a in reads if all(a not in p.read for p in layers)]
            new_sunk = (
                [a for a in reads if all(a not in p.sunk_reads for p in layers)] if sunk else []
            )
            self.log.append((position, sunk, defs, new_reads, new_sunk))
            self.defined |= defs
            self.read.update(new_reads)
            if sunk:
                self.sunk_defs |= defs
                self.sunk_reads.update(new_sunk)
        return True
