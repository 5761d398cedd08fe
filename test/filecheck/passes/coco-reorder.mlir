// RUN: coco-opt %s --split-input-file -p coco-reorder | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-diagnostics | filecheck %s --check-prefix=SCRIPT

// Greedy mode (CHECK) runs on every chunk. The SCRIPT run applies each chunk's own
// `coco.schedule` (coco-schedule without a name: the chunk names its targets, as a transform
// script names its handles) and prints each refusal at the op it is about:
// `FILE:LINE:COL: [rule] message`, its line pinned by `[[# @LINE + 1]]`.

// The script moves exactly @state's %gm (named computations); greedy mode ignores it.
module attributes {coco.schedule = "coco-reorder{ops=gm}"} {

// SGD after split: the update computes on slices; %w is read through a slice; the new
// all_gather of the moved %w1 takes the name %w1 and feeds the update.
// CHECK-LABEL: func.func @sgd
// CHECK-NEXT:    %g1_rs = comm.reduce_scatter sum %g
// CHECK-NEXT:    %d_s = coco.mul %lr, %g1_rs : !coco.tensor<f32>, !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32, sliced<0>>
// CHECK-NEXT:    %w_s = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
// CHECK-NEXT:    %w1_s = coco.sub %w_s, %d_s : !coco.tensor<64xf32, sliced<0>>
// CHECK-NEXT:    %w1 = comm.all_gather %w1_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
// CHECK-NEXT:    coco.update %w, %w1 : !coco.tensor<64xf32>
// CHECK-NEXT:    func.return
func.func @sgd(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>, %lr: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %g1_rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
  %g1 = comm.all_gather %g1_rs : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<64xf32>
  coco.update %w, %w1 : !coco.tensor<64xf32>
  func.return
}

// Optimizer state: `beta * %m` reads no gathered value but feeds only moved ops, so it is
// pulled onto the slice too, and %m is read only through a slice (what coco-as-slice needs).
// Named computations (EXACT) move exactly those ops: %other stays and reads the gather.
// CHECK-LABEL: func.func @state
// CHECK:         %m_s = coco.slice %m : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
// CHECK-NEXT:    %mb_s = coco.mul %b, %m_s
// CHECK-NEXT:    %gm_s = coco.add %mb_s, %gx_rs : !coco.tensor<64xf32, sliced<0>>
// CHECK-NEXT:    %gm = comm.all_gather %gm_s
// CHECK-NEXT:    coco.update %m, %gm
// CHECK-NEXT:    %other_s = coco.exp %gx_rs : !coco.tensor<64xf32, sliced<0>>
// CHECK-NEXT:    %other = comm.all_gather %other_s
// CHECK-NEXT:    %lone = coco.exp %b
// CHECK-NEXT:    func.return %other
// SCRIPT-LABEL: func.func @state
// SCRIPT:        %gx = comm.all_gather %gx_rs
// SCRIPT:        %gm_s = coco.add %mb_s, %gx_rs
// SCRIPT:        %other = coco.exp %gx : !coco.tensor<64xf32>
func.func @state(%g: !coco.tensor<64xf32, local>, %m: !coco.tensor<64xf32>, %b: !coco.tensor<f32>) -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %gx_rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
  %gx = comm.all_gather %gx_rs : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
  %mb = coco.mul %b, %m : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %gm = coco.add %mb, %gx : !coco.tensor<64xf32>
  coco.update %m, %gm : !coco.tensor<64xf32>
  %other = coco.exp %gx : !coco.tensor<64xf32>
  %lone = coco.exp %b : !coco.tensor<f32>
  func.return %other : !coco.tensor<64xf32>
}

