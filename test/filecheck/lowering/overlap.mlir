// RUN: coco-opt %s --split-input-file -t 'plan{ranks=2}' | filecheck %s
// RUN: not coco-opt %s --split-input-file -t 'plan{ranks=4}' 2>&1 | filecheck %s --check-prefix=FEW

// A reduce_scatter slicing dim 1 (of [B, S, H]) pipelines too: chunk c of each rank's piece is
// a block of rows per member and batch index, so each chunk's matmul computes those rows
// (one row of each member here) before that chunk's reduce_scatter runs on the
// communication stream.
// CHECK-LABEL: plan @rows on grid [2]
// CHECK:         matmul %x, %w -> %y rows [0, 1) [2, 3)
// CHECK-NEXT:    record y_chunk0
// CHECK-NEXT:    [stream 1] wait y_chunk0
// CHECK-NEXT:    [stream 1] reduce_scatter sum %y -> %ys over [0] rows [0, 1)
// CHECK-NEXT:    matmul %x, %w -> %y rows [1, 2) [3, 4)
// CHECK-NEXT:    record y_chunk1
// CHECK-NEXT:    [stream 1] wait y_chunk1
// CHECK-NEXT:    [stream 1] reduce_scatter sum %y -> %ys over [0] rows [1, 2)
// CHECK:         matmul %x, %w -> %y rows [5, 6) [7, 8)
// CHECK:         [stream 1] reduce_scatter sum %y -> %ys over [0] rows [3, 4)
// CHECK-NEXT:    [stream 1] record y_done
// CHECK-NEXT:    wait y_done
// At 4 ranks each piece has two rows: four chunks cannot be cut, and nothing runs
// unpipelined.
// FEW: [overlap-chunks] 4 chunks need at least 4 rows in each rank's piece
func.func @rows(%x: !coco.tensor<2x4x16xf32, sliced<2>>, %w: !coco.tensor<16x8xf32, sliced<0>>) -> !coco.tensor<2x4x8xf32, sliced<1>> attributes {coco.grid = #coco.grid<[?]>} {
  %ys = comm.overlap chunks 4 -> !coco.tensor<2x4x8xf32, sliced<1>> {
    %y = coco.matmul %x, %w : !coco.tensor<2x4x16xf32, sliced<2>>, !coco.tensor<16x8xf32, sliced<0>> -> !coco.tensor<2x4x8xf32, local>
    %ys_1 = comm.reduce_scatter sum %y dim 1 : !coco.tensor<2x4x8xf32, local> -> !coco.tensor<2x4x8xf32, sliced<1>>
    comm.yield %ys_1 : !coco.tensor<2x4x8xf32, sliced<1>>
  }
  func.return %ys : !coco.tensor<2x4x8xf32, sliced<1>>
}

// -----

// The gather form (async tensor parallelism): chunk k+1's all_gather is issued before chunk
// k's matmul, which waits for chunk k's event on the compute stream.
// CHECK-LABEL: plan @gather on grid [2]
// CHECK:         [stream 1] all_gather %x -> %xg over [0] rows [0, 2)
// CHECK-NEXT:    [stream 1] record xg_chunk0
// CHECK-NEXT:    [stream 1] all_gather %x -> %xg over [0] rows [2, 4)
// CHECK-NEXT:    [stream 1] record xg_chunk1
// CHECK-NEXT:    wait xg_chunk0
// CHECK-NEXT:    matmul %xg, %w -> %h rows [0, 2) [4, 6)
// CHECK-NEXT:    [stream 1] all_gather %x -> %xg over [0] rows [4, 6)
// CHECK-NEXT:    [stream 1] record xg_chunk2
// CHECK-NEXT:    wait xg_chunk1
// CHECK-NEXT:    matmul %xg, %w -> %h rows [2, 4) [6, 8)
func.func @gather(%x: !coco.tensor<2x8x16xf32, sliced<1>>, %w: !coco.tensor<16x8xf32, sliced<1>>) -> !coco.tensor<2x8x8xf32, sliced<2>> attributes {coco.grid = #coco.grid<[?]>} {
  %h = comm.overlap chunks 4 -> !coco.tensor<2x8x8xf32, sliced<2>> {
    %xg = comm.all_gather %x : !coco.tensor<2x8x16xf32, sliced<1>> -> !coco.tensor<2x8x16xf32>
    %h_1 = coco.matmul %xg, %w : !coco.tensor<2x8x16xf32>, !coco.tensor<16x8xf32, sliced<1>> -> !coco.tensor<2x8x8xf32, sliced<2>>
    comm.yield %h_1 : !coco.tensor<2x8x8xf32, sliced<2>>
  }
  func.return %h : !coco.tensor<2x8x8xf32, sliced<2>>
}
