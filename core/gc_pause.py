"""The compiler's phases run with Python's cyclic garbage collector paused.

A compile builds hundreds of thousands of objects that live until it ends (operations,
attributes, the kernels' statement trees): the collector, triggered by every few hundred
allocations, walks them again and again and finds next to nothing (a tenth to a fifth of a
2,400-op program's compile on a 2-core box). Reference counting still frees what is not
in a cycle at once; the few cycles a compile drops (erased operations) are freed by the first
collection after it. Nested phases keep the collector paused until the outermost ends."""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def gc_paused() -> Generator[None, None, None]:
    """The collector paused inside the block (left as it was where it was paused already)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def without_gc(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` run with the collector paused (`gc_paused`)."""

    @functools.wraps(fn)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        with gc_paused():
            return fn(*args, **kwargs)

    return paused
