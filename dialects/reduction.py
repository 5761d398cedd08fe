"""One reduction vocabulary, from the dialects to the runtime.

Every place that combines values names how with a `Reduction`: the ops' attributes (a
collective's `sum`, a `coco.reduce norm`, a `coco.reduce_dims mean`), the kernels' combining
steps, the plan's collectives and the runtime's transports (MPI, NCCL, gloo, the in-process
group), which key their operator tables by it. Each op takes the subset that means something
for it (as MLIR's `vector.reduction` takes a subset of `CombiningKind`): ranks' values combine
by `COLLECTIVE`, a whole tensor reduces by `FULL`, rows by `DIMS`. A `Reduction` is a `str`,
so the plan's text and its JSON are its value.
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.parser import AttrParser
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum


class Reduction(StrEnum):
    SUM = "sum"
    PROD = "prod"
    MAX = "max"  # NumPy's maximum: a NaN wins
    MIN = "min"
    NORM = "norm"  # the L2 norm: a sum of squares, then its square root
    MEAN = "mean"  # a sum divided by the count of reduced elements


# How ranks' values combine (the collectives, and what every transport implements).
COLLECTIVE = (Reduction.SUM, Reduction.PROD, Reduction.MAX, Reduction.MIN)
# How `coco.reduce` takes a whole tensor to a scalar.
FULL = (Reduction.SUM, Reduction.MAX, Reduction.MIN, Reduction.NORM)
# How `coco.reduce_dims` reduces rows.
DIMS = (Reduction.SUM, Reduction.MAX, Reduction.MIN, Reduction.MEAN)


def reduction(value: str, kinds: tuple[Reduction, ...], what: str) -> Reduction:
    """`value` as one of `kinds`, or a ValueError listing them."""
    if value not in kinds:
        raise ValueError(f"unknown {what} {value!r}: use " + ", ".join(kinds))
    return Reduction(value)


class ReductionsOf:
    """What an enum attribute over `Reduction` adds to take only its op's subset: the parser
    offers the subset, and an attribute built in Python with another member fails to
    verify. Mixed in before `EnumAttribute[Reduction]`."""

    name: ClassVar[str]
    kinds: ClassVar[tuple[Reduction, ...]]

    @classmethod
    def parse_parameter(cls, parser: AttrParser) -> Reduction:
        at = parser.pos
        value = parser.parse_optional_identifier_or_str_literal()
        if value not in cls.kinds:
            *first, last = (f"`{k}`" for k in cls.kinds)
            # mark the word alone (the parser already stands at the next token)
            content = parser.lexer.input.content
            quoted = content.startswith('"', at)  # (at the end of a truncated text: no word)
            end = at + len(value) + 2 * quoted if value is not None else at + 1
            end = min(end, len(content))
            parser.raise_error(f"Expected {', '.join(first)}, or {last}.", at, end)
        return Reduction(value)

    def verify(self) -> None:
        data = getattr(self, "data")
        if data not in self.kinds:
            raise VerifyException(
                f"[reduction-kind] {self.name} takes " + ", ".join(self.kinds) + f", not {data}"
            )
