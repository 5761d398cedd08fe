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

// -----

// The gather form on the right operand (FSDP's parameter all_gather): chunk k of each rank's
// rows of the weight is a run of the reduction dim; its matmul multiplies those rows by the
// same columns of x and sums into y. A bf16 y sums in an f32 accumulator the last chunk
// rounds into y, once.
// CHECK-LABEL: plan @fsdp on grid [2]
// CHECK:         buffer %y_acc : 16x32 f32 scratch
// CHECK:         [stream 1] all_gather %w -> %wg over [0] rows [0, 16)
// CHECK-NEXT:    [stream 1] record wg_chunk0
// CHECK-NEXT:    [stream 1] all_gather %w -> %wg over [0] rows [16, 32)
// CHECK-NEXT:    [stream 1] record wg_chunk1
// CHECK-NEXT:    wait wg_chunk0
// CHECK-NEXT:    matmul %x, %wg -> %y k [0, 16) [32, 48) in %y_acc
// CHECK-NEXT:    wait wg_chunk1
// CHECK-NEXT:    matmul %x, %wg -> %y k [16, 32) [48, 64) accumulate in %y_acc final
func.func @fsdp(%x: !coco.tensor<16x64xbf16, local>, %w: !coco.tensor<64x32xbf16, sliced<0>>) -> !coco.tensor<16x32xbf16, local> attributes {coco.grid = #coco.grid<[?]>} {
  %y = comm.overlap chunks 2 -> !coco.tensor<16x32xbf16, local> {
    %wg = comm.all_gather %w : !coco.tensor<64x32xbf16, sliced<0>> -> !coco.tensor<64x32xbf16>
    %y_1 = coco.matmul %x, %wg : !coco.tensor<16x64xbf16, local>, !coco.tensor<64x32xbf16> -> !coco.tensor<16x32xbf16, local>
    comm.yield %y_1 : !coco.tensor<16x32xbf16, local>
  }
  func.return %y : !coco.tensor<16x32xbf16, local>
}

// -----

// A fused all_gather (fuse(ag): the cast of the f32 master shard in the exchange kernel) in the
// gather form: chunk k is the kernel on rows [16k, 16k + 16) of every member's piece (its box
// tables cut to them), on the communication stream, while chunk k-1 multiplies.
// CHECK-LABEL: plan @fused_fsdp on grid [2]
// CHECK:         [stream 1] launch k_fused_all_gather<<<1, 256, 0>>>(%w, %wg, peers(%wb_staged), [send_box_r0to16_0_0[rank],
// CHECK-NEXT:    [stream 1] record wg_chunk0
// CHECK-NEXT:    [stream 1] launch k_fused_all_gather<<<1, 256, 0>>>(%w, %wg, peers(%wb_staged), [send_box_r16to32_0_0[rank],
// CHECK-NEXT:    [stream 1] record wg_chunk1
// CHECK-NEXT:    wait wg_chunk0
// CHECK-NEXT:    matmul %x, %wg -> %y k [0, 16) [32, 48) in %y_acc
// CHECK-NEXT:    wait wg_chunk1
// CHECK-NEXT:    matmul %x, %wg -> %y k [16, 32) [48, 64) accumulate in %y_acc final
func.func @fused_fsdp(%x: !coco.tensor<16x64xbf16, local>, %w: !coco.tensor<64x32xf32, sliced<0>>) -> !coco.tensor<16x32xbf16, local> attributes {coco.grid = #coco.grid<[?]>} {
  %y = comm.overlap chunks 2 -> !coco.tensor<16x32xbf16, local> {
    %wg = comm.fused all_gather -> !coco.tensor<64x32xbf16> {
      %wb = coco.cast %w : !coco.tensor<64x32xf32, sliced<0>> -> !coco.tensor<64x32xbf16, sliced<0>>
      %wg_1 = comm.all_gather %wb : !coco.tensor<64x32xbf16, sliced<0>> -> !coco.tensor<64x32xbf16>
      comm.yield %wg_1 : !coco.tensor<64x32xbf16>
    }
    %y_1 = coco.matmul %x, %wg : !coco.tensor<16x64xbf16, local>, !coco.tensor<64x32xbf16> -> !coco.tensor<16x32xbf16, local>
    comm.yield %y_1 : !coco.tensor<16x32xbf16, local>
  }
  func.return %y : !coco.tensor<16x32xbf16, local>
}

