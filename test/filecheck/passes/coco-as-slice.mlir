// RUN: coco-opt %s --split-input-file -p coco-as-slice | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-diagnostics | filecheck %s --check-prefix=SCRIPT

// Greedy mode (the CHECK lines) runs on every chunk. The SCRIPT run applies each chunk's own
// `coco.schedule` (coco-schedule without a name) and prints each refusal at the op it is
// about: `FILE:LINE:COL: [rule] message`.

module attributes {coco.schedule = "coco-as-slice{ops=m,b}"} {

// After split + reorder of an Adam-like step: %m and %v are read only through slices and
// updated with a gather of a slice. Greedy mode keeps both sliced (the signature changes),
// drops the slices and the gathers; %w is also read by a norm, so it stays replicated.
// The read-only %b is sliced only when named (the script).
// CHECK-LABEL: func.func @adam
// CHECK-SAME:    (%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>, %m: !coco.tensor<64xf32, sliced<0>>, %v: !coco.tensor<64xf32, sliced<0>>, %b: !coco.tensor<64xf32>)
// CHECK-NEXT:    %g1_rs = comm.reduce_scatter sum %g
// CHECK-NEXT:    %m1_s = coco.add %m, %g1_rs : !coco.tensor<64xf32, sliced<0>>
// CHECK-NEXT:    coco.update %m, %m1_s : !coco.tensor<64xf32, sliced<0>>
// CHECK-NEXT:    %v1_s = coco.mul %v, %g1_rs : !coco.tensor<64xf32, sliced<0>>
// CHECK-NEXT:    %v1 = comm.all_gather %v1_s
// CHECK-NEXT:    coco.update %v, %v1_s : !coco.tensor<64xf32, sliced<0>>
// CHECK-NEXT:    %b_s = coco.slice %b
// CHECK-NEXT:    %w_s = coco.slice %w
// CHECK-NEXT:    %wn = coco.reduce norm %w
// CHECK-NEXT:    %w1_s = coco.sub %w_s, %v1_s
// CHECK-NEXT:    %w2_s = coco.add %w1_s, %b_s
// CHECK-NEXT:    %w2 = comm.all_gather %w2_s
// CHECK-NEXT:    coco.update %w, %w2
// CHECK-NEXT:    func.return %wn, %v1

// SCRIPT-LABEL: func.func @adam
// SCRIPT-SAME:    %m: !coco.tensor<64xf32, sliced<0>>, %v: !coco.tensor<64xf32>, %b: !coco.tensor<64xf32, sliced<0>>)
// SCRIPT:         %w2_s = coco.add %w1_s, %b : !coco.tensor<64xf32, sliced<0>>
func.func @adam(%g: !coco.tensor<64xf32, local>, %w: !coco.tensor<64xf32>, %m: !coco.tensor<64xf32>, %v: !coco.tensor<64xf32>, %b: !coco.tensor<64xf32>) -> (!coco.tensor<f32>, !coco.tensor<64xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %g1_rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
  %m_s = coco.slice %m : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
  %m1_s = coco.add %m_s, %g1_rs : !coco.tensor<64xf32, sliced<0>>
  %m1 = comm.all_gather %m1_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
  coco.update %m, %m1 : !coco.tensor<64xf32>
  %v_s = coco.slice %v : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
  %v1_s = coco.mul %v_s, %g1_rs : !coco.tensor<64xf32, sliced<0>>
  %v1 = comm.all_gather %v1_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
  coco.update %v, %v1 : !coco.tensor<64xf32>
  %b_s = coco.slice %b : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
  %w_s = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
  %wn = coco.reduce norm %w : !coco.tensor<64xf32> -> !coco.tensor<f32>
  %w1_s = coco.sub %w_s, %v1_s : !coco.tensor<64xf32, sliced<0>>
  %w2_s = coco.add %w1_s, %b_s : !coco.tensor<64xf32, sliced<0>>
  %w2 = comm.all_gather %w2_s : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
  coco.update %w, %w2 : !coco.tensor<64xf32>
  func.return %wn, %v1 : !coco.tensor<f32>, !coco.tensor<64xf32>
}

// Slices of different layouts, and an update that stores no gather: left alone by greedy
// mode, refused when named.
// CHECK-LABEL: func.func @refused
// CHECK-NEXT:    %q0 = coco.slice %q
// CHECK-NEXT:    %q1 = coco.slice %q
// CHECK:         coco.update %p, %pn
func.func @refused(%q: !coco.tensor<8x8xf32>, %p: !coco.tensor<8x8xf32>) -> (!coco.tensor<8x8xf32, sliced<0>>, !coco.tensor<8x8xf32, sliced<1>>) attributes {coco.grid = #coco.grid<[?]>} {
  %q0 = coco.slice %q : !coco.tensor<8x8xf32> -> !coco.tensor<8x8xf32, sliced<0>>
  %q1 = coco.slice %q : !coco.tensor<8x8xf32> -> !coco.tensor<8x8xf32, sliced<1>>
  %ps = coco.slice %p : !coco.tensor<8x8xf32> -> !coco.tensor<8x8xf32, sliced<0>>
  %pg = comm.all_gather %ps : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  %pn = coco.neg %pg : !coco.tensor<8x8xf32>
  coco.update %p, %pn : !coco.tensor<8x8xf32>
  func.return %q0, %q1 : !coco.tensor<8x8xf32, sliced<0>>, !coco.tensor<8x8xf32, sliced<1>>
}
}