// Reductions of moved values become partial reductions + all_reduce; norm becomes
// sqrt(all_reduce(sum(x * x))). Scalar arithmetic on their results is left alone.
// CHECK-LABEL: func.func @norms
// CHECK-NEXT:    %y_s = coco.mul %x, %x : !coco.tensor<32x4xf32, sliced<1>>
// CHECK-NEXT:    %n_sq = coco.mul %y_s, %y_s : !coco.tensor<32x4xf32, sliced<1>>
// CHECK-NEXT:    %n_part = coco.reduce sum %n_sq : !coco.tensor<32x4xf32, sliced<1>> -> !coco.tensor<f32, local>
// CHECK-NEXT:    %n_sumsq = comm.all_reduce sum %n_part : !coco.tensor<f32, local> -> !coco.tensor<f32>
// CHECK-NEXT:    %n = coco.sqrt %n_sumsq : !coco.tensor<f32>
// CHECK-NEXT:    %top_part = coco.reduce max %y_s : !coco.tensor<32x4xf32, sliced<1>> -> !coco.tensor<f32, local>
// CHECK-NEXT:    %top = comm.all_reduce max %top_part : !coco.tensor<f32, local> -> !coco.tensor<f32>
// CHECK-NEXT:    %t = coco.div %n, %top : !coco.tensor<f32>
// CHECK-NEXT:    %z_s = coco.mul %t, %y_s : !coco.tensor<f32>, !coco.tensor<32x4xf32, sliced<1>> -> !coco.tensor<32x4xf32, sliced<1>>
// CHECK-NEXT:    %z = comm.all_gather %z_s
// CHECK-NEXT:    func.return %z
func.func @norms(%x: !coco.tensor<32x4xf32, sliced<1>>) -> !coco.tensor<32x4xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %xg = comm.all_gather %x : !coco.tensor<32x4xf32, sliced<1>> -> !coco.tensor<32x4xf32>
  %y = coco.mul %xg, %xg : !coco.tensor<32x4xf32>
  %n = coco.reduce norm %y : !coco.tensor<32x4xf32> -> !coco.tensor<f32>
  %top = coco.reduce max %y : !coco.tensor<32x4xf32> -> !coco.tensor<f32>
  %t = coco.div %n, %top : !coco.tensor<f32>
  %z = coco.mul %t, %y : !coco.tensor<f32>, !coco.tensor<32x4xf32> -> !coco.tensor<32x4xf32>
  func.return %z : !coco.tensor<32x4xf32>
}

// The same in f16: a sum's and a norm's partials are carried in f32 (an exact widening),
// all-reduced in f32 and cast back once -- rounding each rank's partial to f16 moved the total
// by an f16 ulp where the program rounds its sum once. max stays in f16 (exact in any type).
// CHECK-LABEL: func.func @narrow_norms
// CHECK-NEXT:    %y_s = coco.mul %x, %x : !coco.tensor<32x4xf16, sliced<1>>
// CHECK-NEXT:    %n_wide = coco.cast %y_s : !coco.tensor<32x4xf16, sliced<1>> -> !coco.tensor<32x4xf32, sliced<1>>
// CHECK-NEXT:    %n_sq = coco.mul %n_wide, %n_wide : !coco.tensor<32x4xf32, sliced<1>>
// CHECK-NEXT:    %n_part = coco.reduce sum %n_sq : !coco.tensor<32x4xf32, sliced<1>> -> !coco.tensor<f32, local>
// CHECK-NEXT:    %n_sumsq = comm.all_reduce sum %n_part : !coco.tensor<f32, local> -> !coco.tensor<f32>
// CHECK-NEXT:    %n_root = coco.sqrt %n_sumsq : !coco.tensor<f32>
// CHECK-NEXT:    %n = coco.cast %n_root : !coco.tensor<f32> -> !coco.tensor<f16>
// CHECK-NEXT:    %s_wide = coco.cast %y_s : !coco.tensor<32x4xf16, sliced<1>> -> !coco.tensor<32x4xf32, sliced<1>>
// CHECK-NEXT:    %s_part = coco.reduce sum %s_wide : !coco.tensor<32x4xf32, sliced<1>> -> !coco.tensor<f32, local>
// CHECK-NEXT:    %s_total = comm.all_reduce sum %s_part : !coco.tensor<f32, local> -> !coco.tensor<f32>
// CHECK-NEXT:    %s = coco.cast %s_total : !coco.tensor<f32> -> !coco.tensor<f16>
// CHECK-NEXT:    %top_part = coco.reduce max %y_s : !coco.tensor<32x4xf16, sliced<1>> -> !coco.tensor<f16, local>
func.func @narrow_norms(%x: !coco.tensor<32x4xf16, sliced<1>>) -> !coco.tensor<32x4xf16> attributes {coco.grid = #coco.grid<[?]>} {
  %xg = comm.all_gather %x : !coco.tensor<32x4xf16, sliced<1>> -> !coco.tensor<32x4xf16>
  %y = coco.mul %xg, %xg : !coco.tensor<32x4xf16>
  %n = coco.reduce norm %y : !coco.tensor<32x4xf16> -> !coco.tensor<f16>
  %s = coco.reduce sum %y : !coco.tensor<32x4xf16> -> !coco.tensor<f16>
  %top = coco.reduce max %y : !coco.tensor<32x4xf16> -> !coco.tensor<f16>
  %t = coco.div %n, %top : !coco.tensor<f16>
  %u = coco.add %t, %s : !coco.tensor<f16>
  %z = coco.mul %u, %y : !coco.tensor<f16>, !coco.tensor<32x4xf16> -> !coco.tensor<32x4xf16>
  func.return %z : !coco.tensor<32x4xf16>
}

