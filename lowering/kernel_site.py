"""What an elementwise kernel computes, up to the values it computes it on: the lowering
builds one kernel per distinct site and hands later sites of the same computation that
kernel (a deep model's layers, an optimizer's step over each parameter tensor).

A site is its ops (names, properties and attributes, numerics policy, how their operands refer
to the inputs and to each other, their result types), its inputs' types, its iteration type and
its stores, with every value numbered by first occurrence; two sites with equal keys build
kernels that differ only in what names their variables and comments take from the program's
values, and in their dropouts' seeds, which are arguments (kernels/params.py). A later site
takes the first site's kernel with its parameters pointed at its own values (`params_of`),
which is all the lowering reads of them to fill a launch's arguments."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.ir import Attribute, Operation, SSAValue

from coconet.dialects import coco
from coconet.lowering.kernel_ir import Param
from coconet.lowering.kernels.spec import Store

SiteKey = tuple[object, ...]

# Properties that reach the kernel as arguments, not in its text: left out of the key.
_ARGUMENT_PROPERTIES: dict[type[Operation], frozenset[str]] = {coco.DropoutOp: frozenset({"seed"})}


@dataclass(frozen=True)
class KernelSite:
    key: SiteKey
    # the site's values in the order the key numbers them
    values: tuple[SSAValue, ...]
    number: dict[SSAValue, int]

    def params_of(self, first: KernelSite, params: Sequence[Param]) -> tuple[Param, ...] | None:
        """`params` (of the kernel built for `first`, a site of the same key) pointed at this
        site's values; None where a parameter names a value the key does not number."""
        out: list[Param] = []
        for p in params:
            if p.value is None:
                out.append(p)
                continue
            n = first.number.get(p.value)
            if n is None:
                return None
            out.append(p.for_value(self.values[n]))
        return tuple(out)


def _properties(op: Operation) -> tuple[tuple[str, Attribute], ...]:
    skipped = _ARGUMENT_PROPERTIES.get(type(op), frozenset())
    return tuple(sorted((k, a) for k, a in op.properties.items() if k not in skipped))


def kernel_site(
    ops: Sequence[Operation],
    iteration: Attribute,
    inputs: Sequence[SSAValue],
    stores: Sequence[Store],
    extras: Sequence[tuple[object, Sequence[SSAValue]]] = (),
) -> KernelSite | None:
    """The site of an elementwise kernel; None for ops this key cannot describe (ops with
    regions or successors: built every time). `extras`: what else the kernel is built from,
    each a description (hashable, naming no value) and the values it relates (a fused
    collective's reduce_scatters, all_gathers and reductions: fused_collective.py)."""
    number: dict[SSAValue, int] = {}
    values: list[SSAValue] = []

    def ref(v: SSAValue) -> int:
        n = number.get(v)
        if n is None:
            n = number[v] = len(values)
            values.append(v)
        return n

    key: list[object] = [iteration]
    for v in inputs:
        key.append((ref(v), v.type))
    for op in ops:
        if op.regions or op.successors:
            return None
        key.append(
            (
                op_description(op),
                tuple(ref(v) for v in op.operands),
                tuple(ref(r) for r in op.results),
                tuple(r.type for r in op.results),
            )
        )
    for s in stores:
        target = None if s.target is None else (ref(s.target), s.target.type)
        key.append((ref(s.value), s.type, target))
    for description, related in extras:
        key.append((description, tuple(ref(v) for v in related), tuple(v.type for v in related)))
    return KernelSite(tuple(key), tuple(values), number)


def op_description(op: Operation) -> tuple[object, ...]:
    """An op as a site's key describes it: its name and the properties and attributes its
    kernel's text shows, and the numerics policy it computes under (its own, or the default
    of its function or module: coco.numerics_of)."""
    return (
        op.name,
        _properties(op),
        tuple(sorted(op.attributes.items())),
        coco.numerics_of(op).value,
    )
