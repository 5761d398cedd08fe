"""A cost model of plans: how long one step of a lowered program takes on a machine.

    from coconet.tune.cost_model import predict, published_profile
    prediction = predict(plan, published_profile("dgx-a100"))
    prediction.seconds, prediction.steps     # the step time, and each plan step's share

The model walks the plan as the executors do and prices each step from the plan alone:

* a kernel launch is a roofline: max(bytes / memory bandwidth, flops / FLOP/s), plus the launch
  overhead; a fused collective kernel's peer traffic goes at the peer bandwidth (NVLink on a
  GPU node, the same DRAM on a CPU host) and each cross-rank flag exchange costs one
  synchronization latency;
* a library collective is alpha-beta on the fabric its group spans (intra-node, or the
  inter-node network once a group crosses nodes): ring all_reduce 2(p-1) alpha + 2(p-1)/p n /
  beta, reduce_scatter, all_gather and all_to_all (p-1) alpha + (p-1)/p n / beta, broadcast
  and reduce ceil(log2 p) alpha + n / beta, send alpha + n / beta, plus a per-call overhead;
* a matmul is a roofline with the machine's matmul FLOP/s for its element type, plus its fixed
  cost per step (a launch, or what the profile measured for that element type);
* an overlap's chunk (a range of rows, or a block of one dim: the all_to_all forms) moves or
  computes its share of the step's bytes and flops but pays the whole per-call overhead and
  latency, so many tiny chunks cost more than they hide;
* the two streams (compute, communication) run side by side and meet at events, so work that
  overlaps costs the max of its parts, not their sum. On a host (the cpu backend) one thread
  runs every kernel, matmul and copy, whatever its stream; only library collectives progress
  on their own (non-blocking MPI).

Bytes come from the plan's buffers and the kernels' signatures (lowering/traffic.py
`buffer_nbytes`; a parameter's bytes are at most its buffer's and at most the launch's
iteration elements); a kernel's flops are estimated as one operation per input per iterated
element (the plan carries no kernel bodies; elementwise kernels are memory bound anyway);
a matmul's flops are 2 M N K from its buffers' shapes.

A `MachineProfile` holds the machine's numbers: measured on this host for the cpu backend
(coconet/tune/machine_probe.py, cached), or published figures of GPU nodes (`PUBLISHED_PROFILES`,
each figure with its source).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from coconet.core.program import CocoError
from coconet.core.values import group_of
from coconet.lowering.plan import (
    COMM_STREAM,
    ArgTable,
    Buffer,
    Collective,
    Copy,
    Launch,
    Matmul,
    PeerTable,
    Plan,
    RecordEvent,
    Step,
    WaitEvent,
    gather_destinations,
    reads_whole,
    staged_piece,
)
from coconet.lowering.signature import ParamKind
from coconet.lowering.traffic import buffer_nbytes

__all__ = [
    "PUBLISHED_PROFILES",
    "Fabric",
    "MachineProfile",
    "Prediction",
    "StepCost",
    "kernel_exchanges",
    "kernel_traffic",
    "predict",
    "published_profile",
]

GB = 1e9
TFLOPS = 1e12
US = 1e-6


@dataclass(frozen=True)
class Fabric:
    """A link between ranks: what one rank moves per second one way (`bandwidth` for data
    that is only moved, `reduce_bandwidth` for data a collective also reduces) and the latency
    of one message / ring step."""

    name: str
    bandwidth: float
    latency: float
    reduce_bandwidth: float = 0.0

    @property
    def reducing(self) -> float:
        return self.reduce_bandwidth or self.bandwidth


@dataclass(frozen=True)
class MachineProfile:
    """The numbers the cost model needs, per rank. `ranks_per_node` ranks share a node (a
    collective group within one node uses `intra`, one that crosses nodes `inter`)."""

    name: str
    description: str
    ranks_per_node: int
    memory_bandwidth: float  # bytes/s one rank's kernels stream (all ranks busy)
    matmul_flops: dict[str, float]  # FLOP/s of one rank's matmuls, by element type
    elementwise_flops: float  # FLOP/s of one rank's elementwise kernels
    intra: Fabric
    inter: Fabric | None
    peer_bandwidth: float  # bytes/s a fused kernel reads/writes peers' memory at
    launch_overhead: float  # s per kernel launch, matmul or copy
    collective_overhead: float  # s per library collective call, beyond its alpha terms
    fused_sync: float  # s per cross-rank flag exchange inside a fused collective kernel
    event_overhead: float = 0.0  # s per record / wait
    # s per step of the whole plan, paid once however many launches it makes (the host
    # executor's walk: run()'s bookkeeping, the final synchronize)
    step_overhead: float = 0.0
    # s per exchange of reduction partials inside a fused kernel (a norm finished in the
    # kernel: every block done, then the last block of each rank trades partials with its
    # peers); None: one flag exchange's
    exchange_sync: float | None = None
    # s per flag protocol of a one-shot fused all_reduce kernel (an entry and a done
    # handshake; the two-shot kernel's `fused_sync` has a third between its reduce_scatter and
    # all_gather phases); None: `fused_sync` (profiles probed before it was measured)
    one_shot_sync: float | None = None
    # The host runs kernels on one thread whatever their stream (cpu backend); only
    # library collectives progress concurrently.
    host_serializes_kernels: bool = False
    # Element types whose reductions the backend performs by exchanging every rank's piece
    # and combining locally (the cpu backend's exact path for f16 / bf16 / i1).
    exchange_reductions: tuple[str, ...] = ()
    source: str = "published"  # "measured" or "published"
    notes: dict[str, Any] = field(default_factory=dict)
    # s per matmul step by element type, where it differs from a kernel launch (the cpu
    # backend's NumPy matmul converts f16/bf16 operands to f32 and allocates its result)
    matmul_overhead: dict[str, float] = field(default_factory=dict)

    def matmul_rate(self, elt: str) -> float:
        return self.matmul_flops.get(elt) or self.matmul_flops.get("f32") or 1e9

    def matmul_call(self, elt: str) -> float:
        """The fixed cost of one matmul step of element type `elt`."""
        return self.matmul_overhead.get(elt, self.matmul_overhead.get("f32", self.launch_overhead))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> MachineProfile:
        """A profile from its JSON form; ValueError when a field is missing or malformed."""
        try:
            d = dict(data)
            d["intra"] = Fabric(**d["intra"])
            d["inter"] = Fabric(**d["inter"]) if d.get("inter") else None
            d["exchange_reductions"] = tuple(d.get("exchange_reductions", ()))
            d["matmul_flops"] = {str(k): float(v) for k, v in d["matmul_flops"].items()}
            d["matmul_overhead"] = {
                str(k): float(v) for k, v in d.get("matmul_overhead", {}).items()
            }
            profile = MachineProfile(**d)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"not a machine profile: {e}") from None
        numbers = [
            profile.memory_bandwidth,
            profile.elementwise_flops,
            profile.peer_bandwidth,
            profile.intra.bandwidth,
            *profile.matmul_flops.values(),
        ]
        if not all(isinstance(x, int | float) and math.isfinite(x) and x > 0 for x in numbers):
            raise ValueError("a machine profile's bandwidths and FLOP/s must be positive numbers")
        times = [
            *profile.matmul_overhead.values(),
            profile.launch_overhead,
            profile.collective_overhead,
            profile.fused_sync,
            profile.exchange_sync or 0.0,
            profile.one_shot_sync or 0.0,
            profile.step_overhead,
            profile.intra.latency,
        ]
        if not all(isinstance(x, int | float) and math.isfinite(x) and x >= 0 for x in times):
            raise ValueError("a machine profile's latencies must be non-negative numbers")
        if profile.ranks_per_node < 1:
            raise ValueError("a machine profile needs ranks_per_node >= 1")
        return profile


# ---------------------------------------------------------------------------------------------
# Published figures of GPU nodes
# ---------------------------------------------------------------------------------------------
# Peak figures come from NVIDIA's datasheets and whitepapers (cited per figure). What a program
# reaches is a fraction of a peak; the fractions below are this model's assumptions, stated
# once: HBM 0.9 of peak (STREAM-like kernels), NVLink / InfiniBand 0.8 of the per-GPU link
# rate (NCCL's bus bandwidth on NVSwitch nodes is about 80% of the link rate), tensor-core
# matmuls 0.7 of peak (large cuBLAS GEMMs). Latencies are orders of magnitude, not datasheet
# figures: ~5 us per kernel launch (CUDA's commonly quoted launch overhead), ~2 us per
# NVLink ring step and ~5 us per InfiniBand ring step (NCCL's low-latency protocol), ~3 us
# per flag exchange of a fused kernel over NVLink (a peer write + a spin on a flag).
HBM_EFFICIENCY = 0.9
LINK_EFFICIENCY = 0.8
TENSOR_EFFICIENCY = 0.7


def _gpu_node(
    name: str,
    description: str,
    *,
    gpus: int,
    hbm_gbs: float,
    nvlink_gbs_one_way: float,
    ib_gbs_per_gpu: float,
    fp16_tflops: float,
    fp32_tflops: float,
    bf16_tflops: float | None = None,
) -> MachineProfile:
    nvlink = nvlink_gbs_one_way * GB * LINK_EFFICIENCY
    return MachineProfile(
        name=name,
        description=description,
        ranks_per_node=gpus,
        memory_bandwidth=hbm_gbs * GB * HBM_EFFICIENCY,
        matmul_flops={
            "f16": fp16_tflops * TFLOPS * TENSOR_EFFICIENCY,
            "bf16": (bf16_tflops or fp16_tflops) * TFLOPS * TENSOR_EFFICIENCY,
            "f32": fp32_tflops * TFLOPS * TENSOR_EFFICIENCY,
        },
        elementwise_flops=fp32_tflops * TFLOPS,
        intra=Fabric("NVLink", nvlink, 2 * US),
        inter=Fabric("InfiniBand", ib_gbs_per_gpu * GB * LINK_EFFICIENCY, 5 * US),
        peer_bandwidth=nvlink,
        launch_overhead=5 * US,
        collective_overhead=5 * US,
        fused_sync=3 * US,  # three handshakes: entry, between the phases, done
        one_shot_sync=2 * US,  # two: entry, done
        event_overhead=1 * US,
        source="published",
    )


PUBLISHED_PROFILES: dict[str, MachineProfile] = {
    # NVIDIA DGX-2 (CoCoNet's machine): 16 V100-SXM3 32 GB on NVSwitch, 8 x 100 Gb/s EDR IB.
    # - HBM2 900 GB/s, FP16 tensor 125 TFLOPS, FP32 15.7 TFLOPS: NVIDIA Tesla V100 datasheet
    #   (2018) / Volta architecture whitepaper (2017), Table 1.
    # - NVLink 2.0: 6 links x 25 GB/s per direction = 150 GB/s one way per GPU (300 GB/s
    #   both ways); NVSwitch gives every GPU that rate to any other: NVIDIA DGX-2 datasheet
    #   (2018), "NVSwitch ... 2.4 TB/s bisection bandwidth".
    # - 8 x 100 Gb/s InfiniBand per node = 100 GB/s for 16 GPUs, 6.25 GB/s per GPU: DGX-2
    #   datasheet, "Network: 8X 100Gb/sec InfiniBand/100GigE".
    "dgx2-v100": _gpu_node(
        "dgx2-v100",
        "NVIDIA DGX-2: 16x V100 SXM3 32 GB, NVSwitch, 8x 100 Gb/s InfiniBand",
        gpus=16,
        hbm_gbs=900,
        nvlink_gbs_one_way=150,
        ib_gbs_per_gpu=8 * 12.5 / 16,  # 8 NICs x 12.5 GB/s shared by 16 GPUs
        fp16_tflops=125,
        fp32_tflops=15.7,
        bf16_tflops=15.7,  # V100 has no bf16 tensor cores
    ),
    # NVIDIA DGX A100: 8 A100-SXM4 80 GB, NVLink 3 through NVSwitch, 8 x 200 Gb/s HDR IB.
    # - HBM2e 2,039 GB/s, FP16/BF16 tensor 312 TFLOPS dense, FP32 19.5 TFLOPS, NVLink
    #   600 GB/s (both ways; 300 GB/s one way): NVIDIA A100 Tensor Core GPU datasheet (2021).
    # - 8 x 200 Gb/s ConnectX-6 for the compute fabric = 25 GB/s per GPU: NVIDIA DGX A100
    #   datasheet (2020).
    "dgx-a100": _gpu_node(
        "dgx-a100",
        "NVIDIA DGX A100: 8x A100 SXM4 80 GB, NVLink 3 / NVSwitch, 8x 200 Gb/s InfiniBand",
        gpus=8,
        hbm_gbs=2039,
        nvlink_gbs_one_way=300,
        ib_gbs_per_gpu=25,
        fp16_tflops=312,
        fp32_tflops=19.5,
    ),
    # NVIDIA DGX H100: 8 H100-SXM5 80 GB, NVLink 4 through NVSwitch, 8 x 400 Gb/s NDR IB.
    # - HBM3 3.35 TB/s, FP16/BF16 tensor 989 TFLOPS dense (1,979 with sparsity), FP32 67
    #   TFLOPS, NVLink 900 GB/s both ways (450 one way): NVIDIA H100 Tensor Core GPU
    #   datasheet (2023), SXM column.
    # - 8 x 400 Gb/s ConnectX-7 = 50 GB/s per GPU: NVIDIA DGX H100 datasheet (2023).
    "dgx-h100": _gpu_node(
        "dgx-h100",
        "NVIDIA DGX H100: 8x H100 SXM5 80 GB, NVLink 4 / NVSwitch, 8x 400 Gb/s InfiniBand",
        gpus=8,
        hbm_gbs=3350,
        nvlink_gbs_one_way=450,
        ib_gbs_per_gpu=50,
        fp16_tflops=989,
        fp32_tflops=67,
    ),
    # NVIDIA DGX H200: 8 H200-SXM 141 GB; the H100's compute and NVLink with HBM3e.
    # - HBM3e 4.8 TB/s, FP16/BF16 tensor 989 TFLOPS dense, FP32 67 TFLOPS, NVLink 900 GB/s:
    #   NVIDIA H200 Tensor Core GPU datasheet (2024), SXM column.
    # - 8 x 400 Gb/s ConnectX-7 = 50 GB/s per GPU: NVIDIA DGX H200 datasheet (2024).
    "dgx-h200": _gpu_node(
        "dgx-h200",
        "NVIDIA DGX H200: 8x H200 SXM 141 GB, NVLink 4 / NVSwitch, 8x 400 Gb/s InfiniBand",
        gpus=8,
        hbm_gbs=4800,
        nvlink_gbs_one_way=450,
        ib_gbs_per_gpu=50,
        fp16_tflops=989,
        fp32_tflops=67,
    ),
}


def published_profile(name: str) -> MachineProfile:
    try:
        return PUBLISHED_PROFILES[name]
    except KeyError:
        raise CocoError(
            f"[profile-unknown] no machine profile named '{name}': published profiles are "
            + ", ".join(PUBLISHED_PROFILES)
            + "; 'cpu' is this host, measured"
        ) from None


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


@dataclass
class StepCost:
    """One plan step as the model prices it: when it starts and how long it takes on its
    stream, the bytes and flops it was priced from, and which term bounds it."""

    text: str
    stream: int
    start: float
    seconds: float
    bytes: float = 0.0
    flops: float = 0.0
    bound: str = ""  # memory, compute, peers, network, latency, overhead

    @property
    def end(self) -> float:
        return self.start + self.seconds


@dataclass
class Prediction:
    """A plan's predicted step time on one rank (the slowest rank's, from `predict`)."""

    seconds: float
    rank: int
    steps: list[StepCost]

    @property
    def busy(self) -> float:
        """The sum of every step's time: `seconds` is below it by what overlaps."""
        return sum(s.seconds for s in self.steps)

    def summary(self, top: int = 3) -> str:
        worst = sorted(self.steps, key=lambda s: -s.seconds)[:top]
        parts = [f"{s.text.split('(')[0]} {s.seconds * 1e3:.3g} ms ({s.bound})" for s in worst]
        return "; ".join(parts)