// Model-parallel tail on a [?] grid, sliced on dim 2: the bias [32] is sliced on its dim 0,
// the residual on dim 2; dropout moves (its mask is keyed on global indices).
// CHECK-LABEL: func.func @mp
// CHECK-NEXT:    %b_s = coco.slice %b : !coco.tensor<32xf32> -> !coco.tensor<32xf32, sliced<0>>
// CHECK-NEXT:    %sb_s = coco.add %s, %b_s : !coco.tensor<2x8x32xf32, sliced<2>>, !coco.tensor<32xf32, sliced<0>> -> !coco.tensor<2x8x32xf32, sliced<2>>
// CHECK-NEXT:    %dr_s = coco.dropout %sb_s, 1.000000e-01 seed 7 : !coco.tensor<2x8x32xf32, sliced<2>>
// CHECK-NEXT:    %r_s = coco.slice %r : !coco.tensor<2x8x32xf32> -> !coco.tensor<2x8x32xf32, sliced<2>>
// CHECK-NEXT:    %out_s = coco.add %dr_s, %r_s : !coco.tensor<2x8x32xf32, sliced<2>>
// CHECK-NEXT:    %out = comm.all_gather %out_s : !coco.tensor<2x8x32xf32, sliced<2>> -> !coco.tensor<2x8x32xf32>
// CHECK-NEXT:    func.return %out
func.func @mp(%s: !coco.tensor<2x8x32xf32, sliced<2>>, %b: !coco.tensor<32xf32>, %r: !coco.tensor<2x8x32xf32>) -> !coco.tensor<2x8x32xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %sg = comm.all_gather %s : !coco.tensor<2x8x32xf32, sliced<2>> -> !coco.tensor<2x8x32xf32>
  %sb = coco.add %sg, %b : !coco.tensor<2x8x32xf32>, !coco.tensor<32xf32> -> !coco.tensor<2x8x32xf32>
  %dr = coco.dropout %sb, 0.1 seed 7 : !coco.tensor<2x8x32xf32>
  %out = coco.add %dr, %r : !coco.tensor<2x8x32xf32>
  func.return %out : !coco.tensor<2x8x32xf32>
}

