"""The one plan walker every multi-process backend shares, and the hooks a backend provides.

A lowered plan (lowering/plan.py) is SPMD: every rank walks the same steps. `PlanRunner` is one
rank's walk. It owns everything that does not depend on where memory lives or how bytes move:

* resolving kernel arguments: `Buffer` -> the address of this rank's buffer, `PeerTable` -> the
  address of a device array holding the group members' addresses of a symmetric buffer (in
  group order), `Epoch` -> the address of the site's launch counter on the device (the end of
  its flag array: kernels take their epochs from it, so a step's arguments never change),
  `RankValue` -> `table[rank]`, literals as they are;
* typing them: the parameter types come from the kernel signatures the plan carries (the C
  type of each parameter, from the lowering's kernel IR), so a `coco_i32 me` is passed as
  4 bytes to CuPy as it is to ctypes;
* the order of steps, streams (0 compute, 1 communication) and events;
* checking the caller's inputs against the plan before anything is launched.

A backend (`Backend`) provides memory (plain and symmetric), kernel launches, library
collectives, matmuls, copies and events: `cpu` (runtime/cpu.py: MPI ranks, host-compiled
kernels, MPI-3 shared-memory windows) and `cuda` (runtime/cuda.py: CuPy, NCCL, CUDA IPC).
The `sim` backend is the oracle (runtime/sim.py) and interprets the IR, not plans.

Helpers here are pure functions of the plan and the grid, shared by both backends and
unit-tested: process groups, the regions of a piece that collectives exchange. The plan's
traffic (`plan_traffic`) and its buffers' bytes come from lowering/traffic.py, a function of
the plan alone.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from coconet.core import values as V
from coconet.core.program import CocoError, memory_for
from coconet.dialects.coco import TensorType
from coconet.lowering.plan import (
    COMPUTE_STREAM,
    EPOCH_WORDS,
    ArgTable,
    Buffer,
    Collective,
    Copy,
    Epoch,
    Launch,
    Matmul,
    PeerTable,
    Plan,
    RankValue,
    RecordEvent,
    Step,
    WaitEvent,
)
from coconet.lowering.signature import ABI_KINDS
from coconet.lowering.traffic import (
    buffer_dtype,
    plan_group,
    plan_traffic,
)

if TYPE_CHECKING:
    from coconet.runtime.trace import StepTracer

__all__ = [
    "Backend",
    "KernelArg",
    "PlanRunner",
    "buffer_dtype",
    "flat_block",
    "group_of",
    "groups_of",
    "kernel_signatures",
    "member_region",
    "plan_group",
    "plan_traffic",
]

# ---------------------------------------------------------------------------------------------
# Kernel signatures
# ---------------------------------------------------------------------------------------------

# Parameter kinds: a pointer, or a scalar of this C type.
PARAM_KINDS = ABI_KINDS


def kernel_signatures(plan: Plan) -> dict[str, tuple[str, ...]]:
    """Parameter kinds (PARAM_KINDS) of every kernel of `plan`, from the plan's kernel
    signatures (the lowering's own description of each kernel, not its CUDA text)."""
    out: dict[str, tuple[str, ...]] = {}
    for name, params in plan.signatures.items():
        try:
            out[name] = tuple(p.ctype.abi for p in params)
        except ValueError as e:
            raise CocoError(f"kernel {name}: {e}") from None
    return out


@dataclass(frozen=True)
class KernelArg:
    """One resolved kernel argument: its parameter kind and its value (an address for "ptr")."""

    kind: str
    value: int | float


# ---------------------------------------------------------------------------------------------
# Process groups and the regions collectives exchange
# ---------------------------------------------------------------------------------------------


groups_of = V.groups_of
group_of = V.group_of


def member_region(
    outer: TensorType,
    outer_rank: int,
    inner: TensorType,
    inner_rank: int,
    grid_shape: Sequence[int],
) -> tuple[slice, ...]:
    """The index region, within `outer_rank`'s piece of a tensor of type `outer`, that holds
    `inner_rank`'s piece of the same logical tensor under type `inner`.

    reduce_scatter: outer = the source at me, inner = the result at member m (what I send m);
    all_gather: outer = the result at me, inner = the source at member m (where m's piece goes).
    """
    oc = V.coords_of(outer_rank, grid_shape)
    ic = V.coords_of(inner_rank, grid_shape)
    index = []
    for d in range(inner.rank):
        o_start, _ = V.piece_range(outer, d, oc, grid_shape)
        i_start, i_len = V.piece_range(inner, d, ic, grid_shape)
        index.append(slice(i_start - o_start, i_start - o_start + i_len))
    return tuple(index)


def flat_block(region: tuple[slice, ...], shape: Sequence[int]) -> tuple[int, int] | None:
    """(offset, count) in elements when `region` of a C-contiguous array of `shape` is one
    contiguous run of memory, else None: single indices on the leading dims, any range on one
    dim, full ranges after it."""
    if not shape:
        return 0, 1
    lengths = [s.stop - s.start for s in region]
    j = len(shape) - 1
    while j > 0 and lengths[j] == shape[j]:
        j -= 1
    if any(lengths[d] != 1 for d in range(j)):
        return None
    strides = [int(np.prod(shape[d + 1 :], dtype=np.int64)) for d in range(len(shape))]
    offset = sum(s.start * st for s, st in zip(region, strides))
    count = int(np.prod(lengths, dtype=np.int64))
    return offset, count


def consecutive_blocks(regions: Sequence[tuple[slice, ...]], shape: Sequence[int]) -> bool:
    """True when the regions, in order, tile the array as equal consecutive runs of memory
    (then a library collective can work on the buffer as it is, without packing)."""
    blocks = [flat_block(r, shape) for r in regions]
    if any(b is None for b in blocks):
        return False
    count = blocks[0][1]  # type: ignore[index]
    total = int(np.prod(shape, dtype=np.int64))
    return count * len(blocks) == total and all(
        b == (i * count, count)
        for i, b in enumerate(blocks)  # type: ignore[comparison-overlap]
    )


# ---------------------------------------------------------------------------------------------
# Matmul chunks
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def matmul_segments(
    rows: tuple[tuple[int, int], ...] | None,
    block: tuple[int, int, int] | None,
    block_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    c_shape: tuple[int, ...],
) -> tuple[tuple[int, int, int | None], ...]:
    """The runs [lo, hi) of rows of a and c (flattened leading dims) a chunked matmul computes
    on this rank, each with the matrix of b it multiplies (None: b is one matrix) -- see
    lowering/plan.py `Matmul`. `block_shape`: this rank's shape of the buffer `block` cuts.
    Cached: every call of a compiled program asks again."""
    if block is not None:
        d, lo, hi = block
        index = np.arange(int(np.prod(block_shape[:-1], dtype=np.int64)), dtype=np.int64)
        picked = index.reshape(block_shape[:-1])[(slice(None),) * d + (slice(lo, hi),)]
        flat = np.sort(picked.reshape(-1))
        breaks = np.flatnonzero(np.diff(flat) != 1) + 1
        starts, ends = np.concatenate(([0], breaks)), np.concatenate((breaks, [flat.size]))
        runs = [(int(flat[a]), int(flat[e - 1]) + 1) for a, e in zip(starts, ends) if e > a]
    else:
        runs = list(rows or ())
    matrices = int(np.prod(b_shape[:-2], dtype=np.int64)) if len(b_shape) > 2 else 1
    if matrices <= 1:
        return tuple((lo, hi, None) for lo, hi in runs)
    total = int(np.prod(c_shape[:-1], dtype=np.int64))
    if total % matrices:
        raise CocoError(
            f"[overlap-rows] a chunked matmul of {total} rows cannot multiply {matrices} "
            "matrices of b, one run of rows each"
        )
    per = total // matrices
    out: list[tuple[int, int, int | None]] = []
    for lo, hi in runs:
        while lo < hi:
            end = min(hi, (lo // per + 1) * per)
            out.append((lo, end, lo // per))
            lo = end
    return tuple(out)


def reduction_runs(step: Matmul) -> Iterator[tuple[slice, bool]]:
    """Each run of the reduction dim a chunk multiplies (lowering/plan.py `Matmul.k_rows`), as
    a slice of b's rows (a's columns: a view, no copy), and whether its product adds to the
    sum (every run but the first chunk's first). One GEMM a run: a gathered chunk holds one
    run per member's piece."""
    assert step.k_rows is not None
    for n, (lo, hi) in enumerate(step.k_rows):
        yield slice(lo, hi), step.accumulate or n > 0


def accumulate_chunk(into: Any, part: Any, add: bool) -> None:
    """A run's product `part` written into (`add` false) or added to `into` (c, or the step's
    accumulator)."""
    if add:
        into += part.astype(into.dtype, copy=False)
    else:
        into[...] = part


def check_plan_size(plan: Plan, size: int) -> None:
    """A backend runs the plan of its job's size only."""
    if plan.size != size:
        raise CocoError(
            f"the plan of @{plan.program} is for {plan.size} rank(s), but this job has "
            f"{size} process(es)"
        )


# ---------------------------------------------------------------------------------------------
# The backend interface
# ---------------------------------------------------------------------------------------------


class Backend(Protocol):
    """What one rank's backend provides to the walker. Methods marked collective are called by
    every rank of the job in the same order (the plan is SPMD)."""

    name: str
    rank: int
    size: int

    def prepare(self, plan: Plan) -> None:
        """Compile the plan's kernels and create the communicators its steps need
        (collective)."""

    def allocate(self, buffers: Sequence[Buffer]) -> None:
        """Allocate this rank's plain buffers."""

    def allocate_symmetric(self, buffers: Sequence[Buffer]) -> dict[str, dict[int, int]]:
        """Allocate symmetric buffers (zeroed) reachable by the ranks of this node; returns,
        per buffer name, every reachable rank's address of it by global rank (collective)."""
        ...

    def peer_table(self, addresses: Sequence[int]) -> int:
        """A device array holding `addresses` (u64); returns its address."""
        ...

    def table(self, values: Sequence[int], dtype: np.dtype, key: object = None) -> int:
        """A device array holding `values` (u64 addresses or i64 integers of a kernel's table
        form); returns its address. It replaces the previous table of the same `key` once no
        launch can still read that one (None: kept until close())."""
        ...

    def address(self, name: str) -> int:
        """The address of this rank's buffer `name`."""
        ...

    def bind(self, buf: Buffer, value: Any) -> bool:
        """Use the caller's array as the buffer if possible (zero copy); False: copy it in."""
        ...

    def write(self, buf: Buffer, value: Any) -> None:
        """Copy the caller's piece into the buffer."""

    def order_inputs(self, values: Sequence[Any]) -> None:
        """The caller's values passed again unchanged (not coerced anew): the backend's
        later work waits for what the caller did to them since (a device's streams)."""

    def holds(self, buf: Buffer, value: Any) -> bool:
        """Whether `value` is this rank's buffer itself (the array `array(buf.name)` gave the
        caller, who wrote into it): nothing to copy."""
        ...

    def array(self, name: str) -> Any:
        """This rank's buffer `name` as an array of the backend's kind (NumPy, CuPy)."""
        ...

    def read(self, buf: Buffer) -> Any:
        """A copy of the buffer's content (for outputs)."""
        ...

    def unbind(self, buf: Buffer) -> None:
        """Stop using a bound caller array (back to the backend's own buffer)."""

    # The caller's values (coconet.compile): what the backend accepts, and the results.

    def coerce_input(self, name: str, value: Any, buf: Buffer) -> Any:
        """The caller's value as an array this backend can check and place (no dtype
        conversion: a wrong dtype must be reported, not fixed)."""
        ...

    def shape_of(self, value: Any) -> tuple[int, ...]: ...

    def dtype_of(self, value: Any) -> np.dtype: ...

    def write_back(self, buf: Buffer, caller: Any, *, bound: bool) -> Any:
        """An updated argument's new value, in the caller's array where it can take it."""
        ...

    def output(self, buf: Buffer) -> Any:
        """A returned value: a new array of the backend's kind (NumPy, CuPy)."""
        ...

    # Steps.

    def launch(self, step: Launch, args: Sequence[KernelArg]) -> None: ...

    def collective(self, step: Collective) -> None: ...

    def gather_into(self, step: Collective, target: Any) -> None:
        """Run the all_gather `step` now, after the plan ran, from its source buffer into
        `target`, a caller's array standing for its destination (coconet/convention.py)."""
        ...

    def matmul(self, step: Matmul) -> None: ...

    def copy(self, step: Copy) -> None: ...

    def record_event(self, event: str, stream: int) -> None: ...

    def wait_event(self, event: str, stream: int) -> None: ...

    def synchronize(self) -> None:
        """Wait for every outstanding operation of this rank."""

    def barrier(self) -> None:
        """All ranks of the job (collective)."""

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------------
# The walker
# ---------------------------------------------------------------------------------------------


@dataclass
class StepProgress:
    """What the rank is doing, for the watchdog and for failure messages. `what` is the plan
    step itself (or a phase's name): its text is made only when a message needs it -- a
    table launch's text takes 25-60 us to format, and the walk enters every step."""

    index: int = -1
    what: object = "setup"
    since: float = field(default_factory=time.monotonic)

    def enter(self, index: int, what: object) -> None:
        self.index, self.what, self.since = index, what, time.monotonic()

    @property
    def text(self) -> str:
        return str(self.what)


def graph_refusal(plan: Plan) -> str | None:
    """Why `plan`'s steps cannot be captured as one CUDA graph and replayed (None: they can):
    a graph holds its kernel launches, copies and events; library calls (NCCL collectives,
    cuBLAS matmuls) run from the host every step."""
    for i, step in enumerate(plan.steps):
        if not isinstance(step, Launch | Copy | RecordEvent | WaitEvent):
            return f"step {i} ({step}) is a library call, which graphs do not capture here"
    return None


class PlanRunner:
    """One rank's execution of a plan on a backend: `setup()` once (collective), then
    `set_inputs(pieces)`, `run()` and `outputs()` per call, or `run()` alone on resident data."""

    def __init__(
        self,
        plan: Plan,
        rank: int,
        backend: Backend,
        *,
        fault: Callable[[int, Step], None] | None = None,
    ):
        if not 0 <= rank < plan.size:
            raise CocoError(f"rank {rank} is outside the plan's grid {list(plan.grid_shape)}")
        self.plan = plan
        self.rank = rank
        self.backend = backend
        self.signatures = kernel_signatures(plan)
        self._site_buffers = {b.name: b for b in plan.buffers}
        self.peer_tables: dict[tuple[str, tuple[int, ...], str], int] = {}
        # ArgTable -> (the values it was built from, its device address); rebuilt when a
        # bound caller array moves a buffer.
        self.arg_tables: dict[int, tuple[tuple[int, ...], int]] = {}
        # Where the buffers are: bumped whenever an argument buffer moves (set_inputs binding
        # a caller's array at another address; setup allocating), the only events that
        # change a launch's arguments (epochs advance on the device).
        self._placement = 0
        # each launch's resolved arguments, by id(launch): (the placement they were resolved
        # at, the arguments) (resolve)
        self._resolved: dict[int, tuple[int, list[KernelArg]]] = {}
        self.progress = StepProgress()
        self.fault = fault
        self.steps_run = 0
        self.bound: set[str] = set()
        # arguments whose value the caller passed is the buffer itself (input_buffer): at the
        # last set_inputs, neither copied nor bound
        self.held: set[str] = set()
        self._ready = False
        self.tracer: StepTracer | None = None
        self._expected: dict[str, tuple[tuple[int, ...], np.dtype, TensorType]] | None = None
        # a backend that converts a launch's arguments once per placement (`pack`, the cpu
        # backend's ctypes values) and launches them as they are from then on
        self._pack = getattr(backend, "pack", None)
        # each launch's packed arguments, by id(launch): (placement, packed)
        self._packed: dict[int, tuple[int, Any]] = {}
        # packs made (tests count them: once per launch per placement)
        self.packs = 0
        self.inputs_set = 0  # set_inputs calls (coconet/compiled.py: what its inputs match)
        # caller values copied into argument buffers, by name (a symmetric one always is,
        # unless the caller wrote into the buffer itself: CompiledProgram.input_buffer)
        self.copies_in: Counter[str] = Counter()
        # Steps replayed from a CUDA graph (a backend that captures, `graphs` on): why the
        # plan cannot be (None: it can), the graph and the placement it was captured at.
        self.graph_refusal = graph_refusal(plan) if getattr(backend, "graphs", False) else "off"
        self._graph: tuple[int, Any] | None = None
        self.captures = 0

    # -- setup -------------------------------------------------------------------------------

    def setup(self) -> None:
        plan, b = self.plan, self.backend
        self._placement += 1  # buffers and the peer tables are made here
        for step in plan.steps:
            if isinstance(step, Launch):
                if step.kernel not in self.signatures:
                    raise CocoError(
                        f"the plan launches {step.kernel} but carries no signature of it"
                    )
                want = len(self.signatures[step.kernel])
                if want != len(step.args):
                    raise CocoError(
                        f"the plan passes {len(step.args)} argument(s) to {step.kernel}, "
                        f"which takes {want}"
                    )
        b.prepare(plan)
        symmetric = [buf for buf in plan.buffers if buf.symmetric]
        with memory_for(f"the buffers of @{plan.program}"):
            b.allocate([buf for buf in plan.buffers if not buf.symmetric])
            addresses = b.allocate_symmetric(symmetric) if symmetric else {}
        for step in plan.steps:
            if not isinstance(step, Launch):
                continue
            # A table-form launch carries each tensor's peer tables in its argument tables.
            tables = [x for a in step.args if isinstance(a, ArgTable) for x in a.items]
            for a in [*step.args, *tables]:
                if not isinstance(a, PeerTable):
                    continue
                key = (a.buffer.name, a.span, a.part)
                if key in self.peer_tables:
                    continue
                if not a.buffer.symmetric:
                    raise CocoError(
                        f"{step.kernel} reaches peers' %{a.buffer.name}, which is not symmetric"
                    )
                group = plan_group(plan, a.span, a.part, self.rank)
                reachable = addresses.get(a.buffer.name, {})
                missing = [m for m in group if m not in reachable]
                if missing:
                    raise CocoError(
                        f"{step.kernel} is a fused collective over ranks {group}, but rank(s) "
                        f"{missing} are not on this rank's node, although the plan puts them "
                        "there: lower the plan for the job's nodes (coconet.compile and coco-run "
                        "do; COCONET_RANKS_PER_NODE declares a split)"
                    )
                self.peer_tables[key] = b.peer_table([reachable[m] for m in group])
        self._ready = True

    # -- inputs and outputs ------------------------------------------------------------------

    def expected_inputs(self) -> dict[str, tuple[tuple[int, ...], np.dtype, TensorType]]:
        if self._expected is None:  # the plan does not change: made once (every call checks)
            self._expected = {
                name: (tuple(buf.shape_at(self.rank)), buffer_dtype(buf), buf.type)
                for name, buf in self.plan.arguments.items()
            }
        return dict(self._expected)

    def check_inputs(
        self,
        pieces: Mapping[str, Any],
        shape_of: Callable[[Any], tuple],
        dtype_of: Callable[[Any], Any],
        *,
        only: Iterable[str] | None = None,
    ) -> None:
        """Every argument present, no unknown one, each of this rank's piece shape and dtype:
        one clear error before anything is launched. `only`: check the shapes and dtypes of
        these names alone (the caller checked the names, and the others were checked before
        and did not change)."""
        self.expected_inputs()
        want = self._expected
        assert want is not None
        if only is None:
            V.check_input_names(self.plan.program, pieces, list(want))
            only = want
        for name in only:
            shape, dtype, t = want[name]
            got_shape, got_dtype = shape_of(pieces[name]), dtype_of(pieces[name])
            if tuple(got_shape) != shape:
                raise CocoError(
                    f"input '{name}' of type {t}: rank {self.rank} must pass its piece of shape "
                    f"{list(shape)}, got {list(got_shape)}"
                )
            if np.dtype(got_dtype) != dtype:
                raise CocoError(
                    f"input '{name}' of type {t}: expected dtype {t.elt} ({dtype.name}), got "
                    f"{np.dtype(got_dtype).name}"
                )

    def set_inputs(
        self,
        pieces: Mapping[str, Any],
        *,
        zero_copy: bool = True,
        fresh: Iterable[str] | None = None,
    ) -> None:
        """Place this rank's pieces in the argument buffers (checked before by check_inputs).
        `fresh`: the names whose values may differ from the last call's (None: every name);
        an argument bound to the caller's array and not fresh keeps its binding -- the same
        array at the same address (coconet/compiled.py checks both) -- while an argument
        copied in is copied again (the caller may have written new values into it)."""
        self.inputs_set += 1
        names = self.plan.arguments
        fresh = names if fresh is None else set(fresh)
        was = {n: self.backend.address(n) for n in self.bound if n in fresh}
        for name in was:
            self.backend.unbind(names[name])
            self.bound.discard(name)
        moved = False
        self.held.clear()
        for name, buf in names.items():
            if name in self.bound:
                continue  # kept: not fresh
            value = pieces[name]
            if zero_copy and not buf.symmetric and self.backend.bind(buf, value):
                self.bound.add(name)
                moved = moved or was.get(name) != self.backend.address(name)
            elif self.backend.holds(buf, value):
                self.held.add(name)
                moved = moved or name in was  # already there: the caller wrote into it
            else:
                self.backend.write(buf, value)
                self.copies_in[name] += 1
                moved = moved or name in was
        # The same caller arrays again (a training loop's parameters): nothing moved, and the
        # launches keep the arguments they resolved.
        if moved:
            self._placement += 1

    # -- execution ---------------------------------------------------------------------------

    def resolve(self, launch: Launch) -> list[KernelArg]:
        """The launch's arguments. They do not change from step to step (epochs advance on
        the device, coco_epoch_next): numbers, rank tables, peer tables, buffers' addresses
        and the argument tables holding them are resolved again only after a buffer moved
        (`_placement`) -- a table launch takes 20-odd argument tables, and resolving them
        every step cost ~100 us a step, most of a small optimizer step on this host."""
        cached = self._resolved.get(id(launch))
        if cached is None or cached[0] != self._placement:
            kinds = self.signatures[launch.kernel]
            args = [self._argument(launch, a, k) for a, k in zip(launch.args, kinds, strict=True)]
            cached = self._resolved[id(launch)] = (self._placement, args)
        return cached[1]

    def _launch_packed(self, launch: Launch) -> None:
        """The launch through the backend's packed arguments, converted once per placement
        (no per-step conversion or allocation)."""
        cached = self._packed.get(id(launch))
        if cached is None or cached[0] != self._placement:
            assert self._pack is not None
            cached = self._packed[id(launch)] = (
                self._placement,
                self._pack(launch, self.resolve(launch)),
            )
            self.packs += 1
        self.backend.launch_packed(launch, cached[1])  # type: ignore[attr-defined]

    def epoch_counter(self, site: str) -> int:
        """The address of the epoch counter pair of the flag array `site` (its last words)."""
        buf = self._site_buffers[site]
        return self.backend.address(site) + 4 * (buf.count - EPOCH_WORDS)

    def _argument(self, launch: Launch, a: Any, kind: str) -> KernelArg:
        if isinstance(a, Buffer):
            arg = KernelArg("ptr", self.backend.address(a.name))
        elif isinstance(a, PeerTable):
            arg = KernelArg("ptr", self.peer_tables[(a.buffer.name, a.span, a.part)])
        elif isinstance(a, Epoch):
            arg = KernelArg("ptr", self.epoch_counter(a.site))
        elif isinstance(a, ArgTable):
            arg = KernelArg("ptr", self.arg_table(a))
        elif isinstance(a, RankValue):
            arg = KernelArg(kind, int(a.table[self.rank]))
        elif isinstance(a, bool):
            arg = KernelArg(kind, int(a))
        elif isinstance(a, (int, float)):
            arg = KernelArg(kind, float(a) if kind in ("f32", "f64") else int(a))
        else:
            raise CocoError(f"{launch.kernel}: cannot pass argument {a!r}")
        if kind == "ptr" and arg.kind != "ptr":
            raise CocoError(f"{launch.kernel}: a pointer parameter gets {a}")
        if kind != "ptr" and arg.kind == "ptr":
            raise CocoError(f"{launch.kernel}: a {kind} parameter gets the buffer {a}")
        return arg

    def arg_table(self, table: ArgTable) -> int:
        """The device array of a kernel's table-form argument: buffers' addresses (u64) or
        integers (i64), one per tensor the launch serves."""
        values = []
        pointers = False
        for x in table.items:
            if isinstance(x, Buffer):
                values.append(self.backend.address(x.name))
                pointers = True
            elif isinstance(x, PeerTable):
                values.append(self.peer_tables[(x.buffer.name, x.span, x.part)])
                pointers = True
            elif isinstance(x, Epoch):
                values.append(self.epoch_counter(x.site))
                pointers = True
            elif isinstance(x, ArgTable):
                # A collective's per-member table (bases, counts), one per tensor.
                values.append(self.arg_table(x))
                pointers = True
            elif isinstance(x, RankValue):
                values.append(int(x.table[self.rank]))
            elif isinstance(x, (int, np.integer)):
                values.append(int(x))
            else:
                raise CocoError(f"cannot put {x!r} in a kernel's argument table")
        key = tuple(values)
        cached = self.arg_tables.get(id(table))
        if cached is not None and cached[0] == key:
            return cached[1]
        dtype = np.dtype(np.uint64) if pointers else np.dtype(np.int64)
        address = self.backend.table(values, dtype, key=id(table))
        self.arg_tables[id(table)] = (key, address)
        return address

    def execute(self, index: int, step: Step) -> None:
        self.progress.enter(index, step)
        if self.fault is not None:
            self.fault(index, step)
        b = self.backend
        match step:
            case Launch():
                if self._pack is not None:
                    self._launch_packed(step)
                else:
                    b.launch(step, self.resolve(step))
            case Collective():
                b.collective(step)
            case Matmul():
                b.matmul(step)
            case Copy():
                b.copy(step)
            case RecordEvent():
                b.record_event(step.event, step.stream)
            case WaitEvent():
                b.wait_event(step.event, step.stream)
            case _:
                raise CocoError(f"the {b.name} backend cannot run the plan step {step}")

    def trace(self, tracer: StepTracer | None) -> None:
        """Time every step through `tracer` (runtime/trace.py) from now on; None stops. The
        traced `execute` is bound on this instance in place of the class's, so an untraced
        walk tests no flag per step: tracing off costs nothing."""
        self.tracer = tracer
        self.__dict__.pop("execute", None)
        if tracer is not None:
            self.execute = tracer.timed(self.execute)  # type: ignore[method-assign]

    def run(self) -> None:
        """One execution of every step, and a wait for all of it: from the second on, a
        replay of the steps captured as a graph, where the backend and the plan allow."""
        if not self._ready:
            raise CocoError("PlanRunner.setup() must run before run()")
        traced = self.tracer is not None or self.fault is not None
        if self.graph_refusal is None and self.steps_run and not traced:
            self._replay()
        else:
            for i, step in enumerate(self.plan.steps):
                self.execute(i, step)
        self.progress.enter(len(self.plan.steps), "synchronize")
        if self.tracer is None:
            self.backend.synchronize()
        else:
            self.tracer.span("synchronize", "sync", COMPUTE_STREAM, self.backend.synchronize)
        self.progress.enter(-1, "idle")
        self.steps_run += 1

    def _replay(self) -> None:
        """The steps from their graph, captured first (again after a buffer moved: the
        arguments a graph holds are the addresses at its capture). Every argument is
        resolved before the capture, which must not allocate or copy from the host."""
        b: Any = self.backend
        if self._graph is None or self._graph[0] != self._placement:
            for step in self.plan.steps:
                if isinstance(step, Launch):
                    self.resolve(step)
            self.progress.enter(0, "a CUDA graph capture")
            b.begin_capture()
            try:
                for i, step in enumerate(self.plan.steps):
                    self.execute(i, step)
            except BaseException:
                with contextlib.suppress(Exception):  # the stream usable again; the cause raised
                    b.end_capture()
                raise
            graph = b.end_capture()
            self._graph = (self._placement, graph)
            self.captures += 1
        self.progress.enter(0, "a CUDA graph replay")
        b.replay(self._graph[1])

    def close(self) -> None:
        self._graph = None
        self.backend.close()
