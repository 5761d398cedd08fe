// RUN: coco-opt %s -p coco-reorder | filecheck %s
// RUN: coco-opt %s -p 'coco-reorder{ops=gm}' | filecheck %s --check-prefix=EXACT
// RUN: coco-opt %s -p coco-reorder,coco-reorder | filecheck %s --check-prefix=IDEM
// RUN: not coco-opt %s -p 'coco-reorder{ops=lx}' 2>&1 | filecheck %s --check-prefix=LOCAL
// RUN: not coco-opt %s -p 'coco-reorder{ops=mx}' 2>&1 | filecheck %s --check-prefix=ELEMENTWISE
// RUN: not coco-opt %s -p 'coco-reorder{ops=ex,mm}' 2>&1 | filecheck %s --check-prefix=EXACT-ELEMENTWISE
// RUN: not coco-opt %s -p 'coco-reorder{ops=gm,lone}' 2>&1 | filecheck %s --check-prefix=CONNECTED
// RUN: not coco-opt %s -p 'coco-reorder{ops=two}' 2>&1 | filecheck %s --check-prefix=TWO
// RUN: not coco-opt %s -p 'coco-reorder{ops=ux}' 2>&1 | filecheck %s --check-prefix=NOTHING
// RUN: not coco-opt %s -p 'coco-reorder{ops=cx}' 2>&1 | filecheck %s --check-prefix=LAYOUTS
// RUN: not coco-opt %s -p 'coco-reorder{ops=rx}' 2>&1 | filecheck %s --check-prefix=BLOCK
// RUN: not coco-opt %s -p 'coco-reorder{ops=w}' 2>&1 | filecheck %s --check-prefix=GATHER
// RUN: not coco-opt %s -p 'coco-reorder{ops=ug}' 2>&1 | filecheck %s --check-prefix=UPDATE

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
// EXACT-LABEL: func.func @state
// EXACT:         %gx = comm.all_gather %gx_rs
// EXACT:         %gm_s = coco.add %mb_s, %gx_rs
// EXACT:         %other = coco.exp %gx : !coco.tensor<64xf32>
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
// IDEM-LABEL: func.func @sgd
// IDEM:         %w1_s = coco.sub %w_s, %d_s
// IDEM-NEXT:    %w1 = comm.all_gather %w1_s
// IDEM-NEXT:    coco.update %w, %w1
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

// LOCAL:       coco-opt: error: [reorder-local] %la (coco.add) reads %loc : !coco.tensor<8x8xf32, local>, which is local on grid axis 0: a per-rank value cannot be sliced, so %la (coco.add) cannot move before the all_gather
// LOCAL-NOT:   {{.}}
// ELEMENTWISE: coco-opt: error: [reorder-elementwise] %mm (coco.matmul) reads %mx but is not elementwise: only elementwise ops (and sum/max/min/norm reductions) commute with an all_gather
// ELEMENTWISE-NOT: {{.}}
// EXACT-ELEMENTWISE: coco-opt: error: [reorder-elementwise] %mm (coco.matmul) is not elementwise
// CONNECTED:   coco-opt: error: [reorder-connected] %lone (coco.exp) neither reads %gx (comm.all_gather) (or a moved value) nor feeds only moved ops
// CONNECTED-NOT: {{.}}
// TWO:         coco-opt: error: [reorder-gather] the named computations must read exactly one all_gather (the one named, if any); they read: %ex (comm.all_gather), %tx (comm.all_gather)
// NOTHING:     coco-opt: error: [reorder-nothing] %ux (comm.all_gather) has no elementwise consumer to move before it
// LAYOUTS:     coco-opt: error: [reorder-layouts] on slices, the operands of %ca (coco.add) do not combine: [elementwise-layouts]
// BLOCK:       coco-opt: error: [reorder-block] %rx (comm.all_gather) is read only inside a region (coco.add); reorder moves ops of the gather's own block
// GATHER:      coco-opt: error: [reorder-gather] no op named %w in the program

// The gathered argument is updated before the consumer runs: the consumer must keep reading
// the gathered copy, not the (overwritten) argument.
// CHECK-LABEL: func.func @after_update
// CHECK-NEXT:    %ug = comm.all_gather %ua
// CHECK-NEXT:    coco.update %ua, %un
// CHECK-NEXT:    %uy = coco.neg %ug
// UPDATE: coco-opt: error: [reorder-update] %uy (coco.neg) runs after the update of %ua: reading the slice %ua instead of %ug (comm.all_gather) would read the overwritten buffer
// UPDATE-NOT: {{.}}
func.func @after_update(%ua: !coco.tensor<8xf32, sliced<0>>, %un: !coco.tensor<8xf32, sliced<0>>) -> !coco.tensor<8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %ug = comm.all_gather %ua : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32>
  coco.update %ua, %un : !coco.tensor<8xf32, sliced<0>>
  %uy = coco.neg %ug : !coco.tensor<8xf32>
  func.return %uy : !coco.tensor<8xf32>
}
