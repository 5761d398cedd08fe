"""LAMB over parameter tensors whose sizes do not divide by the rank count (a model's real
tensors: an odd vocabulary, a bias of 33, a norm's 7 scales). The program is
lamb_scattered.py's over these sizes.

A slice of a size that does not divide is uneven, as MPI_Reduce_scatter's recvcounts and
np.array_split cut it: of n elements over p ranks, the first n % p ranks hold one element
more. Every split or fused schedule runs at any rank count (at most the smallest size).
"""

import importlib.util
from pathlib import Path

SIZES = (1000, 33, 4097, 12345, 7, 65537, 999)

_spec = importlib.util.spec_from_file_location(
    "lamb_scattered", Path(__file__).with_name("lamb_scattered.py")
)
_lamb_scattered = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_lamb_scattered)


def build(sizes=SIZES):
    return _lamb_scattered.build(sizes)


program = build()
