// RUN: coco-opt %s --split-input-file -p coco-overlap | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-diagnostics | filecheck %s --check-prefix=SCRIPT

// Greedy mode (the CHECK lines) runs on every chunk. The SCRIPT run applies each chunk's own
// `coco.schedule` (coco-schedule without a name) and prints each refusal at the op it is
// about: `FILE:LINE:COL: [rule] message`.

module attributes {coco.schedule = "coco-overlap{ops=fsum chunks=2}"} {

// A matmul of partial sums and the all_reduce consuming it: one chunked pipeline. An op in
// between that does not depend on the matmul moves above the region.
// CHECK-LABEL: func.func @mp
// CHECK-NEXT:    %e = coco.exp %r
// CHECK-NEXT:    %sum = comm.overlap chunks 4 -> !coco.tensor<2x8x32xf32> {
// CHECK-NEXT:      %layer = coco.matmul %in, %w
// CHECK-NEXT:      %sum_1 = comm.all_reduce sum %layer
// CHECK-NEXT:      comm.yield %sum_1
// CHECK-NEXT:    }
// CHECK-NEXT:    %out = coco.add %sum, %e
func.func @mp(%in: !coco.tensor<2x8x32xf32, sliced<2>>, %w: !coco.tensor<32x32xf32, sliced<0>>, %r: !coco.tensor<2x8x32xf32>) -> !coco.tensor<2x8x32xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %layer = coco.matmul %in, %w : !coco.tensor<2x8x32xf32, sliced<2>>, !coco.tensor<32x32xf32, sliced<0>> -> !coco.tensor<2x8x32xf32, local>
  %e = coco.exp %r : !coco.tensor<2x8x32xf32>
  %sum = comm.all_reduce sum %layer : !coco.tensor<2x8x32xf32, local> -> !coco.tensor<2x8x32xf32>
  %out = coco.add %sum, %e : !coco.tensor<2x8x32xf32>
  func.return %out : !coco.tensor<2x8x32xf32>
}

// The consumer may be a fused all_reduce (CoCoNet's overlap(MatMul, fused RS-C-AG)); here
// named by the fused region's result (the script, with 2 chunks).
// CHECK-LABEL: func.func @fused
// CHECK-NEXT:    %fsum = comm.overlap chunks 4
// SCRIPT-LABEL: func.func @fused
// SCRIPT-NEXT:    %fsum = comm.overlap chunks 2 -> !coco.tensor<16x32xf32> {
// SCRIPT-NEXT:      %fl = coco.matmul %fin, %fw
// SCRIPT-NEXT:      %fsum_1 = comm.fused all_reduce -> !coco.tensor<16x32xf32> {
// SCRIPT-NEXT:        %rs = comm.reduce_scatter sum %fl
// SCRIPT-NEXT:        %rs2 = coco.relu %rs
// SCRIPT-NEXT:        %ag = comm.all_gather %rs2
// SCRIPT-NEXT:        comm.yield %ag
// SCRIPT-NEXT:      }
// SCRIPT-NEXT:      comm.yield %fsum_1
// SCRIPT-NEXT:    }
func.func @fused(%fin: !coco.tensor<16x32xf32, sliced<1>>, %fw: !coco.tensor<32x32xf32, sliced<0>>) -> !coco.tensor<16x32xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %fl = coco.matmul %fin, %fw : !coco.tensor<16x32xf32, sliced<1>>, !coco.tensor<32x32xf32, sliced<0>> -> !coco.tensor<16x32xf32, local>
  %fsum = comm.fused all_reduce -> !coco.tensor<16x32xf32> {
    %rs = comm.reduce_scatter sum %fl : !coco.tensor<16x32xf32, local> -> !coco.tensor<16x32xf32, sliced<0>>
    %rs2 = coco.relu %rs : !coco.tensor<16x32xf32, sliced<0>>
    %ag = comm.all_gather %rs2 : !coco.tensor<16x32xf32, sliced<0>> -> !coco.tensor<16x32xf32>
    comm.yield %ag : !coco.tensor<16x32xf32>
  }
  func.return %fsum : !coco.tensor<16x32xf32>
}

