"""The bytes a plan moves, per rank and per step, against the floor the program itself sets
(`coco-opt -t 'traffic{ranks=N}'`, issue #24): a kernel is at the byte floor by construction
when the report's total equals the floor.

**Traffic (T)** is read off the plan alone. For each step, the bytes one rank reads and writes,
split into its own memory and its peers' (symmetric buffers reached through peer tables, or
what a library collective receives):

* a launch, by each kernel parameter's kind (signature.py `ParamKind`) and the launch's element
  range [begin, end) (`n` below; a table-form launch: each tensor's own piece): IN reads and
  OUT writes `min(n, piece)` elements of its buffer (a scalar: one); PEERS_IN reads the rank's
  slice (n elements) of every group member's buffer, its own from its memory, p - 1 from
  peers -- every member's whole buffer where the kernel iterates over a value the table's axes
  do not slice (the one-shot fused all_reduce: `plan.reads_whole`); PEERS_OUT writes the
  rank's slice into its own symmetric buffer and reads the p - 1 peers' slices from theirs
  (writing them there too where the launch has no GATHER_OUT: the value is the buffer; and
  writing nothing of its own where its buffer is the GATHER_OUT's, a `{coco.symmetric}`
  argument assembled in place); GATHER_OUT writes the p gathered slices (at most its
  piece); SEND_PEERS writes the slice into the receiver's buffer (a peer's memory) where the
  rank sends; RED_OUT and COUNTER write their (small) scratch once, PARTIALS a partial per
  block of each reduction, EXCHANGE reads every member's share of its
  partials (p - 1 from peers) after writing its own. Flags and epochs (the handshake, a few
  words per block) and integer tables (bases, counts, boxes) are synchronization and metadata,
  not data, and are not counted;
* a library collective reads its source piece and writes its destination piece (own memory)
  and receives from peers what a bandwidth-optimal algorithm moves (`collective_sent`: ring
  all_reduce 2(p-1)/p n, reduce_scatter (p-1)/p of its input, all_gather (p-1)/p of its
  result, all_to_all (p-1)/p of its input, broadcast and reduce n; a send's receiver n);
* a copy reads its source and writes its destination; a matmul reads a and b and writes c
  (its rows' share when chunked); events move nothing.

**Floor (F)** is read off the scheduled function (its ops, fused regions included), per rank,
the fewest bytes the program itself makes that rank move -- whatever the kernels:

* every argument the function reads, its piece at this rank once: where every read of it is a
  `coco.slice`, the largest slice's piece (the program needs no more of it); a
  reduce_scatter's input is the rank's slice of every member's piece, as many elements as its
  own piece, (p-1)/p of them necessarily from peers -- that share is this read, not added;
* every updated argument's piece and every returned value's piece written once;
* what a collective inherently receives beyond its input's read: an all_gather or
  all_to_all (p-1)/p of its result piece, an all_reduce (p-1)/p of its result (the gather
  half; the reducing half is its input's read) or, where fewer, p - 1 pieces of its input
  before the casts computing it (the one-shot form pulling a narrow wire type), a
  broadcast's non-root its result piece, a send's receiver its result piece. A reduce (like
  a reduce_scatter) reads its input.

Computed intermediates are free (a fused kernel keeps them in registers), so F is a lower
bound: a plan that stores one, or a library step that reads what a kernel wrote, moves more.
Bytes between ranks are counted once, on the rank that receives them (a pull: its read of a
peer's memory), as the fused kernels move them. E.g. SGD (`w -= lr * all_reduce(g)`, n f32
elements, p ranks) under `fuse(rs-c-ag)`: F = 4n (g) + 4n/p (w's slice) + 4n (p-1)/p (the
all_gather) + 4n (w written) + 4 (lr) = 12n + 4 bytes per rank at every p.

`plan_traffic` (the bytes a rank sends, the bench tables' busbw) lives here too, beside the
collectives' formulas it shares; the runtime imports it (this module reads only the plan)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from xdsl.dialects import func
from xdsl.ir import Attribute, Operation, SSAValue

from coconet.core import values as V
from coconet.dialects import coco, comm
from coconet.dialects.coco import TensorType
from coconet.lowering.plan import (
    MAX_COLLECTIVE_BLOCKS,
    ArgTable,
    Buffer,
    Collective,
    Copy,
    KernelArg,
    Launch,
    Matmul,
    PeerTable,
    Plan,
    RankValue,
    Step,
    gather_destinations,
    reads_whole,
    staged_piece,
)
from coconet.lowering.signature import CTYPE_BYTES, ParamKind

# Element types of scratch buffers (`Buffer.elt`): the accumulators kernels keep there.
SCRATCH_DTYPES = {
    "i64": np.dtype(np.int64),
    "f64": np.dtype(np.float64),
    "f32": np.dtype(np.float32),
    "u32": np.dtype(np.uint32),
}


def buffer_dtype(buf: Buffer) -> np.dtype:
    """Host dtype of a buffer: its tensor's element type, or its scratch element type (an
    unknown one is a lowering bug: never the tensor's type in its place, which would allocate
    a narrower buffer than the kernel writes)."""
    if buf.elt:
        return SCRATCH_DTYPES[buf.elt]
    return V.numpy_dtype(buf.type)


def pointer_width_errors(plan: Plan) -> list[str]:
    """Each launch argument whose buffer holds elements of another width than its kernel's
    pointer parameter reads or writes (a scratch buffer allocated in the tensor's type where
    the kernel keeps f32 partials): the kernel would run past the allocation. Empty for a
    sound plan."""
    errors: list[str] = []
    for step in plan.steps:
        if not isinstance(step, Launch):
            continue
        for param, arg in zip(plan.signatures.get(step.kernel, ()), step.args, strict=False):
            # (peer tables and a table form's tables are arrays of pointers: the signature
            # types the array, not what it points to)
            if param.ctype.pointer and not param.table and isinstance(arg, Buffer):
                if itemsize(arg) != CTYPE_BYTES[param.ctype.name]:
                    errors.append(
                        f"{step.kernel}: parameter {param.name} ({param.ctype.name}*) is "
                        f"given %{arg.name} of {itemsize(arg)}-byte elements"
                    )
    return errors


def itemsize(buf: Buffer) -> int:
    return buffer_dtype(buf).itemsize


def buffer_nbytes(buf: Buffer) -> int:
    """The bytes of the buffer as allocated (its largest piece)."""
    return buf.count * itemsize(buf)


def plan_group(plan: Plan, span: tuple[int, ...], part: str, rank: int) -> list[int]:
    """`rank`'s group over grid axes `span`, or its part within or across nodes (a
    hierarchical collective's steps), in group order."""
    group = V.group_of(plan.grid_shape, span, rank)
    return V.group_part(group, plan.nodes, part, rank) if part != "all" else group