_IN_KINDS = {ParamKind.IN, ParamKind.STREAM}
_OUT_KINDS = {ParamKind.OUT, ParamKind.GATHER_OUT, ParamKind.RED_OUT}
_PEER_KINDS = {ParamKind.PEERS_IN, ParamKind.PEERS_OUT}


def _elements(step: Launch) -> float:
    if not step.iteration_shape:
        return 0.0
    n = math.prod(step.iteration_shape)
    if step.range_positions:
        lo, hi = (step.args[i] for i in step.range_positions)
        if isinstance(lo, int) and isinstance(hi, int):
            return float(hi - lo)
    return float(n)


def _itemsize(buf: Buffer) -> float:
    return buffer_nbytes(buf) / max(1, buf.count)


def kernel_traffic(plan: Plan, step: Launch, group_size: int) -> tuple[float, float, float, int]:
    """(local bytes, peer bytes, flops, flag exchanges) of one launch, from the plan.

    Each input or output parameter moves its buffer's bytes, but no more than the launch's
    iterated elements of it (a kernel reading its slice of a replicated tensor reads the
    slice). A peer parameter (a fused collective kernel's view of its group's symmetric
    buffers) moves the whole buffer's bytes, (p-1)/p of them from or to peers -- in the
    one-shot fused all_reduce, (p-1) whole buffers from peers and its own. Flags and
    in-kernel exchanges are synchronizations: one each."""
    params = plan.signatures.get(step.kernel, ())
    elements = _elements(step)
    local = peer = 0.0
    inputs = 0
    syncs = 0
    # gathered values assembled in place, in a symmetric argument (the GATHER_OUT's own
    # buffer): no staging store, one more handshake (the exit after the pull)
    assembled_in = gather_destinations(plan, step)
    for param, arg in zip(params, step.args, strict=False):
        buffers: list[Buffer] = []
        if isinstance(arg, Buffer):
            buffers = [arg]
        elif isinstance(arg, PeerTable):
            buffers = [arg.buffer]
        elif isinstance(arg, ArgTable):
            buffers = [a for a in arg.items if isinstance(a, Buffer)]
        if param.kind in _IN_KINDS | _OUT_KINDS:
            for b in buffers:
                nbytes = buffer_nbytes(b)
                if elements and not param.table:
                    nbytes = min(nbytes, elements * _itemsize(b))
                local += nbytes
            inputs += param.kind in _IN_KINDS
        elif param.kind in _PEER_KINDS:
            frac = 1.0
            if step.range_positions and step.iteration_shape:
                whole = math.prod(step.iteration_shape)
                frac = elements / whole if whole else 1.0
            # the one-shot fused all_reduce reads every peer's whole buffer
            read_whole = isinstance(arg, PeerTable) and reads_whole(step, arg)
            for b in buffers:
                nbytes = buffer_nbytes(b) * frac
                if read_whole or (isinstance(arg, PeerTable) and staged_piece(arg)):
                    # (a staging buffer of this rank's piece: every peer reads all of it)
                    peer += nbytes * (group_size - 1)
                    local += nbytes
                elif b.name in assembled_in:
                    peer += nbytes * (group_size - 1) / group_size
                    syncs += 1
                else:
                    peer += nbytes * (group_size - 1) / group_size
                    local += nbytes / group_size
            inputs += param.kind == ParamKind.PEERS_IN
        elif param.kind in (ParamKind.FLAGS, ParamKind.EXCHANGE):
            syncs += 1
    if not elements:
        elements = max((b.count for b in plan.buffers if b.kind != "scratch"), default=0)
    flops = elements * max(1, inputs)
    return local, peer, flops, syncs