// Sliced on dim 0, a [8] bias broadcasts along the sliced dim: it is not sliced. Two
// gathers meet: the slice of the other gather's result folds to its input, and that gather
// goes away. A consumer with a local operand stays and reads the re-gathered value.
// CHECK-LABEL: func.func @bcast
// CHECK-NEXT:    %c_s = coco.add %p, %q : !coco.tensor<4x8xf32, sliced<0>>
// CHECK-NEXT:    %e_s = coco.add %c_s, %bias : !coco.tensor<4x8xf32, sliced<0>>, !coco.tensor<8xf32> -> !coco.tensor<4x8xf32, sliced<0>>
// CHECK-NEXT:    %e = comm.all_gather %e_s
// CHECK-NEXT:    %k = coco.add %e, %loc : !coco.tensor<4x8xf32>, !coco.tensor<4x8xf32, local> -> !coco.tensor<4x8xf32, local>
// CHECK-NEXT:    func.return %k
func.func @bcast(%p: !coco.tensor<4x8xf32, sliced<0>>, %q: !coco.tensor<4x8xf32, sliced<0>>, %bias: !coco.tensor<8xf32>, %loc: !coco.tensor<4x8xf32, local>) -> !coco.tensor<4x8xf32, local> attributes {coco.grid = #coco.grid<[?]>} {
  %pg = comm.all_gather %p : !coco.tensor<4x8xf32, sliced<0>> -> !coco.tensor<4x8xf32>
  %qg = comm.all_gather %q : !coco.tensor<4x8xf32, sliced<0>> -> !coco.tensor<4x8xf32>
  %c = coco.add %pg, %qg : !coco.tensor<4x8xf32>
  %e = coco.add %c, %bias : !coco.tensor<4x8xf32>, !coco.tensor<8xf32> -> !coco.tensor<4x8xf32>
  %k = coco.add %e, %loc : !coco.tensor<4x8xf32>, !coco.tensor<4x8xf32, local> -> !coco.tensor<4x8xf32, local>
  func.return %k : !coco.tensor<4x8xf32, local>
}

// A 2-D grid: the gather spans axis 1; values stay local along the pipeline axis 0.
// CHECK-LABEL: func.func @grid2
// CHECK-NEXT:    %h_s = coco.slice %h : !coco.tensor<4x8xf32, [local, replicated]> -> !coco.tensor<4x8xf32, [local, sliced<1>]>
// CHECK-NEXT:    %o_s = coco.mul %v, %h_s : !coco.tensor<4x8xf32, [local, sliced<1>]>
// CHECK-NEXT:    %o = comm.all_gather %o_s over [1] : !coco.tensor<4x8xf32, [local, sliced<1>]> -> !coco.tensor<4x8xf32, [local, replicated]>
func.func @grid2(%v: !coco.tensor<4x8xf32, [local, sliced<1>]>, %h: !coco.tensor<4x8xf32, [local, replicated]>) -> !coco.tensor<4x8xf32, [local, replicated]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  %vg = comm.all_gather %v over [1] : !coco.tensor<4x8xf32, [local, sliced<1>]> -> !coco.tensor<4x8xf32, [local, replicated]>
  %o = coco.mul %vg, %h : !coco.tensor<4x8xf32, [local, replicated]>
  func.return %o : !coco.tensor<4x8xf32, [local, replicated]>
}