def launch_elements(step: Launch) -> int | None:
    """The elements of the launch's range [begin, end), or of its iteration (None: unknown)."""
    if step.range_positions:
        lo, hi = (step.args[i] for i in step.range_positions)
        if isinstance(lo, int) and isinstance(hi, int):
            return hi - lo
    if step.iteration_shape is not None:
        n = 1
        for d in step.iteration_shape:
            n *= d
        return n
    return None


def rows_fraction(step: Collective | Launch) -> float:
    """The part of its buffers a chunked step (an overlap chunk) covers; 1 when whole."""
    if isinstance(step, Collective):
        return step.fraction
    n = launch_elements(step)
    if step.range_positions and step.iteration_shape and n is not None:
        whole = 1
        for d in step.iteration_shape:
            whole *= d
        if whole:
            return n / whole
    return 1.0


def _send_partner(plan: Plan, step: Collective, rank: int, shift: int) -> int | None:
    assert step.along is not None  # a send names its axis
    return V.send_partner(V.coords_of(rank, plan.grid_shape), plan.grid_shape, step.along, shift)


def collective_sent(plan: Plan, step: Collective, rank: int) -> float:
    """Bytes `rank` sends in a library collective, as a bandwidth-optimal algorithm moves them
    (what it receives is the same but for a send: `collective_received`)."""
    frac = rows_fraction(step)
    if step.op == "send":
        assert step.shift is not None
        partner = _send_partner(plan, step, rank, step.shift)
        return 0.0 if partner is None else frac * buffer_nbytes(step.src)
    p = len(plan_group(plan, step.axes, step.part, rank))
    if p <= 1:
        return 0.0
    n_src, n_dst = buffer_nbytes(step.src), buffer_nbytes(step.dst)
    return frac * {
        "all_reduce": 2 * (p - 1) / p * n_src,
        "reduce_scatter": (p - 1) / p * n_src,
        "all_gather": (p - 1) / p * n_dst,
        "all_to_all": (p - 1) / p * n_src,
        "broadcast": n_src,
        "reduce": n_src,
    }.get(step.op, 0.0)


