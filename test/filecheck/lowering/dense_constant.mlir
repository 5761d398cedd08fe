// RUN: coco-opt %s -p 'coco-split-allreduce,coco-reorder,coco-as-slice,coco-fuse' -t 'cuda{ranks=2}' | filecheck %s

// A dense constant's values are a static array in the kernel that computes it, rounded to
// the element type (0.1 in f32; inf as 1/0), and a slice of it (the reorder's, for this
// rank's rows) reads the array at this rank's offset: the fused kernel's base parameter.

func.func @bias_rows(%x: !coco.tensor<4x3xf32, local>) -> !coco.tensor<4x3xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %s = comm.all_reduce sum %x : !coco.tensor<4x3xf32, local> -> !coco.tensor<4x3xf32>
  %bias = coco.constant dense<[[0.1, 2.0, inf], [1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]> : !coco.tensor<4x3xf32>
  %y = coco.add %s, %bias : !coco.tensor<4x3xf32>
  func.return %y : !coco.tensor<4x3xf32>
}

// CHECK:      COCO_KERNEL(k_fused_all_reduce,
// CHECK:        coco_i64 bias_base,
// CHECK:        static const float bias_values[12] = {
// CHECK-NEXT:       0x1.99999a0000000p-4f, 0x1.0000000000000p+1f, 1.0f / 0.0f, 0x1.0000000000000p+0f, 0x1.0000000000000p+1f, 0x1.8000000000000p+1f, 0x1.0000000000000p+2f, 0x1.4000000000000p+2f,
// CHECK-NEXT:       0x1.8000000000000p+2f, 0x1.c000000000000p+2f, 0x1.0000000000000p+3f, 0x1.2000000000000p+3f
// CHECK-NEXT:   };
// CHECK:        const float bias = bias_values[bias_base + i];  // coco.constant %bias
// CHECK:        const float bias_s = bias;  // coco.slice %bias_s
