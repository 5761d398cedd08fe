"""A kernel's signature as the plan carries it to the executors: the device layer's C types
(`CType`) and how each is passed (`ABI_KINDS`), what each parameter is (`ParamKind`), and the
parameters themselves (`KernelParam`). The kernel IR (kernel_ir.py) builds kernels out of
these; the runtime reads them from the plan and nothing else of the lowering.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from xdsl.utils.str_enum import StrEnum

# ---------------------------------------------------------------------------------------------
# Types
# ---------------------------------------------------------------------------------------------

# C types of the device layer -> how the runtime passes a value of that type by value (one of
# "bool", "i32", "u32", "i64", "u64", "f32", "f64"), or None where it is never a parameter.
SCALAR_ABI: dict[str, str | None] = {
    "bool": "bool",
    "coco_i32": "i32",
    "coco_u32": "u32",
    "coco_i64": "i64",
    "coco_u64": "u64",
    "float": "f32",
    "double": "f64",
    "coco_f16": None,
    "coco_bf16": None,
    "coco_f8e4m3": None,
    "coco_f8e5m2": None,
    "coco_range": None,
}

# Bytes of a value of each C type of the device layer (coco_range: two 64-bit bounds).
CTYPE_BYTES: dict[str, int] = {
    "bool": 1,
    "coco_i32": 4,
    "coco_u32": 4,
    "coco_i64": 8,
    "coco_u64": 8,
    "float": 4,
    "double": 8,
    "coco_f16": 2,
    "coco_bf16": 2,
    "coco_f8e4m3": 1,
    "coco_f8e5m2": 1,
    "coco_range": 16,
}

# Every parameter kind the runtime passes: a pointer, or a scalar of one of these C types.
ABI_KINDS = ("ptr", "bool", "i32", "u32", "i64", "u64", "f32", "f64")


@dataclass(frozen=True)
class CType:
    """A C type: a scalar of the device layer, or a pointer to one."""

    name: str
    pointer: bool = False
    # Of the pointee: `const float*`.
    const: bool = False
    # Only meaningful on pointer parameters (locals are printed without it).
    restrict: bool = False

    def __post_init__(self) -> None:
        if self.name not in SCALAR_ABI:
            raise ValueError(f"'{self.name}' is not a C type of the device layer")
        if (self.const or self.restrict) and not self.pointer:
            raise ValueError("const and __restrict__ qualify pointers only")

    @property
    def abi(self) -> str:
        """How the runtime passes a value of this type (ABI_KINDS)."""
        if self.pointer:
            return "ptr"
        kind = SCALAR_ABI[self.name]
        if kind is None:
            raise ValueError(f"a {self.name} cannot be passed to a kernel by value")
        return kind

    def ptr(self, *, const: bool = False, restrict: bool = False) -> CType:
        assert not self.pointer, "no pointers to pointers in kernels"
        return CType(self.name, pointer=True, const=const, restrict=restrict)

    def pointee(self) -> CType:
        assert self.pointer
        return CType(self.name)

    def unrestricted(self) -> CType:
        return replace(self, restrict=False)


BOOL = CType("bool")
I32 = CType("coco_i32")
U32 = CType("coco_u32")
I64 = CType("coco_i64")
U64 = CType("coco_u64")
F32 = CType("float")
F64 = CType("double")
RANGE = CType("coco_range")


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------


class ParamKind(StrEnum):
    """What a kernel parameter is: how the lowering fills it at a launch."""

    IN = "in"  # an input tensor (payload: its value)
    OUT = "out"  # a stored result or an updated argument
    BEGIN = "begin"  # the element range [begin, end) a launch covers (overlap chunks)
    END = "end"
    COUNT = "count"  # an element or partial count (reduction kernels)
    DIM = "dim"  # the local size of iteration dims [dim, dim + span) (collapsed: their product)
    STRIDE = "stride"  # the local stride of `value` along iteration dim `dim`
    BASE = "base"  # where this rank's iteration piece starts in `value`'s piece
    # a block scale's offset along iteration dim `dim`: the global start of this rank's
    # iteration piece less block times that of `value`'s piece (kernels/spec.py Operand)
    BLOCK_START = "block_start"
    # the global start of this rank's piece along iteration dims [dim, dim + span), counted
    # in elements of the collapsed dim (dims after `dim` in it are never sliced)
    GSTART = "gstart"
    GOFFSET = "goffset"  # the global linear offset of this rank's piece (dim-0 slices)
    STREAM = "stream"  # a dropout's random stream for this rank (payload: its input)
    SEED = "seed"  # a dropout's seed (payload: its result)
    # every group member's reduce_scatter input, or staged all_to_all input (symmetric)
    PEERS_IN = "peers_in"
    PEERS_OUT = "peers_out"  # every group member's gathered buffer (symmetric)
    GATHER_OUT = "gather_out"  # the updated argument a gathered value is assembled in
    PEER_BASES = "peer_bases"  # where each group member's piece starts in a gathered buffer
    PEER_COUNTS = "peer_counts"  # each group member's element count (uneven slices)
    # each group member's local size of iteration dims [dim, dim + span) (uneven slices)
    PEER_DIMS = "peer_dims"
    RED_OUT = "red_out"  # the all_reduced result of an in-kernel reduction
    PARTIALS = "partials"  # per-block partials of a reduction (scratch)
    COUNTER = "counter"  # the last-block ticket counter (scratch)
    EXCHANGE = "exchange"  # every group member's rank-partials buffer (symmetric)
    FLAGS = "flags"  # every group member's flag array (symmetric)
    EPOCH = "epoch"  # the value flags carry at this launch
    ME = "me"  # this rank's index in its group
    NRANKS = "nranks"  # the group's size
    PARTS = "parts"  # pieces per rank of a hierarchical collective: its group's nodes
    SEND_PEERS = "send_peers"  # every member's receive buffer along a send's axis (symmetric)
    SEND_TO = "send_to"  # the member this rank sends to along the axis (-1: none)
    RECEIVES = "receives"  # 1 when some member sends to this rank (0: it receives zeros)
    # a fused all_to_all's box per group member: what this rank sends it, what it receives
    # from it (lowering/kernels/exchange.py)
    SEND_BOXES = "send_boxes"
    RECV_BOXES = "recv_boxes"
    BLOCKS = "blocks"  # table form: prefix sums of the blocks of each tensor
    NTENSORS = "ntensors"  # table form: how many tensors the launch serves


@dataclass(frozen=True)
class KernelParam:
    """One parameter of a kernel's signature, as the plan carries it for the executors."""

    name: str
    kind: ParamKind
    ctype: CType
    # Table form: a device array of this parameter's value for every tensor of the launch.
    table: bool = False


class _HasKind(Protocol):
    @property
    def kind(self) -> ParamKind: ...


def range_positions(params: Sequence[_HasKind]) -> tuple[int, int]:
    """Where a kernel's element range [begin, end) sits among its parameters (its IR's or the
    plan's signature); ValueError when it has none."""
    kinds = [p.kind for p in params]
    return kinds.index(ParamKind.BEGIN), kinds.index(ParamKind.END)
