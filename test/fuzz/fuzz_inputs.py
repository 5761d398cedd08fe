"""The fuzzer's inputs: a corpus of real programs and pipelines, and the mutations made of them.

Seeds are every example (`examples/*.mlir`, and the IR the `examples/*.py` programs print) and
every chunk of every lit input (`test/filecheck/**/*.mlir`, split at `// -----`); pipelines
are the `-p` and `-t` options of the lit RUN lines. A case is a deterministic function of
(seed, index): `make_case` draws the seed program round-robin and 1-3 mutations from a
`random.Random` keyed by both, so any case a run reports is re-made from its index alone.

Mutations act on the text the way a user's mistakes (or a corrupted file) would: token
deletion, duplication, swaps and splices; a sliced value re-cut by comm.all_to_all and back;
the scale of a quantize / dequantize given a shape per block (dividing the input's dims, or
not);
element types, layouts, shapes (0, 2^31, 2^40, 2^63,
2^64, `?`), grids, literals (NaN, inf, out-of-range), op names and SSA uses; unknown ops,
misspelt attributes, declarations, nested functions, ops at module level; truncation and
bytes that are not UTF-8. Mutations that break a documented rule (docs/architecture.md §9,
dialects/program_rules.py) carry that rule as `must_reject`: they are applied last, so no later
mutation can undo them, and accepting such a program is a silent acceptance.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# -- the corpus --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seed:
    name: str  # where it comes from: `examples/adam.mlir`, `test/.../x.mlir#3`
    text: str


def _read(path: Path) -> str:
    """A file's text; bytes that are not UTF-8 (a lit input of that) survive the round trip
    back to bytes (surrogate escapes)."""
    return path.read_bytes().decode(errors="surrogateescape")


@cache
def seeds() -> tuple[Seed, ...]:
    out: list[Seed] = []
    for path in sorted((ROOT / "examples").glob("*.mlir")):
        out.append(Seed(str(path.relative_to(ROOT)), _read(path)))
    out.extend(python_example_seeds())
    # the unit tests' program files: row reductions of every kind, dense constants
    for path in sorted((ROOT / "test" / "unit" / "programs").glob("*.mlir")):
        out.append(Seed(str(path.relative_to(ROOT)), _read(path)))
    for path in sorted((ROOT / "test" / "filecheck").rglob("*.mlir")):
        rel = str(path.relative_to(ROOT))
        for i, chunk in enumerate(re.split(r"^// -----\s*$", _read(path), flags=re.MULTILINE)):
            if chunk.strip():
                out.append(Seed(f"{rel}#{i}", chunk))
    return tuple(out)


def python_example_seeds() -> list[Seed]:
    """The IR each `examples/*.py` program builds (printed by the front end)."""
    import coconet

    out = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        if path.name.startswith("torch_"):  # training scripts (torch_lm, torch_gpt), no program
            continue
        out.append(Seed(str(path.relative_to(ROOT)), coconet.load(path).print()))
    return out


@cache
def valid_seeds() -> tuple[Seed, ...]:
    """The examples (they verify): the programs pipeline cases schedule."""
    return tuple(s for s in seeds() if s.name.startswith("examples/"))


@cache
def verifying_seeds() -> tuple[Seed, ...]:
    """The seeds that parse and verify (the examples and lit inputs of valid IR): mutants of
    these reach the lowering and the sim far more often than mutants of refused IR."""
    from coconet.core.program import CocoError, parse_module

    out = []
    for s in seeds():
        try:
            parse_module(s.text, s.name)
        except CocoError:
            continue
        out.append(s)
    return tuple(out)


@cache
def corpus_pipelines() -> tuple[str, ...]:
    """Every `-p` pipeline of the lit RUN lines and every chunk's own (its `coco.schedule`
    attribute, which `coco-schedule` applies), plus each registered pass alone."""
    from coconet.schedule import get_all_passes

    found: set[str] = set(get_all_passes())
    for path in sorted((ROOT / "test" / "filecheck").rglob("*")):
        if path.suffix not in (".mlir", ".py"):
            continue
        for line in _read(path).splitlines():
            for m in re.finditer(r'coco\.schedule\s*=\s*"((?:[^"\\]|\\.)*)"', line):
                found.add(re.sub(r"\\(.)", r"\1", m.group(1)))
            if "RUN:" not in line:
                continue
            for m in re.finditer(r"-p\s+(?:'([^']*)'|\"([^\"]*)\"|(\S+))", line):
                found.add(next(g for g in m.groups() if g is not None))
    return tuple(sorted(found))


@cache
def corpus_op_names() -> tuple[str, ...]:
    from coconet.dialects import coco, comm

    names = {op.name for d in (coco.Coco, comm.Comm) for op in d.operations}
    return tuple(sorted(names))


# -- cases -------------------------------------------------------------------------------------


@dataclass
class Case:
    index: int
    kind: str  # "ir" (a mutated program) or "pipeline" (a valid program, a mutated -p / -t)
    seed: str
    data: bytes
    mutations: list[str] = field(default_factory=list)
    must_reject: str | None = None  # the rule a mutation broke, if it broke a documented one
    pipeline: str | None = None
    target: str | None = None

    def describe(self) -> str:
        what = f"case {self.index} ({self.kind}) of {self.seed}: {', '.join(self.mutations)}"
        if self.pipeline is not None:
            what += f"; -p '{self.pipeline}' -t '{self.target}'"
        return what


Mutation = Callable[[str, random.Random], tuple[str | bytes, str | None] | None]

TOKEN = re.compile(
    r"""(?P<ws>\s+)|(?P<comment>//[^\n]*)|(?P<str>"(?:[^"\\\n]|\\.)*")
    |(?P<num>-?0x[0-9a-fA-F]+|-?\d+\.\d*(?:[eE][-+]?\d+)?|-?\d+(?:[eE][-+]?\d+)?)
    |(?P<ssa>%[\w$.-]+)|(?P<sym>@[\w$.-]+)|(?P<attr>\#[\w$.]+)|(?P<type>![\w$.]+)
    |(?P<id>[A-Za-z_][\w$.]*)|(?P<arrow>->)|(?P<punct>.)""",
    re.VERBOSE | re.DOTALL,
)


def tokens(text: str) -> list[tuple[str, int, int]]:
    """(class, start, end) of each token that is not whitespace."""
    return [
        (m.lastgroup or "", m.start(), m.end())
        for m in TOKEN.finditer(text)
        if m.lastgroup not in ("ws",)
    ]


def _replace(text: str, start: int, end: int, new: str) -> str:
    return text[:start] + new + text[end:]


def _in_comment(text: str, at: int) -> bool:
    line_start = text.rfind("\n", 0, at) + 1
    return "//" in text[line_start:at]


def _pick_match(pattern: str, text: str, rng: random.Random) -> re.Match[str] | None:
    """A random match of `pattern` in the code of `text` (a mutated comment changes nothing)."""
    found = [m for m in re.finditer(pattern, text) if not _in_comment(text, m.start())]
    return rng.choice(found) if found else None


def delete_token(text, rng):
    t = tokens(text)
    if not t:
        return None
    _, s, e = rng.choice(t)
    return _replace(text, s, e, ""), None


def duplicate_token(text, rng):
    t = tokens(text)
    if not t:
        return None
    _, s, e = rng.choice(t)
    return _replace(text, s, e, text[s:e] + " " + text[s:e]), None


def swap_adjacent_tokens(text, rng):
    t = tokens(text)
    if len(t) < 2:
        return None
    i = rng.randrange(len(t) - 1)
    (_, s1, e1), (_, s2, e2) = t[i], t[i + 1]
    return text[:s1] + text[s2:e2] + text[e1:s2] + text[s1:e1] + text[e2:], None


def splice_token(text, rng):
    """A token replaced by another token of the same class from the same text."""
    t = tokens(text)
    if len(t) < 2:
        return None
    cls, s, e = rng.choice(t)
    same = [x for x in t if x[0] == cls] or t
    _, s2, e2 = rng.choice(same)
    return _replace(text, s, e, text[s2:e2]), None


ELEMENT_TYPES = (
    "f32",
    "f16",
    "bf16",
    "i32",
    "i1",
    "f64",
    "i64",
    "i8",
    "index",
    "f8E4M3FN",
    "f8E5M2",
    "f8E4M3FNUZ",
)
ELEMENT_TYPE_RE = r"(?<=[x<])(f32|f16|bf16|i32|i1|f64|i64|f8E4M3FN|f8E5M2)(?=[>,])"


def element_type(text, rng):
    m = _pick_match(ELEMENT_TYPE_RE, text, rng)
    if m is None:
        return None
    new = rng.choice((*ELEMENT_TYPES, "complex<f32>", "tf32", "i128", "ui32", "none"))
    return _replace(text, m.start(), m.end(), new), None


LAYOUTS = (
    "local",
    "replicated",
    "sliced<0>",
    "sliced<1>",
    "sliced<2>",
    "sliced<7>",
    "sliced<-1>",
    "sliced<99999999999999999999>",
    "local, local",
    "replicated, sliced<0>",
    "sliced<0>, sliced<0>",
    # nested cuts (levels): valid, partial, duplicate, out of range, grid order, odd spelling
    "sliced<0, level 1>, sliced<0, level 0>",
    "sliced<0, level 1>, sliced<0>",
    "sliced<0, level 0>, sliced<0, level 0>",
    "sliced<0, level 5>, sliced<0, level 0>",
    "sliced<0, level 0>, sliced<0, level 1>",
    "sliced<1, level 1>",
    "sliced<0, level -1>",
    "sliced<0, 1>",
)


def layout(text, rng):
    m = _pick_match(r"\b(local|replicated|sliced<-?\d+(?:, level -?\d+)?>)", text, rng)
    if m is None:
        m = _pick_match(r"(?<=[x<])(f32|f16|bf16|i32|i1)(?=>)", text, rng)
        if m is None:
            return None
        return _replace(text, m.end(), m.end(), ", " + rng.choice(LAYOUTS)), None
    return _replace(text, m.start(), m.end(), rng.choice(LAYOUTS)), None


DIMS = ("0", "1", "3", "5", "?", "2147483648", "1099511627776", "9223372036854775808")
DIMS += ("18446744073709551616", "4294967296")


def shape_dim(text, rng):
    m = _pick_match(r"(?<=[<x])(\d+|\?)(?=x)", text, rng)
    if m is None:
        return None
    new = rng.choice(DIMS)
    # No tensor has a dim of 2^63 or more (docs/architecture.md §9: at most 2^63 - 1 elements).
    rule = "tensor-size" if new.isdigit() and int(new) >= 1 << 63 else None
    return _replace(text, m.start(), m.end(), new), rule


def add_or_drop_dim(text, rng):
    m = _pick_match(r"(?<=coco\.tensor<)(\d+x)?", text, rng)
    if m is None:
        return None
    if m.group(0):
        return _replace(text, m.start(), m.end(), ""), None
    return _replace(text, m.start(), m.start(), rng.choice(DIMS[:5]) + "x"), None


def shape_everywhere(text, rng):
    """Every occurrence of one dimension size changed at once, so the types still agree and
    the program reaches the lowering and the sim with dims of 0, 1, 3 or 2^40."""
    m = _pick_match(r"(?<=[<x])(\d+)(?=x)", text, rng)
    if m is None:
        return None
    # 3, 5, 7, 45: cut unevenly at 2 and 3 ranks (the cpu stage's), where per-rank extents
    # differ between ranks
    new = rng.choice(
        ("0", "1", "3", "5", "6", "7", "45", "1099511627776", "2147483648", "4611686018427387904")
    )
    return re.sub(rf"(?<=[<x]){m.group(0)}(?=x)", new, text), None


def element_type_everywhere(text, rng):
    m = _pick_match(ELEMENT_TYPE_RE, text, rng)
    if m is None:
        return None
    new = rng.choice(("f32", "f16", "bf16", "i32", "f64", "i64", "i1", "f8E4M3FN", "f8E5M2"))
    return re.sub(rf"(?<=[x<]){m.group(0)}(?=[>,])", new, text), None


LITERALS = ("nan", "inf", "-inf", "0x7FC00000", "0xFFFFFFFF", "1e309", "-0.0", "1.0e-45")
LITERALS += ("340282366920938463463374607431768211456", "0x7F800000", "1", "true")


def literal(text, rng):
    m = _pick_match(r"(?<=coco\.constant )[^:\s]+", text, rng) or _pick_match(
        r"(?<=\s)-?\d+\.\d+(?:[eE][-+]?\d+)?", text, rng
    )
    if m is None:
        return None
    return _replace(text, m.start(), m.end(), rng.choice(LITERALS)), None


# Rank counts beyond the documented maximum (2^16, docs/architecture.md §9) must be refused.
GRIDS_OVER_LIMIT = ("[1099511627776]", "[18446744073709551616]", "[65537]", "[65536, 2]")
GRIDS = ("[0]", "[-1]", "[]", "[?, ?, ?]", "[65536]", "[2, 0]", "[1, ?]", "[3, ?]", "[?, 2]")


def grid(text, rng):
    m = _pick_match(r"(?<=#coco\.grid<)\[[^\]]*\]", text, rng)
    if m is None:
        return None
    if rng.random() < 0.4:
        return _replace(text, m.start(), m.end(), rng.choice(GRIDS_OVER_LIMIT)), "grid-size"
    return _replace(text, m.start(), m.end(), rng.choice(GRIDS)), None


def op_name(text, rng):
    m = _pick_match(r"\b(coco|comm)\.[a-z_]+\b(?!\s*=)", text, rng)
    if m is None or m.group(0) in ("coco.grid", "coco.tensor"):
        return None
    return _replace(text, m.start(), m.end(), rng.choice(corpus_op_names())), None


def ssa_use(text, rng):
    """One use of an SSA value replaced by another value's name (maybe defined later, of
    another type, or the op's own result)."""
    names = sorted(set(re.findall(r"%[\w$.-]+", text)))
    uses = [m for m in re.finditer(r"(?<=[\s,(])%[\w$.-]+(?=[\s,):])", text) if m.start() > 0]
    uses = [
        m
        for m in uses
        if not re.match(r"\s*=", text[m.end() : m.end() + 3]) and not _in_comment(text, m.start())
    ]
    if len(names) < 2 or not uses:
        return None
    m = rng.choice(uses)
    return _replace(text, m.start(), m.end(), rng.choice(names)), None


# An op line whose result is a tensor sliced on a 1-D grid: the type ends the line.
_SLICED_RESULT = re.compile(
    r"^(\s*)(%[\w$.-]+) = (?:coco|comm)\.[^\n]*?(!coco\.tensor<((?:\d+x)+)(\w+), "
    r"sliced<(\d+)>>)[ \t]*$",
    re.MULTILINE,
)


def all_to_all_round_trip(text, rng):
    """A sliced result re-cut along another dim by comm.all_to_all and back, its later uses
    reading the round trip: the same program (if it still verifies where it landed: inside a
    fused region it may not), so every stage meets all_to_alls."""
    matches = [m for m in _SLICED_RESULT.finditer(text) if not _in_comment(text, m.start())]
    if not matches:
        return None
    m = rng.choice(matches)
    indent, name, t, dims, a = m.group(1), m.group(2), m.group(3), m.group(4), int(m.group(6))
    # a dim of 4 or more cuts at 1, 2 and 4 ranks (the fuzzer's) without an empty slice
    sizes = [int(n) for n in dims.split("x")[:-1]]
    others = [d for d, n in enumerate(sizes) if d != a and n >= 4]
    if not others:
        return None
    b = rng.choice(others)
    there = t.replace(f"sliced<{a}>>", f"sliced<{b}>>")
    k = 0
    while f"%a2a{k}_" in text:
        k += 1
    fwd, back = f"%a2a{k}_fwd", f"%a2a{k}_back"
    block = (
        f"\n{indent}{fwd} = comm.all_to_all {name} : {t} -> {there}"
        f"\n{indent}{back} = comm.all_to_all {fwd} : {there} -> {t}"
    )
    rest = re.sub(re.escape(name) + r"(?![\w$.-])", back, text[m.end() :])
    return text[: m.end()] + block + rest, None


# A reducing collective's line, and what it may state as its accumulation: the legal ones
# (comm.ACC_TYPE_NAMES, as wide as the data or wider) and some that are not.
_REDUCING = re.compile(r"= comm\.(?:all_reduce|reduce_scatter|reduce) [^\n]*")
ACCUMULATIONS = ("f32", "f64", "bf16", "f16", "f8E4M3FN", "i32")


def accumulation(text, rng):
    """A reducing collective states an accumulation (`acc T`, before `over`, the attributes
    and the signature): one its data widens to, which the sim, the library path and the
    fused kernels must all honour, or one it does not (a `[<op>-acc]` refusal)."""
    found = [
        m
        for m in _REDUCING.finditer(text)
        if " acc " not in m.group(0) and not _in_comment(text, m.start())
    ]
    if not found:
        return None
    m = rng.choice(found)
    line = m.group(0)
    cut = min(i for i in (line.find(" over ["), line.find(" {"), line.find(" : ")) if i >= 0)
    stated = f"{line[:cut]} acc {rng.choice(ACCUMULATIONS)}{line[cut:]}"
    return text[: m.start()] + stated + text[m.end() :], None


# The word that says how an op reduces (coco.reduce, coco.reduce_dims, a reducing collective).
_REDUCTION_WORD = re.compile(
    r"= (?:coco\.reduce(?:_dims)?|comm\.(?:all_reduce|reduce_scatter|reduce)) (\w+) "
)
# The one reduction vocabulary (dialects/reduction.py), spelled out so the fuzzer does not
# import the code under test.
REDUCTIONS = ("sum", "prod", "max", "min", "norm", "mean")


def reduction_kind(text, rng):
    """A reducing op names another member of the reduction vocabulary: one of its op's subset
    changes what the program computes (every schedule must still agree with the sim), any
    other must be refused where it is parsed, naming the op's subset."""
    found = [m for m in _REDUCTION_WORD.finditer(text) if not _in_comment(text, m.start())]
    if not found:
        return None
    m = rng.choice(found)
    other = rng.choice([k for k in REDUCTIONS if k != m.group(1)])
    return text[: m.start(1)] + other + text[m.end(1) :], None


_TENSOR = r"!coco\.tensor<((?:\d+x)*)(\w+)((?:, (?:\[[^\]]*\]|\w+(?:<\d+>)?))?)>"
# `coco.quantize %x, %s : T, S -> Q` (or dequantize): the scale's name, T's dims and layout,
# the scale's type and element type
_SCALED = re.compile(
    r"coco\.(?:de)?quantize %[\w$.-]+, (%[\w$.-]+) : " + _TENSOR + r", (" + _TENSOR[:-1] + r">) ->"
)


def _divisors(n: int) -> list[int]:
    """The divisors of `n` between 1 and `n`, found up to its square root (a mutated shape
    may hold a dim of 10^12: a scan to `n` hung the fuzzer's driver), none past 2^40."""
    if n > 1 << 40:
        return []
    small = [d for d in range(2, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def block_scale(text, rng):
    """One coco.quantize or dequantize reads a new argument as its scale, of a shape per
    block of its input: each dim 1, the input's, a divisor of it (a block), now and then one
    that divides nothing ([quantize-block]); replicated or laid out as the input (cut on
    block boundaries at some rank counts only: [quantize-block-slices] at launch)."""
    matches = [m for m in _SCALED.finditer(text) if not _in_comment(text, m.start())]
    header = list(re.finditer(r"func\.func @[\w$.-]+\(", text))
    matches = [m for m in matches if any(h.end() < m.start() for h in header)]
    if not matches:
        return None
    m = rng.choice(matches)
    dims = [int(n) for n in m.group(2).split("x")[:-1]]
    shape = []
    for n in dims:
        choices = [1, n, *_divisors(n)]
        shape.append(rng.choice(choices) if rng.random() < 0.9 else n + 1)
    layout = m.group(4) if rng.random() < 0.3 else ""
    new = "!coco.tensor<" + "".join(f"{d}x" for d in shape) + m.group(7) + layout + ">"
    k = 0
    while f"%bscale{k}" in text:
        k += 1
    op = text[m.start() : m.end()]
    op = op[: m.start(1) - m.start()] + f"%bscale{k}" + op[m.end(1) - m.start() :]
    op = op[: op.rindex(m.group(5))] + new + op[op.rindex(m.group(5)) + len(m.group(5)) :]
    at = [h for h in header if h.end() < m.start()][-1].end()
    closes = text[at] == ")"
    arg = f"%bscale{k}: {new}" + ("" if closes else ", ")
    return text[:at] + arg + text[at : m.start()] + op + text[m.end() :], None


# An argument in a func.func's signature: `%name: !coco.tensor<...>` not yet attributed.
_ARGUMENT = re.compile(r"(%[\w$.-]+: " + _TENSOR + r")(?! \{)")


def symmetric_argument(text, rng):
    """An argument is marked `{coco.symmetric}` (now and then a scalar, or with a value: a
    `[symmetric-argument]` refusal): a fused all_gather assembled in it then pulls from it,
    with no staging copy, which the sim's values must survive."""
    header = [m.end() for m in re.finditer(r"func\.func @[\w$.-]+\(", text)]
    found = [
        m
        for m in _ARGUMENT.finditer(text)
        if any(h <= m.start() for h in header) and not _in_comment(text, m.start())
    ]
    if not found:
        return None
    m = rng.choice(found)
    attr = "{coco.symmetric}" if rng.random() < 0.9 else "{coco.symmetric = 1 : i64}"
    return text[: m.end()] + " " + attr + text[m.end() :], None


# An op's line up to its signature (`%x = coco.add %a, %b` or `coco.update %w, %w1`) with no
# attribute dictionary yet, and a fused region's head.
_OP_HEAD = re.compile(r"(?:%[\w$.-]+ = )?(?:coco|comm)\.\w+ [^\n{:]*?(?= : )")
_FUSED_HEAD = re.compile(r"comm\.fused \w+(?: one_shot)?(?= (?:->|\{))")


def segment_mark(text, rng):
    """A lowering decision written by hand: `{comm.segment = K}` on an op (inside a fused
    region or not), or `comm.segments = K` on a fused region, now and then not an integer
    (an `[unknown-attribute]` refusal). The lowering must honour it where coco-segment would
    have written it, or refuse it naming [segment] or [segment-op]."""
    value = f"{rng.randrange(3)} : i64" if rng.random() < 0.85 else '"first"'
    if rng.random() < 0.25:
        found = [m for m in _FUSED_HEAD.finditer(text) if not _in_comment(text, m.start())]
        if found:
            m = rng.choice(found)
            head = f"{m.group(0)} attributes {{comm.segments = {value}}}"
            return text[: m.start()] + head + text[m.end() :], None
    found = [
        m
        for m in _OP_HEAD.finditer(text)
        if not _in_comment(text, m.start())
        and not m.group(0).startswith(("comm.fused", "comm.yield"))
    ]
    # mostly an op of a fused region, where the lowering reads segments
    regions = [(h.end(), text.find("comm.yield", h.end())) for h in _FUSED_HEAD.finditer(text)]
    inside = [m for m in found if any(a < m.start() < b for a, b in regions)]
    if inside and rng.random() < 0.7:
        found = inside
    if not found:
        return None
    m = rng.choice(found)
    return text[: m.end()] + f" {{comm.segment = {value}}}" + text[m.end() :], None


def truncate(text, rng):
    if len(text) < 2:
        return None
    return text[: rng.randrange(1, len(text))], None


BAD_BYTES = (b"\xff", b"\xc3\x28", b"\x80\x80", b"\xed\xa0\x80", b"\x00", b"\xfe\xff", b"\xe2\x82")


def non_utf8(text, rng):
    data = text.encode(errors="surrogateescape")
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.choice(BAD_BYTES) + data[at:], None


def odd_unicode(text, rng):
    m = _pick_match(r"%[\w$.-]+|@[\w$.-]+", text, rng)
    if m is None:
        return None
    return _replace(text, m.end(), m.end(), rng.choice(("é", "\u200b", "\u2028", "ß", "名"))), None


def _lines(text: str) -> list[str]:
    return text.split("\n")


def delete_line(text, rng):
    lines = _lines(text)
    del lines[rng.randrange(len(lines))]
    return "\n".join(lines), None


def duplicate_line(text, rng):
    lines = _lines(text)
    i = rng.randrange(len(lines))
    lines.insert(i, lines[i])
    return "\n".join(lines), None


def swap_lines(text, rng):
    lines = _lines(text)
    if len(lines) < 2:
        return None
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines), None


def _body_line(text: str, rng: random.Random) -> int | None:
    """The index of a line inside a function body (an op line or the return, never a
    `func.func` line: printed IR indents its functions inside `builtin.module`)."""
    lines = _lines(text)
    op_line = r"\s+((%[\w$.-]+(, %[\w$.-]+)* = )?(coco|comm)\.|func\.return)"
    inside = [i for i, ln in enumerate(lines) if re.match(op_line, ln)]
    return rng.choice(inside) if inside else None


FOREIGN_OPS = (
    '"test.op"() : () -> ()',
    '%zz_foreign = "foo.bar"() : () -> !coco.tensor<f32>',
    '%zz_foreign = "arith.constant"() <{value = 1 : i32}> : () -> i32',
    '"func.call"() <{callee = @nowhere}> : () -> ()',
)


def foreign_op(text, rng):
    at = _body_line(text, rng)
    if at is None:
        return None
    lines = _lines(text)
    lines.insert(at, "  " + rng.choice(FOREIGN_OPS))
    return "\n".join(lines), "foreign-op"


def nested_function(text, rng):
    at = _body_line(text, rng)
    if at is None:
        return None
    lines = _lines(text)
    lines.insert(at, "  func.func @zz_nested(%a: !coco.tensor<8xf32>) {\n    func.return\n  }")
    return "\n".join(lines), "nested-function"


def misspelt_attribute(text, rng):
    m = _pick_match(r"coco\.grid =", text, rng)
    if m is None:
        # A function without attributes: give it a misspelt grid.
        m = _pick_match(r"(?m)^func\.func @[\w$.-]+\([^{]*?\)(\s*->[^{]*?)?(?= \{\n)", text, rng)
        if m is None:
            return None
        return _replace(
            text, m.end(), m.end(), " attributes {coco.gird = #coco.grid<[?]>}"
        ), "unknown-attribute"
    name = rng.choice(("coco.gird", "coco.Grid", "coco.grids", "comm.grid"))
    return _replace(text, m.start(), m.end(), f"{name} ="), "unknown-attribute"


def extra_attribute(text, rng):
    m = _pick_match(r"\{coco\.grid = ", text, rng)
    if m is None:
        return None
    return _replace(text, m.start() + 1, m.start() + 1, "coco.frobnicate = true, "), (
        "unknown-attribute"
    )


MODULE_LEVEL = (
    '"test.op"() : () -> ()',
    "%zz_top = coco.constant 1.0 : !coco.tensor<f32>",
    '"arith.constant"() <{value = 1 : i32}> : () -> i32',
)


def module_level_op(text, rng):
    if "func.func" not in text:
        return None
    return text + "\n" + rng.choice(MODULE_LEVEL) + "\n", "module-ops"


def declaration(text, rng):
    if "func.func" not in text:
        return None
    return text + "\nfunc.func private @zz_declared(%a: !coco.tensor<8xf32>)\n", (
        "function-declaration"
    )


MUTATIONS: dict[str, Mutation] = {
    f.__name__: f
    for f in (
        delete_token,
        duplicate_token,
        swap_adjacent_tokens,
        splice_token,
        element_type,
        layout,
        shape_dim,
        shape_everywhere,
        element_type_everywhere,
        add_or_drop_dim,
        literal,
        grid,
        op_name,
        ssa_use,
        truncate,
        non_utf8,
        odd_unicode,
        delete_line,
        duplicate_line,
        swap_lines,
        all_to_all_round_trip,
        accumulation,
        block_scale,
        symmetric_argument,
        segment_mark,
        reduction_kind,
    )
}
# Those that break a documented rule: applied last (see the module docstring).
RULE_MUTATIONS: dict[str, Mutation] = {
    f.__name__: f
    for f in (
        foreign_op,
        nested_function,
        misspelt_attribute,
        extra_attribute,
        module_level_op,
        declaration,
    )
}
# Semantic mutations keep programs parseable more often, so they reach the deep stages.
WEIGHTS = {name: 1.0 for name in MUTATIONS}
WEIGHTS.update(
    element_type=2.5,
    layout=2.5,
    shape_dim=2.5,
    literal=2.5,
    grid=1.5,
    op_name=2.0,
    ssa_use=2.0,
    shape_everywhere=4.0,
    element_type_everywhere=3.0,
    all_to_all_round_trip=2.0,
    accumulation=2.0,
    block_scale=2.0,
    symmetric_argument=2.0,
    segment_mark=2.0,
    reduction_kind=2.0,
)


def make_case(seed: int, index: int) -> Case:
    """Case `index` of the run seeded `seed`: half the time a mutant of a verifying seed,
    else of any seed (each seed list taken round-robin); 12% are pipeline cases."""
    rng = random.Random(f"coconet-fuzz:{seed}:{index}")
    if rng.random() < 0.12:
        return make_pipeline_case(index, rng)
    corpus = verifying_seeds() if rng.random() < 0.5 else seeds()
    base = corpus[(index + seed) % len(corpus)]
    case = Case(index, "ir", base.name, b"")
    text: str | bytes = base.text
    names = list(MUTATIONS)
    weights = [WEIGHTS[n] for n in names]
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
        if isinstance(text, bytes):
            break
        name = rng.choices(names, weights)[0]
        made = MUTATIONS[name](text, rng)
        if made is not None:
            # a rule the last mutation broke stays broken (nothing after it can undo it)
            text, case.must_reject = made
            case.mutations.append(name)
    if isinstance(text, str) and rng.random() < 0.25:
        name = rng.choice(list(RULE_MUTATIONS))
        made = RULE_MUTATIONS[name](text, rng)
        if made is not None:
            text, case.must_reject = made
            case.mutations.append(name)
    case.data = text if isinstance(text, bytes) else text.encode(errors="surrogateescape")
    return case


# -- pipeline cases ----------------------------------------------------------------------------

OPTION_VALUES = ("0", "-1", "-2", "9", "1099511627776", "x", "", '"fuse(rs-c-ag)"', "g1,g1", "4")
TARGETS = ("mlir", "plan", "cuda")
RANK_OPTIONS = ("-2", "0", "1", "2", "3", "4", "5", "1099511627776", "x")


def make_pipeline_case(index: int, rng: random.Random) -> Case:
    from coconet.schedule import resolve_schedule_name  # noqa: F401 - names exist

    base = rng.choice(valid_seeds())
    pipeline = rng.choice(corpus_pipelines())
    mutations = []
    for _ in range(rng.choice((0, 1, 1, 2))):
        how = rng.choice(("option", "drop-char", "dup-pass", "typo", "schedule"))
        if how == "option":
            m = _pick_match(r"(?<==)[^ }]*", pipeline, rng)
            if m is not None:
                pipeline = _replace(pipeline, m.start(), m.end(), rng.choice(OPTION_VALUES))
            else:
                key = rng.choice(("dim", "chunks", "ops", "mode", "bogus"))
                pipeline += "{" + key + "=" + rng.choice(OPTION_VALUES) + "}"
        elif how == "drop-char" and pipeline:
            i = rng.randrange(len(pipeline))
            pipeline = pipeline[:i] + pipeline[i + 1 :]
        elif how == "dup-pass":
            pipeline = pipeline + "," + pipeline
        elif how == "typo" and pipeline:
            pipeline = pipeline.replace("coco-", "coco_", 1)
        elif how == "schedule":
            name = rng.choice(("ar-c", "rs-c-ag", "fuse(rs-c-ag)", "ol(mm,fuse(rs-c-ag))", "x"))
            pipeline = f'coco-schedule{{name="{name}"}}'
        mutations.append(how)
    target = rng.choice(TARGETS)
    if target != "mlir" and rng.random() < 0.5:
        key = rng.choice(("ranks", "block", "max_blocks"))
        target += "{" + key + "=" + rng.choice(RANK_OPTIONS) + "}"
    case = Case(index, "pipeline", base.name, base.text.encode(errors="surrogateescape"), mutations)
    case.pipeline, case.target = pipeline, target
    m = re.search(r"ranks=(-?\d+)", target)
    if m and int(m.group(1)) < 0:
        case.must_reject = "target-ranks"
    return case
