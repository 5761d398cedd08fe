"""Environment variables coconet reads, each parsed in one place into one clear refusal.

A bad value (`COCONET_STEP_TIMEOUT=abc`, `WORLD_SIZE=-2`) is a user error like a bad option:
it ends in a `CocoError` naming the variable and what it takes, never a raw `ValueError`
from deep inside a run, and never a value silently taken to mean something else.
"""

from __future__ import annotations

import math
import os

from coconet.core.program import CocoError

__all__ = [
    "DEFAULT_STEP_TIMEOUT",
    "STEP_TIMEOUT_ENV",
    "env_choice",
    "env_count",
    "env_seconds",
    "step_timeout",
]

STEP_TIMEOUT_ENV = "COCONET_STEP_TIMEOUT"
# How long a rank may make no progress in one plan step, or wait for its peers at a call,
# before the job ends naming who did not arrive: torch.distributed's default NCCL timeout
# (10 min), so a job that torch would let wait is not cut shorter (a rank saving a checkpoint
# while its peers wait at the next step), and nothing waits forever.
DEFAULT_STEP_TIMEOUT = 600.0


def _seconds(value: float, what: str) -> float | None:
    """`value` seconds as a limit: None for 0 (no limit); refused unless finite and >= 0."""
    if not math.isfinite(value) or value < 0:
        raise CocoError(f"{what}: expected a number of seconds (> 0), or 0 for no limit")
    return value or None


def env_seconds(name: str, default: float | None) -> float | None:
    """A duration in seconds from `name`: unset or empty gives `default`; `0` turns the
    limit off (None); anything else must be a positive finite number."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    return _seconds(value, f"{name}={raw!r}")


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """One of `choices` from `name`: unset or empty gives `default`; anything else is refused
    with the values it takes."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if raw not in choices:
        raise CocoError(f"{name}={raw!r}: expected one of {', '.join(choices)}")
    return raw


def env_count(name: str) -> int | None:
    """A positive integer from `name`: unset or empty gives None (the caller's default);
    anything else is refused with what it takes."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise CocoError(f"{name}={raw!r}: expected a positive integer")
    return value


def step_timeout(given: float | None = None) -> float | None:
    """The step timeout of a job: `given` (seconds; 0 = off) where the caller passed one,
    else COCONET_STEP_TIMEOUT, else DEFAULT_STEP_TIMEOUT."""
    if given is not None:
        return _seconds(given, f"step timeout {given!r}")
    return env_seconds(STEP_TIMEOUT_ENV, DEFAULT_STEP_TIMEOUT)
