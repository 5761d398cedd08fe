"""The execution plan: what every rank does, in order, to run a scheduled program.

A plan is SPMD like the program: one list of host steps that every rank walks, with the
rank-dependent numbers (offsets of a rank's slice, its dropout stream) resolved per rank by the
executor from `RankValue`s. Steps name buffers (a rank's piece of a value), launch kernels of
the plan's one CUDA translation unit, call library collectives (NCCL on GPUs, MPI on CPUs, the
sim's semantics in-process), run matmuls (cuBLAS / BLAS), copy, and order work on two streams
(compute 0, communication 1) with events for overlap.

The plan prints as text (`coco-opt -t plan`), deterministically, for humans and lit tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from coconet.dialects.coco import ReplicatedAttr, TensorType
from coconet.dialects.reduction import Reduction
from coconet.lowering.signature import KernelParam, ParamKind

COMPUTE_STREAM = 0
COMM_STREAM = 1

# Blocks of a fused collective kernel all wait on their peers, so they must be resident at
# once. The plan's grid is at most PLAN_COLLECTIVE_BLOCKS (the host backend's blocks are
# chunks of work on a few cores, and any GPU holds that many); the cuda backend grows it, up
# to what the GPU holds, to MAX_COLLECTIVE_BLOCKS at most: what the flag and partial buffers
# are sized for. 64 blocks of 256 threads leave half of an H200's 132 SMs idle (measured: an
# Adam step at 2^24 ran at 0.9 TB/s against a 4.3 TB/s copy).
PLAN_COLLECTIVE_BLOCKS = 64
MAX_COLLECTIVE_BLOCKS = 2048
# The u32 words at the end of a flag array that hold its site's epoch counter and ticket
# (coco_device.h coco_epoch_next).
EPOCH_WORDS = 2


def flag_words(group: int) -> int:
    """The u32 words of a fused collective's flag array for a group of `group` ranks: entry,
    done and exit flags (group x MAX_COLLECTIVE_BLOCKS each), one exchange flag per rank, and
    the epoch counter pair."""
    return 3 * group * MAX_COLLECTIVE_BLOCKS + group + EPOCH_WORDS


def shrink_grids(grids: Sequence[int], most: int) -> list[int]:
    """Grids of at least one block each, in proportion to `grids`, summing to at most `most`
    (at least as many as there are grids)."""
    total = sum(grids)
    if total <= most:
        return list(grids)
    out = [max(1, g * most // total) for g in grids]
    while sum(out) > most:
        out[out.index(max(out))] -= 1
    return out


@dataclass(eq=False)
class Buffer:
    """A rank's piece of one value. `kind`: arg (the caller's buffer), temp, or partials
    (scratch of reductions). Symmetric buffers are reachable by every rank of a node (CUDA IPC
    / MPI shared-memory windows): fused collective kernels read and write their peers'."""

    name: str
    type: TensorType
    shape: tuple[int, ...]
    kind: Literal["arg", "temp", "scratch"] = "temp"
    symmetric: bool = False
    elt: str = ""
    # Each rank's piece shape, in rank order, where ranks hold pieces of different shapes (an
    # uneven slice); empty when every rank's is `shape`. `shape` is then the largest piece
    # (what a symmetric buffer allocates on every rank); a rank's piece is stored compactly,
    # row-major, at the start of its buffer.
    rank_shapes: tuple[tuple[int, ...], ...] = ()

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def shape_at(self, rank: int) -> tuple[int, ...]:
        """The shape of rank `rank`'s piece."""
        return self.rank_shapes[rank] if self.rank_shapes else self.shape

    def count_at(self, rank: int) -> int:
        n = 1
        for d in self.shape_at(rank):
            n *= d
        return n

    def describe(self) -> str:
        sym = " symmetric" if self.symmetric else ""
        shape = "x".join(map(str, self.shape)) or "scalar"
        if self.rank_shapes:
            shape = "uneven " + "|".join("x".join(map(str, s)) for s in self.rank_shapes)
        return f"buffer %{self.name} : {shape} {self.elt or self.type.elt} {self.kind}{sym}"


@dataclass(frozen=True)
class RankValue:
    """An integer that depends on the rank: `table[rank]` (precomputed per rank at lowering)."""

    label: str
    table: tuple[int, ...]

    def __str__(self) -> str:
        if len(set(self.table)) == 1:
            return str(self.table[0])
        return f"{self.label}[rank]"


