// RUN: coco-opt %s --split-input-file -t 'plan{ranks=4}' | filecheck %s
// RUN: coco-opt %s --split-input-file -t 'plan{ranks=2 block=1 max-blocks=3}' | filecheck %s --check-prefix=SMALL

// The unscheduled SGD step: a library all_reduce, one kernel per elementwise op, and a copy
// into the caller's buffer for the update.
func.func @sgd(%g: !coco.tensor<1024xf32, local>, %w: !coco.tensor<1024xf32>, %lr: !coco.tensor<f32>) {
  %g1 = comm.all_reduce sum %g : !coco.tensor<1024xf32, local> -> !coco.tensor<1024xf32>
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<1024xf32> -> !coco.tensor<1024xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<1024xf32>
  coco.update %w, %w1 : !coco.tensor<1024xf32>
  func.return
}
// CHECK-LABEL: plan @sgd on grid [4]
// CHECK-NEXT:    buffer %g : 1024 f32 arg
// CHECK-NEXT:    buffer %w : 1024 f32 arg
// CHECK-NEXT:    buffer %lr : scalar f32 arg
// CHECK:         all_reduce sum %g -> %g1 over [0]
// CHECK-NEXT:    launch k_mul<<<1, 256, 0>>>(%lr, %g1, %d, 0, 1024)
// CHECK-NEXT:    launch k_sub<<<1, 256, 0>>>(%w, %d, %w1, 0, 1024)
// CHECK-NEXT:    copy %w1 -> %w
// CHECK-NEXT:    output w = %w
// SMALL-LABEL: plan @sgd on grid [2]
// SMALL:         launch k_mul<<<3, 1, 0>>>

// -----

// A fused all_reduce: one kernel reads the reduce_scatter input from its peers (symmetric),
// updates the sliced state in place, publishes its piece of the gathered weights in its own
// symmetric buffer (a staging copy sized to the piece) and pulls the peers' pieces (at the
// offsets of the table) straight into the updated argument: no copy after the kernel.
func.func @fused(%g: !coco.tensor<64xf16, local>, %w: !coco.tensor<64xf32>, %m: !coco.tensor<64xf32, sliced<0>>) {
  %r = comm.fused all_reduce -> !coco.tensor<64xf32> {
    %rs = comm.reduce_scatter sum %g : !coco.tensor<64xf16, local> -> !coco.tensor<64xf16, sliced<0>>
    %gf = coco.cast %rs : !coco.tensor<64xf16, sliced<0>> -> !coco.tensor<64xf32, sliced<0>>
    %m1 = coco.add %m, %gf : !coco.tensor<64xf32, sliced<0>>
    coco.update %m, %m1 : !coco.tensor<64xf32, sliced<0>>
    %ws = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
    %w1 = coco.sub %ws, %m1 : !coco.tensor<64xf32, sliced<0>>
    %w2 = comm.all_gather %w1 : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    coco.update %w, %w2 : !coco.tensor<64xf32>
    comm.yield %w2 : !coco.tensor<64xf32>
  }
  func.return
}
// CHECK-LABEL: plan @fused on grid [4]
// CHECK-NEXT:    buffer %g : 64 f16 arg symmetric
// CHECK-NEXT:    buffer %w : 64 f32 arg
// CHECK-NEXT:    buffer %m : 16 f32 arg
// CHECK-NEXT:    buffer %w2 : 16 f32 temp symmetric
// CHECK-NEXT:    buffer %k_fused_all_reduce_flags : {{[0-9]+}} u32 scratch symmetric
// CHECK-NEXT:    launch k_fused_all_reduce<<<1, 256, 0>>>({{.*}}peers(%g), peers(%w2), [0, 16, 32, 48], %w, peers(%k_fused_all_reduce_flags), epoch(k_fused_all_reduce_flags), me[rank], 4,
// CHECK-NEXT:    output m = %m
// CHECK-NEXT:    output w = %w
// CHECK-NOT:     copy
// CHECK-NOT:     all_reduce
// CHECK-NOT:     reduce_scatter

// -----

// Overlap: the matmul runs in chunks on the compute stream; each chunk's all_reduce waits
// for its event on the communication stream.
func.func @mp(%in: !coco.tensor<8x32xf32, sliced<1>>, %w: !coco.tensor<32x16xf32, sliced<0>>) -> !coco.tensor<8x16xf32> {
  %o = comm.overlap chunks 2 -> !coco.tensor<8x16xf32> {
    %layer = coco.matmul %in, %w : !coco.tensor<8x32xf32, sliced<1>>, !coco.tensor<32x16xf32, sliced<0>> -> !coco.tensor<8x16xf32, local>
    %sum = comm.all_reduce sum %layer : !coco.tensor<8x16xf32, local> -> !coco.tensor<8x16xf32>
    comm.yield %sum : !coco.tensor<8x16xf32>
  }
  func.return %o : !coco.tensor<8x16xf32>
}
// CHECK-LABEL: plan @mp on grid [4]
// CHECK:         matmul %in, %w -> %layer rows [0, 4)
// CHECK-NEXT:    record layer_chunk0
// CHECK-NEXT:    [stream 1] wait layer_chunk0
// CHECK-NEXT:    [stream 1] all_reduce sum %layer -> %sum over [0] rows [0, 4)
// CHECK-NEXT:    matmul %in, %w -> %layer rows [4, 8)
// CHECK-NEXT:    record layer_chunk1
// CHECK-NEXT:    [stream 1] wait layer_chunk1
// CHECK-NEXT:    [stream 1] all_reduce sum %layer -> %sum over [0] rows [4, 8)
// CHECK-NEXT:    [stream 1] record layer_done
// CHECK-NEXT:    wait layer_done
// CHECK-NEXT:    output o = %sum
