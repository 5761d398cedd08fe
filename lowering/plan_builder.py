"""What a region lowering sees of the plan builder.

`lower_to_plan.Lowering` builds a plan op by op and hands each fused or overlapped region to its
lowering (fused_collective, fused_send, fused_all_to_all, hierarchical, overlap), which builds
with the same state and helpers and hands the ops inside back through `lower_op`. The region
lowerings are written against this protocol, not against `Lowering`, so the dispatcher imports
them and none imports it: no cycle, and each region lowering states exactly what it relies on.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

from xdsl.ir import Operation, SSAValue

from coconet.core.program import CocoError
from coconet.dialects import coco
from coconet.dialects.coco import TensorType
from coconet.lowering.kernel_ir import Kernel, KernelKey, Param
from coconet.lowering.kernel_site import KernelSite, SiteKey
from coconet.lowering.plan import Buffer, KernelArg, RankValue, Step, flag_words


@dataclass(frozen=True)
class LaunchConfig:
    """Block size and the most blocks a kernel launches (tests vary both, down to 1)."""

    block: int = 256
    max_blocks: int = 1024
    elements_per_thread: int = 4
    # Fold launches of one kernel text into table launches (batching.py); off: the plan
    # before that step (coco-opt -t 'plan{batch=false}'), every launch its own.
    batch: bool = True

    def __post_init__(self) -> None:
        # 1024 threads per block is CUDA's limit on every architecture coconet targets.
        for name, value, top in (
            ("block", self.block, 1024),
            ("max_blocks", self.max_blocks, 1 << 31),
            ("elements_per_thread", self.elements_per_thread, 1 << 16),
        ):
            # the fields say int, but a caller may hand anything in
            if not isinstance(value, int) or not 1 <= value <= top:  # pyright: ignore[reportUnnecessaryIsInstance]
                raise CocoError(
                    f"[launch-config] {name} must be an integer in 1..{top}, got {value}"
                )

    def grid_for(self, n: int) -> int:
        per_block = self.block * self.elements_per_thread
        return max(1, min(self.max_blocks, (n + per_block - 1) // per_block))


class PlanBuilder(Protocol):
    """The builder's state and helpers that region lowerings use (lower_to_plan.Lowering)."""

    grid_shape: tuple[int, ...]
    size: int
    nodes: tuple[int, ...]
    coords: list[tuple[int, ...]]
    config: LaunchConfig
    buffers: dict[SSAValue, Buffer]
    steps: list[Step]
    stream: int
    # scalar arithmetic that fused collective kernels compute themselves, and the fused
    # collective kernels that run in table form (by name: their text key and kernel)
    deferred: set[Operation]
    collective_kernels: dict[str, tuple[KernelKey, Kernel]]
    # kernels built so far by what they compute (kernel_site.py): kernel, its site, its name
    memoize_kernels: ClassVar[bool]
    built_kernels: dict[SiteKey, tuple[Kernel, KernelSite, str]]

    def fresh(self, base: str) -> str: ...

    def new_buffer(
        self,
        hint: str,
        t: TensorType,
        kind: Literal["arg", "temp", "scratch"] = "temp",
        symmetric: bool = False,
        elt: str = "",
        shape: Sequence[int] | None = None,
    ) -> Buffer: ...

    def buffer_for(self, v: SSAValue) -> Buffer: ...

    def value_buffer(self, v: SSAValue) -> Buffer: ...

    def make_symmetric(self, v: SSAValue) -> None: ...

    def group_size(self, span: Sequence[int]) -> int: ...

    def group_index(self, rank: int, span: Sequence[int]) -> int: ...

    def rank_table(
        self,
        label: str,
        fn: Callable[[int], int],
        key: Hashable = None,
        name: str | None = None,
    ) -> RankValue: ...

    def piece_shape(self, t: TensorType, rank: int) -> tuple[int, ...]: ...

    def piece_count(self, t: TensorType, rank: int) -> int: ...

    def base_offset(self, t: TensorType, it: TensorType, rank: int) -> int: ...

    def add_kernel(self, kernel: Kernel, key: KernelKey | None = None) -> str: ...

    def emit(self, step: Step) -> None: ...

    def iteration_type(
        self, ops: Sequence[Operation], types: Sequence[TensorType] | None = None
    ) -> TensorType: ...

    def kernel_args(
        self, params: Sequence[Param], iteration: TensorType, store_buffers: list[Buffer]
    ) -> list[KernelArg]: ...

    def lower_op(self, op: Operation) -> None: ...

    def lower_elementwise(
        self,
        ops: Sequence[Operation],
        kernel_hint: str,
        stores: Sequence[SSAValue] | None = None,
        updates: Sequence[coco.UpdateOp] = (),
    ) -> None: ...

    def lower_update(self, op: coco.UpdateOp) -> None: ...

    def rematerialized(
        self, values: Sequence[SSAValue], computed: Collection[Operation] = ()
    ) -> list[Operation]: ...


def needed_after(
    v: SSAValue, inside: Collection[Operation], stored: Collection[coco.UpdateOp]
) -> bool:
    """Whether a kernel computing `v` over the ops `inside` must store it: some op outside
    reads it, or an update the kernel does not store itself (`stored`) copies it later (an
    optimizer's `m` updated after its norms, in a later segment)."""
    return any(use.operation not in inside and use.operation not in stored for use in v.uses)


def flags_buffer(lw: PlanBuilder, hint: str, t: TensorType, group: int) -> Buffer:
    """A fused collective's flag array for a group of `group` ranks (plan.flag_words): every
    member's symmetric scratch, zeroed, which its kernel's `Epoch` counts launches in too."""
    return lw.new_buffer(
        f"{hint}_flags", t, kind="scratch", symmetric=True, elt="u32", shape=(flag_words(group),)
    )