// Sites the rules refuse: greedy mode leaves them as they are.
// CHECK-LABEL: func.func @refused
// CHECK-NEXT:    %lx = comm.all_gather %l1
// CHECK-NEXT:    %la = coco.add %lx, %loc
// CHECK-NEXT:    %mx = comm.all_gather %l1
// CHECK-NEXT:    %mm = coco.matmul %mx, %sq
// CHECK-NEXT:    %ex = comm.all_gather %l1
// CHECK-NEXT:    %ea_s = coco.exp %l1
// CHECK-NEXT:    %ea = comm.all_gather %ea_s
// CHECK-NEXT:    %two_s = coco.add %l1, %l1
// CHECK-NEXT:    %two = comm.all_gather %two_s
// CHECK-NEXT:    %stray = coco.exp %sq
// CHECK-NEXT:    %ux = comm.all_gather %l1
// CHECK-NEXT:    coco.update %u, %ux
// CHECK-NEXT:    %cx = comm.all_gather %l1
// CHECK-NEXT:    %ca = coco.add %cx, %c1
// CHECK-NEXT:    %rx = comm.all_gather %l1
// CHECK-NEXT:    %both = comm.fused elementwise
func.func @refused(%l1: !coco.tensor<8x8xf32, sliced<0>>, %loc: !coco.tensor<8x8xf32, local>, %sq: !coco.tensor<8x8xf32>, %u: !coco.tensor<8x8xf32>, %c1: !coco.tensor<8x8xf32, sliced<1>>) -> (!coco.tensor<8x8xf32, local>, !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32, sliced<1>>, !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %lx = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  %la = coco.add %lx, %loc : !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32, local> -> !coco.tensor<8x8xf32, local>
  %mx = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  %mm = coco.matmul %mx, %sq : !coco.tensor<8x8xf32>
  %ex = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  %ea = coco.exp %ex : !coco.tensor<8x8xf32>
  %tx = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  %two = coco.add %ex, %tx : !coco.tensor<8x8xf32>
  %stray = coco.exp %sq : !coco.tensor<8x8xf32>
  %ux = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  coco.update %u, %ux : !coco.tensor<8x8xf32>
  %cx = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  %ca = coco.add %cx, %c1 : !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32, sliced<1>> -> !coco.tensor<8x8xf32, sliced<1>>
  %rx = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  %both = comm.fused elementwise -> !coco.tensor<8x8xf32> {
    %in = coco.add %rx, %ex : !coco.tensor<8x8xf32>
    comm.yield %in : !coco.tensor<8x8xf32>
  }
  func.return %la, %mm, %ea, %stray, %ca, %both, %two : !coco.tensor<8x8xf32, local>, !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32, sliced<1>>, !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32>
}
}

// -----

// The gathered argument is updated before the consumer runs: the consumer must keep reading
// the gathered copy, not the (overwritten) argument; a request to move it is refused.
// CHECK-LABEL: func.func @after_update
// CHECK-NEXT:    %ug = comm.all_gather %ua
// CHECK-NEXT:    coco.update %ua, %un
// CHECK-NEXT:    %uy = coco.neg %ug
module attributes {coco.schedule = "coco-reorder{ops=ug}"} {
func.func @after_update(%ua: !coco.tensor<8xf32, sliced<0>>, %un: !coco.tensor<8xf32, sliced<0>>) -> !coco.tensor<8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %ug = comm.all_gather %ua : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32>
  coco.update %ua, %un : !coco.tensor<8xf32, sliced<0>>
  // SCRIPT: coco-reorder.mlir:[[# @LINE + 1]]:3: [reorder-update] %uy (coco.neg) runs after the update of %ua: reading the slice %ua instead of %ug (comm.all_gather) would read the overwritten buffer
  %uy = coco.neg %ug : !coco.tensor<8xf32>
  func.return %uy : !coco.tensor<8xf32>
}
}

// -----

// Applying the pass twice changes nothing more.
// SCRIPT-LABEL: func.func @sgd_twice
// SCRIPT:         %w1_s = coco.sub %w_s, %d_s
// SCRIPT-NEXT:    %w1 = comm.all_gather %w1_s
// SCRIPT-NEXT:    coco.update %w, %w1
module attributes {coco.schedule = "coco-reorder,coco-reorder"} {
func.func @sgd_twice(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>, %lr: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %g1_rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
  %g1 = comm.all_gather %g1_rs : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<64xf32>
  coco.update %w, %w1 : !coco.tensor<64xf32>
  func.return
}
}

// -----

