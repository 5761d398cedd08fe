"""SGD, data parallel (CoCoNet's README example; reference sec. 4.3). Same IR as sgd.mlir.

Each rank holds its own gradient `g` (local); the all-reduced gradient updates the replicated
weights. Schedules: AR_C as written; split the all_reduce (reduce_scatter + all_gather),
reorder the update onto the slices, fuse RS + update + AG into one FusedAllReduce.
"""

from coconet import frontend
from coconet.frontend import F32, AllReduce, Local, Replicated, Scalar, Tensor, Update

N = 4096


@frontend.program(grid=[None])
def sgd(g: Tensor(F32, [N], Local), w: Tensor(F32, [N], Replicated), lr: Scalar(F32)):
    g1 = AllReduce("+", g)
    w1 = w - lr * g1
    Update(w, w1)


program = sgd  # what coconet.load() picks up