def collective_received(plan: Plan, step: Collective, rank: int) -> float:
    """Bytes `rank` receives in a library collective (a send's receiver: its sender's)."""
    if step.op == "send":
        assert step.shift is not None
        sender = _send_partner(plan, step, rank, -step.shift)
        return 0.0 if sender is None else rows_fraction(step) * buffer_nbytes(step.dst)
    return collective_sent(plan, step, rank)


def plan_traffic(plan: Plan, rank: int = 0) -> int:
    """Bytes this rank sends to other ranks in one step of the plan: `collective_sent` for
    library collectives; a fused collective kernel (p-1)/p of every symmetric buffer it
    reaches through a peer table except its flags (it reads peers' slices of its
    reduce_scatter input and pushes its gathered slice to every peer) -- (p-1) times the whole
    buffer where its iteration is not sliced over the table's axes (the one-shot fused
    all_reduce: every peer reads this rank's whole input). Chunked steps count their rows."""
    total = 0.0
    for step in plan.steps:
        if isinstance(step, Collective):
            total += collective_sent(plan, step, rank)
        elif isinstance(step, Launch):
            frac = rows_fraction(step)
            for a in step.args:
                if isinstance(a, PeerTable) and a.buffer.kind != "scratch":
                    p = len(plan_group(plan, a.span, a.part, rank))
                    whole = reads_whole(step, a) or staged_piece(a)
                    share = (p - 1) if whole else (p - 1) / p
                    total += frac * share * buffer_nbytes(a.buffer)
    return round(total)


# ---------------------------------------------------------------------------------------------
# Traffic per step
# ---------------------------------------------------------------------------------------------


@dataclass
class Moved:
    """Bytes one rank reads and writes in its own memory and in its peers'."""

    read: float = 0.0
    write: float = 0.0
    peer_read: float = 0.0
    peer_write: float = 0.0

    @property
    def total(self) -> float:
        return self.read + self.write + self.peer_read + self.peer_write

    def add(self, other: Moved) -> None:
        self.read += other.read
        self.write += other.write
        self.peer_read += other.peer_read
        self.peer_write += other.peer_write


def _rank_int(arg: KernelArg, rank: int) -> int | None:
    if isinstance(arg, RankValue):
        return arg.table[rank]
    return arg if isinstance(arg, int) and not isinstance(arg, bool) else None


def _tensors(arg: KernelArg) -> list[Buffer | PeerTable]:
    """The buffers (or peer tables) an argument names: one, or each tensor's of a table."""
    if isinstance(arg, Buffer | PeerTable):
        return [arg]
    if isinstance(arg, ArgTable):
        return [a for a in arg.items if isinstance(a, Buffer | PeerTable)]
    return []