// The script names the row reduction of @rows_sliced_by_hidden.
module attributes {coco.schedule = "coco-reorder{ops=csq,cms}"} {

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
  // SCRIPT: coco-reorder.mlir:[[# @LINE + 1]]:3: [reorder-row-reduction] %cms (coco.reduce_dims) reduces dim 1, which the slices of %ch (comm.all_gather) cut (grid axis 0): on slices it would see part rows only; reorder moves a row-wise op onto slices of the dims it keeps (split the all_reduce along another dim)
  %cms = coco.reduce_dims mean %csq dims [1] keepdims : !coco.tensor<16x64xf32> -> !coco.tensor<16x1xf32>
  func.return %cms : !coco.tensor<16x1xf32>
}

// CHECK-LABEL: func.func @rows_sliced_by_hidden(
// CHECK-NEXT:    %crs = comm.reduce_scatter sum %x dim 1 : !coco.tensor<16x64xf32, local> -> !coco.tensor<16x64xf32, sliced<1>>{{$}}
// CHECK-NEXT:    %csq_s = coco.mul %crs, %crs : !coco.tensor<16x64xf32, sliced<1>>{{$}}
// CHECK-NEXT:    %csq = comm.all_gather %csq_s : !coco.tensor<16x64xf32, sliced<1>> -> !coco.tensor<16x64xf32>{{$}}
// CHECK-NEXT:    %cms = coco.reduce_dims mean %csq dims [1] keepdims : !coco.tensor<16x64xf32> -> !coco.tensor<16x1xf32>{{$}}
}

// -----

// Requests the rules refuse (greedy mode leaves these sites, as in @refused above).
// A local operand cannot be sliced.
module attributes {coco.schedule = "coco-reorder{ops=lx}"} {
func.func @local(%l1: !coco.tensor<8x8xf32, sliced<0>>, %loc: !coco.tensor<8x8xf32, local>) -> !coco.tensor<8x8xf32, local> attributes {coco.grid = #coco.grid<[?]>} {
  %lx = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  // SCRIPT: coco-reorder.mlir:[[# @LINE + 1]]:3: [reorder-local] %la (coco.add) reads %loc : !coco.tensor<8x8xf32, local>, which is local on grid axis 0: a per-rank value cannot be sliced, so %la (coco.add) cannot move before the all_gather
  %la = coco.add %lx, %loc : !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32, local> -> !coco.tensor<8x8xf32, local>
  func.return %la : !coco.tensor<8x8xf32, local>
}
}

// -----

// A matmul does not commute with an all_gather, named through its gather (ELEMENTWISE) ...
module attributes {coco.schedule = "coco-reorder{ops=mx}"} {
func.func @matmul(%l1: !coco.tensor<8x8xf32, sliced<0>>, %sq: !coco.tensor<8x8xf32>) -> !coco.tensor<8x8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %mx = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  // SCRIPT: coco-reorder.mlir:[[# @LINE + 1]]:3: [reorder-elementwise] %mm (coco.matmul) reads %mx but is not elementwise: only elementwise ops (and sum/max/min/norm reductions) commute with an all_gather
  %mm = coco.matmul %mx, %sq : !coco.tensor<8x8xf32>
  func.return %mm : !coco.tensor<8x8xf32>
}
}

// -----

// ... or named itself, beside another gather (EXACT-ELEMENTWISE).
module attributes {coco.schedule = "coco-reorder{ops=ex,mm}"} {
func.func @matmul_named(%l1: !coco.tensor<8x8xf32, sliced<0>>, %sq: !coco.tensor<8x8xf32>) -> (!coco.tensor<8x8xf32>, !coco.tensor<8x8xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %mx = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  // SCRIPT: coco-reorder.mlir:[[# @LINE + 1]]:3: [reorder-elementwise] %mm (coco.matmul) is not elementwise: only elementwise ops (and sum/max/min/norm reductions) commute with an all_gather
  %mm = coco.matmul %mx, %sq : !coco.tensor<8x8xf32>
  %ex = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  %ea = coco.exp %ex : !coco.tensor<8x8xf32>
  func.return %mm, %ea : !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32>
}
}

