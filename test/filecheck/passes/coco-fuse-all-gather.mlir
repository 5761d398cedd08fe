// RUN: coco-opt %s --split-input-file -p coco-fuse-all-gather | filecheck %s
// RUN: coco-opt %s --split-input-file -p 'coco-fuse{mode=all_gather}' | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-fuse | filecheck %s --check-prefix=AUTO
// RUN: coco-opt %s --split-input-file -p coco-fuse-all-gather -t 'plan{ranks=3}' | filecheck %s --check-prefix=PLAN
// RUN: coco-opt %s --split-input-file -p 'coco-schedule{name=fuse-ag}' --verify-equivalence --equivalence-ranks 1,2,3,4 | filecheck %s --check-prefix=SCHED
// RUN: coco-opt %s --split-input-file --verify-diagnostics -p 'coco-fuse-all-gather{ops=nb,ng,n2}' | filecheck %s --check-prefix=EXACT

// FSDP's mixed-precision parameter gather: the cast of the f32 master shard to bf16 (on the
// sender's piece) and the all_gather in one comm.fused all_gather; the gathered weight the
// GEMM reads is stored whole.
// CHECK-LABEL: func.func @fsdp_cast
// CHECK-NEXT:    %wg = comm.fused all_gather -> !coco.tensor<64x32xbf16> {
// CHECK-NEXT:      %wb = coco.cast %w
// CHECK-NEXT:      %wg_1 = comm.all_gather %wb
// CHECK-NEXT:      comm.yield %wg_1
// CHECK-NEXT:    }
// CHECK-NEXT:    %y = coco.matmul %x, %wg
// The greedy coco-fuse leaves all_gathers to the library (mode=all_gather fuses them).
// AUTO-LABEL: func.func @fsdp_cast
// AUTO-NOT:      comm.fused all_gather
// One kernel at 3 ranks (64 rows cut 22, 21, 21): each rank stages its piece once (its own
// send box; the others empty) and pulls every member's whole piece into its rows of %wg.
// PLAN-LABEL: plan @fsdp_cast on grid [3]
// PLAN:         buffer %wb_staged : uneven 22x32|21x32|21x32 bf16 temp symmetric
// PLAN:         launch k_fused_all_gather<<<1, 256, 0>>>(%w, %wg, peers(%wb_staged), [send_box0_0[rank], send_box0_1[rank], 0, 32, send_box1_0[rank], send_box1_1[rank], 0, 32, send_box2_0[rank], send_box2_1[rank], 0, 32], [704, 32, 0, 32, 0, 32, 672, 32, 0, 32, 704, 32, 672, 32, 0, 32, 1376, 32],
// PLAN-NEXT:    matmul %x, %wg -> %y
// SCHED-LABEL: func.func @fsdp_cast
// SCHED:         comm.fused all_gather
func.func @fsdp_cast(%x: !coco.tensor<16x64xbf16, local>, %w: !coco.tensor<64x32xf32, sliced<0>>) -> !coco.tensor<16x32xbf16, local> attributes {coco.grid = #coco.grid<[?]>} {
  %wb = coco.cast %w : !coco.tensor<64x32xf32, sliced<0>> -> !coco.tensor<64x32xbf16, sliced<0>>
  %wg = comm.all_gather %wb : !coco.tensor<64x32xbf16, sliced<0>> -> !coco.tensor<64x32xbf16>
  %y = coco.matmul %x, %wg : !coco.tensor<16x64xbf16, local>, !coco.tensor<64x32xbf16> -> !coco.tensor<16x32xbf16, local>
  func.return %y : !coco.tensor<16x32xbf16, local>
}

// -----

// Consumers join on the receiver's side (a cast back and a scale of the gathered value, in
// its iteration space); a bare all_gather stays the library's in greedy mode.
// CHECK-LABEL: func.func @consumers
// CHECK-NEXT:    %z = comm.fused all_gather -> !coco.tensor<8x4xf32> {
// CHECK-NEXT:      %g = comm.all_gather %a
// CHECK-NEXT:      %c = coco.cast %g
// CHECK-NEXT:      %z_1 = coco.mul %c, %s
// CHECK-NEXT:      comm.yield %z_1
// CHECK-NEXT:    }
// CHECK-NEXT:    %bare = comm.all_gather %b
// SCHED-LABEL: func.func @consumers
// SCHED:         comm.fused all_gather
func.func @consumers(%a: !coco.tensor<8x4xbf16, sliced<0>>, %b: !coco.tensor<8x4xf32, sliced<1>>, %s: !coco.tensor<f32>) -> (!coco.tensor<8x4xf32>, !coco.tensor<8x4xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %g = comm.all_gather %a : !coco.tensor<8x4xbf16, sliced<0>> -> !coco.tensor<8x4xbf16>
  %c = coco.cast %g : !coco.tensor<8x4xbf16> -> !coco.tensor<8x4xf32>
  %z = coco.mul %c, %s : !coco.tensor<8x4xf32>, !coco.tensor<f32> -> !coco.tensor<8x4xf32>
  %bare = comm.all_gather %b : !coco.tensor<8x4xf32, sliced<1>> -> !coco.tensor<8x4xf32>
  func.return %z, %bare : !coco.tensor<8x4xf32>, !coco.tensor<8x4xf32>
}

// -----

// Named all_gathers each make a region; a named set of elementwise ops and two all_gathers
// is refused.
// EXACT-LABEL: // {{-----}}
// EXACT: [fuse-chain] a fused all_gather holds exactly one comm.all_gather and no other exchange; the named ops hold %ng (comm.all_gather), %n2 (comm.all_gather)
func.func @two(%w: !coco.tensor<8x4xf32, sliced<0>>) -> !coco.tensor<8x4xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %nb = coco.neg %w : !coco.tensor<8x4xf32, sliced<0>>
  %ng = comm.all_gather %nb : !coco.tensor<8x4xf32, sliced<0>> -> !coco.tensor<8x4xf32>
  %n1 = coco.slice %ng : !coco.tensor<8x4xf32> -> !coco.tensor<8x4xf32, sliced<0>>
  %n2 = comm.all_gather %n1 : !coco.tensor<8x4xf32, sliced<0>> -> !coco.tensor<8x4xf32>
  func.return %n2 : !coco.tensor<8x4xf32>
}
