"""One encoding per stored narrow float: `share_encodings`.

A kernel computes in float and rounds each narrow-float value as it is computed
(`coco_round_bf16(x)`: encode to the storage type, decode back); storing that value encodes
it a second time. For fp8 the encoding is a dozen vector operations an element, so a quantize
kernel encoded, decoded and encoded again. Encoding a value that is already on the type's grid
gives back the code it came from (encode(decode(encode(x))) == encode(x), NaN included: the
encoders emit one NaN code each), so the store can take the first encoding itself:

    const float y = coco_round_f8e4m3(e);         const coco_f8e4m3 y_q = coco_f8e4m3_from_f32(e);
    out[i] = coco_f8e4m3_from_f32(y);      ->     const float y = coco_to_f32(y_q);
                                                  out[i] = y_q;

The decoding is left out where nothing else reads the value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any, cast

from coconet.lowering.kernel_ir import Call, Decl, Kernel, Stmt, Var, rewrite
from coconet.lowering.kernels.elements import C_STORAGE, NARROW_FLOATS

_STORAGE = {sfx: C_STORAGE[elt] for elt, sfx in NARROW_FLOATS.items()}
_ROUND = {f"coco_round_{sfx}": sfx for sfx in NARROW_FLOATS.values()}
_ENCODE = {f"coco_{sfx}_from_f32": sfx for sfx in NARROW_FLOATS.values()}


def share_encodings(kernel: Kernel) -> Kernel:
    """`kernel` with each stored rounded value encoded once (see the module)."""
    stored: set[tuple[Var, str]] = set()

    def find(x: Any) -> None:
        if isinstance(x, Call) and x.fn in _ENCODE and isinstance(x.args[0], Var):
            stored.add((x.args[0], _ENCODE[x.fn]))
        return None

    rewrite(kernel.body, find)  # (find replaces nothing: it visits every node)
    codes: dict[Var, tuple[Var, str]] = {}

    def split(s: Decl) -> tuple[Stmt, ...] | None:
        init = s.init
        if not (isinstance(init, Call) and init.fn in _ROUND):
            return None
        sfx = _ROUND[init.fn]
        if (s.var, sfx) not in stored:
            return None
        # (a variable declared in several scopes -- a vector loop and its tail -- gets one
        # code variable, declared beside it in each)
        if s.var not in codes:
            hint = s.var.hint and f"{s.var.hint}_q"
            codes[s.var] = (Var(_STORAGE[sfx], hint, f"{s.var.fallback}_q"), sfx)
        code = codes[s.var][0]
        return (
            Decl(code, Call(f"coco_{sfx}_from_f32", init.args), comment=s.comment),
            Decl(s.var, Call("coco_to_f32", (code,))),
        )

    body = _expand(kernel.body, split)
    if not codes:
        return kernel

    def reuse(x: Any) -> Any | None:
        if isinstance(x, Call) and x.fn in _ENCODE and isinstance(x.args[0], Var):
            code = codes.get(x.args[0])
            if code is not None and code[1] == _ENCODE[x.fn]:
                return code[0]
        return None

    body = rewrite(body, reuse)
    read: set[Var] = set()

    def reads(x: Any) -> Any | None:
        if isinstance(x, Decl) and x.var in codes:
            rewrite(x.init, reads)
            return x  # (its declaration is no read: nothing below it is visited)
        if isinstance(x, Var) and x in codes:
            read.add(x)
        return None

    rewrite(body, reads)
    # a value only ever stored needs no decoding (an unread variable warns)
    unread = {v for v in codes if v not in read}

    def drop_unread(s: Decl) -> tuple[Stmt, ...] | None:
        return () if s.var in unread else None

    body = _expand(body, drop_unread)
    return replace(kernel, body=body)


def _expand(
    stmts: tuple[Stmt, ...], split: Callable[[Decl], tuple[Stmt, ...] | None]
) -> tuple[Stmt, ...]:
    """`stmts` with every declaration (at any depth) that `split` returns statements for
    replaced by them."""
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Decl):
            parts = split(s)
            out += parts if parts is not None else (s,)
            continue
        changes: dict[str, tuple[Stmt, ...]] = {}
        for f in fields(s):  # type: ignore[arg-type]
            value: object = getattr(s, f.name)
            if not isinstance(value, tuple):
                continue
            items = cast("tuple[object, ...]", value)
            if all(isinstance(x, Stmt) for x in items):
                changes[f.name] = _expand(cast("tuple[Stmt, ...]", items), split)
        out.append(replace(s, **changes) if changes else s)  # type: ignore[type-var]
    return tuple(out)