@dataclass(frozen=True)
class PeerTable:
    """A device array of the pointers to `buffer` (symmetric) of every member of this rank's
    group over grid axes `span`, in group order: how a fused collective kernel reaches peers."""

    buffer: Buffer
    span: tuple[int, ...]
    # "all" the group, or only its members on this rank's node (a hierarchical collective's
    # intra-node kernel): core/values.py GROUP_PARTS.
    part: str = "all"

    def __str__(self) -> str:
        where = " on node" if self.part == "node" else ""
        return f"peers(%{self.buffer.name}{where})"


@dataclass(frozen=True)
class Epoch:
    """The launch counter of the kernel at this site (the flag array named `site`): the
    address of its last EPOCH_WORDS words, from which every launch takes its epoch on the
    device (coco_epoch_next) -- the value its cross-rank flags carry, so flags never need
    resetting, and a launch replayed from a CUDA graph with unchanged arguments still carries
    a new one."""

    site: str

    def __str__(self) -> str:
        return f"epoch({self.site})"


@dataclass(frozen=True)
class ArgTable:
    """A device array of per-tensor values (pointers of buffers, integers) for a kernel's
    table form: one launch serving many tensors."""

    items: tuple[KernelArg, ...]

    def __str__(self) -> str:
        def show(a: KernelArg) -> str:
            return f"%{a.name}" if isinstance(a, Buffer) else str(a)

        return "[" + ", ".join(show(a) for a in self.items) + "]"


KernelArg = Buffer | int | float | RankValue | PeerTable | Epoch | ArgTable


