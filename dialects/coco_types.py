"""The coco dialect's attributes and types: element types, layouts, process grids and the
distributed tensor type `!coco.tensor<SHAPE x ELT, LAYOUT>` (dialects/coco.py registers them
with the ops and describes their meaning).

They live apart from the ops so that the layout rules (layout_rules.py), which read these
types and which the ops' verifiers call, import them without importing the ops: types, then
rules, then ops, with no cycle between them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, TypeVar, cast

from xdsl.dialects.builtin import (
    ArrayAttr,
    BFloat16Type,
    Float8E4M3FNType,
    Float8E5M2Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IntAttr,
    IntegerType,
)
from xdsl.ir import (
    Attribute,
    ParametrizedAttribute,
    TypeAttribute,
)
from xdsl.irdl import (
    irdl_attr_definition,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

# --------------------------------------------------------------------------------------------
# Element types
# --------------------------------------------------------------------------------------------

# fp8 types keep MLIR's names: e4m3 with no infinities (NaN where the others overflow to inf)
# and e5m2 (IEEE-like), both as ml_dtypes and the OCP FP8 spec define them.
FLOAT_TYPE_NAMES = ("f16", "bf16", "f32", "f64", "f8E4M3FN", "f8E5M2")
FP8_TYPE_NAMES = ("f8E4M3FN", "f8E5M2")
# The largest finite value of each fp8 type: where coco.quantize saturates.
FP8_MAX = {"f8E4M3FN": 448.0, "f8E5M2": 57344.0}
ELEMENT_TYPE_NAMES = (*FLOAT_TYPE_NAMES, "i32", "i64", "i1")


def is_float_name(elt: str) -> bool:
    """Whether the short element type name `elt` is a floating-point type."""
    return elt in FLOAT_TYPE_NAMES


# Float types every value of which the wider type holds exactly (range and precision): each
# fp8 type in f16, bf16, f32 and f64; f16 and bf16 in f32 and f64; f32 in f64.
_WIDER = {
    "f8E4M3FN": ("f16", "bf16", "f32", "f64"),
    "f8E5M2": ("f16", "bf16", "f32", "f64"),
    "f16": ("f32", "f64"),
    "bf16": ("f32", "f64"),
    "f32": ("f64",),
}


def exact_widening(src: str, dst: str) -> bool:
    """Whether a cast from element type `src` to `dst` changes no value."""
    return dst in _WIDER.get(src, ())


def element_type_name(t: Attribute) -> str:
    """The short name (`f16`, `i1`, ...) of a supported element type; raises otherwise."""
    match t:
        case Float16Type():
            return "f16"
        case BFloat16Type():
            return "bf16"
        case Float32Type():
            return "f32"
        case Float64Type():
            return "f64"
        case Float8E4M3FNType():
            return "f8E4M3FN"
        case Float8E5M2Type():
            return "f8E5M2"
        case IntegerType() if t.width.data in (1, 32, 64) and t.signedness.data.name == "SIGNLESS":
            return f"i{t.width.data}"
        case _:
            raise VerifyException(
                f"[unsupported-element-type] unsupported element type {t}: coco tensors hold "
                "one of " + ", ".join(ELEMENT_TYPE_NAMES)
            )


def element_type_of_name(elt: str) -> Attribute:
    """The element type whose short name is `elt` (`element_type_name`'s inverse)."""
    types: dict[str, Attribute] = {
        "f16": Float16Type(),
        "bf16": BFloat16Type(),
        "f32": Float32Type(),
        "f64": Float64Type(),
        "f8E4M3FN": Float8E4M3FNType(),
        "f8E5M2": Float8E5M2Type(),
    }
    if elt in types:
        return types[elt]
    if elt in ("i1", "i32", "i64"):
        return IntegerType(int(elt[1:]))
    raise VerifyException(
        f"[unsupported-element-type] unsupported element type {elt}: coco tensors hold one of "
        + ", ".join(ELEMENT_TYPE_NAMES)
    )


def is_float_type(t: Attribute) -> bool:
    return isinstance(
        t,
        Float16Type | BFloat16Type | Float32Type | Float64Type | Float8E4M3FNType | Float8E5M2Type,
    )


# --------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------


class LayoutAttr(ParametrizedAttribute):
    """How a logical tensor lives on the ranks along one grid axis (abstract)."""


@irdl_attr_definition
class ReplicatedAttr(LayoutAttr):
    """Every rank along the axis holds the same full value."""

    name = "coco.replicated"


@irdl_attr_definition
class LocalAttr(LayoutAttr):
    """Every rank along the axis holds a full-shape value of its own."""

    name = "coco.local"


@irdl_attr_definition
class SlicedAttr(LayoutAttr):
    """Contiguous parts along tensor dim `dim`; rank i along the axis holds part i.

    A dim several grid axes cut is cut in mixed radix: by the outermost cutting axis first,
    each of its parts then by the next. By default the cutting axes nest in grid order
    (outer axis outermost); `level` (`sliced<0, level 1>`) states another nesting: the
    axis's place among the axes cutting the dim, 0 outermost. Megatron's flat gradient
    buffer, sliced on tp and then reduce-scattered over an outer dp axis, is
    `[sliced<0, level 1>, sliced<0, level 0>]`: each tp piece cut over dp. The level is
    written (and stored) only where the nesting is not grid order, so one nesting has one
    spelling (`normalize_layouts`); -1 means "in grid order"."""

    name = "coco.sliced"
    dim: IntAttr
    level: IntAttr

    def __init__(self, dim: int | IntAttr, level: int | IntAttr = -1):
        super().__init__(
            IntAttr(dim) if isinstance(dim, int) else dim,
            IntAttr(level) if isinstance(level, int) else level,
        )

    @property
    def nested(self) -> bool:
        """Whether this axis states its level (its dim's cuts nest other than grid order)."""
        return self.level.data >= 0

    def with_dim(self, dim: int) -> SlicedAttr:
        """The same cut of another dim (an op that moves dims keeps how they nest)."""
        return SlicedAttr(dim, self.level)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            dim = IntAttr(parser.parse_integer(allow_boolean=False, allow_negative=False))
            level = -1
            if parser.parse_optional_punctuation(","):
                parser.parse_keyword("level")
                level = parser.parse_integer(allow_boolean=False, allow_negative=False)
            return (dim, IntAttr(level))

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<" + layout_str(self)[len("sliced<") :])


REPLICATED = ReplicatedAttr()
LOCAL = LocalAttr()


def same_cut(a: LayoutAttr, b: LayoutAttr) -> bool:
    """Whether two layouts of one grid axis cut alike, however the dim's cuts nest (the
    nesting is a property of the dim: `check_innermost_slicing` compares it)."""
    if isinstance(a, SlicedAttr) and isinstance(b, SlicedAttr):
        return a.dim == b.dim
    return a == b


def layout_str(layout: LayoutAttr) -> str:
    if isinstance(layout, SlicedAttr):
        if layout.nested:
            return f"sliced<{layout.dim.data}, level {layout.level.data}>"
        return f"sliced<{layout.dim.data}>"
    return "local" if isinstance(layout, LocalAttr) else "replicated"


K = TypeVar("K")
V = TypeVar("V")

# The entries a memo of the dialects (types parsed or built, results inferred, checks passed)
# holds at most: one with more starts over instead of growing without end.
MEMO_LIMIT = 4096


# The dialects' compile-time memos, in one registry (each module's by name): MEMOS lists
# them, clear_memos() empties them all (a long-lived process done with its programs).
MEMOS: dict[str, dict[Any, Any]] = {}


def memo(name: str) -> dict[Any, Any]:
    """The dialects' memo `name`, registered in MEMOS (fill it through `remember`)."""
    return MEMOS.setdefault(name, {})


def clear_memos() -> None:
    for m in MEMOS.values():
        m.clear()


def remember(memo: dict[K, V], key: K, value: V) -> V:
    """Store `value` under `key` in a bounded memo (emptied when full); returns `value`."""
    if len(memo) >= MEMO_LIMIT:
        memo.clear()
    memo[key] = value
    return value


# Parsed tensor type bodies by their text (TensorType.parse_parameters): the text between
# `<` and its `>` determines the parameters.
_PARSED_BODIES: dict[str, tuple[Attribute, ...]] = memo("parsed tensor type bodies")
# Tensor types built by TensorType.new, by their parameters.
_BUILT_TYPES: dict[tuple[Attribute, ...], TensorType] = memo("built tensor types")
# Tensor types derived from others (TensorType.with_layouts, ...): passes re-type thousands
# of values of a deep program with a handful of distinct types.
_DERIVED_TYPES: dict[tuple[Attribute, Attribute, tuple[Attribute, ...]], TensorType] = memo(
    "derived tensor types"
)
# Tensor types' hashes by id(type), with the type itself (alive while remembered, so its id is
# not reused; TensorType.__hash__).
_HASHES: dict[int, tuple[TensorType, int]] = memo("tensor type hashes")
# What a tensor type's body may hold (dims, element type, layouts, one level of `<...>`), up
# to its closing `>`; a body with anything else (a string, a nested dialect attribute) does
# not match and is parsed as it is, never looked up.
_BODY = re.compile(r"([0-9A-Za-z_?\[\], ]*(?:<[0-9A-Za-z_?\[\], ]*>[0-9A-Za-z_?\[\], ]*)*)>")


def _body_text(parser: AttrParser) -> str | None:
    """The text of the `<...>` body the parser stands at (without the brackets), or None
    where it is not at a `<` or the body holds what a tensor type does not."""
    content = parser.lexer.input.content
    if not content.startswith("<", parser.pos):  # (at the end of the text, no token)
        return None
    match = _BODY.match(content, parser.pos + 1)
    return match.group(1) if match is not None else None


def _skip_body(parser: AttrParser, length: int) -> None:
    """Move the parser past the `<`, a body of `length` characters and its `>`.

    Public API only: the lexer runs one token ahead of the parser, so moving it past the `>`
    and then consuming the `<` makes the token after the `>` the current one."""
    parser.lexer.pos = parser.pos + length + 2
    parser.parse_punctuation("<")


def _parse_layout(parser: AttrParser) -> LayoutAttr:
    if parser.parse_optional_keyword("replicated"):
        return REPLICATED
    if parser.parse_optional_keyword("local"):
        return LOCAL
    if parser.parse_optional_keyword("sliced"):
        return SlicedAttr.new(SlicedAttr.parse_parameters(parser))
    parser.raise_error("expected a layout: replicated, local, sliced<DIM> or sliced<DIM, level L>")


def normalize_layouts(layouts: Sequence[LayoutAttr]) -> tuple[LayoutAttr, ...]:
    """One spelling per meaning: replicated on every axis is written as no layout at all;
    the levels of a dim's cuts are renumbered 0, 1, ... in their order, and dropped where
    that order is grid order (or one axis cuts the dim). Built types only (the parser keeps
    what a program writes, for the verifier to refuse a spelling that is not canonical): an
    axis cutting a dim without a level where others state theirs nests innermost, as a cut
    added to a piece does (`nest_layouts`)."""
    layouts = tuple(layouts)
    if all(isinstance(lay, ReplicatedAttr) for lay in layouts):
        return ()
    if not any(isinstance(lay, SlicedAttr) and lay.nested for lay in layouts):
        return layouts
    out = list(layouts)
    for d in {lay.dim.data for lay in layouts if isinstance(lay, SlicedAttr) and lay.nested}:
        axes = [a for a in range(len(out)) if _cuts(layouts, a, d)]
        stated = sorted(
            (a for a in axes if cast(SlicedAttr, layouts[a]).nested),
            key=lambda a: cast(SlicedAttr, layouts[a]).level.data,
        )
        order = stated + [a for a in axes if a not in stated]
        in_grid_order = order == axes
        for place, a in enumerate(order):
            out[a] = SlicedAttr(d) if in_grid_order else SlicedAttr(d, place)
    return tuple(out)


def nest_layouts(before: TensorType, layouts: Sequence[LayoutAttr]) -> list[LayoutAttr]:
    """`layouts` (a new layout per grid axis of a value of type `before`) with the cuts they
    add nested inside the cuts `before` already has: what a collective or slice that cuts a
    rank's piece further does. A dim's existing cuts keep their order, outermost; the axes
    newly cutting it follow, in grid order. Only the dims whose cutting axes change are
    renumbered; the rest keep what they state."""
    out = list(layouts)
    for d in {lay.dim.data for lay in layouts if isinstance(lay, SlicedAttr)}:
        kept = [a for a in before.slicing_axes(d) if _cuts(out, a, d)]
        added = [a for a in range(len(out)) if _cuts(out, a, d) and a not in kept]
        if not added and len(kept) == len(before.slicing_axes(d)):
            continue
        for place, a in enumerate(kept + added):
            out[a] = SlicedAttr(d, place)
    return out


def _cuts(layouts: Sequence[LayoutAttr], axis: int, dim: int) -> bool:
    lay = layouts[axis] if axis < len(layouts) else REPLICATED
    return isinstance(lay, SlicedAttr) and lay.dim.data == dim


# --------------------------------------------------------------------------------------------
# The process grid
# --------------------------------------------------------------------------------------------

DYNAMIC = -1

# The most ranks a program's grid may have. CoCoNet targets one job's GPUs (the largest
# training clusters hold ~10^5); beyond that a grid is a typo or a fuzzer's, and tools that
# enumerate ranks (the lowering builds per-rank plans and process groups) would run for hours
# or exhaust memory rather than fail, so the verifier refuses it up front.
MAX_RANKS = 2**16

# The most elements a tensor may have: its element count and flat indices are int64 in the
# sim (NumPy) and in the generated kernels.
MAX_ELEMENTS = 2**63 - 1


@irdl_attr_definition
class GridAttr(ParametrizedAttribute):
    """The process grid a function runs on: `#coco.grid<[2, 4]>`; `?` is sized at launch.

    Axis 0 is the outermost (slowest varying) coordinate of a rank: on a `[stages, ranks]`
    grid, rank r sits at stage r // ranks, position r % ranks. A grid has at most
    `MAX_RANKS` (2^16) ranks, counting its fixed axes before launch and all of them once
    bound (`[grid-size]`).
    """

    name = "coco.grid"
    sizes: ArrayAttr[IntAttr]

    def __init__(self, sizes: Sequence[int]):
        super().__init__(ArrayAttr(IntAttr(s) for s in sizes))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s.data for s in self.sizes)

    @property
    def rank(self) -> int:
        return len(self.sizes)

    def is_static(self) -> bool:
        return DYNAMIC not in self.shape

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        def parse_size() -> IntAttr:
            if parser.parse_optional_punctuation("?"):
                return IntAttr(DYNAMIC)
            return IntAttr(parser.parse_integer(allow_boolean=False, allow_negative=False))

        with parser.in_angle_brackets():
            sizes = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parse_size)
        return (ArrayAttr(sizes),)

    def print_parameters(self, printer: Printer) -> None:
        text = ", ".join("?" if s == DYNAMIC else str(s) for s in self.shape)
        printer.print_string(f"<[{text}]>")

    def verify(self) -> None:
        if not self.sizes.data:
            raise VerifyException("[grid] a process grid needs at least one axis")
        for s in self.shape:
            if s != DYNAMIC and s < 1:
                raise VerifyException(f"[grid] grid axis sizes must be positive or '?', got {s}")
        if self.shape.count(DYNAMIC) > 1:
            raise VerifyException("[grid] at most one grid axis may be sized at launch ('?')")
        fixed = math.prod(s for s in self.shape if s != DYNAMIC)
        if fixed > MAX_RANKS:
            raise VerifyException(
                f"[grid-size] the grid {self} has {fixed} ranks"
                + (" before its '?' axis is sized" if not self.is_static() else "")
                + f": at most {MAX_RANKS} (2^16) ranks are supported"
            )

    def bind(self, num_ranks: int) -> tuple[int, ...]:
        """The concrete axis sizes when `num_ranks` processes run the program."""
        if num_ranks < 1:
            raise ValueError(f"a job needs at least 1 rank, but {num_ranks} were given")
        if num_ranks > MAX_RANKS:
            raise ValueError(
                f"{num_ranks} ranks exceed the supported maximum of {MAX_RANKS} (2^16)"
            )
        fixed = 1
        for s in self.shape:
            if s != DYNAMIC:
                fixed *= s
        if DYNAMIC not in self.shape:
            if fixed != num_ranks:
                raise ValueError(
                    f"the program's grid {list(self.shape)} needs {fixed} ranks, "
                    f"but {num_ranks} were given"
                )
            return self.shape
        if num_ranks % fixed:
            raise ValueError(
                f"{num_ranks} ranks do not fill the grid {self}: "
                f"the rank count must be a multiple of {fixed}"
            )
        return tuple(num_ranks // fixed if s == DYNAMIC else s for s in self.shape)

    def __str__(self) -> str:
        return "[" + ", ".join("?" if s == DYNAMIC else str(s) for s in self.shape) + "]"


DEFAULT_GRID = GridAttr([DYNAMIC])
GRID_ATTR_NAME = "coco.grid"
# A module's own schedule: the pass pipeline `coco-schedule` (given no name) applies to it, as
# MLIR's transform interpreter runs the script its payload module holds.
SCHEDULE_ATTR_NAME = "coco.schedule"
# The numerics policy of a module's or function's transcendental ops that carry none of their
# own (`#coco<numerics fast>`; coco.py `numerics_of`).
NUMERICS_ATTR_NAME = "coco.numerics"
# A function argument the caller keeps in symmetric memory (`{coco.symmetric}`): peers of a
# fused collective reach it there, so an all_gather assembled in it needs no staging copy.
SYMMETRIC_ARG_ATTR = "coco.symmetric"


# --------------------------------------------------------------------------------------------
# The distributed tensor type
# --------------------------------------------------------------------------------------------


@irdl_attr_definition
class TensorType(ParametrizedAttribute, TypeAttribute):
    """`!coco.tensor<1024x512xf16, sliced<0>>`: global shape, element type, per-axis layouts."""

    name = "coco.tensor"
    shape: ArrayAttr[IntAttr]
    element_type: Attribute
    layouts: ArrayAttr[LayoutAttr]

    def __init__(
        self,
        shape: Sequence[int],
        element_type: Attribute,
        layouts: LayoutAttr | Sequence[LayoutAttr] = (),
    ):
        if isinstance(layouts, LayoutAttr):
            layouts = (layouts,)
        super().__init__(
            ArrayAttr(IntAttr(d) for d in shape),
            element_type,
            ArrayAttr(normalize_layouts(layouts)),
        )

    def __hash__(self) -> int:
        # The generated hash walks every parameter (~1.6 us); the compiler keys memos by
        # tensor types at every op of a deep program (layout checks, the lowering's tables).
        # Equal types hash alike: this is that hash, computed once per object.
        entry = _HASHES.get(id(self))
        if entry is not None and entry[0] is self:
            return entry[1]
        h = hash((self.shape, self.element_type, self.layouts))
        remember(_HASHES, id(self), (self, h))
        return h

    # -- queries -------------------------------------------------------------------------

    def get_shape(self) -> tuple[int, ...]:
        return tuple(d.data for d in self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def elt(self) -> str:
        return element_type_name(self.element_type)

    def layout_on(self, axis: int) -> LayoutAttr:
        """The layout along grid axis `axis` (replicated where none is written)."""
        if axis < len(self.layouts):
            return self.layouts.data[axis]
        return REPLICATED

    def layout_list(self, grid_rank: int) -> list[LayoutAttr]:
        return [self.layout_on(a) for a in range(grid_rank)]

    def is_replicated(self) -> bool:
        return not self.layouts.data

    def local_axes(self) -> tuple[int, ...]:
        return tuple(a for a, lay in enumerate(self.layouts) if isinstance(lay, LocalAttr))

    def slicing_axes(self, dim: int) -> tuple[int, ...]:
        """The grid axes that cut tensor dim `dim`, outermost cut first (grid order unless
        their layouts state levels: `SlicedAttr`)."""
        axes = tuple(
            a
            for a, lay in enumerate(self.layouts)
            if isinstance(lay, SlicedAttr) and lay.dim.data == dim
        )
        if len(axes) > 1 and cast(SlicedAttr, self.layouts.data[axes[0]]).nested:
            return tuple(
                sorted(axes, key=lambda a: cast(SlicedAttr, self.layouts.data[a]).level.data)
            )
        return axes

    def local_shape(self, grid_shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of the largest part one rank holds on a grid of the given (bound) sizes:
        every rank's where slices are even; where a dim does not divide by the ranks that cut
        it, the first `size % parts` ranks hold one element more (core/values.py)."""
        shape = list(self.get_shape())
        for a, lay in enumerate(self.layouts):
            if isinstance(lay, SlicedAttr):
                shape[lay.dim.data] = -(-shape[lay.dim.data] // grid_shape[a])
        return tuple(shape)

    def with_layouts(self, layouts: LayoutAttr | Sequence[LayoutAttr]) -> TensorType:
        if isinstance(layouts, LayoutAttr):
            layouts = (layouts,)
        return _tensor_type(self.shape, self.element_type, normalize_layouts(layouts))

    def with_element_type(self, element_type: Attribute) -> TensorType:
        return _tensor_type(self.shape, element_type, self.layouts.data)

    def with_shape(self, shape: Sequence[int]) -> TensorType:
        return TensorType(shape, self.element_type, self.layouts.data)

    def layout_text(self) -> str:
        lays = self.layouts.data
        if not lays:
            return "replicated"
        if len(lays) == 1:
            return layout_str(lays[0])
        return "[" + ", ".join(layout_str(lay) for lay in lays) + "]"

    # -- syntax --------------------------------------------------------------------------

    @classmethod
    def new(cls, params: Sequence[Attribute]) -> TensorType:
        # One object per distinct type built generically (the parser builds every type it
        # reads this way): attributes are immutable values, and a type already built has
        # passed its verifier.
        key = tuple(params)
        got = _BUILT_TYPES.get(key)
        if got is None:
            got = remember(_BUILT_TYPES, key, super().new(key))
        return got

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        # A program spells a few tensor types thousands of times (a deep stack: every op
        # names its operands' and results' types): each distinct spelling is parsed once and
        # its parameters (immutable attributes) are reused, which halves parsing a program.
        body = _body_text(parser)
        if body is not None and (params := _PARSED_BODIES.get(body)) is not None:
            _skip_body(parser, len(body))
            return params
        params = cls._parse_body(parser)
        if body is not None:
            remember(_PARSED_BODIES, body, params)
        return params

    @classmethod
    def _parse_body(cls, parser: AttrParser) -> tuple[Attribute, ...]:
        with parser.in_angle_brackets():
            shape_pos = parser.pos
            dims, elt = parser.parse_ranked_shape()
            layouts: list[LayoutAttr] = []
            if parser.parse_optional_punctuation(","):
                if parser.parse_optional_punctuation("["):
                    layouts = [_parse_layout(parser)]
                    while parser.parse_optional_punctuation(","):
                        layouts.append(_parse_layout(parser))
                    parser.parse_punctuation("]")
                else:
                    layouts = [_parse_layout(parser)]
        if any(d < 0 for d in dims):
            parser.raise_error(
                "coco tensors have static shapes: '?' is not allowed here", shape_pos
            )
        # Only the all-replicated spelling is rewritten: levels stay as written, for the
        # verifier to refuse a spelling that is not the one of its nesting.
        return (
            ArrayAttr(IntAttr(d) for d in dims),
            elt,
            ArrayAttr(() if all(isinstance(x, ReplicatedAttr) for x in layouts) else layouts),
        )

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_dimension_list(self.get_shape())
            if self.shape.data:
                printer.print_string("x")
            printer.print_attribute(self.element_type)
            if self.layouts.data:
                printer.print_string(", " + self.layout_text())

    def verify(self) -> None:
        element_type_name(self.element_type)
        for d in self.get_shape():
            if d < 1:
                raise VerifyException(
                    f"[tensor-shape] tensor dims must be positive, got shape "
                    f"{list(self.get_shape())}"
                )
        # Python ints never overflow, but NumPy and the kernels count elements in int64.
        if (count := math.prod(self.get_shape())) > MAX_ELEMENTS:
            raise VerifyException(
                f"[tensor-size] a tensor of shape {list(self.get_shape())} has {count} "
                f"elements, more than int64 can count (at most 2^63 - 1)"
            )
        if self.layouts.data and all(isinstance(x, ReplicatedAttr) for x in self.layouts):
            raise VerifyException("an all-replicated layout is written as no layout")
        for lay in self.layouts:
            if isinstance(lay, SlicedAttr) and lay.dim.data >= self.rank:
                raise VerifyException(
                    f"[sliced-dim-in-range] sliced<{lay.dim.data}> names a dim that a "
                    f"rank-{self.rank} tensor of shape {list(self.get_shape())} does not have"
                )
        self._verify_levels()

    def _verify_levels(self) -> None:
        """The levels of a dim's cuts, where stated, number every cutting axis 0, 1, ... and
        differ from grid order (else they are not written: one spelling per nesting)."""
        nested = {
            lay.dim.data for lay in self.layouts if isinstance(lay, SlicedAttr) and lay.nested
        }
        for d in sorted(nested):
            axes = [
                a
                for a, lay in enumerate(self.layouts)
                if isinstance(lay, SlicedAttr) and lay.dim.data == d
            ]
            levels = [cast(SlicedAttr, self.layouts.data[a]).level.data for a in axes]
            if sorted(levels) != list(range(len(axes))):
                raise VerifyException(
                    f"[sliced-level] dim {d} of a tensor of shape {list(self.get_shape())} is "
                    f"cut by grid axes {axes} with levels {['-' if x < 0 else x for x in levels]}"
                    f": every axis cutting a dim states its level, numbered 0 (outermost) to "
                    f"{len(axes) - 1}, or none does (grid order)"
                )
            if levels == sorted(levels):
                raise VerifyException(
                    f"[sliced-level] dim {d} of a tensor of shape {list(self.get_shape())} is "
                    f"cut by grid axes {axes} in grid order: write it without levels "
                    f"(sliced<{d}>)"
                )


def _tensor_type(
    shape: ArrayAttr[IntAttr], element_type: Attribute, layouts: tuple[LayoutAttr, ...]
) -> TensorType:
    """The tensor type of these (normalized) parameters, built once per distinct type."""
    key = (shape, element_type, layouts)
    got = _DERIVED_TYPES.get(key)
    if got is None:
        got = remember(
            _DERIVED_TYPES, key, TensorType.new((shape, element_type, ArrayAttr(layouts)))
        )
    return got
