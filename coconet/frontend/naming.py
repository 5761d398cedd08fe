"""Naming by frames: Python names become SSA names, read from the frames of the user's code
(every frame outside this package) while a program is built and when it returns; where an
error is reported (`file:line` of that code); which names MLIR keeps."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from xdsl.ir import SSAValue

from coconet.core.program import CocoError

# The front end's own files: their frames are skipped, so names and locations are the user's.
FRONTEND_FILES = frozenset(str(path) for path in Path(__file__).parent.glob("*.py"))


def user_frames(code: Any) -> list[FrameType] | None:
    """The frames outside the front end from the caller up to the one running `code`,
    innermost first; None when no frame runs `code`."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename not in FRONTEND_FILES:
            frames.append(frame)
        if frame.f_code is code:
            return frames
        frame = frame.f_back
    return None


def variable_holding(obj: object) -> str | None:
    """The innermost local variable of the user's frames that holds `obj` itself."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename not in FRONTEND_FILES:
            for var, held in frame.f_locals.items():
                if held is obj:
                    return var
        frame = frame.f_back
    return None


def caller_scope() -> dict[str, Any]:
    """The locals of the innermost frame outside the front end (where a decorator runs)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in FRONTEND_FILES:
        frame = frame.f_back
    return dict(frame.f_locals) if frame is not None else {}


def user_location() -> str:
    """`file:line` of the innermost frame outside the front end."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in FRONTEND_FILES:
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def valid_name(name: str) -> bool:
    try:
        SSAValue.extract_valid_name(name)
    except ValueError:
        return False
    return True


def check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not valid_name(name):
        raise CocoError(
            f"{name!r} cannot name {what}: use letters, digits, '_', '$', '.', '-' and do not "
            "start with a digit"
        )
    if SSAValue.extract_valid_name(name) != name:
        raise CocoError(
            f"{name!r} cannot name {what}: MLIR reads a trailing '_<digits>' as a printer "
            "suffix and drops it, so the name would not survive; rename it"
        )


def capture_locals(fn: Callable[..., Any], args: Sequence[object]) -> tuple[Any, dict[str, Any]]:
    """Call `fn` and return its result and its locals as they were when it returned.

    A one-shot hook catches the call's frame at its first event and removes itself there: the
    frame object keeps its locals after the call returns. (A hook left in place for the whole
    call ran on every call the program's construction made, which tripled the time to build a
    2,401-op program.) The hook is a trace function, or a profile function where a debugger or
    coverage already traces; with both taken (a debugger under a profiler), values keep no
    Python names."""
    code = fn.__code__
    frames: list[FrameType] = []
    if sys.gettrace() is None:
        install: Callable[[Any], None] = sys.settrace
    elif sys.getprofile() is None:
        install = sys.setprofile
    else:
        return fn(*args), {}

    def catch(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is code and not frames:
            frames.append(frame)
            install(None)

    install(catch)
    try:
        result = fn(*args)
    finally:
        install(None)
    return result, dict(frames[0].f_locals) if frames else {}
