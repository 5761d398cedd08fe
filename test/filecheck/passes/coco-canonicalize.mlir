// RUN: coco-opt %s --split-input-file -p coco-canonicalize | filecheck %s
// RUN: coco-opt %s --split-input-file -p canonicalize | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-diagnostics | filecheck %s --check-prefix=SCRIPT

// Greedy mode (the CHECK lines) runs on every chunk; so does xDSL's own `canonicalize`, which
// applies the same folds because the ops publish them (their canonicalization traits). The SCRIPT run applies each chunk's own
// `coco.schedule` (coco-schedule without a name) and prints each refusal at the op it is
// about: `FILE:LINE:COL: [rule] message`.

module attributes {coco.schedule = "coco-canonicalize{ops=back}"} {

// all_gather(slice(x)) -> x; slice(all_gather(y)) -> y; a slice that cuts nothing -> its
// input. The producers left unread go too. The script folds %back alone.
// CHECK-LABEL: func.func @f
// CHECK-NEXT:    %keep = coco.slice %x : !coco.tensor<16xf32> -> !coco.tensor<16xf32, sliced<0>>
// CHECK-NEXT:    %sum = coco.add %x, %x : !coco.tensor<16xf32>
// CHECK-NEXT:    %t = coco.add %y, %y : !coco.tensor<16xf32, sliced<0>>
// CHECK-NEXT:    %u = coco.add %t, %y : !coco.tensor<16xf32, sliced<0>>
// CHECK-NEXT:    func.return %sum, %u, %keep
// SCRIPT-LABEL: func.func @f
// SCRIPT-NEXT:    %keep = coco.slice %x
// SCRIPT-NEXT:    %sum = coco.add %x, %x
func.func @f(%x: !coco.tensor<16xf32>, %y: !coco.tensor<16xf32, sliced<0>>) -> (!coco.tensor<16xf32>, !coco.tensor<16xf32, sliced<0>>, !coco.tensor<16xf32, sliced<0>>) attributes {coco.grid = #coco.grid<[?]>} {
  %keep = coco.slice %x : !coco.tensor<16xf32> -> !coco.tensor<16xf32, sliced<0>>
  %back = comm.all_gather %keep : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32>
  %sum = coco.add %back, %back : !coco.tensor<16xf32>
  %yg = comm.all_gather %y : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32>
  %ys = coco.slice %yg : !coco.tensor<16xf32> -> !coco.tensor<16xf32, sliced<0>>
  %same = coco.slice %ys : !coco.tensor<16xf32, sliced<0>>
  %t = coco.add %same, %ys : !coco.tensor<16xf32, sliced<0>>
  %u = coco.add %t, %y : !coco.tensor<16xf32, sliced<0>>
  func.return %sum, %u, %keep : !coco.tensor<16xf32>, !coco.tensor<16xf32, sliced<0>>, !coco.tensor<16xf32, sliced<0>>
}

// all_gather(slice(%w)) read after %w's update: folding to %w would read the overwritten
// buffer, so it stays.
// CHECK-LABEL: func.func @after_update
// CHECK-NEXT:    %ws = coco.slice %w
// CHECK-NEXT:    %wg = comm.all_gather %ws
// CHECK-NEXT:    %wn = coco.neg %wg
// CHECK-NEXT:    coco.update %w, %wn
// CHECK-NEXT:    func.return %wg
func.func @after_update(%w: !coco.tensor<8xf16>) -> !coco.tensor<8xf16> attributes {coco.grid = #coco.grid<[?]>} {
  %ws = coco.slice %w : !coco.tensor<8xf16> -> !coco.tensor<8xf16, sliced<0>>
  %wg = comm.all_gather %ws : !coco.tensor<8xf16, sliced<0>> -> !coco.tensor<8xf16>
  %wn = coco.neg %wg : !coco.tensor<8xf16>
  coco.update %w, %wn : !coco.tensor<8xf16>
  func.return %wg : !coco.tensor<8xf16>
}

// all_to_all(all_to_all(x)) back to x's layout over the same axes -> x (Ulysses' re-cut and
// its inverse; the dispatch form undoes itself); a round trip to another layout, or one
// whose inner re-cut is read elsewhere, keeps what is read.
// CHECK-LABEL: func.func @a2a
// CHECK-NEXT:    %h = comm.all_to_all %s : !coco.tensor<8x12xf32, sliced<0>> -> !coco.tensor<8x12xf32, sliced<1>>
// CHECK-NEXT:    %r = coco.add %s, %s : !coco.tensor<8x12xf32, sliced<0>>
// CHECK-NEXT:    %e = coco.neg %d : !coco.tensor<8x4xf32, local>
// CHECK-NEXT:    func.return %r, %h, %e
func.func @a2a(%s: !coco.tensor<8x12xf32, sliced<0>>, %d: !coco.tensor<8x4xf32, local>) -> (!coco.tensor<8x12xf32, sliced<0>>, !coco.tensor<8x12xf32, sliced<1>>, !coco.tensor<8x4xf32, local>) attributes {coco.grid = #coco.grid<[?]>} {
  %h = comm.all_to_all %s : !coco.tensor<8x12xf32, sliced<0>> -> !coco.tensor<8x12xf32, sliced<1>>
  %b = comm.all_to_all %h : !coco.tensor<8x12xf32, sliced<1>> -> !coco.tensor<8x12xf32, sliced<0>>
  %r = coco.add %b, %b : !coco.tensor<8x12xf32, sliced<0>>
  %d1 = comm.all_to_all %d : !coco.tensor<8x4xf32, local> -> !coco.tensor<8x4xf32, local>
  %d2 = comm.all_to_all %d1 : !coco.tensor<8x4xf32, local> -> !coco.tensor<8x4xf32, local>
  %e = coco.neg %d2 : !coco.tensor<8x4xf32, local>
  func.return %r, %h, %e : !coco.tensor<8x12xf32, sliced<0>>, !coco.tensor<8x12xf32, sliced<1>>, !coco.tensor<8x4xf32, local>
}

// A cast to a narrower type that alone reads an all_to_all moves before it (the dispatch in
// bf16: half the bytes); a widening one, or one beside another reader, stays.
// CHECK-LABEL: func.func @narrow
// CHECK-NEXT:    %0 = coco.cast %x : !coco.tensor<8x12xf32, sliced<0>> -> !coco.tensor<8x12xbf16, sliced<0>>
// CHECK-NEXT:    %n = comm.all_to_all %0 : !coco.tensor<8x12xbf16, sliced<0>> -> !coco.tensor<8x12xbf16, sliced<1>>
// CHECK-NEXT:    %w = comm.all_to_all %h : !coco.tensor<8x12xbf16, sliced<0>> -> !coco.tensor<8x12xbf16, sliced<1>>
// CHECK-NEXT:    %wf = coco.cast %w : !coco.tensor<8x12xbf16, sliced<1>> -> !coco.tensor<8x12xf32, sliced<1>>
// CHECK-NEXT:    func.return %n, %wf
func.func @narrow(%x: !coco.tensor<8x12xf32, sliced<0>>, %h: !coco.tensor<8x12xbf16, sliced<0>>) -> (!coco.tensor<8x12xbf16, sliced<1>>, !coco.tensor<8x12xf32, sliced<1>>) attributes {coco.grid = #coco.grid<[?]>} {
  %y = comm.all_to_all %x : !coco.tensor<8x12xf32, sliced<0>> -> !coco.tensor<8x12xf32, sliced<1>>
  %n = coco.cast %y : !coco.tensor<8x12xf32, sliced<1>> -> !coco.tensor<8x12xbf16, sliced<1>>
  %w = comm.all_to_all %h : !coco.tensor<8x12xbf16, sliced<0>> -> !coco.tensor<8x12xbf16, sliced<1>>
  %wf = coco.cast %w : !coco.tensor<8x12xbf16, sliced<1>> -> !coco.tensor<8x12xf32, sliced<1>>
  func.return %n, %wf : !coco.tensor<8x12xbf16, sliced<1>>, !coco.tensor<8x12xf32, sliced<1>>
}
}

