"""A cache of compiled programs: the plan (with its CUDA text) of a program text under a
schedule, for a rank count, node map, launch configuration and target, so a program compiled
once starts without parsing, scheduling or lowering again (a warm start).

Entries live in the kernel cache's directory (toolchain/kernel_cache.py, namespace "plans") and
follow its rules: published atomically, loaded only when intact (the digest written beside
the entry matches) and trusted (owned by this user, writable by nobody else, in a tree of
this user's private directories), read through the descriptor those checks were made on,
rebuilt when they fail to load. An entry is a pickle, which can run code when loaded: that is
why only a trusted, intact entry is ever unpickled, as only such a shared library is ever
loaded.

The key covers everything the plan depends on: the program text and entry function, the
schedule, the ranks, nodes and launch configuration, the target, and the compiler itself
(a digest of coconet's sources and device header), so a changed compiler never reads an old
plan.
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from xdsl.parser import Parser

from coconet.core.program import make_context
from coconet.dialects.coco_types import TensorType
from coconet.lowering.plan import Plan
from coconet.toolchain.kernel_cache import CachedArtifact, KernelCache, content_key

__all__ = ["PLAN_CACHE", "cached_plan", "compiler_digest", "plan_key"]

PLAN_CACHE = KernelCache("plans")

# The folders of coconet's packages (pyproject's package-dir): what a plan is computed by.
# Installed, the API's subpackages (frontend/, schedule/, tune/) stand beside them.
_SOURCE_DIRS = (
    "coconet",
    "core",
    "dialects",
    "passes",
    "toolchain",
    "lowering",
    "frontend",
    "schedule",
    "tune",
)
_compiler_digest: str | None = None


def compiler_digest() -> str:
    """SHA-256 over coconet's Python sources and device header (computed once a process)."""
    global _compiler_digest
    if _compiler_digest is None:
        # the source tree (an editable install) or the installed `coconet` package, which
        # holds the API's modules at its top and the other packages as folders
        root = Path(__file__).resolve().parents[1]
        files = sorted(root.glob("*.py"))
        for folder in _SOURCE_DIRS:
            files += sorted(p for p in (root / folder).rglob("*") if p.suffix in (".py", ".h"))
        h = hashlib.sha256()
        for path in files:
            h.update(str(path.relative_to(root)).encode() + b"\0")
            h.update(path.read_bytes())
        _compiler_digest = h.hexdigest()
    return _compiler_digest


def plan_key(
    text: str,
    entry: str | None,
    schedule: str,
    ranks: int,
    nodes: Sequence[int],
    launch_config: str,
    target: str,
) -> str:
    return content_key(
        compiler_digest(),
        text,
        entry or "",
        schedule,
        str(ranks),
        ",".join(map(str, nodes)),
        launch_config,
        target,
    )


# A plan's buffers and steps hold thousands of tensor types, each an xDSL attribute tree (the
# shape's ArrayAttr of IntAttrs, the element type, the layouts): pickled as such, loading a
# 2,401-op program's plan spent 0.27 s rebuilding those trees, most of a warm start. They are
# stored as their text instead, and each distinct text is parsed once per process.


@functools.cache
def _type_text(t: TensorType) -> str:
    return str(t)


@functools.cache
def tensor_type_from_text(text: str) -> TensorType:
    """A `!coco.tensor` from its text (a plan entry stores tensor types so)."""
    parsed = Parser(make_context(), text).parse_attribute()
    if not isinstance(parsed, TensorType):
        raise ValueError(f"not a coco tensor type: {text}")
    return parsed


class _PlanPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, TensorType):
            return tensor_type_from_text, (_type_text(obj),)
        return NotImplemented


def dump_plan(plan: Plan) -> bytes:
    """A plan as the bytes of a plan entry."""
    out = io.BytesIO()
    _PlanPickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(plan)
    return out.getvalue()


def _load(path: Path) -> Plan:
    try:
        with open(path, "rb") as f:
            plan = pickle.load(f)
    except OSError:
        raise
    except Exception as e:  # an unpickling failure of any kind: the entry is unusable
        raise ValueError(f"unreadable plan entry {path}: {e}") from None
    if not isinstance(plan, Plan):
        raise ValueError(f"plan entry {path} holds a {type(plan).__name__}")
    return plan


def cached_plan(key: str, build: Callable[[], Plan]) -> CachedArtifact[Plan]:
    """The plan stored under `key`, or `build()`'s, stored under it first."""
    built: list[Plan] = []

    def write(tmp: Path) -> None:
        built.append(build())
        tmp.write_bytes(dump_plan(built[0]))

    def load(path: Path) -> Plan:
        # the plan just built is the one published: no need to read it back
        return built[0] if built else _load(path)

    return PLAN_CACHE.get_or_build(key, ".plan.pickle", write, load)
