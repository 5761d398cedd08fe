"""Handles: name-based references to what a schedule's steps made, and how a step's targets
(names, handles, xDSL values or ops) become the SSA names passes act on."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from xdsl.ir import Operation, OpResult, SSAValue

from coconet.core.program import Program
from coconet.schedule.errors import schedule_error
from coconet.schedule.targets import top_level_named


class HasProgram(Protocol):
    """What a handle reads of its schedule (ScheduleSteps, which stands above this module)."""

    @property
    def program(self) -> Program: ...


@dataclass(frozen=True, eq=False)
class Handle:
    """A name-based reference to a value (or the op producing it) of a Schedule's program.

    It stays valid across later steps as long as some op still produces a value of that name
    (a value moved into a fused region is found inside it). `str(handle)` is `%name`. A region
    with no results has no name: such a handle holds the op itself and cannot be targeted."""

    schedule: HasProgram = field(repr=False)
    name: str | None
    kind: str  # the producing op's name (`comm.reduce_scatter`, ...) or `argument`
    _op: Operation | None = field(default=None, repr=False)

    @property
    def value(self) -> SSAValue | None:
        if self.name is None:
            return None
        return top_level_named(self.schedule.program.func, self.name)

    @property
    def op(self) -> Operation | None:
        """The op producing the value now (None for an argument)."""
        if self.name is None:
            return self._op if self._op is not None and self._op.parent is not None else None
        v = self.value
        return v.owner if isinstance(v, OpResult) else None

    @property
    def type(self) -> Any:
        v = self.value
        return None if v is None else v.type

    def __str__(self) -> str:
        return f"%{self.name}" if self.name else f"<unnamed {self.kind}>"


class Reordered:
    """What `Schedule.reorder` returns: unpacks as CoCoNet's `(newComps, newAGs)`: the moved
    computations (their sliced values) and the all_gathers re-inserted for values that leave
    the moved set; `slices` holds the slices of replicated operands it made."""

    def __init__(self, computations: list[Handle], gathers: list[Handle], slices: list[Handle]):
        self.computations = computations
        self.gathers = gathers
        self.slices = slices

    def __iter__(self) -> Iterator[list[Handle]]:
        return iter((self.computations, self.gathers))

    def __repr__(self) -> str:
        show = lambda hs: "[" + ", ".join(map(str, hs)) + "]"  # noqa: E731
        return (
            f"Reordered(computations={show(self.computations)}, gathers={show(self.gathers)}, "
            f"slices={show(self.slices)})"
        )


Target = str | Handle | SSAValue | Operation


def target_name(t: Target, method: str) -> str:
    if isinstance(t, Handle):
        if t.name is None:
            raise schedule_error(
                "schedule-target",
                f"{method}: {t} has no SSA name, so no pass can target it; target a named op "
                "it holds, or call without targets (greedy mode)",
            )
        return t.name
    if isinstance(t, str):
        name = t[1:] if t.startswith("%") else t
        if not name:
            raise schedule_error("schedule-target", f"{method}: empty target name")
        return name
    if isinstance(t, SSAValue):
        if not t.name_hint:
            raise schedule_error(
                "schedule-target",
                f"{method}: the value has no SSA name; name it in the program (passes find "
                "ops by name) or call without targets (greedy mode)",
            )
        return t.name_hint
    if isinstance(t, Operation):
        named = [r.name_hint for r in t.results if r.name_hint]
        if not named:
            raise schedule_error(
                "schedule-target", f"{method}: {t.name} has no named result to target"
            )
        return named[0]
    raise schedule_error("schedule-target", f"{method}: cannot target a {type(t).__name__}")


def flatten_targets(targets: Iterable[Any]) -> list[Target]:
    out: list[Target] = []
    for t in targets:
        if isinstance(t, list | tuple | set | frozenset | Reordered):
            out.extend(flatten_targets(t))
        elif t is not None:
            out.append(t)
    return out