@dataclass
class Step:
    stream: int = field(default=COMPUTE_STREAM, kw_only=True)

    def text(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        prefix = "" if self.stream == COMPUTE_STREAM else f"[stream {self.stream}] "
        return prefix + self.text()


@dataclass
class Launch(Step):
    kernel: str
    grid: int
    block: int
    args: list[KernelArg]
    shared_bytes: int = 0
    # Which buffers the launch writes (for the executors' bookkeeping and for humans).
    writes: tuple[str, ...] = ()
    # Positions of the kernel's `begin`/`end` arguments (element range of its iteration),
    # so overlap can launch the same kernel on one chunk at a time.
    range_positions: tuple[int, int] | None = None
    # The local shape the kernel iterates over (rows = all dims but the last) and its type.
    iteration_shape: tuple[int, ...] | None = None
    iteration_type: TensorType | None = None

    def text(self) -> str:
        def show(a: KernelArg) -> str:
            if isinstance(a, Buffer):
                return f"%{a.name}"
            return str(a)

        return (
            f"launch {self.kernel}<<<{self.grid}, {self.block}, {self.shared_bytes}>>>"
            f"({', '.join(show(a) for a in self.args)})"
        )


@dataclass
class Collective(Step):
    """A library collective on whole buffers. `op`: all_reduce, reduce_scatter, all_gather,
    broadcast, reduce, send (point-to-point shift), all_to_all. Types say the layouts (and so
    which part of the logical tensor each rank holds before and after)."""

    op: str
    src: Buffer
    dst: Buffer
    kind: Reduction | None = None
    axes: tuple[int, ...] = ()
    root: int | None = None
    along: int | None = None
    shift: int | None = None
    # Row range [begin, end) of the flattened leading dims when one chunk of an overlapped
    # pipeline runs (the collective of those rows only): rows of both buffers, except that a
    # reduce_scatter's are rows of its result (every member's part of them is reduced) and
    # an all_gather's rows of its input (every member's rows are gathered) -- `row_buffer`.
    rows: tuple[int, int] | None = None
    # "all" the group, or its members across nodes (one per node: a hierarchical
    # collective's inter-node step, on buffers packed in that member order).
    part: str = "all"
    # The reduction's stated accumulation (comm.accumulation): combined here in rank order,
    # each step rounded to it, never by the library (runtime/collectives.py).
    acc: str | None = None
    # (dim, begin, end): one chunk of an overlapped all_to_all, the range [begin, end) of dim
    # `dim` of both buffers -- a dim the all_to_all neither splits nor gathers and every rank
    # holds whole (comm.a2a_chunk_dims), so the chunk is the all_to_all of that sub-block.
    block: tuple[int, int, int] | None = None

    @property
    def row_buffer(self) -> Buffer:
        """The buffer whose rows `rows` counts."""
        return self.dst if self.op == "reduce_scatter" else self.src

    def text(self) -> str:
        parts = [self.op]
        if self.kind:
            parts.append(self.kind)
        parts.append(f"%{self.src.name} -> %{self.dst.name}")
        if self.axes:
            parts.append("over [" + ", ".join(map(str, self.axes)) + "]")
        if self.root is not None:
            parts.append(f"root {self.root}")
        if self.along is not None:
            parts.append(f"along {self.along} shift {self.shift}")
        if self.part == "across":
            parts.append("across nodes")
        if self.acc is not None:
            parts.append(f"acc {self.acc}")
        if self.rows is not None:
            parts.append(f"rows [{self.rows[0]}, {self.rows[1]})")
        if self.block is not None:
            parts.append(f"dim {self.block[0]} [{self.block[1]}, {self.block[2]})")
        return " ".join(parts)

    @property
    def fraction(self) -> float:
        """The part of its buffers a chunked step moves (1 when whole)."""
        if self.rows is not None:
            buf = self.row_buffer
            rows = max(1, buf.count // max(1, buf.shape[-1] if buf.shape else 1))
            return (self.rows[1] - self.rows[0]) / rows
        if self.block is not None:
            d, lo, hi = self.block
            return (hi - lo) / max(1, self.src.shape[d])
        return 1.0


@dataclass
class Matmul(Step):
    """c = a @ b on this rank's pieces (batched over leading dims), computing in f32 for
    f16/bf16 (cuBLAS with fp32 accumulation / NumPy BLAS). An overlapped chunk computes some
    rows of c (flattened leading dims) from the same rows of a: `rows`, ranges of them, or
    `block` = (dim, begin, end), the rows whose index along that dim of `block_of` ("a" or
    "c") lies in [begin, end) -- found on each rank's own piece, which an uneven cut of
    another dim shapes differently. a (or c) may then be the buffer of a reshape of the
    operand (result) that keeps its last dim: the same rows. A batched b is not broadcast
    over c's batch dims: each of its matrices multiplies one run of c's rows."""

    a: Buffer
    b: Buffer
    c: Buffer
    rows: tuple[tuple[int, int], ...] | None = None
    block: tuple[int, int, int] | None = None
    block_of: str = "c"
    # A chunk of the reduction dim (the gather form on the right operand: FSDP's parameter
    # all_gather): the rows of b (one matrix) and the same columns of a it multiplies, as
    # ranges; the chunk writes its product into c (`accumulate` false: the first chunk) or
    # adds it. Where c is narrower than its compute type (f16, bf16, fp8) the chunks sum in
    # `acc` (that compute type, c's shape), which the `final` chunk rounds into c: one
    # rounding, as the whole product's.
    k_rows: tuple[tuple[int, int], ...] | None = None
    accumulate: bool = False
    acc: Buffer | None = None
    final: bool = False

    def text(self) -> str:
        rows = " rows " + " ".join(f"[{lo}, {hi})" for lo, hi in self.rows) if self.rows else ""
        if self.block is not None:
            d, lo, hi = self.block
            rows += f" dim {d} [{lo}, {hi}) of %{getattr(self, self.block_of).name}"
        if self.k_rows is not None:
            rows += " k " + " ".join(f"[{lo}, {hi})" for lo, hi in self.k_rows)
            rows += " accumulate" if self.accumulate else ""
            if self.acc is not None:
                rows += f" in %{self.acc.name}" + (" final" if self.final else "")
        return f"matmul %{self.a.name}, %{self.b.name} -> %{self.c.name}{rows}"

    @property
    def fraction(self) -> float:
        """The part of c's rows a chunked step computes (1 when whole); of the reduction dim,
        for a chunk of it."""
        if self.k_rows is not None:
            k = self.b.shape[0] if self.b.shape else 1
            return sum(hi - lo for lo, hi in self.k_rows) / max(1, k)
        if self.rows:
            k = self.a.shape[-1] if self.a.shape else 1
            return sum(hi - lo for lo, hi in self.rows) / max(1, self.a.count // max(1, k))
        if self.block is not None:
            d, lo, hi = self.block
            return (hi - lo) / max(1, getattr(self, self.block_of).shape[d])
        return 1.0


@dataclass
class Copy(Step):
    src: Buffer
    dst: Buffer

    def text(self) -> str:
        return f"copy %{self.src.name} -> %{self.dst.name}"


@dataclass
class RecordEvent(Step):
    event: str

    def text(self) -> str:
        return f"record {self.event}"


@dataclass
class WaitEvent(Step):
    event: str

    def text(self) -> str:
        return f"wait {self.event}"


@dataclass
class Plan:
    program: str
    grid_shape: tuple[int, ...]
    buffers: list[Buffer]
    steps: list[Step]
    cuda_source: str
    # Buffers the caller sees: argument name -> buffer, output name -> buffer.
    arguments: dict[str, Buffer] = field(default_factory=dict)
    outputs: dict[str, Buffer] = field(default_factory=dict)
    # Every kernel of `cuda_source` -> its parameters in order: how executors type the
    # arguments of a launch (never read back from the text).
    signatures: dict[str, tuple[KernelParam, ...]] = field(default_factory=dict)
    # The node of every rank (core/values.py); empty: one node holds every rank.
    nodes: tuple[int, ...] = ()
    # The type the program AS WRITTEN gives each argument a schedule stores otherwise
    # (coco-as-slice: replicated state kept sliced), recorded by coconet.compile: what the
    # caller passes under its default calling convention (coconet/convention.py). Empty: the
    # arguments' own types.
    written_types: dict[str, TensorType] = field(default_factory=dict)

    @property
    def size(self) -> int:
        n = 1
        for s in self.grid_shape:
            n *= s
        return n

    def kernels(self) -> list[str]:
        return sorted({s.kernel for s in self.steps if isinstance(s, Launch)})

    def peers_max(self) -> int:
        """The largest group a kernel of the plan runs the cross-rank protocol in (0 for
        none): what a GPU build defines COCO_PEERS_MAX as (coco_device.h), so that a vector
        iteration keeps registers for exactly the peers that can exist."""
        largest = 0
        for step in self.steps:
            if not isinstance(step, Launch):
                continue
            params = self.signatures.get(step.kernel, ())
            for p, arg in zip(params, step.args):
                if p.kind == ParamKind.NRANKS:
                    largest = max([largest, *_integers(arg)])
        return largest

    def device_source(self) -> str:
        """`cuda_source` with the plan's compile-time constants (`peers_max`): the text a GPU
        build compiles. `cuda_source` itself is the same at every rank count."""
        largest = self.peers_max()
        if not largest:
            return self.cuda_source
        return f"#define COCO_PEERS_MAX {largest}\n" + self.cuda_source

    def format(self) -> str:
        lines = [f"plan @{self.program} on grid {list(self.grid_shape)}"]
        if self.nodes:
            lines[0] += f" on {len(set(self.nodes))} nodes {list(self.nodes)}"
        lines += ["  " + b.describe() for b in self.buffers]
        lines += ["  " + str(s) for s in self.steps]
        lines += [f"  output {name} = %{b.name}" for name, b in self.outputs.items()]
        return "\n".join(lines) + "\n"


def _integers(arg: KernelArg) -> list[int]:
    """The integers a kernel argument takes (on every rank, for every tensor of a table)."""
    if isinstance(arg, bool):
        return []
    if isinstance(arg, int):
        return [arg]
    if isinstance(arg, RankValue):
        return list(arg.table)
    if isinstance(arg, ArgTable):
        return [n for item in arg.items for n in _integers(item)]
    return []


def staged_piece(table: PeerTable) -> bool:
    """Whether the table's symmetric buffer holds only this rank's piece of a value its group
    cuts (an all_gather's staging buffer): every peer then reads all of it."""
    t = table.buffer.type
    cut = {axis for d in range(t.rank) for axis in t.slicing_axes(d)}
    return bool(table.span) and set(table.span) <= cut


def gather_destinations(plan: Plan, step: Launch) -> set[str]:
    """The buffers a launch's fused all_gathers assemble their values in (its GATHER_OUT
    arguments, a table launch's every tensor's): where one is also a peer table's buffer (a
    `{coco.symmetric}` argument), the peers pull from the destination itself."""
    names: set[str] = set()
    for param, arg in zip(plan.signatures.get(step.kernel, ()), step.args, strict=False):
        if param.kind == ParamKind.GATHER_OUT:
            items = arg.items if isinstance(arg, ArgTable) else (arg,)
            names.update(a.name for a in items if isinstance(a, Buffer))
    return names


def reads_whole(step: Launch, table: PeerTable) -> bool:
    """Whether each peer of a launch reads all of the table's buffer: the launch iterates over
    a type replicated on every axis of the table (the one-shot fused all_reduce: every rank
    reduces every peer's whole input), where a two-shot kernel iterates over its slice."""
    t = step.iteration_type
    if t is None or table.part != "all":
        return False
    layouts = t.layouts.data
    return all(ax >= len(layouts) or isinstance(layouts[ax], ReplicatedAttr) for ax in table.span)