def launch_bytes(plan: Plan, step: Launch, rank: int) -> Moved:
    """What one launch moves on `rank`, by its parameters' kinds (module docstring)."""
    params = plan.signatures.get(step.kernel, ())
    kinds = {p.kind: a for p, a in zip(params, step.args, strict=False)}
    send_to = kinds.get(ParamKind.SEND_TO)
    sends = send_to is None or (_rank_int(send_to, rank) or 0) >= 0
    # without a GATHER_OUT the gathered value is assembled in the symmetric buffer itself
    in_place = ParamKind.GATHER_OUT not in kinds
    # assembled in a symmetric argument: the peers pull from the destination itself
    assembled_in = gather_destinations(plan, step)
    n_launch = launch_elements(step)
    frac = rows_fraction(step)
    m = Moved()
    for param, arg in zip(params, step.args, strict=False):
        for t in _tensors(arg):
            buf = t.buffer if isinstance(t, PeerTable) else t
            size = itemsize(buf)
            piece = buf.count_at(rank)
            p = len(plan_group(plan, t.span, t.part, rank)) if isinstance(t, PeerTable) else 1
            # a table launch's tensors each iterate over their own piece (or slice of it)
            if param.table or n_launch is None:
                n = piece // p if isinstance(t, PeerTable) else piece
            else:
                n = n_launch
            kind = param.kind
            if kind == ParamKind.IN:
                m.read += min(n, piece) * size
            elif kind == ParamKind.OUT:
                m.write += min(n, piece) * size
            elif kind == ParamKind.GATHER_OUT:
                m.write += min(n * _group_of(plan, step, rank), piece) * size
            elif kind == ParamKind.PEERS_IN and isinstance(t, PeerTable):
                if reads_whole(step, t):
                    m.read += frac * piece * size
                    m.peer_read += frac * (p - 1) * piece * size
                else:
                    m.read += n * size
                    m.peer_read += (p - 1) * n * size
            elif kind == ParamKind.PEERS_OUT:
                if buf.name not in assembled_in:  # (else the GATHER_OUT's writes)
                    m.write += (p if in_place else 1) * n * size
                m.peer_read += (p - 1) * n * size
            elif kind == ParamKind.SEND_PEERS:
                m.peer_write += n * size if sends and p > 1 else 0
            elif kind == ParamKind.EXCHANGE:
                m.write += piece * size / p
                m.read += piece * size / p
                m.peer_read += (p - 1) * piece * size / p
            elif kind == ParamKind.PARTIALS:
                # a partial per block of each reduction: the buffer has room for
                # MAX_COLLECTIVE_BLOCKS blocks of each (a fused kernel's), or the grid's
                reductions = -(-piece // MAX_COLLECTIVE_BLOCKS)
                m.write += min(piece, reductions * step.grid) * size
            elif kind in (ParamKind.RED_OUT, ParamKind.COUNTER):
                m.write += piece * size
    return m


def _group_of(plan: Plan, step: Launch, rank: int) -> int:
    """The group a launch gathers over: that of its first peer table (1: none)."""
    for a in step.args:
        for t in _tensors(a):
            if isinstance(t, PeerTable) and t.buffer.kind != "scratch":
                return len(plan_group(plan, t.span, t.part, rank))
    return 1


def step_bytes(plan: Plan, step: Step, rank: int) -> Moved:
    """What one plan step moves on `rank` (events: nothing)."""
    if isinstance(step, Launch):
        return launch_bytes(plan, step, rank)
    if isinstance(step, Collective):
        frac = rows_fraction(step)
        return Moved(
            read=frac * step.src.count_at(rank) * itemsize(step.src),
            write=frac * step.dst.count_at(rank) * itemsize(step.dst),
            peer_read=collective_received(plan, step, rank),
        )
    if isinstance(step, Matmul):
        frac = step.fraction
        a, b, c = step.a, step.b, step.c
        if step.k_rows is not None:
            # a run of the reduction dim: its columns of a and rows of b; the sum read back
            # where the chunk adds to it, and the accumulator rounded into c by the last
            into = c if step.acc is None else step.acc
            whole = into.count_at(rank) * itemsize(into)
            rounds = step.acc is not None and step.final
            return Moved(
                read=frac * (a.count_at(rank) * itemsize(a) + b.count_at(rank) * itemsize(b))
                + (whole if step.accumulate else 0)
                + (whole if rounds else 0),
                write=whole + (c.count_at(rank) * itemsize(c) if rounds else 0),
            )
        return Moved(
            read=frac * a.count_at(rank) * itemsize(a) + b.count_at(rank) * itemsize(b),
            write=frac * c.count_at(rank) * itemsize(c),
        )
    if isinstance(step, Copy):
        return Moved(
            read=step.src.count_at(rank) * itemsize(step.src),
            write=step.dst.count_at(rank) * itemsize(step.dst),
        )
    return Moved()


# ---------------------------------------------------------------------------------------------
# The floor
# ---------------------------------------------------------------------------------------------


def _piece_bytes(t: Attribute, grid_shape: tuple[int, ...], rank: int) -> int:
    assert isinstance(t, TensorType)  # the verifier's: every coco value is a tensor
    n = 1
    for d in V.piece_shape(t, V.coords_of(rank, grid_shape), grid_shape):
        n *= d
    return n * V.numpy_dtype(t).itemsize


def _ops(op: Operation) -> Iterator[Operation]:
    """Every op nested in `op` (fused and overlap regions' bodies included)."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.ops:
                yield inner
                yield from _ops(inner)


def _reads(value: SSAValue) -> list[Operation]:
    """The ops reading `value` (an update's target is written, not read)."""
    return [
        u.operation
        for u in value.uses
        if not (isinstance(u.operation, coco.UpdateOp) and u.index == 0)
    ]


def _wire_type(value: SSAValue) -> Attribute:
    """The type of `value` before the casts that compute it (what peers can pull)."""
    while isinstance(value.owner, coco.CastOp):
        value = value.owner.input
    return value.type


def floor_items(f: func.FuncOp, grid_shape: tuple[int, ...], rank: int) -> list[tuple[str, int]]:
    """The floor's terms on `rank`, each (what, bytes) (module docstring)."""
    items: list[tuple[str, float]] = []
    for arg in f.body.block.args:
        t = arg.type
        assert isinstance(t, TensorType)
        name = f"%{arg.name_hint}" if arg.name_hint else f"argument {arg.index}"
        readers = _reads(arg)
        if not readers:
            continue
        if all(isinstance(r, coco.SliceOp) for r in readers):
            nbytes = max(_piece_bytes(r.results[0].type, grid_shape, rank) for r in readers)
            items.append((f"read {name} (its slice)", nbytes))
        else:
            items.append((f"read {name}", _piece_bytes(t, grid_shape, rank)))
    written: set[SSAValue] = set()
    ops = list(_ops(f))
    for op in ops:
        if isinstance(op, coco.UpdateOp) and op.target not in written:
            written.add(op.target)
            what = op.target.name_hint or "an argument"
            items.append((f"write %{what}", _piece_bytes(op.target.type, grid_shape, rank)))
    ret = f.body.block.last_op
    if isinstance(ret, func.ReturnOp):
        for v in ret.arguments:
            items.append(
                (f"write result %{v.name_hint or '?'}", _piece_bytes(v.type, grid_shape, rank))
            )
    coords = V.coords_of(rank, grid_shape)
    for op in ops:
        if not isinstance(op, comm.CollectiveOp):
            continue
        result = op.results[0].type
        received = 0.0
        if isinstance(op, comm.SendOp):
            along, shift = op.along.value.data, op.shift.value.data
            if V.send_partner(coords, grid_shape, along, -shift) is not None:
                received = _piece_bytes(result, grid_shape, rank)
        else:
            p = len(V.group_of(grid_shape, op.span(), rank))
            share = (p - 1) / p * _piece_bytes(result, grid_shape, rank)
            if isinstance(op, comm.AllGatherOp | comm.AllToAllOp):
                received = share
            elif isinstance(op, comm.AllReduceOp):
                # or every peer's input on its (narrower) wire type: the one-shot form
                wire = _wire_type(op.input)
                received = min(share, (p - 1) * _piece_bytes(wire, grid_shape, rank))
            elif isinstance(op, comm.BroadcastOp) and p > 1:
                group = V.group_of(grid_shape, op.span(), rank)
                root = op.root.value.data
                received = (
                    0 if group.index(rank) == root else _piece_bytes(result, grid_shape, rank)
                )
        if received:
            what = op.results[0].name_hint or "?"
            items.append((f"receive {op.name.removeprefix('comm.')} %{what}", received))
    return [(what, round(b)) for what, b in items]


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


def _step_name(step: Step) -> str:
    if isinstance(step, Launch):
        return f"launch {step.kernel}"
    return str(step)


def plan_total(plan: Plan, rank: int) -> int:
    """T: the bytes `rank` moves in one step of the plan."""
    total = Moved()
    for step in plan.steps:
        total.add(step_bytes(plan, step, rank))
    return round(total.total)


def floor_total(f: func.FuncOp, grid_shape: tuple[int, ...], rank: int) -> int:
    """F: the fewest bytes the scheduled function makes `rank` move."""
    return sum(b for _, b in floor_items(f, grid_shape, rank))


def format_report(plan: Plan, f: func.FuncOp, rank: int = 0) -> str:
    """Each step's bytes on `rank` (own memory read/write, peers' read/write), the floor's
    terms, and the last line `total: T bytes/rank, floor: F bytes/rank (T/F = R)`."""
    lines = [
        f"traffic @{plan.program} on {plan.size} rank(s), rank {rank}: bytes read/written in "
        "its own memory, and in its peers'"
    ]
    for step in plan.steps:
        m = step_bytes(plan, step, rank)
        lines.append(
            f"  {_step_name(step)}: own {round(m.read)}r {round(m.write)}w, "
            f"peers {round(m.peer_read)}r {round(m.peer_write)}w"
        )
    for what, nbytes in floor_items(f, plan.grid_shape, rank):
        lines.append(f"  floor {what}: {nbytes}")
    for name, buf in plan.arguments.items():
        if buf.symmetric:
            # Not a plan step: the runtime's placement of the caller's value (executor.py
            # set_inputs), which a caller writing into the buffer itself skips.
            n = buf.count_at(rank) * itemsize(buf)
            # an updated argument is copied back into the caller's array too
            way, k = ("into and out of", 2 * n) if plan.outputs.get(name) is buf else ("into", n)
            lines.append(
                f"  copy {way} symmetric %{name} per call: own {k}r {k}w (not in the total: "
                f"none where the caller writes into CompiledProgram.input_buffer('{name}'))"
            )
    t, fl = plan_total(plan, rank), floor_total(f, plan.grid_shape, rank)
    ratio = f"{t / fl:.3f}" if fl else "inf"
    lines.append(f"total: {t} bytes/rank, floor: {fl} bytes/rank (T/F = {ratio})")
    return "\n".join(lines) + "\n"
