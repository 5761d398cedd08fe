# RUN: python %s | filecheck %s
# Python names become SSA names: arguments by their parameter (or declared) name,
# intermediates by the variable that first holds them; literals are typed constants.

from coconet import frontend
from coconet.frontend import (
    F16,
    F32,
    AllReduce,
    Cast,
    Local,
    Replicated,
    Scalar,
    Sqrt,
    Tensor,
    Update,
)


@frontend.program(grid=[None])
def adam_like(
    g: Tensor(F16, [1024], Local),
    w: Tensor(F32, [1024], Replicated),
    lr: Scalar(F32),
    v=Tensor(F32, [1024], Replicated, "second_moment"),
):
    g1 = AllReduce("+", g)
    gf = Cast(F32, g1)
    v1 = 0.999 * v + 0.001 * gf * gf
    Update(v, v1)
    w1 = w - lr * gf / (Sqrt(v1) + 1e-8)
    Update(w, w1)


print(adam_like)

# CHECK:      func.func @adam_like(%g: !coco.tensor<1024xf16, local>, %w: !coco.tensor<1024xf32>, %lr: !coco.tensor<f32>, %second_moment: !coco.tensor<1024xf32>) attributes {coco.grid = #coco.grid<[?]>} {
# CHECK-NEXT:   %g1 = comm.all_reduce sum %g : !coco.tensor<1024xf16, local> -> !coco.tensor<1024xf16>
# CHECK-NEXT:   %gf = coco.cast %g1 : !coco.tensor<1024xf16> -> !coco.tensor<1024xf32>
# CHECK-NEXT:   %[[B2:.*]] = coco.constant 0.999 : !coco.tensor<f32>
# CHECK-NEXT:   %[[T0:.*]] = coco.mul %[[B2]], %second_moment : !coco.tensor<f32>, !coco.tensor<1024xf32> -> !coco.tensor<1024xf32>
# CHECK-NEXT:   %[[C:.*]] = coco.constant 0.001 : !coco.tensor<f32>
# CHECK-NEXT:   %[[T1:.*]] = coco.mul %[[C]], %gf
# CHECK-NEXT:   %[[T2:.*]] = coco.mul %[[T1]], %gf : !coco.tensor<1024xf32>
# CHECK-NEXT:   %v1 = coco.add %[[T0]], %[[T2]] : !coco.tensor<1024xf32>
# CHECK-NEXT:   coco.update %second_moment, %v1 : !coco.tensor<1024xf32>
# CHECK:        %[[EPS:.*]] = coco.constant {{1(\.0)?e-08}} : !coco.tensor<f32>
# CHECK:        %w1 = coco.sub %w, %{{.*}} : !coco.tensor<1024xf32>
# CHECK-NEXT:   coco.update %w, %w1 : !coco.tensor<1024xf32>
# CHECK-NEXT:   func.return