def kernel_exchanges(plan: Plan, step: Launch) -> int:
    """How many of a launch's synchronizations (kernel_traffic's count) are exchanges of
    reduction partials rather than flag handshakes."""
    params = plan.signatures.get(step.kernel, ())
    return sum(p.kind == ParamKind.EXCHANGE for p in params)


def _group_size(plan: Plan, step: Launch, rank: int, profile: MachineProfile) -> int:
    """The size of the group a fused kernel reaches through peer tables (1: none); a group
    that spans nodes cannot be reached through symmetric memory (the lowering's fused kernels
    are single-node), so such a plan cannot run on this machine."""
    for arg in step.args:
        if isinstance(arg, PeerTable):
            members = group_of(plan.grid_shape, arg.span, rank)
            if arg.part == "node" and plan.nodes:  # a hierarchical collective's node kernel
                members = [m for m in members if plan.nodes[m] == plan.nodes[rank]]
            if len({m // profile.ranks_per_node for m in members}) > 1:
                raise CocoError(
                    f"[cost-fused-across-nodes] {step.kernel} reaches {len(members)} ranks "
                    f"through symmetric memory, but {profile.name} has "
                    f"{profile.ranks_per_node} per node"
                )
            return len(members)
    return 1


def _fabric(profile: MachineProfile, members: Iterable[int]) -> Fabric:
    nodes = {m // profile.ranks_per_node for m in members}
    if len(nodes) > 1 and profile.inter is not None:
        return profile.inter
    return profile.intra


def _collective_cost(
    plan: Plan, step: Collective, profile: MachineProfile, rank: int
) -> tuple[float, float, str]:
    """(seconds, bytes moved by this rank, bound) of a library collective."""
    frac = 1.0
    if step.rows is not None:
        cols = step.src.shape[-1] if step.src.shape else 1
        rows = max(1, step.src.count // max(1, cols))
        frac = (step.rows[1] - step.rows[0]) / rows
    elif step.block is not None:
        frac = step.fraction
    n_src = buffer_nbytes(step.src) * frac
    n_dst = buffer_nbytes(step.dst) * frac
    if step.op == "send":
        from coconet.core.values import coords_of, rank_of

        c = list(coords_of(rank, plan.grid_shape))
        c[step.along] += step.shift  # type: ignore[index,operator]
        if not 0 <= c[step.along] < plan.grid_shape[step.along]:  # type: ignore[index]
            return profile.collective_overhead, 0.0, "overhead"
        fabric = _fabric(profile, [rank, rank_of(c, plan.grid_shape)])
        t = fabric.latency + n_src / fabric.bandwidth
        return profile.collective_overhead + t, n_src, "network"
    members = group_of(plan.grid_shape, step.axes, rank)
    p = len(members)
    if p <= 1:
        return profile.collective_overhead, 0.0, "overhead"
    fabric = _fabric(profile, members)
    a = fabric.latency
    steps_log = math.ceil(math.log2(p))
    reduces = step.op in ("all_reduce", "reduce_scatter", "reduce")
    exchange = reduces and step.src.type.elt in profile.exchange_reductions
    if exchange:
        # every rank's piece is gathered and combined locally in rank order
        moved = (p - 1) * (n_src if step.op != "reduce_scatter" else n_src / p)
        combine = p * (n_dst if step.op != "reduce" else n_src) / profile.memory_bandwidth
        t = (p - 1) * a + moved / fabric.bandwidth + combine
    elif step.op == "all_reduce":
        moved = 2 * (p - 1) / p * n_src
        t = 2 * (p - 1) * a + moved / fabric.reducing
    elif step.op == "reduce_scatter":
        moved = (p - 1) / p * n_src
        t = (p - 1) * a + moved / fabric.reducing
    elif step.op == "all_gather":
        moved = (p - 1) / p * n_dst
        t = (p - 1) * a + moved / fabric.bandwidth
    elif step.op == "all_to_all":
        # each rank keeps 1/p of its piece and sends the rest, one peer at a time
        moved = (p - 1) / p * n_src
        t = (p - 1) * a + moved / fabric.bandwidth
    elif step.op in ("broadcast", "reduce"):
        moved = n_src
        bw = fabric.reducing if step.op == "reduce" else fabric.bandwidth
        t = steps_log * a + moved / bw
    else:
        raise CocoError(f"the cost model has no formula for the collective '{step.op}'")
    latency = (2 * (p - 1) if step.op == "all_reduce" else p - 1) * a
    bound = "latency" if latency > t - latency else "network"
    return profile.collective_overhead + t, moved, bound


def _matmul_cost(step: Matmul, profile: MachineProfile) -> tuple[float, float, float, str]:
    a, b = step.a.shape, step.b.shape
    k = a[-1] if a else 1
    n = b[-1] if b else 1
    rows = step.a.count // max(1, k)
    frac = step.fraction
    flops = 2.0 * rows * frac * k * n
    nbytes = frac * (buffer_nbytes(step.a) + buffer_nbytes(step.c)) + buffer_nbytes(step.b)
    if step.k_rows is not None:  # a run of the reduction dim: all of c, read back to add
        into = step.c if step.acc is None else step.acc
        nbytes = frac * (buffer_nbytes(step.a) + buffer_nbytes(step.b)) + buffer_nbytes(into) * (
            2 if step.accumulate else 1
        )
    t_compute = flops / profile.matmul_rate(step.a.type.elt)
    t_memory = nbytes / profile.memory_bandwidth
    bound = "compute" if t_compute >= t_memory else "memory"
    call = profile.matmul_call(step.a.type.elt)
    return call + max(t_compute, t_memory), nbytes, flops, bound


def _launch_cost(
    plan: Plan, step: Launch, profile: MachineProfile, rank: int
) -> tuple[float, float, float, str]:
    p = _group_size(plan, step, rank, profile)
    local, peer, flops, syncs = kernel_traffic(plan, step, p)
    terms = {
        "memory": local / profile.memory_bandwidth,
        "peers": peer / profile.peer_bandwidth,
        "compute": flops / profile.elementwise_flops,
    }
    if profile.host_serializes_kernels:
        # peers' memory is this host's DRAM: local and peer bytes share its bandwidth
        terms["memory"] = (local + peer) / profile.memory_bandwidth
        terms["peers"] = 0.0
    bound = max(terms, key=terms.__getitem__)
    exchanges = kernel_exchanges(plan, step)
    per_exchange = profile.fused_sync if profile.exchange_sync is None else profile.exchange_sync
    per_sync = profile.fused_sync
    if profile.one_shot_sync is not None and is_one_shot(step):
        per_sync = profile.one_shot_sync
    sync = (syncs - exchanges) * per_sync + exchanges * per_exchange if p > 1 else 0.0
    if sync > terms[bound]:
        bound = "latency"
    return profile.launch_overhead + max(terms.values()) + sync, local + peer, flops, bound


def is_one_shot(step: Launch) -> bool:
    """A one-shot fused all_reduce kernel: it reads its peers' whole inputs."""
    return any(isinstance(a, PeerTable) and reads_whole(step, a) for a in step.args)


def step_cost(
    plan: Plan, step: Step, profile: MachineProfile, rank: int = 0
) -> tuple[float, float, float, str]:
    """(seconds, bytes, flops, bound) of one plan step on `rank`."""
    if isinstance(step, Launch):
        return _launch_cost(plan, step, profile, rank)
    if isinstance(step, Collective):
        t, moved, bound = _collective_cost(plan, step, profile, rank)
        return t, moved, 0.0, bound
    if isinstance(step, Matmul):
        return _matmul_cost(step, profile)
    if isinstance(step, Copy):
        nbytes = 2.0 * buffer_nbytes(step.src)
        return profile.launch_overhead + nbytes / profile.memory_bandwidth, nbytes, 0.0, "memory"
    if isinstance(step, RecordEvent | WaitEvent):
        return profile.event_overhead, 0.0, 0.0, "overhead"
    raise CocoError(f"the cost model cannot price the plan step '{step}'")


def predict_rank(plan: Plan, profile: MachineProfile, rank: int = 0) -> Prediction:
    """The step time of `plan` on `rank`: the streams advance side by side and meet at events
    (overlap costs the max of its parts); on a host, one thread runs every kernel."""
    clocks: dict[int, float] = {}
    host = 0.0  # when the host thread is free (host_serializes_kernels)
    events: dict[str, float] = {}
    costs: list[StepCost] = []
    for step in plan.steps:
        s = step.stream
        now = clocks.get(s, 0.0)
        seconds, nbytes, flops, bound = step_cost(plan, step, profile, rank)
        if isinstance(step, WaitEvent):
            now = max(now, events.get(step.event, 0.0))
        on_host = profile.host_serializes_kernels and not (
            isinstance(step, Collective) and s == COMM_STREAM
        )
        start = max(now, host) if on_host else now
        end = start + seconds
        if on_host:
            host = end
        clocks[s] = end
        if isinstance(step, RecordEvent):
            events[step.event] = end
        costs.append(StepCost(str(step), s, start, seconds, nbytes, flops, bound))
    total = max([*clocks.values(), host], default=0.0) + profile.step_overhead
    return Prediction(total, rank, costs)


def predict(plan: Plan, profile: MachineProfile, ranks: Iterable[int] | None = None) -> Prediction:
    """The slowest rank's predicted step time (every rank, or the given ones; a plan is SPMD,
    so ranks differ only where a send's edge or a group's nodes do)."""
    chosen = list(range(min(plan.size, 64))) if ranks is None else list(ranks)
    return max((predict_rank(plan, profile, r) for r in chosen), key=lambda p: p.seconds)