// -----

// A slice of a value no all_gather produced folds nothing: named, it is refused.
module attributes {coco.schedule = "coco-canonicalize{ops=keep}"} {
func.func @keep(%x: !coco.tensor<16xf32>) -> !coco.tensor<16xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  // SCRIPT: coco-canonicalize.mlir:[[# @LINE + 1]]:3: [canonicalize-fold] %keep (coco.slice) is not a foldable slice/all_gather or all_to_all round trip
  %keep = coco.slice %x : !coco.tensor<16xf32> -> !coco.tensor<16xf32, sliced<0>>
  func.return %keep : !coco.tensor<16xf32, sliced<0>>
}
}

// -----

// A fused all_to_all whose all_to_all is dead (nothing reads the exchange) loses it to DCE;
// the region, holding no collective, dissolves: its other ops move out in front of it.
module attributes {coco.schedule = "coco-canonicalize"} {
// CHECK-LABEL: func.func @spent
// CHECK-NEXT:    %p = coco.neg %x : !coco.tensor<4x8xf32, sliced<0>>
// CHECK-NEXT:    %q = coco.add %p, %p : !coco.tensor<4x8xf32, sliced<0>>
// CHECK-NEXT:    func.return %q : !coco.tensor<4x8xf32, sliced<0>>
func.func @spent(%x: !coco.tensor<4x8xf32, sliced<0>>) -> !coco.tensor<4x8xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  %r = comm.fused all_to_all -> !coco.tensor<4x8xf32, sliced<0>> {
    %p = coco.neg %x : !coco.tensor<4x8xf32, sliced<0>>
    %h = comm.all_to_all %p : !coco.tensor<4x8xf32, sliced<0>> -> !coco.tensor<4x8xf32, sliced<1>>
    comm.yield %p : !coco.tensor<4x8xf32, sliced<0>>
  }
  %q = coco.add %r, %r : !coco.tensor<4x8xf32, sliced<0>>
  func.return %q : !coco.tensor<4x8xf32, sliced<0>>
}
}

