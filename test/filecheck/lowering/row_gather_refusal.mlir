// RUN: not coco-opt %s -t 'plan{ranks=2}' 2>&1 | filecheck %s

// A fused row kernel (RMSNorm's) that gathers a row value (its mean square, one per row)
// inside the region: refused with the rule, not a lowering failure.

func.func @rowstat(%x: !coco.tensor<6x40xf32, local>, %res: !coco.tensor<6x40xf32>, %stat: !coco.tensor<6x1xf32>) -> !coco.tensor<6x40xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %y, %s = comm.fused all_reduce -> !coco.tensor<6x40xf32>, !coco.tensor<6x1xf32> {
  %rs = comm.reduce_scatter sum %x : !coco.tensor<6x40xf32, local> -> !coco.tensor<6x40xf32, sliced<0>>
  %res_s = coco.slice %res : !coco.tensor<6x40xf32> -> !coco.tensor<6x40xf32, sliced<0>>
  %t = coco.add %rs, %res_s : !coco.tensor<6x40xf32, sliced<0>>
  %h = comm.all_gather %t : !coco.tensor<6x40xf32, sliced<0>> -> !coco.tensor<6x40xf32>
  %sq = coco.mul %t, %t : !coco.tensor<6x40xf32, sliced<0>>
  %ms = coco.reduce_dims mean %sq dims [1] keepdims : !coco.tensor<6x40xf32, sliced<0>> -> !coco.tensor<6x1xf32, sliced<0>>
  %ms_g = comm.all_gather %ms : !coco.tensor<6x1xf32, sliced<0>> -> !coco.tensor<6x1xf32>
  %eps = coco.constant 1.0e-06 : !coco.tensor<f32>
  %d = coco.add %ms, %eps : !coco.tensor<6x1xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<6x1xf32, sliced<0>>
  %r = coco.rsqrt %d : !coco.tensor<6x1xf32, sliced<0>>
  %y_s = coco.mul %t, %r : !coco.tensor<6x40xf32, sliced<0>>, !coco.tensor<6x1xf32, sliced<0>> -> !coco.tensor<6x40xf32, sliced<0>>
  %y = comm.all_gather %y_s : !coco.tensor<6x40xf32, sliced<0>> -> !coco.tensor<6x40xf32>
  coco.update %res, %h : !coco.tensor<6x40xf32>
  coco.update %stat, %ms_g : !coco.tensor<6x1xf32>
  comm.yield %y, %ms_g : !coco.tensor<6x40xf32>, !coco.tensor<6x1xf32>
  }
  func.return %y : !coco.tensor<6x40xf32>
}

// CHECK: coco-opt: error: [lower-fused-rows] the all_gather of %ms (!coco.tensor<6x1xf32, sliced<0>>) in a fused row kernel gathers one value per row, not the rows' elements; gather it outside the fused region
