# RUN: python %s | filecheck %s
# A 2-D grid [stages, ranks]: per-axis layouts, a collective over axis 1, CoCoNet's
# Send(x, GroupRank(GROUP + 1, RANK)) as comm.send along axis 0.

from coconet import frontend
from coconet.frontend import (
    F16,
    GROUP,
    RANK,
    AllReduce,
    Dropout,
    GroupRank,
    Local,
    MatMul,
    Replicated,
    Send,
    Sliced,
    Tensor,
)  # fmt: skip


@frontend.program(grid=[2, None])
def boundary(
    x: Tensor(F16, [4, 8, 32], [Local, Sliced(2)]),
    w: Tensor(F16, [32, 32], [Local, Sliced(0)]),
    b: Tensor(F16, [32], [Local, Replicated]),
):
    layer = MatMul(x, w)
    total = AllReduce("+", layer, over=[1])
    out = Dropout(total + b, 0.1, seed=5)
    recv = Send(out, GroupRank(GROUP + 1, RANK))
    return recv


print(boundary)

# CHECK:      func.func @boundary(%x: !coco.tensor<4x8x32xf16, [local, sliced<2>]>, %w: !coco.tensor<32x32xf16, [local, sliced<0>]>, %b: !coco.tensor<32xf16, [local, replicated]>) -> !coco.tensor<4x8x32xf16, [local, replicated]> attributes {coco.grid = #coco.grid<[2, ?]>} {
# CHECK-NEXT:   %layer = coco.matmul %x, %w : {{.*}} -> !coco.tensor<4x8x32xf16, [local, local]>
# CHECK-NEXT:   %total = comm.all_reduce sum %layer over [1] : !coco.tensor<4x8x32xf16, [local, local]> -> !coco.tensor<4x8x32xf16, [local, replicated]>
# CHECK-NEXT:   %[[SUM:.*]] = coco.add %total, %b
# CHECK-NEXT:   %out = coco.dropout %[[SUM]], 1.000000e-01 seed 5 : !coco.tensor<4x8x32xf16, [local, replicated]>
# CHECK-NEXT:   %recv = comm.send %out along 0 shift 1 : !coco.tensor<4x8x32xf16, [local, replicated]>
# CHECK-NEXT:   func.return %recv