// Refused sites stay as they are in greedy mode.
// CHECK-LABEL: func.func @refused
// CHECK-NEXT:    %l2 = coco.matmul
// CHECK-NEXT:    %s2 = comm.all_reduce sum %l2
// CHECK-NEXT:    %l3 = coco.matmul
// CHECK-NEXT:    %s3 = comm.all_reduce sum %l3
// CHECK-NEXT:    %n3 = coco.neg %l3
// CHECK-NEXT:    %l4 = coco.matmul
// CHECK-NEXT:    %n4 = coco.neg %l4
// CHECK-NEXT:    %s4 = comm.all_reduce sum %n4
// CHECK-NEXT:    %l5 = coco.matmul
// CHECK-NEXT:    %m5 = comm.fused elementwise
func.func @refused(%a: !coco.tensor<6x4xf32, local>, %b: !coco.tensor<4x4xf32>, %z5: !coco.tensor<6x4xf32, local>) -> (!coco.tensor<6x4xf32>, !coco.tensor<6x4xf32>, !coco.tensor<6x4xf32, local>, !coco.tensor<6x4xf32>, !coco.tensor<6x4xf32, local>) attributes {coco.grid = #coco.grid<[?]>} {
  %l2 = coco.matmul %a, %b : !coco.tensor<6x4xf32, local>, !coco.tensor<4x4xf32> -> !coco.tensor<6x4xf32, local>
  %s2 = comm.all_reduce sum %l2 : !coco.tensor<6x4xf32, local> -> !coco.tensor<6x4xf32>
  %l3 = coco.matmul %a, %b : !coco.tensor<6x4xf32, local>, !coco.tensor<4x4xf32> -> !coco.tensor<6x4xf32, local>
  %s3 = comm.all_reduce sum %l3 : !coco.tensor<6x4xf32, local> -> !coco.tensor<6x4xf32>
  %n3 = coco.neg %l3 : !coco.tensor<6x4xf32, local>
  %l4 = coco.matmul %a, %b : !coco.tensor<6x4xf32, local>, !coco.tensor<4x4xf32> -> !coco.tensor<6x4xf32, local>
  %n4 = coco.neg %l4 : !coco.tensor<6x4xf32, local>
  %s4 = comm.all_reduce sum %n4 : !coco.tensor<6x4xf32, local> -> !coco.tensor<6x4xf32>
  %l5 = coco.matmul %a, %b : !coco.tensor<6x4xf32, local>, !coco.tensor<4x4xf32> -> !coco.tensor<6x4xf32, local>
  %m5 = comm.fused elementwise -> !coco.tensor<6x4xf32, local> {
    %y5 = coco.add %l5, %z5 : !coco.tensor<6x4xf32, local>
    comm.yield %y5 : !coco.tensor<6x4xf32, local>
  }
  func.return %s2, %s3, %n3, %s4, %m5 : !coco.tensor<6x4xf32>, !coco.tensor<6x4xf32>, !coco.tensor<6x4xf32, local>, !coco.tensor<6x4xf32>, !coco.tensor<6x4xf32, local>
}
}

// -----

