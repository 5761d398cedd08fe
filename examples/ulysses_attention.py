"""Ulysses sequence parallelism (DeepSpeed-Ulysses, Jacobs et al. 2023): causal self-attention
over a sequence that the ranks hold in slices. Each rank holds its slice of the sequence of
the queries q [H, S, D] and values v [H, S, D] (sliced<1>) and of the transposed keys
kt [H, D, S] (sliced<2>); an all_to_all re-cuts each to head slices (sliced<0>: every rank
then holds whole sequences of its heads), each rank computes the scores of its heads
(q @ kt), scales them by 1/sqrt(D), adds the causal mask (0 on and below the diagonal, -inf
above it: a dense constant), takes the softmax over the keys and multiplies by v; a second
all_to_all re-cuts the heads' outputs back to sequence slices, and the output projection
(wo [H, D, E], the heads' rows of the usual [H*D, E] matrix) sums each head's product over
the heads: out [S, E], sequence-sliced again. Same IR as ulysses_attention.mlir.

The sequence (14) and the heads (10) need not divide by the rank count: the all_to_alls cut
them as the other collectives do (np.array_split).

Schedules: as written (the library all_to_all: MPI Alltoallv, NCCL grouped send/recv, gloo
all_to_all_single; one kernel per elementwise op and per row reduction between them); the
enumerator's other schedules (coconet.schedule.enumerate_scheduled_programs) are checked too.
"""

import numpy as np

from coconet import frontend
from coconet.frontend import (
    F32,
    AllToAll,
    Constant,
    MatMul,
    Replicated,
    Sliced,
    Softmax,
    Sum,
    Tensor,
)

H, S, D, E = 10, 14, 16, 32  # heads, sequence, head dim, model dim


def causal_mask(s: int = S) -> np.ndarray:
    """0 where key j is at or before query i, -inf after it."""
    i, j = np.indices((s, s))
    return np.where(j <= i, 0.0, -np.inf)


def build(h: int = H, s: int = S, d: int = D, e: int = E, dtype=F32):
    @frontend.program(grid=[None])
    def ulysses_attention(
        q: Tensor(dtype, [h, s, d], Sliced(1)),
        kt: Tensor(dtype, [h, d, s], Sliced(2)),
        v: Tensor(dtype, [h, s, d], Sliced(1)),
        wo: Tensor(dtype, [h, d, e], Replicated),
    ):
        qh = AllToAll(q, dim=0)  # sequence slices -> head slices
        kh = AllToAll(kt, dim=0)
        vh = AllToAll(v, dim=0)
        qk = MatMul(qh, kh)  # [h, s, s]: each rank's heads
        scores = qk * (1 / np.sqrt(d)) + Constant(causal_mask(s), dtype)
        heads = MatMul(Softmax(scores), vh)
        back = AllToAll(heads, dim=1)  # head slices -> sequence slices
        per_head = MatMul(back, wo)  # the output projection, summed over the heads
        out = Sum(per_head, dims=0)
        return out

    return ulysses_attention


program = build()  # what coconet.load() picks up