// -----

// A named computation must read the gather (or a moved value) or feed only moved ops.
module attributes {coco.schedule = "coco-reorder{ops=gm,lone}"} {
func.func @connected(%gx_rs: !coco.tensor<64xf32, sliced<0>>, %m: !coco.tensor<64xf32>, %b: !coco.tensor<f32>) -> !coco.tensor<f32> attributes {coco.grid = #coco.grid<[?]>} {
  %gx = comm.all_gather %gx_rs : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
  %mb = coco.mul %b, %m : !coco.tensor<f32>, !coco.tensor<64xf32> -> !coco.tensor<64xf32>
  %gm = coco.add %mb, %gx : !coco.tensor<64xf32>
  coco.update %m, %gm : !coco.tensor<64xf32>
  // SCRIPT: coco-reorder.mlir:[[# @LINE + 1]]:3: [reorder-connected] %lone (coco.exp) neither reads %gx (comm.all_gather) (or a moved value) nor feeds only moved ops
  %lone = coco.exp %b : !coco.tensor<f32>
  func.return %lone : !coco.tensor<f32>
}
}

// -----

// Named computations read exactly one all_gather.
module attributes {coco.schedule = "coco-reorder{ops=two}"} {
func.func @two_gathers(%l1: !coco.tensor<8x8xf32, sliced<0>>) -> !coco.tensor<8x8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %ex = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  %tx = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  // SCRIPT: coco-reorder.mlir:[[# @LINE + 1]]:3: [reorder-gather] the named computations must read exactly one all_gather (the one named, if any); they read: %ex (comm.all_gather), %tx (comm.all_gather)
  %two = coco.add %ex, %tx : !coco.tensor<8x8xf32>
  func.return %two : !coco.tensor<8x8xf32>
}
}

// -----

// A named gather needs a consumer to move.
module attributes {coco.schedule = "coco-reorder{ops=ux}"} {
func.func @nothing(%l1: !coco.tensor<8x8xf32, sliced<0>>, %u: !coco.tensor<8x8xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-reorder.mlir:[[# @LINE + 1]]:3: [reorder-nothing] %ux (comm.all_gather) has no elementwise consumer to move before it
  %ux = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  coco.update %u, %ux : !coco.tensor<8x8xf32>
  func.return
}
}

// -----

// On slices, the operands must still combine by the layout rules.
module attributes {coco.schedule = "coco-reorder{ops=cx}"} {
func.func @layouts(%l1: !coco.tensor<8x8xf32, sliced<0>>, %c1: !coco.tensor<8x8xf32, sliced<1>>) -> !coco.tensor<8x8xf32, sliced<1>> attributes {coco.grid = #coco.grid<[?]>} {
  %cx = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  // SCRIPT: coco-reorder.mlir:[[# @LINE + 1]]:3: [reorder-layouts] on slices, the operands of %ca (coco.add) do not combine: [elementwise-layouts] operands #0 : !coco.tensor<8x8xf32, sliced<0>>, #1 : !coco.tensor<8x8xf32, sliced<1>>: layouts sliced<0> and sliced<1> cannot meet in one elementwise op (only replicated combines with another layout)
  %ca = coco.add %cx, %c1 : !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32, sliced<1>> -> !coco.tensor<8x8xf32, sliced<1>>
  func.return %ca : !coco.tensor<8x8xf32, sliced<1>>
}
}

// -----

// Reorder moves ops of the gather's own block, not of a region inside it.
module attributes {coco.schedule = "coco-reorder{ops=rx}"} {
func.func @block(%l1: !coco.tensor<8x8xf32, sliced<0>>) -> !coco.tensor<8x8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %ex = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  // SCRIPT: coco-reorder.mlir:[[# @LINE + 1]]:3: [reorder-block] %rx (comm.all_gather) is read only inside a region (coco.add); reorder moves ops of the gather's own block
  %rx = comm.all_gather %l1 : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  %both = comm.fused elementwise -> !coco.tensor<8x8xf32> {
    %in = coco.add %rx, %ex : !coco.tensor<8x8xf32>
    comm.yield %in : !coco.tensor<8x8xf32>
  }
  func.return %both : !coco.tensor<8x8xf32>
}
}

// -----

// A name must name an op (%w is an argument): refused with no op to point at.
// SCRIPT: {{^}}[reorder-gather] no op named %w in the program
module attributes {coco.schedule = "coco-reorder{ops=w}"} {
func.func @argument(%w: !coco.tensor<8x8xf32>) -> !coco.tensor<8x8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %e = coco.exp %w : !coco.tensor<8x8xf32>
  func.return %e : !coco.tensor<8x8xf32>
}
}

