"""The counter-based generator behind dropout (and any randomness a program draws).

Each element's draw is a pure function of (seed, global flat index, stream), never of which
thread, block, slice or rank computes it: a sliced, fused or overlapped schedule draws exactly
the masks of the unscheduled program, on every backend. `stream` is the rank's flat coordinate
on the axes where the tensor is `local` (its own values there), 0 otherwise.

toolchain/coco_device.h implements the same function in C; tests check they agree bit for bit.
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np

# splitmix64's finaliser runs on one key (a NumPy uint64) or a whole array of counters
_Word = TypeVar("_Word", np.uint64, np.ndarray)

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z: _Word) -> _Word:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def seed_word(seed: int) -> int:
    """A program's seed (any i64) as the unsigned 64-bit word the generator mixes."""
    return seed & 0xFFFFFFFFFFFFFFFF


def counter_hash(seed: int, index: np.ndarray, stream: int) -> np.ndarray:
    """mix64(index + mix64(seed ^ (stream * GOLDEN))), all uint64 arithmetic wrapping."""
    with np.errstate(over="ignore"):
        key = _mix64(np.uint64(seed_word(seed)) ^ (np.uint64(stream) * GOLDEN))
        return _mix64(np.asarray(index, dtype=np.uint64) + key)


def dropout_threshold(prob: float) -> int:
    """Keep an element iff the top 24 bits of its hash are >= this (so P(drop) = p, to 2^-24)."""
    return math.ceil(prob * (1 << 24))


def dropout_keep(seed: int, index: np.ndarray, stream: int, prob: float) -> np.ndarray:
    return (counter_hash(seed, index, stream) >> np.uint64(40)) >= np.uint64(
        dropout_threshold(prob)
    )