// -----

// ZeRO-3 written naively: an all_reduce whose only reader keeps this rank's slice becomes a
// reduce_scatter (same kind, axes, acc; the slice's name), unevenly cut, on a [2, ?] grid over
// both axes, and over axis 0 where axis 1 already cuts the dim (dp's cut nests inside tp's).
// %kept is also read whole: it stays.
module attributes {coco.schedule = "coco-canonicalize{ops=g1,h1}"} {
// CHECK-LABEL: func.func @zero3_naive
// CHECK-NEXT:    %gs = comm.reduce_scatter sum %g acc f32 : !coco.tensor<13xbf16, [local, local]> -> !coco.tensor<13xbf16, [sliced<0>, sliced<0>]>
// CHECK-NEXT:    %hs = comm.reduce_scatter max %h over [0] : !coco.tensor<8x6xf32, [local, sliced<0>]> -> !coco.tensor<8x6xf32, [sliced<0, level 1>, sliced<0, level 0>]>
// CHECK-NEXT:    %kept = comm.all_reduce sum %k
// CHECK-NEXT:    %ks = coco.slice %kept
// SCRIPT-LABEL: func.func @zero3_naive
// SCRIPT-NEXT:    %gs = comm.reduce_scatter sum %g acc f32
// SCRIPT-NEXT:    %hs = comm.reduce_scatter max %h over [0]
func.func @zero3_naive(%g: !coco.tensor<13xbf16, [local, local]>, %h: !coco.tensor<8x6xf32, [local, sliced<0>]>, %k: !coco.tensor<8xf32, [local, local]>) -> (!coco.tensor<13xbf16, [sliced<0>, sliced<0>]>, !coco.tensor<8x6xf32, [sliced<0, level 1>, sliced<0, level 0>]>, !coco.tensor<8xf32, [replicated, sliced<0>]>, !coco.tensor<8xf32, [replicated, replicated]>) attributes {coco.grid = #coco.grid<[2, ?]>} {
  %g1 = comm.all_reduce sum %g acc f32 : !coco.tensor<13xbf16, [local, local]> -> !coco.tensor<13xbf16, [replicated, replicated]>
  %gs = coco.slice %g1 : !coco.tensor<13xbf16, [replicated, replicated]> -> !coco.tensor<13xbf16, [sliced<0>, sliced<0>]>
  %h1 = comm.all_reduce max %h over [0] : !coco.tensor<8x6xf32, [local, sliced<0>]> -> !coco.tensor<8x6xf32, [replicated, sliced<0>]>
  %hs = coco.slice %h1 : !coco.tensor<8x6xf32, [replicated, sliced<0>]> -> !coco.tensor<8x6xf32, [sliced<0, level 1>, sliced<0, level 0>]>
  %kept = comm.all_reduce sum %k : !coco.tensor<8xf32, [local, local]> -> !coco.tensor<8xf32, [replicated, replicated]>
  %ks = coco.slice %kept : !coco.tensor<8xf32, [replicated, replicated]> -> !coco.tensor<8xf32, [replicated, sliced<0>]>
  func.return %gs, %hs, %ks, %kept : !coco.tensor<13xbf16, [sliced<0>, sliced<0>]>, !coco.tensor<8x6xf32, [sliced<0, level 1>, sliced<0, level 0>]>, !coco.tensor<8xf32, [replicated, sliced<0>]>, !coco.tensor<8xf32, [replicated, replicated]>
}
}

