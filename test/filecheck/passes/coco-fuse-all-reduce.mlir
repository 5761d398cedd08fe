// RUN: coco-opt %s --split-input-file -p coco-fuse-all-reduce | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-diagnostics | filecheck %s --check-prefix=SCRIPT

// Greedy mode (the CHECK lines) runs on every chunk. The SCRIPT run applies each chunk's
// own `coco.schedule` (coco-schedule without a name) and prints each refusal at the op it is
// about: `FILE:LINE:COL: [rule] message`. The one-shot form:
// coco-fuse-all-reduce-one-shot.mlir.

// SGD after split + reorder: reduce_scatter, the sliced update and the all_gather become one
// fused all_reduce (CoCoNet's FusedAllReduce); the slice of %w and the update join it.
// CHECK-LABEL: func.func @sgd
// CHECK-NEXT:    comm.fused all_reduce {
// CHECK-NEXT:      %g1_rs = comm.reduce_scatter sum %g
// CHECK-NEXT:      %d_s = coco.mul %lr, %g1_rs
// CHECK-NEXT:      %w_s = coco.slice %w
// CHECK-NEXT:      %w1_s = coco.sub %w_s, %d_s
// CHECK-NEXT:      %w1 = comm.all_gather %w1_s
// CHECK-NEXT:      coco.update %w, %w1
// CHECK-NEXT:      comm.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return
func.func @sgd(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>, %lr: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %g1_rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
  %d_s = coco.mul %lr, %g1_rs : !coco.tensor<f32>, !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32, sliced<0>>
  %w_s = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
  %w1_s = coco.sub %w_s, %d_s : !coco.tensor<64xf32, sliced<0>>
  %w1 = comm.all_gather %w1_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
  coco.update %w, %w1 : !coco.tensor<64xf32>
  func.return
}

// ZeRO-3's step: a chain whose state is kept sliced (no all_gather) and whose every result
// updates that state fuses with its reduce_scatter (one kernel pulls the peers' pieces).
// CHECK-LABEL: func.func @zero
// CHECK-NEXT:    comm.fused all_reduce {
// CHECK-NEXT:      %h_rs = comm.reduce_scatter sum %h
// CHECK-NEXT:      %h2 = coco.mul %h_rs, %h_rs
// CHECK-NEXT:      %h3 = coco.sub %p, %h2
// CHECK-NEXT:      coco.update %p, %h3
// CHECK-NEXT:      comm.yield
func.func @zero(%h: !coco.tensor<64xf32, local>, %p: !coco.tensor<64xf32, sliced<0>>) attributes {coco.grid = #coco.grid<[?]>} {
  %h_rs = comm.reduce_scatter sum %h : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
  %h2 = coco.mul %h_rs, %h_rs : !coco.tensor<64xf32, sliced<0>>
  %h3 = coco.sub %p, %h2 : !coco.tensor<64xf32, sliced<0>>
  coco.update %p, %h3 : !coco.tensor<64xf32, sliced<0>>
  func.return
}
// -----

// Two reduce_scatters meet: the first one's chain takes the combining op and reads the
// second from outside (hoisted above the region); one reduce_scatter per fused all_reduce.
// Named, the chain holds both: refused, with no one op to point at.
// SCRIPT: {{^}}[fuse-chain] a fused all_reduce holds exactly one reduce_scatter; the named ops hold 2
// CHECK-LABEL: func.func @two
// CHECK-NEXT:    %rb = comm.reduce_scatter sum %b
// CHECK-NEXT:    %ccg = comm.fused all_reduce -> !coco.tensor<64xf32> {
// CHECK-NEXT:      %ra = comm.reduce_scatter sum %a
// CHECK-NEXT:      %cc = coco.add %ra, %rb
// CHECK-NEXT:      %ccg_1 = comm.all_gather %cc
// CHECK-NEXT:      comm.yield %ccg_1
module attributes {coco.schedule = "coco-fuse-all-reduce{ops=ra,rb,cc,ccg}"} {
func.func @two(%a: !coco.tensor<64xf32, local>, %b: !coco.tensor<64xf32, local>) -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %ra = comm.reduce_scatter sum %a : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
  %rb = comm.reduce_scatter sum %b : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
  %cc = coco.add %ra, %rb : !coco.tensor<64xf32, sliced<0>>
  %ccg = comm.all_gather %cc : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
  func.return %ccg : !coco.tensor<64xf32>
}
}

// -----

