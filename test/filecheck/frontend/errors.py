# RUN: python %s | filecheck %s
# Mistakes in a Python program are one CocoError naming the line, the rule and the Python
# names involved.

from coconet import frontend
from coconet.core.program import CocoError
from coconet.frontend import F32, AllReduce, Local, Sliced, Tensor, Update


def attempt(fn):
    try:
        frontend.build_program(fn)
    except CocoError as e:
        print("error:", e)


def mixed(grads: Tensor(F32, [16], Local), weights: Tensor(F32, [16], Sliced(0))):
    return grads + weights


attempt(mixed)
# CHECK: error: {{.*}}errors.py:18: cannot build `grads + weights` from 'grads' (!coco.tensor<16xf32, local>), 'weights' (!coco.tensor<16xf32, sliced<0>>):
# CHECK-NEXT: [elementwise-layouts] {{.*}}layouts local and sliced<0> cannot meet


def reduce_slice(shard: Tensor(F32, [16], Sliced(0))):
    return AllReduce("+", shard)


attempt(reduce_slice)
# CHECK: error: {{.*}}cannot build `AllReduce(sum, shard)` from 'shard'
# CHECK-NEXT: [all-reduce-input]


def stale(w: Tensor(F32, [16]), g: Tensor(F32, [16])):
    Update(w, w - g)
    return w * 2


attempt(stale)
# CHECK: error: {{.*}}`w * 2` reads 'w' after Update(w, ...)
