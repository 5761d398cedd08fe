// RUN: coco-opt %s -p coco-reorder | filecheck %s
// RUN: not coco-opt %s -p 'coco-reorder{ops=csq,cms}' 2>&1 | filecheck %s --check-prefix=ROWS

// Row-wise ops (coco.reduce_dims) move onto slices only when the gather's slices cut a dim
// they keep: sliced along the tokens, each rank normalizes whole rows of its slice.

func.func @rows_sliced_by_token(%x: !coco.tensor<16x64xf32, local>, %w: !coco.tensor<64xf32>) -> !coco.tensor<16x64xf32> {
  %rs = comm.reduce_scatter sum %x : !coco.tensor<16x64xf32, local> -> !coco.tensor<16x64xf32, sliced<0>>
  %h = comm.all_gather %rs : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x64xf32>
  %sq = coco.mul %h, %h : !coco.tensor<16x64xf32>
  %ms = coco.reduce_dims mean %sq dims [1] keepdims : !coco.tensor<16x64xf32> -> !coco.tensor<16x1xf32>
  %r = coco.rsqrt %ms : !coco.tensor<16x1xf32>
  %n = coco.mul %h, %r : !coco.tensor<16x64xf32>, !coco.tensor<16x1xf32> -> !coco.tensor<16x64xf32>
  %y = coco.mul %n, %w : !coco.tensor<16x64xf32>, !coco.tensor<64xf32> -> !coco.tensor<16x64xf32>
  func.return %y : !coco.tensor<16x64xf32>
}

// CHECK-LABEL: func.func @rows_sliced_by_token(
// CHECK-NEXT:    %rs = comm.reduce_scatter sum %x : !coco.tensor<16x64xf32, local> -> !coco.tensor<16x64xf32, sliced<0>>{{$}}
// CHECK-NEXT:    %sq_s = coco.mul %rs, %rs : !coco.tensor<16x64xf32, sliced<0>>{{$}}
// CHECK-NEXT:    %ms_s = coco.reduce_dims mean %sq_s dims [1] keepdims : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x1xf32, sliced<0>>{{$}}
// CHECK-NEXT:    %r_s = coco.rsqrt %ms_s : !coco.tensor<16x1xf32, sliced<0>>{{$}}
// CHECK-NEXT:    %n_s = coco.mul %rs, %r_s : !coco.tensor<16x64xf32, sliced<0>>, !coco.tensor<16x1xf32, sliced<0>> -> !coco.tensor<16x64xf32, sliced<0>>{{$}}
// CHECK-NEXT:    %y_s = coco.mul %n_s, %w : !coco.tensor<16x64xf32, sliced<0>>, !coco.tensor<64xf32> -> !coco.tensor<16x64xf32, sliced<0>>{{$}}
// CHECK-NEXT:    %y = comm.all_gather %y_s : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x64xf32>{{$}}
// CHECK-NEXT:    func.return %y : !coco.tensor<16x64xf32>{{$}}

// Sliced along the reduced (hidden) dim, a rank would see part rows: greedy reorder moves
// the elementwise op, re-gathers its value for the row reduction, which stays; naming the
// reduction is refused with the rule.

func.func @rows_sliced_by_hidden(%x: !coco.tensor<16x64xf32, local>) -> !coco.tensor<16x1xf32> {
  %crs = comm.reduce_scatter sum %x dim 1 : !coco.tensor<16x64xf32, local> -> !coco.tensor<16x64xf32, sliced<1>>
  %ch = comm.all_gather %crs : !coco.tensor<16x64xf32, sliced<1>> -> !coco.tensor<16x64xf32>
  %csq = coco.mul %ch, %ch : !coco.tensor<16x64xf32>
  %cms = coco.reduce_dims mean %csq dims [1] keepdims : !coco.tensor<16x64xf32> -> !coco.tensor<16x1xf32>
  func.return %cms : !coco.tensor<16x1xf32>
}

// CHECK-LABEL: func.func @rows_sliced_by_hidden(
// CHECK-NEXT:    %crs = comm.reduce_scatter sum %x dim 1 : !coco.tensor<16x64xf32, local> -> !coco.tensor<16x64xf32, sliced<1>>{{$}}
// CHECK-NEXT:    %csq_s = coco.mul %crs, %crs : !coco.tensor<16x64xf32, sliced<1>>{{$}}
// CHECK-NEXT:    %csq = comm.all_gather %csq_s : !coco.tensor<16x64xf32, sliced<1>> -> !coco.tensor<16x64xf32>{{$}}
// CHECK-NEXT:    %cms = coco.reduce_dims mean %csq dims [1] keepdims : !coco.tensor<16x64xf32> -> !coco.tensor<16x1xf32>{{$}}

// ROWS: [reorder-row-reduction] %cms (coco.reduce_dims) reduces dim 1, which the slices of %ch (comm.all_gather) cut (grid axis 0): on slices it would see part rows only; reorder moves a row-wise op onto slices of the dims it keeps (split the all_reduce along another dim)