// A chain without an all_gather whose result leaves it (returned) is no fused all_reduce:
// greedy mode leaves it (coco-fuse then fuses its computation as an elementwise kernel);
// named, it is refused.
// CHECK-LABEL: func.func @zero_escapes
// CHECK-NEXT:    %q_rs = comm.reduce_scatter sum %q
// CHECK-NEXT:    %q2 = coco.mul %q_rs, %q_rs
// CHECK-NEXT:    %q3 = coco.sub %r, %q2
module attributes {coco.schedule = "coco-fuse-all-reduce{ops=q_rs}"} {
func.func @zero_escapes(%q: !coco.tensor<64xf32, local>, %r: !coco.tensor<64xf32, sliced<0>>) -> !coco.tensor<64xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-fuse-all-reduce.mlir:[[# @LINE + 1]]:3: [fuse-chain] no all_gather of the chain of %q_rs (comm.reduce_scatter) over its axes: a fused all_reduce needs reduce_scatter, computation and all_gather (or, ZeRO-3's, computation whose every result updates sliced state)
  %q_rs = comm.reduce_scatter sum %q : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
  %q2 = coco.mul %q_rs, %q_rs : !coco.tensor<64xf32, sliced<0>>
  %q3 = coco.sub %r, %q2 : !coco.tensor<64xf32, sliced<0>>
  func.return %q3 : !coco.tensor<64xf32, sliced<0>>
}
}

// -----

// A targeted fused all_reduce (greedy mode would find the same chain).
// SCRIPT-LABEL: func.func @sgd_targeted
// SCRIPT-NEXT:    comm.fused all_reduce {
// SCRIPT-NEXT:      %g1_rs = comm.reduce_scatter sum %g
module attributes {coco.schedule = "coco-fuse-all-reduce{ops=g1_rs}"} {
func.func @sgd_targeted(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>, %lr: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %g1_rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
  %d_s = coco.mul %lr, %g1_rs : !coco.tensor<f32>, !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32, sliced<0>>
  %w_s = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
  %w1_s = coco.sub %w_s, %d_s : !coco.tensor<64xf32, sliced<0>>
  %w1 = comm.all_gather %w1_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
  coco.update %w, %w1 : !coco.tensor<64xf32>
  func.return
}
}

// -----

// Row-wise ops, with fused all_reduces only (the script).
module attributes {coco.schedule = "coco-fuse-all-reduce"} {

// A fused all_reduce takes the row-wise ops of a slice of whole rows (RMSNorm after the
// reduce_scatter and the residual add): one kernel, a block per row (row_collective.py).

func.func @rmsnorm(%x: !coco.tensor<16x64xf32, local>, %res: !coco.tensor<16x64xf32>, %w: !coco.tensor<64xf32>) -> (!coco.tensor<16x64xf32>, !coco.tensor<16x64xf32>) {
  %rs = comm.reduce_scatter sum %x : !coco.tensor<16x64xf32, local> -> !coco.tensor<16x64xf32, sliced<0>>
  %res_s = coco.slice %res : !coco.tensor<16x64xf32> -> !coco.tensor<16x64xf32, sliced<0>>
  %h_s = coco.add %rs, %res_s : !coco.tensor<16x64xf32, sliced<0>>
  %h = comm.all_gather %h_s : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x64xf32>
  %sq = coco.mul %h_s, %h_s : !coco.tensor<16x64xf32, sliced<0>>
  %ms = coco.reduce_dims mean %sq dims [1] keepdims : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x1xf32, sliced<0>>
  %eps = coco.constant 1.0e-06 : !coco.tensor<f32>
  %d = coco.add %ms, %eps : !coco.tensor<16x1xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<16x1xf32, sliced<0>>
  %r = coco.rsqrt %d : !coco.tensor<16x1xf32, sliced<0>>
  %n = coco.mul %h_s, %r : !coco.tensor<16x64xf32, sliced<0>>, !coco.tensor<16x1xf32, sliced<0>> -> !coco.tensor<16x64xf32, sliced<0>>
  %y_s = coco.mul %n, %w : !coco.tensor<16x64xf32, sliced<0>>, !coco.tensor<64xf32> -> !coco.tensor<16x64xf32, sliced<0>>
  %y = comm.all_gather %y_s : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x64xf32>
  func.return %h, %y : !coco.tensor<16x64xf32>, !coco.tensor<16x64xf32>
}

// SCRIPT-LABEL: func.func @rmsnorm(
// SCRIPT-NEXT:    %h, %y = comm.fused all_reduce -> !coco.tensor<16x64xf32>, !coco.tensor<16x64xf32> {
// SCRIPT-NEXT:      %rs = comm.reduce_scatter sum %x
// SCRIPT-NEXT:      %res_s = coco.slice %res
// SCRIPT-NEXT:      %h_s = coco.add %rs, %res_s
// SCRIPT-NEXT:      %h_1 = comm.all_gather %h_s
// SCRIPT-NEXT:      %sq = coco.mul %h_s, %h_s
// SCRIPT-NEXT:      %ms = coco.reduce_dims mean %sq dims [1] keepdims
// SCRIPT-NEXT:      %eps = coco.constant
// SCRIPT-NEXT:      %d = coco.add %ms, %eps
// SCRIPT-NEXT:      %r = coco.rsqrt %d
// SCRIPT-NEXT:      %n = coco.mul %h_s, %r
// SCRIPT-NEXT:      %y_s = coco.mul %n, %w
// SCRIPT-NEXT:      %y_1 = comm.all_gather %y_s
// SCRIPT-NEXT:      comm.yield %h_1, %y_1
// SCRIPT-NEXT:    }
// SCRIPT-NEXT:    func.return %h, %y

// A full reduction (a norm finished across blocks) and row reductions in one chain: refused.

func.func @rows_and_norm(%nx: !coco.tensor<16x64xf32, local>) -> (!coco.tensor<16x64xf32>, !coco.tensor<f32>) {
  %nrs = comm.reduce_scatter sum %nx : !coco.tensor<16x64xf32, local> -> !coco.tensor<16x64xf32, sliced<0>>
  %nmax = coco.reduce_dims max %nrs dims [1] keepdims : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x1xf32, sliced<0>>
  %nsub = coco.sub %nrs, %nmax : !coco.tensor<16x64xf32, sliced<0>>, !coco.tensor<16x1xf32, sliced<0>> -> !coco.tensor<16x64xf32, sliced<0>>
  %npart = coco.reduce sum %nsub : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<f32, local>
  %ntotal = comm.all_reduce sum %npart : !coco.tensor<f32, local> -> !coco.tensor<f32>
  %ny = comm.all_gather %nsub : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x64xf32>
  func.return %ny, %ntotal : !coco.tensor<16x64xf32>, !coco.tensor<f32>
}

// Greedy fusion leaves it as it is.
// SCRIPT-LABEL: func.func @rows_and_norm(
// SCRIPT-NEXT:    %nrs = comm.reduce_scatter sum %nx
}

// -----

// Named, the chain of @rows_and_norm is refused, with no one op to point at.
// SCRIPT: {{^}}[fuse-chain] a fused all_reduce with row reductions cannot also finish full reductions
module attributes {coco.schedule = "coco-fuse-all-reduce{ops=nrs}"} {
func.func @rows_and_norm_named(%nx: !coco.tensor<16x64xf32, local>) -> (!coco.tensor<16x64xf32>, !coco.tensor<f32>) {
  %nrs = comm.reduce_scatter sum %nx : !coco.tensor<16x64xf32, local> -> !coco.tensor<16x64xf32, sliced<0>>
  %nmax = coco.reduce_dims max %nrs dims [1] keepdims : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x1xf32, sliced<0>>
  %nsub = coco.sub %nrs, %nmax : !coco.tensor<16x64xf32, sliced<0>>, !coco.tensor<16x1xf32, sliced<0>> -> !coco.tensor<16x64xf32, sliced<0>>
  %npart = coco.reduce sum %nsub : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<f32, local>
  %ntotal = comm.all_reduce sum %npart : !coco.tensor<f32, local> -> !coco.tensor<f32>
  %ny = comm.all_gather %nsub : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x64xf32>
  func.return %ny, %ntotal : !coco.tensor<16x64xf32>, !coco.tensor<f32>
}
}

// -----

module attributes {coco.schedule = "coco-fuse-all-reduce{ops=lrs}"} {

// Rows too long for the shared memory a row kernel keeps between its phases fuse too: the
// kernel streams them (test/filecheck/lowering/row_streaming.mlir).

func.func @long_rows(%lx: !coco.tensor<8x16384xf32, local>) -> !coco.tensor<8x16384xf32> {
  %lrs = comm.reduce_scatter sum %lx : !coco.tensor<8x16384xf32, local> -> !coco.tensor<8x16384xf32, sliced<0>>
  %lmean = coco.reduce_dims mean %lrs dims [1] keepdims : !coco.tensor<8x16384xf32, sliced<0>> -> !coco.tensor<8x1xf32, sliced<0>>
  %lc = coco.sub %lrs, %lmean : !coco.tensor<8x16384xf32, sliced<0>>, !coco.tensor<8x1xf32, sliced<0>> -> !coco.tensor<8x16384xf32, sliced<0>>
  %ly = comm.all_gather %lc : !coco.tensor<8x16384xf32, sliced<0>> -> !coco.tensor<8x16384xf32>
  func.return %ly : !coco.tensor<8x16384xf32>
}

// SCRIPT-LABEL: func.func @long_rows(
// SCRIPT-NEXT:    %ly = comm.fused all_reduce -> !coco.tensor<8x16384xf32> {
// SCRIPT-NEXT:      %lrs = comm.reduce_scatter sum %lx
// SCRIPT-NEXT:      %lmean = coco.reduce_dims mean %lrs dims [1] keepdims
// SCRIPT-NEXT:      %lc = coco.sub %lrs, %lmean
// SCRIPT-NEXT:      %ly_1 = comm.all_gather %lc
// SCRIPT-NEXT:      comm.yield %ly_1
}

// -----

// Two chains that meet only in scalar state they update together (a loss scale from a
// found-inf flag over both tensors): ONE region, as chains sharing scalar arithmetic are
// (they used to stay apart, and the shared update refused both: [fuse-chain]).
// CHECK-LABEL: func.func @scalar_state
// CHECK-NEXT:    comm.fused all_reduce {
// CHECK-NEXT:      %ra = comm.reduce_scatter sum %a
// CHECK:           %rb = comm.reduce_scatter sum %b
// CHECK:           %found = coco.max %ma, %mb
// CHECK-NEXT:      %s1 = coco.add %s, %found
// CHECK-NEXT:      coco.update %s, %s1
// CHECK-NEXT:      comm.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return
func.func @scalar_state(%a: !coco.tensor<64xf32, local>, %b: !coco.tensor<32xf32, local>, %wa: !coco.tensor<64xf32>, %wb: !coco.tensor<32xf32>, %s: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %ra = comm.reduce_scatter sum %a : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
  %ma_p = coco.reduce max %ra : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<f32, local>
  %ma = comm.all_reduce max %ma_p : !coco.tensor<f32, local> -> !coco.tensor<f32>
  %wa_s = coco.slice %wa : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
  %ua = coco.mul %ra, %s : !coco.tensor<64xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<64xf32, sliced<0>>
  %wa1_s = coco.sub %wa_s, %ua : !coco.tensor<64xf32, sliced<0>>
  %wa1 = comm.all_gather %wa1_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
  coco.update %wa, %wa1 : !coco.tensor<64xf32>
  %rb = comm.reduce_scatter sum %b : !coco.tensor<32xf32, local> -> !coco.tensor<32xf32, sliced<0>>
  %mb_p = coco.reduce max %rb : !coco.tensor<32xf32, sliced<0>> -> !coco.tensor<f32, local>
  %mb = comm.all_reduce max %mb_p : !coco.tensor<f32, local> -> !coco.tensor<f32>
  %wb_s = coco.slice %wb : !coco.tensor<32xf32> -> !coco.tensor<32xf32, sliced<0>>
  %ub = coco.mul %rb, %s : !coco.tensor<32xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<32xf32, sliced<0>>
  %wb1_s = coco.sub %wb_s, %ub : !coco.tensor<32xf32, sliced<0>>
  %wb1 = comm.all_gather %wb1_s : !coco.tensor<32xf32, sliced<0>> -> !coco.tensor<32xf32>
  coco.update %wb, %wb1 : !coco.tensor<32xf32>
  %found = coco.max %ma, %mb : !coco.tensor<f32>
  %s1 = coco.add %s, %found : !coco.tensor<f32>
  coco.update %s, %s1 : !coco.tensor<f32>
  func.return
}

// -----

// Global-norm clipping over tensors of 8, 4 and 8 elements (a weight, a bias, a weight): each
// tensor's chain takes the norm's scalar arithmetic, and the two 8-element chains each other's
// update computation (it reads the norm, in their space). The two of one space merge first,
// then the 4-element one joins through the scalars: one region with all three reduce_scatters.
// (Merged in program order, the first two were joined through the scalars before the third
// came, whose union with them was not one kernel: %a2_rs stayed outside, read from memory,
// and fuse(rs-c-ag) was refused where the chains are named.)
// CHECK-LABEL: func.func @clip_interleaved
// CHECK-NEXT:    comm.fused all_reduce {
// CHECK-NEXT:      %a0_rs = comm.reduce_scatter sum %g0
// CHECK-NEXT:      %a1_rs = comm.reduce_scatter sum %g1
// CHECK-NEXT:      %a2_rs = comm.reduce_scatter sum %g2
// CHECK:           %c = coco.div %lr, %norm
// CHECK:           coco.update %w0, %u0
// CHECK-NEXT:      coco.update %w1, %u1
// CHECK-NEXT:      coco.update %w2, %u2
// CHECK-NEXT:      comm.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return
module attributes {coco.schedule = "coco-fuse-all-reduce{ops=a0_rs,a1_rs,a2_rs}"} {
func.func @clip_interleaved(%g0: !coco.tensor<8xf32, local>, %g1: !coco.tensor<4xf32, local>, %g2: !coco.tensor<8xf32, local>, %w0: !coco.tensor<8xf32>, %w1: !coco.tensor<4xf32>, %w2: !coco.tensor<8xf32>, %lr: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %a0_rs = comm.reduce_scatter sum %g0 : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32, sliced<0>>
  %a1_rs = comm.reduce_scatter sum %g1 : !coco.tensor<4xf32, local> -> !coco.tensor<4xf32, sliced<0>>
  %a2_rs = comm.reduce_scatter sum %g2 : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32, sliced<0>>
  %q0_s = coco.mul %a0_rs, %a0_rs : !coco.tensor<8xf32, sliced<0>>
  %n0_part = coco.reduce sum %q0_s : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<f32, local>
  %n0 = comm.all_reduce sum %n0_part : !coco.tensor<f32, local> -> !coco.tensor<f32>
  %q1_s = coco.mul %a1_rs, %a1_rs : !coco.tensor<4xf32, sliced<0>>
  %n1_part = coco.reduce sum %q1_s : !coco.tensor<4xf32, sliced<0>> -> !coco.tensor<f32, local>
  %n1 = comm.all_reduce sum %n1_part : !coco.tensor<f32, local> -> !coco.tensor<f32>
  %q2_s = coco.mul %a2_rs, %a2_rs : !coco.tensor<8xf32, sliced<0>>
  %n2_part = coco.reduce sum %q2_s : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<f32, local>
  %n2 = comm.all_reduce sum %n2_part : !coco.tensor<f32, local> -> !coco.tensor<f32>
  %n01 = coco.add %n0, %n1 : !coco.tensor<f32>
  %n = coco.add %n01, %n2 : !coco.tensor<f32>
  %norm = coco.sqrt %n : !coco.tensor<f32>
  %c = coco.div %lr, %norm : !coco.tensor<f32>
  %d0_s = coco.mul %c, %a0_rs : !coco.tensor<f32>, !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32, sliced<0>>
  %w0_s = coco.slice %w0 : !coco.tensor<8xf32> -> !coco.tensor<8xf32, sliced<0>>
  %u0_s = coco.sub %w0_s, %d0_s : !coco.tensor<8xf32, sliced<0>>
  %u0 = comm.all_gather %u0_s : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32>
  %d1_s = coco.mul %c, %a1_rs : !coco.tensor<f32>, !coco.tensor<4xf32, sliced<0>> -> !coco.tensor<4xf32, sliced<0>>
  %w1_s = coco.slice %w1 : !coco.tensor<4xf32> -> !coco.tensor<4xf32, sliced<0>>
  %u1_s = coco.sub %w1_s, %d1_s : !coco.tensor<4xf32, sliced<0>>
  %u1 = comm.all_gather %u1_s : !coco.tensor<4xf32, sliced<0>> -> !coco.tensor<4xf32>
  %d2_s = coco.mul %c, %a2_rs : !coco.tensor<f32>, !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32, sliced<0>>
  %w2_s = coco.slice %w2 : !coco.tensor<8xf32> -> !coco.tensor<8xf32, sliced<0>>
  %u2_s = coco.sub %w2_s, %d2_s : !coco.tensor<8xf32, sliced<0>>
  %u2 = comm.all_gather %u2_s : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32>
  coco.update %w0, %u0 : !coco.tensor<8xf32>
  coco.update %w1, %u1 : !coco.tensor<4xf32>
  coco.update %w2, %u2 : !coco.tensor<8xf32>
  func.return
}
}