// Requests the rules refuse (greedy mode leaves these sites, as in @refused above).
// The chunks must divide the rows.
module attributes {coco.schedule = "coco-overlap{ops=l2}"} {
func.func @chunks(%a: !coco.tensor<6x4xf32, local>, %b: !coco.tensor<4x4xf32>) -> !coco.tensor<6x4xf32> attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-overlap.mlir:[[# @LINE + 1]]:3: [overlap-chunks] 4 chunks do not divide the 6 rows of %l2 (coco.matmul) (shape [6, 4])
  %l2 = coco.matmul %a, %b : !coco.tensor<6x4xf32, local>, !coco.tensor<4x4xf32> -> !coco.tensor<6x4xf32, local>
  %s2 = comm.all_reduce sum %l2 : !coco.tensor<6x4xf32, local> -> !coco.tensor<6x4xf32>
  func.return %s2 : !coco.tensor<6x4xf32>
}
}

// -----

// The matmul's result goes only to the collective.
module attributes {coco.schedule = "coco-overlap{ops=l3}"} {
func.func @uses(%a: !coco.tensor<6x4xf32, local>, %b: !coco.tensor<4x4xf32>) -> (!coco.tensor<6x4xf32>, !coco.tensor<6x4xf32, local>) attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-overlap.mlir:[[# @LINE + 1]]:3: [overlap-consumer] %l3 (coco.matmul) is read by 2 ops: its result must go only to the overlapped collective
  %l3 = coco.matmul %a, %b : !coco.tensor<6x4xf32, local>, !coco.tensor<4x4xf32> -> !coco.tensor<6x4xf32, local>
  %s3 = comm.all_reduce sum %l3 : !coco.tensor<6x4xf32, local> -> !coco.tensor<6x4xf32>
  %n3 = coco.neg %l3 : !coco.tensor<6x4xf32, local>
  func.return %s3, %n3 : !coco.tensor<6x4xf32>, !coco.tensor<6x4xf32, local>
}
}

// -----

// The consumer is a collective or a fused collective ...
module attributes {coco.schedule = "coco-overlap{ops=l4}"} {
func.func @consumer(%a: !coco.tensor<6x4xf32, local>, %b: !coco.tensor<4x4xf32>) -> !coco.tensor<6x4xf32> attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-overlap.mlir:[[# @LINE + 1]]:3: [overlap-consumer] %l4 (coco.matmul) is consumed by %n4 (coco.neg), which is not a collective or a fused collective
  %l4 = coco.matmul %a, %b : !coco.tensor<6x4xf32, local>, !coco.tensor<4x4xf32> -> !coco.tensor<6x4xf32, local>
  %n4 = coco.neg %l4 : !coco.tensor<6x4xf32, local>
  %s4 = comm.all_reduce sum %n4 : !coco.tensor<6x4xf32, local> -> !coco.tensor<6x4xf32>
  func.return %s4 : !coco.tensor<6x4xf32>
}
}

// -----

// ... not a fused elementwise region.
module attributes {coco.schedule = "coco-overlap{ops=l5}"} {
func.func @fused_elementwise(%a: !coco.tensor<6x4xf32, local>, %b: !coco.tensor<4x4xf32>, %z5: !coco.tensor<6x4xf32, local>) -> !coco.tensor<6x4xf32, local> attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-overlap.mlir:[[# @LINE + 1]]:3: [overlap-consumer] %l5 (coco.matmul) is consumed by %m5 (comm.fused), which is not a collective or a fused collective
  %l5 = coco.matmul %a, %b : !coco.tensor<6x4xf32, local>, !coco.tensor<4x4xf32> -> !coco.tensor<6x4xf32, local>
  %m5 = comm.fused elementwise -> !coco.tensor<6x4xf32, local> {
    %y5 = coco.add %l5, %z5 : !coco.tensor<6x4xf32, local>
    comm.yield %y5 : !coco.tensor<6x4xf32, local>
  }
  func.return %m5 : !coco.tensor<6x4xf32, local>
}
}

// -----

// A named collective reads a matmul's result.
module attributes {coco.schedule = "coco-overlap{ops=s4}"} {
func.func @producer(%a: !coco.tensor<6x4xf32, local>, %b: !coco.tensor<4x4xf32>) -> !coco.tensor<6x4xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %l4 = coco.matmul %a, %b : !coco.tensor<6x4xf32, local>, !coco.tensor<4x4xf32> -> !coco.tensor<6x4xf32, local>
  %n4 = coco.neg %l4 : !coco.tensor<6x4xf32, local>
  // SCRIPT: coco-overlap.mlir:[[# @LINE + 1]]:3: [overlap-producer] %s4 (comm.all_reduce) reads 0 matmul results; overlap needs exactly one
  %s4 = comm.all_reduce sum %n4 : !coco.tensor<6x4xf32, local> -> !coco.tensor<6x4xf32>
  func.return %s4 : !coco.tensor<6x4xf32>
}
}

// -----

// A chunk count below 1: refused with no op to point at.
// SCRIPT: {{^}}[overlap-chunks] chunk count must be positive, got 0
module attributes {coco.schedule = "coco-overlap{chunks=0}"} {
func.func @zero(%a: !coco.tensor<6x4xf32, local>, %b: !coco.tensor<4x4xf32>) -> !coco.tensor<6x4xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %l2 = coco.matmul %a, %b : !coco.tensor<6x4xf32, local>, !coco.tensor<4x4xf32> -> !coco.tensor<6x4xf32, local>
  %s2 = comm.all_reduce sum %l2 : !coco.tensor<6x4xf32, local> -> !coco.tensor<6x4xf32>
  func.return %s2 : !coco.tensor<6x4xf32>
}
}

// -----

// FSDP's parameter all_gather: the gathered weight, one matrix, is the matmul's right operand
// and nothing else reads it -- the gather form on the reduction dim.
// CHECK-LABEL: func.func @fsdp_weight
// CHECK:         %y = comm.overlap chunks 4 -> !coco.tensor<16x32xf32, local> {
// CHECK-NEXT:      %wg = comm.all_gather %w
// CHECK-NEXT:      %y_1 = coco.matmul %x, %wg
// CHECK-NEXT:      comm.yield %y_1
func.func @fsdp_weight(%x: !coco.tensor<16x64xf32, local>, %w: !coco.tensor<64x32xf32, sliced<0>>) -> !coco.tensor<16x32xf32, local> attributes {coco.grid = #coco.grid<[?]>} {
  %wg = comm.all_gather %w : !coco.tensor<64x32xf32, sliced<0>> -> !coco.tensor<64x32xf32>
  %y = coco.matmul %x, %wg : !coco.tensor<16x64xf32, local>, !coco.tensor<64x32xf32> -> !coco.tensor<16x32xf32, local>
  func.return %y : !coco.tensor<16x32xf32, local>
}

// -----

// A gathered weight something else reads too is no pipeline (greedy mode leaves it).
// CHECK-LABEL: func.func @weight_read_twice
// CHECK-NOT:     comm.overlap
module attributes {coco.schedule = "coco-overlap{ops=y2}"} {
func.func @weight_read_twice(%x: !coco.tensor<16x64xf32, local>, %w: !coco.tensor<64x32xf32, sliced<0>>) -> (!coco.tensor<16x32xf32, local>, !coco.tensor<64x32xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-overlap.mlir:[[# @LINE + 1]]:3: [overlap-producer] %wg2 (comm.all_gather) is also read by %n2 (coco.neg): overlap gathers a value only the matmul's right operand reads
  %wg2 = comm.all_gather %w : !coco.tensor<64x32xf32, sliced<0>> -> !coco.tensor<64x32xf32>
  %y2 = coco.matmul %x, %wg2 : !coco.tensor<16x64xf32, local>, !coco.tensor<64x32xf32> -> !coco.tensor<16x32xf32, local>
  %n2 = coco.neg %wg2 : !coco.tensor<64x32xf32>
  func.return %y2, %n2 : !coco.tensor<16x32xf32, local>, !coco.tensor<64x32xf32>
}
}

// -----

// A gathered batch of matrices as the right operand: a chunk of its rows is no run of one
// reduction dim.
// CHECK-LABEL: func.func @batched_weights
// CHECK-NOT:     comm.overlap
module attributes {coco.schedule = "coco-overlap{ops=y3}"} {
func.func @batched_weights(%x: !coco.tensor<2x8x64xf32, local>, %w: !coco.tensor<2x64x32xf32, sliced<1>>) -> !coco.tensor<2x8x32xf32, local> attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-overlap.mlir:[[# @LINE + 1]]:3: [overlap-rows] %wg3 (comm.all_gather) gathers a batch of matrices (!coco.tensor<2x64x32xf32>) for the right operand of %y3 (coco.matmul): overlap chunks the rows of one matrix, a run of the reduction dim
  %wg3 = comm.all_gather %w : !coco.tensor<2x64x32xf32, sliced<1>> -> !coco.tensor<2x64x32xf32>
  %y3 = coco.matmul %x, %wg3 : !coco.tensor<2x8x64xf32, local>, !coco.tensor<2x64x32xf32> -> !coco.tensor<2x8x32xf32, local>
  func.return %y3 : !coco.tensor<2x8x32xf32, local>
}
}