// -----

// A slice that cuts an axis the all_reduce does not span (or not all it spans) is no
// reduce_scatter: named, the all_reduce is refused.
module attributes {coco.schedule = "coco-canonicalize{ops=p1}"} {
// CHECK-LABEL: func.func @partial_span
// CHECK-NEXT:    %p1 = comm.all_reduce sum %p
func.func @partial_span(%p: !coco.tensor<8xf32, [local, local]>) -> !coco.tensor<8xf32, [replicated, sliced<0>]> attributes {coco.grid = #coco.grid<[2, 2]>} {
  // SCRIPT: coco-canonicalize.mlir:[[# @LINE + 1]]:3: [canonicalize-fold] %p1 (comm.all_reduce) is not a foldable slice/all_gather or all_to_all round trip, nor an all_reduce whose only reader slices it as a reduce_scatter would
  %p1 = comm.all_reduce sum %p : !coco.tensor<8xf32, [local, local]> -> !coco.tensor<8xf32, [replicated, replicated]>
  %ps = coco.slice %p1 : !coco.tensor<8xf32, [replicated, replicated]> -> !coco.tensor<8xf32, [replicated, sliced<0>]>
  func.return %ps : !coco.tensor<8xf32, [replicated, sliced<0>]>
}
}

// -----

// all_gather(slice(w)) is w only where every reader may read w: the fused region yields the
// gather to a return that runs after w's update (in another region), so the gather stays (it
// was folded, and the return read w after its update: IR the verifier refused). Found by the
// random pipelines after coco-fuse-all-gather.
// CHECK-LABEL: func.func @yielded_after_update
// CHECK:         %v2 = comm.fused all_gather
// CHECK-NEXT:      %v2_1 = comm.all_gather %v1
// CHECK-NEXT:      comm.yield %v2_1
// CHECK:         func.return %v2
func.func @yielded_after_update(%w3: !coco.tensor<4x8xf16>, %w4: !coco.tensor<4x8xf32>) -> !coco.tensor<4x8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %v1 = coco.slice %w4 : !coco.tensor<4x8xf32> -> !coco.tensor<4x8xf32, sliced<0>>
  %v2 = comm.fused all_gather -> !coco.tensor<4x8xf32> {
    %v2_1 = comm.all_gather %v1 : !coco.tensor<4x8xf32, sliced<0>> -> !coco.tensor<4x8xf32>
    comm.yield %v2_1 : !coco.tensor<4x8xf32>
  }
  comm.fused all_gather {
    %v5 = coco.cast %v1 : !coco.tensor<4x8xf32, sliced<0>> -> !coco.tensor<4x8xf16, sliced<0>>
    %v6 = comm.all_gather %v5 : !coco.tensor<4x8xf16, sliced<0>> -> !coco.tensor<4x8xf16>
    %v7 = coco.cast %v6 : !coco.tensor<4x8xf16> -> !coco.tensor<4x8xf32>
    coco.update %w3, %v6 : !coco.tensor<4x8xf16>
    coco.update %w4, %v7 : !coco.tensor<4x8xf32>
    comm.yield
  }
  func.return %v2 : !coco.tensor<4x8xf32>
}
