// RUN: COCO_ROUNDTRIP
// RUN: coco-opt %s --print-op-generic | coco-opt | filecheck %s
// RUN: coco-opt %s -p coco-split-allreduce | filecheck %s --check-prefix=SPLIT

// A reduction's stated accumulation (`acc`, printed only when given): all_reduce,
// reduce_scatter and reduce, every accumulation type a lowering honours, with `dim` and
// `over` around it. coco-split-allreduce moves it to the reduce_scatter it makes.

func.func @acc(%g: !coco.tensor<64xbf16, local>, %h: !coco.tensor<64xf16, local>,
               %q: !coco.tensor<64xf8E4M3FN, local>, %f: !coco.tensor<64xf32, local>)
    -> (!coco.tensor<64xbf16>, !coco.tensor<64xf16, sliced<0>>, !coco.tensor<64xf8E4M3FN, local>,
        !coco.tensor<64xf32>, !coco.tensor<64xbf16>)
    attributes {coco.grid = #coco.grid<[4]>} {
  %a = comm.all_reduce sum %g acc f32 : !coco.tensor<64xbf16, local> -> !coco.tensor<64xbf16>
  %b = comm.reduce_scatter sum %h dim 0 acc f16 over [0] : !coco.tensor<64xf16, local> -> !coco.tensor<64xf16, sliced<0>>
  %c = comm.reduce max %q root 1 acc bf16 : !coco.tensor<64xf8E4M3FN, local>
  %d = comm.all_reduce prod %f acc f64 : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
  %e = comm.all_reduce sum %g : !coco.tensor<64xbf16, local> -> !coco.tensor<64xbf16>
  func.return %a, %b, %c, %d, %e : !coco.tensor<64xbf16>, !coco.tensor<64xf16, sliced<0>>, !coco.tensor<64xf8E4M3FN, local>, !coco.tensor<64xf32>, !coco.tensor<64xbf16>
}

// CHECK:      %a = comm.all_reduce sum %g acc f32 : !coco.tensor<64xbf16, local> -> !coco.tensor<64xbf16>
// CHECK-NEXT: %b = comm.reduce_scatter sum %h acc f16 over [0] : !coco.tensor<64xf16, local> -> !coco.tensor<64xf16, sliced<0>>
// CHECK-NEXT: %c = comm.reduce max %q root 1 acc bf16 : !coco.tensor<64xf8E4M3FN, local>
// CHECK-NEXT: %d = comm.all_reduce prod %f acc f64 : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32>
// CHECK-NEXT: %e = comm.all_reduce sum %g : !coco.tensor<64xbf16, local> -> !coco.tensor<64xbf16>

// SPLIT:      %a_rs = comm.reduce_scatter sum %g acc f32 : !coco.tensor<64xbf16, local> -> !coco.tensor<64xbf16, sliced<0>>
// SPLIT-NEXT: %a = comm.all_gather %a_rs : !coco.tensor<64xbf16, sliced<0>> -> !coco.tensor<64xbf16>
// SPLIT:      %e_rs = comm.reduce_scatter sum %g : !coco.tensor<64xbf16, local> -> !coco.tensor<64xbf16, sliced<0>>