// -----

// A quantize by a scale per 3 x 8 block moves onto the slices of uneven rows: the block
// scale stays replicated (each rank reads the blocks of its rows' global coordinates), a
// scale per row of 1 x 8 blocks is sliced with the rows, and the all_gathers move fp8.
// CHECK-LABEL: func.func @block_scales
// CHECK-NEXT:    %g1_rs = comm.reduce_scatter sum %g : !coco.tensor<18x32xf32, local> -> !coco.tensor<18x32xf32, sliced<0>>
// CHECK-NEXT:    %q_s = coco.quantize %g1_rs, %b : !coco.tensor<18x32xf32, sliced<0>>, !coco.tensor<6x4xf32> -> !coco.tensor<18x32xf8E4M3FN, sliced<0>>
// CHECK-NEXT:    %q = comm.all_gather %q_s : !coco.tensor<18x32xf8E4M3FN, sliced<0>> -> !coco.tensor<18x32xf8E4M3FN>
// CHECK-NEXT:    %r_s = coco.slice %r : !coco.tensor<18x4xf32> -> !coco.tensor<18x4xf32, sliced<0>>
// CHECK-NEXT:    %p_s = coco.quantize %g1_rs, %r_s : !coco.tensor<18x32xf32, sliced<0>>, !coco.tensor<18x4xf32, sliced<0>> -> !coco.tensor<18x32xf8E5M2, sliced<0>>
// CHECK-NEXT:    %p = comm.all_gather %p_s : !coco.tensor<18x32xf8E5M2, sliced<0>> -> !coco.tensor<18x32xf8E5M2>
// SCRIPT-LABEL: func.func @block_scales
// SCRIPT:        %q_s = coco.quantize %g1_rs, %b
module attributes {coco.schedule = "coco-reorder{ops=q,p}"} {
func.func @block_scales(%g: !coco.tensor<18x32xf32, local>, %b: !coco.tensor<6x4xf32>, %r: !coco.tensor<18x4xf32>) -> (!coco.tensor<18x32xf8E4M3FN>, !coco.tensor<18x32xf8E5M2>) attributes {coco.grid = #coco.grid<[?]>} {
  %g1_rs = comm.reduce_scatter sum %g : !coco.tensor<18x32xf32, local> -> !coco.tensor<18x32xf32, sliced<0>>
  %g1 = comm.all_gather %g1_rs : !coco.tensor<18x32xf32, sliced<0>> -> !coco.tensor<18x32xf32>
  %q = coco.quantize %g1, %b : !coco.tensor<18x32xf32>, !coco.tensor<6x4xf32> -> !coco.tensor<18x32xf8E4M3FN>
  %p = coco.quantize %g1, %r : !coco.tensor<18x32xf32>, !coco.tensor<18x4xf32> -> !coco.tensor<18x32xf8E5M2>
  func.return %q, %p : !coco.tensor<18x32xf8E4M3FN>, !coco.tensor<18x32xf8E5M2>
}
}