// -----

// A slice read after the update: stored sliced, the argument would be read after it was
// overwritten. Greedy mode leaves it replicated; named, it is refused.
// CHECK-LABEL: func.func @late
// CHECK-SAME:    %late: !coco.tensor<16xf32>)
module attributes {coco.schedule = "coco-as-slice{ops=late}"} {
func.func @late(%lg: !coco.tensor<16xf32, local>, %late: !coco.tensor<16xf32>) -> !coco.tensor<16xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  %lrs = comm.reduce_scatter sum %lg : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32, sliced<0>>
  %ls = coco.slice %late : !coco.tensor<16xf32> -> !coco.tensor<16xf32, sliced<0>>
  %l1 = coco.sub %ls, %lrs : !coco.tensor<16xf32, sliced<0>>
  %l2 = comm.all_gather %l1 : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32>
  coco.update %late, %l2 : !coco.tensor<16xf32>
  // SCRIPT: coco-as-slice.mlir:[[# @LINE + 1]]:3: [as-slice-uses] func.return reads %ls, the slice of %late, after the update of %late: stored sliced, the argument would be read after it was overwritten
  func.return %ls : !coco.tensor<16xf32, sliced<0>>
}
}

// -----

// Requests the rules refuse. Every use of the argument is a slice (%w of @adam).
module attributes {coco.schedule = "coco-as-slice{ops=w}"} {
func.func @uses(%w: !coco.tensor<64xf32>) -> (!coco.tensor<64xf32, sliced<0>>, !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %w_s = coco.slice %w : !coco.tensor<64xf32> -> !coco.tensor<64xf32, sliced<0>>
  // SCRIPT: coco-as-slice.mlir:[[# @LINE + 1]]:3: [as-slice-uses] %w is read by %wn (coco.reduce), not through a coco.slice: every use must be a slice (run coco-reorder first)
  %wn = coco.reduce norm %w : !coco.tensor<64xf32> -> !coco.tensor<f32>
  func.return %w_s, %wn : !coco.tensor<64xf32, sliced<0>>, !coco.tensor<f32>
}
}

// -----

// The slices share one type (%q of @refused).
module attributes {coco.schedule = "coco-as-slice{ops=q}"} {
func.func @layout(%q: !coco.tensor<8x8xf32>) -> (!coco.tensor<8x8xf32, sliced<0>>, !coco.tensor<8x8xf32, sliced<1>>) attributes {coco.grid = #coco.grid<[?]>} {
  %q0 = coco.slice %q : !coco.tensor<8x8xf32> -> !coco.tensor<8x8xf32, sliced<0>>
  // SCRIPT: coco-as-slice.mlir:[[# @LINE + 1]]:3: [as-slice-layout] the slices of %q have different types: !coco.tensor<8x8xf32, sliced<0>>, !coco.tensor<8x8xf32, sliced<1>>
  %q1 = coco.slice %q : !coco.tensor<8x8xf32> -> !coco.tensor<8x8xf32, sliced<1>>
  func.return %q0, %q1 : !coco.tensor<8x8xf32, sliced<0>>, !coco.tensor<8x8xf32, sliced<1>>
}
}

// -----

// The update stores an all_gather of a slice (%p of @refused).
module attributes {coco.schedule = "coco-as-slice{ops=p}"} {
func.func @update(%p: !coco.tensor<8x8xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %ps = coco.slice %p : !coco.tensor<8x8xf32> -> !coco.tensor<8x8xf32, sliced<0>>
  %pg = comm.all_gather %ps : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32>
  %pn = coco.neg %pg : !coco.tensor<8x8xf32>
  // SCRIPT: coco-as-slice.mlir:[[# @LINE + 1]]:3: [as-slice-update] the update of %p stores %pn (coco.neg), not an all_gather of a value of type !coco.tensor<8x8xf32, sliced<0>>
  coco.update %p, %pn : !coco.tensor<8x8xf32>
  func.return
}
}

// -----

// A name no argument has: refused with no op to point at.
// SCRIPT: {{^}}[as-slice-arg] no function argument named %nope in the program
module attributes {coco.schedule = "coco-as-slice{ops=m,nope}"} {
func.func @argument(%m: !coco.tensor<8x8xf32>) -> !coco.tensor<8x8xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  %m_s = coco.slice %m : !coco.tensor<8x8xf32> -> !coco.tensor<8x8xf32, sliced<0>>
  func.return %m_s : !coco.tensor<8x8xf32, sliced<0>>
}
}
