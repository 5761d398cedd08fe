// RUN: coco-opt %s --split-input-file -p coco-fuse | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-diagnostics | filecheck %s --check-prefix=SCRIPT

// coco-fuse runs the fusion passes in order (coco-fuse-all-reduce, -send, -all-to-all,
// -elementwise), each greedy (the CHECK lines), or, with `mode=`, one of them (the scripts:
// each chunk's own `coco.schedule`, coco-schedule without a name, which prints each refusal
// at the op it is about: `FILE:LINE:COL: [rule] message`). Each pass's own file tests it.

// The script fuses exactly %c and %d of @elt (mode=elementwise: coco-fuse-elementwise);
// greedy mode ignores it.
// The script fuses exactly %c and %d of @elt; greedy mode ignores it.
module attributes {coco.schedule = "coco-fuse{mode=elementwise ops=c,d}"} {

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

// Elementwise components: one iteration space per kernel, values used outside are yielded,
// and an op that would close a cycle through a reduction starts a kernel of its own.
// CHECK-LABEL: func.func @elt
// CHECK-NEXT:    %mm = coco.matmul %x, %x
// CHECK-NEXT:    %e2 = coco.exp %x
// CHECK-NEXT:    %c, %d2 = comm.fused elementwise -> !coco.tensor<16x16xf32>, !coco.tensor<16x16xf32> {
// CHECK-NEXT:      %c_1 = coco.add %mm, %x
// CHECK-NEXT:      %d = coco.mul %c_1, %c_1
// CHECK-NEXT:      %d2_1 = coco.relu %d
// CHECK-NEXT:      comm.yield %c_1, %d2_1
// CHECK-NEXT:    }
// CHECK-NEXT:    %bias2 = coco.mul %bias, %bias : !coco.tensor<16xf32>
// CHECK-NEXT:    %xb = coco.add %x, %bias2
// CHECK-NEXT:    %ca = coco.add %x, %x
// CHECK-NEXT:    %sa = coco.reduce sum %ca
// CHECK-NEXT:    %cb = coco.mul %ca, %sa
// CHECK-NEXT:    func.return
// SCRIPT-LABEL: func.func @elt
// SCRIPT:         %c, %d = comm.fused elementwise -> !coco.tensor<16x16xf32>, !coco.tensor<16x16xf32> {
// SCRIPT-NEXT:      %c_1 = coco.add %mm, %x
// SCRIPT-NEXT:      %d_1 = coco.mul %c_1, %c_1
// SCRIPT-NEXT:      comm.yield %c_1, %d_1
// SCRIPT-NEXT:    }
// SCRIPT-NEXT:    %d2 = coco.relu %d
func.func @elt(%x: !coco.tensor<16x16xf32>, %bias: !coco.tensor<16xf32>) -> (!coco.tensor<16x16xf32>, !coco.tensor<16x16xf32>, !coco.tensor<16xf32>, !coco.tensor<16x16xf32>, !coco.tensor<16x16xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %mm = coco.matmul %x, %x : !coco.tensor<16x16xf32>
  %c = coco.add %mm, %x : !coco.tensor<16x16xf32>
  %e2 = coco.exp %x : !coco.tensor<16x16xf32>
  %d = coco.mul %c, %c : !coco.tensor<16x16xf32>
  %d2 = coco.relu %d : !coco.tensor<16x16xf32>
  %bias2 = coco.mul %bias, %bias : !coco.tensor<16xf32>
  %xb = coco.add %x, %bias2 : !coco.tensor<16x16xf32>, !coco.tensor<16xf32> -> !coco.tensor<16x16xf32>
  %ca = coco.add %x, %x : !coco.tensor<16x16xf32>
  %sa = coco.reduce sum %ca : !coco.tensor<16x16xf32> -> !coco.tensor<f32>
  %cb = coco.mul %ca, %sa : !coco.tensor<16x16xf32>, !coco.tensor<f32> -> !coco.tensor<16x16xf32>
  func.return %c, %e2, %bias2, %cb, %d2 : !coco.tensor<16x16xf32>, !coco.tensor<16x16xf32>, !coco.tensor<16xf32>, !coco.tensor<16x16xf32>, !coco.tensor<16x16xf32>
}

// Computation feeding a send fuses with it (CoCoNet's fused computation + P2P).
// CHECK-LABEL: func.func @send
// CHECK-NEXT:    %y = comm.fused send -> !coco.tensor<8x8xf32, [local, replicated]> {
// CHECK-NEXT:      %t = coco.tanh %a
// CHECK-NEXT:      %t2 = coco.add %t, %a
// CHECK-NEXT:      %y_1 = comm.send %t2 along 0 shift 1
// CHECK-NEXT:      comm.yield %y_1
func.func @send(%a: !coco.tensor<8x8xf32, [local, replicated]>) -> !coco.tensor<8x8xf32, [local, replicated]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  %t = coco.tanh %a : !coco.tensor<8x8xf32, [local, replicated]>
  %t2 = coco.add %t, %a : !coco.tensor<8x8xf32, [local, replicated]>
  %y = comm.send %t2 along 0 shift 1 : !coco.tensor<8x8xf32, [local, replicated]>
  func.return %y : !coco.tensor<8x8xf32, [local, replicated]>
}
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
module attributes {coco.schedule = "coco-fuse{mode=all_reduce ops=ra,rb,cc,ccg}"} {
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
// greedy mode fuses its computation as an elementwise kernel instead; named, it is refused.
// CHECK-LABEL: func.func @zero_escapes
// CHECK-NEXT:    %q_rs = comm.reduce_scatter sum %q
// CHECK-NEXT:    %q3 = comm.fused elementwise
module attributes {coco.schedule = "coco-fuse{mode=all_reduce ops=q_rs}"} {
func.func @zero_escapes(%q: !coco.tensor<64xf32, local>, %r: !coco.tensor<64xf32, sliced<0>>) -> !coco.tensor<64xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-fuse.mlir:[[# @LINE + 1]]:3: [fuse-chain] no all_gather of the chain of %q_rs (comm.reduce_scatter) over its axes: a fused all_reduce needs reduce_scatter, computation and all_gather (or, ZeRO-3's, computation whose every result updates sliced state)
  %q_rs = comm.reduce_scatter sum %q : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
  %q2 = coco.mul %q_rs, %q_rs : !coco.tensor<64xf32, sliced<0>>
  %q3 = coco.sub %r, %q2 : !coco.tensor<64xf32, sliced<0>>
  func.return %q3 : !coco.tensor<64xf32, sliced<0>>
}
}

// -----

// An unknown mode: refused with no op to point at.
// SCRIPT: {{^}}[fuse-mode] unknown mode 'bogus': use one of auto, elementwise, all_reduce, send, all_to_all
module attributes {coco.schedule = "coco-fuse{mode=bogus}"} {
func.func @mode(%x: !coco.tensor<16x16xf32>) -> !coco.tensor<16x16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %e = coco.exp %x : !coco.tensor<16x16xf32>
  func.return %e : !coco.tensor<16x16xf32>
}
}

// -----
// one_shot is a form of the fused all_reduce only.
// SCRIPT: [fuse-form] form=one_shot is a form of a fused all_reduce: use it with mode=all_reduce, not mode=elementwise
module attributes {coco.schedule = "coco-fuse{mode=elementwise form=one_shot}"} {
func.func @form_mode(%x: !coco.tensor<16xf32, local>) -> !coco.tensor<16xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %t = comm.all_reduce sum %x : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32>
  func.return %t : !coco.tensor<16xf32>
}
}

