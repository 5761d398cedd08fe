"""What the GPU runs: the plan's kernels compiled to a cubin by NVRTC (toolchain/nvrtc.py, the
project's options), their ptxas resource usage, and their machine code (SASS, disassembled by
`nvdisasm` from the `nvidia-cuda-nvdisasm` wheel) read for the property the vector loops are
built for (docs/architecture.md section 5, coco_device.h VECTORS): LOADS FIRST.

A vector iteration of a fused kernel is memory-bound: every thread should issue all of its
global loads (every peer's piece of a reduce_scatter, the state, the weights) before it
waits for any of them, so it waits for memory once per vector. Where a load sits behind lane
math -- after a division whose slow path is a call, or after a loop over the peers -- the
iteration pays one DRAM (or NVLink) round trip per wave of loads. `vector_loops` finds each
loop of a kernel whose own body (not counting the loops nested in it) issues 128-bit global
loads, and reports for it the loads issued after the first floating-point instruction that
computes on loaded data, and after the first division or square root of loaded data
(FCHK/MUFU, the start of an IEEE division's or square root's sequence).

The SASS is read as a control-flow graph (blocks between labels and branches; loops are the
natural loops of its back edges), each loop along its paths from its header: a load is late
where some path to it has already computed on loaded data. Registers that global loads write
are followed through the instructions that read them ("loaded data").

`coco-opt FILE -p PIPELINE -t sass-report` prints the report of a program's plan
(lowering/targets.py); tests assert no spills and loads first for the fused optimizers.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coconet.toolchain.nvrtc import compile_cuda

__all__ = [
    "Instruction",
    "KernelReport",
    "LoopReport",
    "MachineCodeError",
    "ResourceUsage",
    "disassemble",
    "format_report",
    "kernel_reports",
    "nvdisasm_path",
    "parse_ptxas_log",
    "parse_sass",
    "sass_report",
    "vector_loops",
]


class MachineCodeError(RuntimeError):
    """nvdisasm is missing or failed."""


# ----------------------------------------------------------------------------------------------
# Tools
# ----------------------------------------------------------------------------------------------


@functools.cache
def nvdisasm_path() -> Path | None:
    """nvdisasm: $COCONET_NVDISASM, else the `nvidia-cuda-nvdisasm` wheel's (nvidia/cu13/bin,
    or nvidia/cuda_nvdisasm/bin for CUDA 12), else one on PATH."""
    override = os.environ.get("COCONET_NVDISASM")
    if override:
        return Path(override)
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            found = sorted(Path(root).glob("*/bin/nvdisasm"), reverse=True)
            if found:
                return found[0]
    on_path = shutil.which("nvdisasm")
    return Path(on_path) if on_path else None


def disassemble(cubin: bytes) -> str:
    """The SASS of a cubin, as nvdisasm prints it (code sections only)."""
    tool = nvdisasm_path()
    if tool is None:
        raise MachineCodeError(
            "nvdisasm not found: install the `nvidia-cuda-nvdisasm` wheel "
            "(pip install 'coconet[test]') or set COCONET_NVDISASM"
        )
    with tempfile.TemporaryDirectory(prefix="coconet-sass-") as scratch:
        path = Path(scratch) / "kernels.cubin"
        path.write_bytes(cubin)
        try:
            done = subprocess.run(
                [str(tool), "-c", str(path)], capture_output=True, text=True, check=False
            )
        except OSError as e:
            raise MachineCodeError(f"cannot run nvdisasm ({tool}): {e}") from None
    if done.returncode != 0:
        raise MachineCodeError(f"nvdisasm failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


# ----------------------------------------------------------------------------------------------
# ptxas resource usage (NVRTC's log with --ptxas-options=-v)
# ----------------------------------------------------------------------------------------------


@dataclass
class ResourceUsage:
    """What ptxas reports of one function."""

    registers: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0


_COMPILING = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")


def parse_ptxas_log(log: str) -> dict[str, ResourceUsage]:
    """Every function's resource usage from ptxas's verbose output: entry functions (the
    kernels) with their registers, and every function (device functions too, which ptxas
    did not inline) with its stack frame and spills."""
    usage: dict[str, ResourceUsage] = {}
    entry: str | None = None
    described: str | None = None
    for line in log.splitlines():
        if m := _COMPILING.search(line):
            name: str = m.group(1)
            entry = name
            usage.setdefault(name, ResourceUsage())
        elif m := _PROPERTIES.search(line):
            described = m.group(1)
        elif (m := _FRAME.search(line)) and described is not None:
            u = usage.setdefault(described, ResourceUsage())
            u.stack_bytes, u.spill_stores, u.spill_loads = (int(g) for g in m.groups())
        elif (m := _USED.search(line)) and entry is not None:
            usage[entry].registers = int(m.group(1))
    return usage


# ----------------------------------------------------------------------------------------------
# SASS
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    address: int
    predicate: str  # "" or e.g. "@!P0"
    opcode: str  # e.g. "LDG.E.128"
    operands: str
    targets: tuple[str, ...] = ()  # labels a branch may go to

    @property
    def root(self) -> str:
        return self.opcode.split(".", 1)[0]

    def __str__(self) -> str:
        pred = f"{self.predicate} " if self.predicate else ""
        return f"/*{self.address:04x}*/ {pred}{self.opcode} {self.operands}".rstrip()


@dataclass
class SassFunction:
    name: str
    instructions: list[Instruction] = field(default_factory=list[Instruction])
    # label -> index of the instruction it names
    labels: dict[str, int] = field(default_factory=dict[str, int])


_LINE = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s*(.*?)\s*;?\s*(?:/\*.*\*/)?\s*$")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_FUNCTION = re.compile(r"^(\$?[A-Za-z_][\w$.]*):\s*$")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
_TARGETS = re.compile(r'BRANCH_TARGETS ([^"]*)"')


def parse_sass(text: str) -> dict[str, SassFunction]:
    """nvdisasm's output as functions (kernels and the subroutines ptxas emits beside them:
    the slow paths of division and square root, ...), each a list of instructions and its
    labels."""
    functions: dict[str, SassFunction] = {}
    current: SassFunction | None = None
    pending: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("//"):
            continue
        if m := _LABEL.match(line):
            pending.append(m.group(1))
            continue
        if (m := _FUNCTION.match(line)) and not line.startswith(".text."):
            current = functions.setdefault(m.group(1), SassFunction(m.group(1)))
            pending = []
            continue
        m = _LINE.match(raw)
        if m is None or current is None:
            continue
        body = m.group(2).strip().rstrip(";").strip()
        if not body:
            continue
        predicate = ""
        if body.startswith("@"):
            predicate, _, body = body.partition(" ")
        opcode, _, operands = body.partition(" ")
        targets: tuple[str, ...] = tuple(_TARGET.findall(operands))
        if t := _TARGETS.search(operands):
            targets = tuple(x.strip() for x in t.group(1).split(",") if x.strip())
        for label in pending:
            current.labels[label] = len(current.instructions)
        pending = []
        current.instructions.append(
            Instruction(int(m.group(1), 16), predicate, opcode, operands.strip(), targets)
        )
    return functions


# -- control flow --------------------------------------------------------------------------------


def _ends_block(ins: Instruction) -> bool:
    return ins.root in ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "BPT")


def _falls_through(ins: Instruction) -> bool:
    if ins.root in ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "BPT"):
        return bool(ins.predicate) and ins.predicate not in ("@PT", "@!PT")
    return True


@dataclass
class _Cfg:
    blocks: list[tuple[int, int]]  # [start, end) instruction indices
    succs: list[list[int]]
    preds: list[list[int]]


def _cfg(fn: SassFunction) -> _Cfg:
    ins = fn.instructions
    leaders = {0, *fn.labels.values()}
    for i, x in enumerate(ins):
        if _ends_block(x) and i + 1 < len(ins):
            leaders.add(i + 1)
    starts = sorted(s for s in leaders if s < len(ins))
    blocks = [(s, e) for s, e in zip(starts, [*starts[1:], len(ins)])]
    block_of = {s: b for b, (s, _) in enumerate(blocks)}
    succs: list[list[int]] = [[] for _ in blocks]
    for b, (_s, e) in enumerate(blocks):
        last = ins[e - 1]
        out: list[int] = []
        for label in last.targets:
            if label in fn.labels and fn.labels[label] in block_of:
                out.append(block_of[fn.labels[label]])
        if _falls_through(last) and b + 1 < len(blocks):
            out.append(b + 1)
        succs[b] = list(dict.fromkeys(out))
    preds: list[list[int]] = [[] for _ in blocks]
    for b, out in enumerate(succs):
        for s in out:
            preds[s].append(b)
    return _Cfg(blocks, succs, preds)


def _dominators(cfg: _Cfg) -> list[set[int]]:
    n = len(cfg.blocks)
    # reverse postorder from the entry
    order: list[int] = []
    seen: set[int] = set()
    stack: list[tuple[int, int]] = [(0, 0)]
    seen.add(0)
    while stack:
        b, k = stack.pop()
        if k < len(cfg.succs[b]):
            stack.append((b, k + 1))
            s = cfg.succs[b][k]
            if s not in seen:
                seen.add(s)
                stack.append((s, 0))
        else:
            order.append(b)
    order.reverse()
    everything = set(range(n))
    dom: list[set[int]] = [set(everything) for _ in range(n)]
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for b in order[1:]:
            new = {b}
            reachable = [dom[p] for p in cfg.preds[b] if p in seen]
            if reachable:
                new |= set[int].intersection(*reachable)
            if new != dom[b]:
                dom[b] = new
                changed = True
    for b in range(n):
        if b not in seen:
            dom[b] = {b}
    return dom


def _natural_loops(cfg: _Cfg) -> dict[int, set[int]]:
    """Header block -> the blocks of its natural loop (every back edge to it merged)."""
    dom = _dominators(cfg)
    loops: dict[int, set[int]] = {}
    for u, out in enumerate(cfg.succs):
        for h in out:
            if h in dom[u]:  # a back edge u -> h
                body = loops.setdefault(h, {h})
                work = [u]
                while work:
                    x = work.pop()
                    if x in body:
                        continue
                    body.add(x)
                    work.extend(cfg.preds[x])
    return loops


# -- what instructions do ------------------------------------------------------------------------

# Floating-point instructions that compute (not moves or selects).
_FP_MATH = frozenset(
    {
        "FADD",
        "FMUL",
        "FFMA",
        "FMNMX",
        "FSETP",
        "FSET",
        "FCHK",
        "FRND",
        "MUFU",
        "DADD",
        "DMUL",
        "DFMA",
        "DSETP",
        "DMNMX",
        "F2F",
        "F2I",
        "I2F",
        "F2FP",
        "HADD2",
        "HMUL2",
        "HFMA2",
        "HSETP2",
        "HMNMX2",
    }
)
_DIVISION_MUFU = ("RCP", "RSQ", "SQRT", "RCP64H", "RSQ64H")
_REGISTER = re.compile(r"\bR(\d+)\b")


def is_global_load(ins: Instruction) -> bool:
    """A load from global memory: LDG, or a generic LD (a peer's buffer through a pointer;
    the kernels' generic loads all read global memory)."""
    return ins.root in ("LDG", "LD")


def is_vector_load(ins: Instruction) -> bool:
    return is_global_load(ins) and ".128" in ins.opcode


def is_vector_store(ins: Instruction) -> bool:
    return ins.root in ("STG", "ST") and ".128" in ins.opcode


def is_division(ins: Instruction) -> bool:
    """The start of an IEEE division's or square root's sequence: FCHK (the division's range
    check), a MUFU reciprocal or (reciprocal) square root."""
    if ins.root == "FCHK":
        return True
    return ins.root == "MUFU" and ins.opcode.split(".")[1] in _DIVISION_MUFU


def _written(ins: Instruction) -> list[int]:
    """The registers an instruction writes (its first operand, with its width)."""
    first = ins.operands.split(",", 1)[0].strip()
    m = re.fullmatch(r"R(\d+)", first)
    if m is None or ins.root in ("ST", "STG", "STS", "STL", "RED", "ATOM"):
        return []
    width = 1
    if ".128" in ins.opcode:
        width = 4
    elif ".64" in ins.opcode or ins.root.startswith("D") or ".F64" in ins.opcode.split(".")[1:2]:
        width = 2
    base = int(m.group(1))
    return list(range(base, base + width))


def _read(ins: Instruction) -> set[int]:
    operands = ins.operands
    if _written(ins):
        operands = operands.split(",", 1)[1] if "," in operands else ""
    return {int(r) for r in _REGISTER.findall(operands)}


# -- loops ---------------------------------------------------------------------------------------


@dataclass
class LoopReport:
    """A loop of a kernel whose own body (its nested loops left out) issues 128-bit loads."""

    header: int  # address of its first instruction
    vector_loads: int
    global_loads: int
    vector_stores: int
    # the first floating-point instruction computing on loaded data, and the first division
    # or square root of loaded data (addresses; None: there is none)
    first_math: int | None
    first_division: int | None
    # global loads issued after them
    loads_after_math: list[Instruction]
    loads_after_division: list[Instruction]
    nested: bool  # inside another loop

    @property
    def loads_first(self) -> bool:
        """Every global load issued before the first computation on loaded data."""
        return not self.loads_after_math

    @property
    def loads_before_division(self) -> bool:
        return not self.loads_after_division


@dataclass
class _State:
    """What holds at a point of a loop's iteration, on some path from its header: registers
    holding loaded data, and whether data has been computed on (divided, ...) yet."""

    tainted: frozenset[int] = frozenset()
    math: bool = False
    division: bool = False

    def join(self, other: _State) -> _State:
        return _State(
            self.tainted | other.tainted,
            self.math or other.math,
            self.division or other.division,
        )


def vector_loops(fn: SassFunction) -> list[LoopReport]:
    """The loops of `fn` that issue 128-bit global loads in their own body (the loops nested
    in it left out), outermost first.

    Each is read along its paths: from the header, over the loop's blocks (its nested loops'
    too: computing on loaded data there counts, as the peers' loop of an earlier design
    did), to its back edges; a global load of the loop's own blocks is late where, on some
    path to it, an instruction already computed on loaded data."""
    cfg = _cfg(fn)
    loops = _natural_loops(cfg)
    reports: list[LoopReport] = []
    for header, body in sorted(loops.items(), key=lambda hb: (-len(hb[1]), hb[0])):
        inner: set[int] = set()
        for other, obody in loops.items():
            if other != header and obody < body:
                inner |= obody
        own = body - inner
        ins = [fn.instructions[i] for b in sorted(own) for i in range(*cfg.blocks[b])]
        if not any(is_vector_load(x) for x in ins):
            continue
        # Forward over the iteration (edges back to the header left out) to a fixpoint.
        states: dict[int, _State] = {header: _State()}
        math_at: list[int] = []
        division_at: list[int] = []
        late_math: dict[int, Instruction] = {}
        late_division: dict[int, Instruction] = {}
        work = [header]
        while work:
            b = work.pop()
            state = states[b]
            tainted = set(state.tainted)
            math, division = state.math, state.division
            for i in range(*cfg.blocks[b]):
                x = fn.instructions[i]
                derived = bool(_read(x) & tainted)
                if b in own and is_global_load(x):
                    if math:
                        late_math[x.address] = x
                    if division:
                        late_division[x.address] = x
                if derived and x.root in _FP_MATH:
                    if not math:
                        math_at.append(x.address)
                    math = True
                if derived and is_division(x):
                    if not division:
                        division_at.append(x.address)
                    division = True
                written = _written(x)
                if is_global_load(x) or derived:
                    tainted.update(written)
                elif not x.predicate:
                    tainted.difference_update(written)
            out = _State(frozenset(tainted), math, division)
            for succ in cfg.succs[b]:
                if succ not in body or succ == header:
                    continue
                joined = out if succ not in states else states[succ].join(out)
                if states.get(succ) != joined:
                    states[succ] = joined
                    work.append(succ)
        loads = [x for x in ins if is_global_load(x)]
        nested = any(other != header and body < obody for other, obody in loops.items())
        reports.append(
            LoopReport(
                header=fn.instructions[cfg.blocks[header][0]].address,
                vector_loads=sum(is_vector_load(x) for x in ins),
                global_loads=len(loads),
                vector_stores=sum(is_vector_store(x) for x in ins),
                first_math=min(math_at, default=None),
                first_division=min(division_at, default=None),
                loads_after_math=sorted(late_math.values(), key=lambda x: x.address),
                loads_after_division=sorted(late_division.values(), key=lambda x: x.address),
                nested=nested,
            )
        )
    return reports


# ----------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------


@dataclass
class KernelReport:
    name: str
    usage: ResourceUsage
    loops: list[LoopReport]
    # the spills of the device functions it calls (ptxas reports them apart)
    callee_spills: int = 0

    @property
    def spills(self) -> int:
        return self.usage.spill_stores + self.usage.spill_loads + self.callee_spills

    @property
    def loads_first(self) -> bool:
        """Every vector loop issues all its global loads before computing on loaded data."""
        return all(loop.loads_first for loop in self.loops)

    @property
    def loads_before_division(self) -> bool:
        """Every vector loop issues all its global loads before its first division or square
        root of loaded data."""
        return all(loop.loads_before_division for loop in self.loops)


def kernel_reports(source: str, arch: str = "sm_90") -> list[KernelReport]:
    """Compile `source` (a translation unit of the device layer) to a cubin for `arch` (a real
    architecture: sm_XX) and report every kernel in it."""
    compiled = compile_cuda(source, arch, options=["--ptxas-options=-v"])
    assert compiled.cubin is not None, f"{arch} is not a real architecture"
    usage = parse_ptxas_log(compiled.log)
    functions = parse_sass(disassemble(compiled.cubin))
    helper_spills = sum(
        u.spill_stores + u.spill_loads for name, u in usage.items() if name not in functions
    )
    reports: list[KernelReport] = []
    for name, fn in functions.items():
        if name.startswith("$"):
            continue  # a subroutine: the slow path of a division, ...
        reports.append(
            KernelReport(name, usage.get(name, ResourceUsage()), vector_loops(fn), helper_spills)
        )
    return sorted(reports, key=lambda r: r.name)


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def format_report(title: str, reports: Sequence[KernelReport]) -> str:
    lines = [
        f"== {title}",
        f"{'kernel':<40} {'regs':>4} {'stack':>5} {'spill st/ld':>11} {'loops':>5}"
        f" {'loads first':>11} {'before div':>10}",
    ]
    for r in reports:
        u = r.usage
        lines.append(
            f"{r.name:<40} {u.registers:>4} {u.stack_bytes:>5} "
            f"{f'{u.spill_stores}/{u.spill_loads}':>11} {len(r.loops):>5} "
            f"{_yes(r.loads_first) if r.loops else '-':>11} "
            f"{_yes(r.loads_before_division) if r.loops else '-':>10}"
        )
        for loop in r.loops:
            where = "nested loop" if loop.nested else "loop"

            def at(address: int | None) -> str:
                return "none" if address is None else f"0x{address:04x}"

            lines.append(
                f"  {where} @0x{loop.header:04x}: {loop.vector_loads} vector loads, "
                f"{loop.global_loads} global loads, {loop.vector_stores} vector stores; "
                f"first math on loaded data {at(loop.first_math)}, first division/sqrt "
                f"{at(loop.first_division)}; loads after them: {len(loop.loads_after_math)}, "
                f"{len(loop.loads_after_division)}"
            )
            for x in loop.loads_after_math:
                lines.append(f"    late: {x}")
    return "\n".join(lines) + "\n"


def sass_report(sources: Iterable[tuple[str, str]], arch: str = "sm_90") -> str:
    """The report of each (title, translation unit)."""
    return "".join(format_report(title, kernel_reports(src, arch)) for title, src in sources)