// -----

// The all_to_all forms: each chunk is the all_to_all of a block of dim 2 (C), which it
// neither splits nor gathers, and the matmul of the same rows -- found on each rank's own
// piece (`dim 2 [b, e) of %buffer`). The expert input's reshape keeps the last dim: the
// expert matmul reads the exchanged buffer, chunk c while chunk c+1 is exchanged.
// CHECK-LABEL: plan @experts on grid [2]
// CHECK:         matmul %d, %t -> %buf dim 2 [0, 2) of %buf
// CHECK-NEXT:    record buf_chunk0
// CHECK-NEXT:    [stream 1] wait buf_chunk0
// CHECK-NEXT:    [stream 1] all_to_all %buf -> %ein over [0] dim 2 [0, 2)
// CHECK-NEXT:    matmul %d, %t -> %buf dim 2 [2, 4) of %buf
// CHECK-NEXT:    record buf_chunk1
// CHECK-NEXT:    [stream 1] wait buf_chunk1
// CHECK-NEXT:    [stream 1] all_to_all %buf -> %ein over [0] dim 2 [2, 4)
// CHECK-NEXT:    [stream 1] record buf_done
// CHECK-NEXT:    wait buf_done
// CHECK-NEXT:    [stream 1] all_to_all %buf2 -> %ein2 over [0] dim 2 [0, 2)
// CHECK-NEXT:    [stream 1] record ein2_chunk0
// CHECK-NEXT:    [stream 1] all_to_all %buf2 -> %ein2 over [0] dim 2 [2, 4)
// CHECK-NEXT:    [stream 1] record ein2_chunk1
// CHECK-NEXT:    wait ein2_chunk0
// CHECK-NEXT:    matmul %ein2, %w1 -> %up dim 2 [0, 2) of %ein2
// CHECK-NEXT:    wait ein2_chunk1
// CHECK-NEXT:    matmul %ein2, %w1 -> %up dim 2 [2, 4) of %ein2
func.func @experts(%d: !coco.tensor<4x4x4x8xf32, sliced<1>>, %t: !coco.tensor<4x4x8x8xf32, sliced<1>>, %buf2: !coco.tensor<4x4x4x8xf32, sliced<1>>, %w1: !coco.tensor<4x8x8xf32, sliced<0>>) -> (!coco.tensor<4x4x4x8xf32, sliced<0>>, !coco.tensor<4x16x8xf32, sliced<0>>) attributes {coco.grid = #coco.grid<[?]>} {
  %ein = comm.overlap chunks 2 dim 2 -> !coco.tensor<4x4x4x8xf32, sliced<0>> {
    %buf = coco.matmul %d, %t : !coco.tensor<4x4x4x8xf32, sliced<1>>, !coco.tensor<4x4x8x8xf32, sliced<1>> -> !coco.tensor<4x4x4x8xf32, sliced<1>>
    %ein_1 = comm.all_to_all %buf : !coco.tensor<4x4x4x8xf32, sliced<1>> -> !coco.tensor<4x4x4x8xf32, sliced<0>>
    comm.yield %ein_1 : !coco.tensor<4x4x4x8xf32, sliced<0>>
  }
  %up = comm.overlap chunks 2 dim 2 -> !coco.tensor<4x16x8xf32, sliced<0>> {
    %ein2 = comm.all_to_all %buf2 : !coco.tensor<4x4x4x8xf32, sliced<1>> -> !coco.tensor<4x4x4x8xf32, sliced<0>>
    %r = coco.reshape %ein2 : !coco.tensor<4x4x4x8xf32, sliced<0>> -> !coco.tensor<4x16x8xf32, sliced<0>>
    %up_1 = coco.matmul %r, %w1 : !coco.tensor<4x16x8xf32, sliced<0>>, !coco.tensor<4x8x8xf32, sliced<0>> -> !coco.tensor<4x16x8xf32, sliced<0>>
    comm.yield %up_1 : !coco.tensor<4x16x8xf32, sliced<0>>
  }
  func.return %ein, %up : !coco.tensor<4x4x4x8xf32, sliced<0>>, !coco.tensor<4x16x8xf32, sliced<0>>
}
