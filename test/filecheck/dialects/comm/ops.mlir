// RUN: COCO_ROUNDTRIP
// The generic form round-trips, and is checked itself (one coco-opt prints it for both):
// RUN: coco-opt %s --split-input-file --print-op-generic | tee %t.mlir | coco-opt --split-input-file | filecheck %s
// RUN: filecheck %s --check-prefix=GENERIC < %t.mlir

// Collectives on a 1-D grid (every axis spanned when `over` is omitted), every reduction
// kind, every element type, attr-dicts.

func.func @collectives(%g: !coco.tensor<4096xf16, local>, %r: !coco.tensor<64x8xbf16>,
                       %s: !coco.tensor<64x8xf32, sliced<1>>, %i: !coco.tensor<16xi32, local>,
                       %d: !coco.tensor<f64, local>, %b: !coco.tensor<16xi1, local>,
                       %l: !coco.tensor<16xi64, local>)
    attributes {coco.grid = #coco.grid<[8]>} {
  %0 = comm.all_reduce sum %g : !coco.tensor<4096xf16, local> -> !coco.tensor<4096xf16>
  %1 = comm.all_reduce prod %r : !coco.tensor<64x8xbf16>
  %2 = comm.all_reduce max %i {tag = 1 : i32} : !coco.tensor<16xi32, local> -> !coco.tensor<16xi32>
  %3 = comm.all_reduce min %d : !coco.tensor<f64, local> -> !coco.tensor<f64>
  %4 = comm.all_reduce max %b : !coco.tensor<16xi1, local> -> !coco.tensor<16xi1>
  %5 = comm.reduce_scatter sum %g : !coco.tensor<4096xf16, local> -> !coco.tensor<4096xf16, sliced<0>>
  %6 = comm.reduce_scatter max %r dim 1 {k} : !coco.tensor<64x8xbf16> -> !coco.tensor<64x8xbf16, sliced<1>>
  %7 = comm.all_gather %5 : !coco.tensor<4096xf16, sliced<0>> -> !coco.tensor<4096xf16>
  %8 = comm.all_gather %s {k} : !coco.tensor<64x8xf32, sliced<1>> -> !coco.tensor<64x8xf32>
  %9 = comm.broadcast %i root 3 : !coco.tensor<16xi32, local> -> !coco.tensor<16xi32>
  %10 = comm.broadcast %r root 0 {k} : !coco.tensor<64x8xbf16>
  %11 = comm.reduce sum %l root 7 : !coco.tensor<16xi64, local>
  %12 = comm.reduce prod %r root 0 {k} : !coco.tensor<64x8xbf16> -> !coco.tensor<64x8xbf16, local>
  %13 = comm.send %l along 0 shift 1 : !coco.tensor<16xi64, local>
  %14 = comm.send %l along 0 shift -2 {k} : !coco.tensor<16xi64, local>
  func.return
}

// CHECK-LABEL: func.func @collectives(
// CHECK-SAME:      attributes {coco.grid = #coco.grid<[8]>} {
// CHECK-NEXT:    %0 = comm.all_reduce sum %g : !coco.tensor<4096xf16, local> -> !coco.tensor<4096xf16>{{$}}
// CHECK-NEXT:    %1 = comm.all_reduce prod %r : !coco.tensor<64x8xbf16>{{$}}
// CHECK-NEXT:    %2 = comm.all_reduce max %i {tag = 1 : i32} : !coco.tensor<16xi32, local> -> !coco.tensor<16xi32>{{$}}
// CHECK-NEXT:    %3 = comm.all_reduce min %d : !coco.tensor<f64, local> -> !coco.tensor<f64>{{$}}
// CHECK-NEXT:    %4 = comm.all_reduce max %b : !coco.tensor<16xi1, local> -> !coco.tensor<16xi1>{{$}}
// CHECK-NEXT:    %5 = comm.reduce_scatter sum %g : !coco.tensor<4096xf16, local> -> !coco.tensor<4096xf16, sliced<0>>{{$}}
// CHECK-NEXT:    %6 = comm.reduce_scatter max %r dim 1 {k} : !coco.tensor<64x8xbf16> -> !coco.tensor<64x8xbf16, sliced<1>>{{$}}
// CHECK-NEXT:    %7 = comm.all_gather %5 : !coco.tensor<4096xf16, sliced<0>> -> !coco.tensor<4096xf16>{{$}}
// CHECK-NEXT:    %8 = comm.all_gather %s {k} : !coco.tensor<64x8xf32, sliced<1>> -> !coco.tensor<64x8xf32>{{$}}
// CHECK-NEXT:    %9 = comm.broadcast %i root 3 : !coco.tensor<16xi32, local> -> !coco.tensor<16xi32>{{$}}
// CHECK-NEXT:    %10 = comm.broadcast %r root 0 {k} : !coco.tensor<64x8xbf16>{{$}}
// CHECK-NEXT:    %11 = comm.reduce sum %l root 7 : !coco.tensor<16xi64, local>{{$}}
// CHECK-NEXT:    %12 = comm.reduce prod %r root 0 {k} : !coco.tensor<64x8xbf16> -> !coco.tensor<64x8xbf16, local>{{$}}
// CHECK-NEXT:    %13 = comm.send %l along 0 shift 1 : !coco.tensor<16xi64, local>{{$}}
// CHECK-NEXT:    %14 = comm.send %l along 0 shift -2 {k} : !coco.tensor<16xi64, local>{{$}}
// CHECK-NEXT:    func.return{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "collectives"
// GENERIC:         %0 = "comm.all_reduce"(%g) <{kind = #comm<collective_kind sum>}> : (!coco.tensor<4096xf16, local>) -> !coco.tensor<4096xf16>
// GENERIC:         %2 = "comm.all_reduce"(%i) <{kind = #comm<collective_kind max>}> {tag = 1 : i32} : (!coco.tensor<16xi32, local>) -> !coco.tensor<16xi32>
// GENERIC:         %5 = "comm.reduce_scatter"(%g) <{kind = #comm<collective_kind sum>, dim = 0 : i64}> : (!coco.tensor<4096xf16, local>) -> !coco.tensor<4096xf16, sliced<0>>
// GENERIC:         %7 = "comm.all_gather"(%5) : (!coco.tensor<4096xf16, sliced<0>>) -> !coco.tensor<4096xf16>
// GENERIC:         %9 = "comm.broadcast"(%i) <{root = 3 : i64}> : (!coco.tensor<16xi32, local>) -> !coco.tensor<16xi32>
// GENERIC:         %11 = "comm.reduce"(%l) <{kind = #comm<collective_kind sum>, root = 7 : i64}> : (!coco.tensor<16xi64, local>) -> !coco.tensor<16xi64, local>
// GENERIC:         %13 = "comm.send"(%l) <{along = 0 : i64, shift = 1 : i64}> : (!coco.tensor<16xi64, local>) -> !coco.tensor<16xi64, local>

// -----

// A [stages, ranks] grid: `over [1]` is a collective inside each stage, `over [0, 1]` spans
// both axes, and `send ... along 0` goes to the same rank of the next stage; axes a
// collective does not span keep their layout.

func.func @pipeline(%x: !coco.tensor<8x16xf16, [local, sliced<1>]>, %p: !coco.tensor<8x16xbf16, [replicated, local]>,
                    %q: !coco.tensor<8x16xf32, [local, local]>)
    attributes {coco.grid = #coco.grid<[2, 4]>} {
  %0 = comm.all_reduce max %p over [1] {tag = 1 : i32} : !coco.tensor<8x16xbf16, [replicated, local]> -> !coco.tensor<8x16xbf16>
  %1 = comm.all_reduce sum %q over [1] : !coco.tensor<8x16xf32, [local, local]> -> !coco.tensor<8x16xf32, [local, replicated]>
  %2 = comm.all_reduce sum %q over [0, 1] : !coco.tensor<8x16xf32, [local, local]> -> !coco.tensor<8x16xf32>
  %3 = comm.all_reduce min %q : !coco.tensor<8x16xf32, [local, local]> -> !coco.tensor<8x16xf32>
  %4 = comm.reduce_scatter prod %p over [1] : !coco.tensor<8x16xbf16, [replicated, local]> -> !coco.tensor<8x16xbf16, [replicated, sliced<0>]>
  %5 = comm.reduce_scatter sum %q dim 1 over [1, 0] : !coco.tensor<8x16xf32, [local, local]> -> !coco.tensor<8x16xf32, [sliced<1>, sliced<1>]>
  %6 = comm.all_gather %x over [1] : !coco.tensor<8x16xf16, [local, sliced<1>]> -> !coco.tensor<8x16xf16, [local, replicated]>
  %7 = comm.all_gather %5 : !coco.tensor<8x16xf32, [sliced<1>, sliced<1>]> -> !coco.tensor<8x16xf32>
  %8 = comm.broadcast %p root 2 over [1] : !coco.tensor<8x16xbf16, [replicated, local]> -> !coco.tensor<8x16xbf16>
  %9 = comm.reduce min %p root 0 over [1] : !coco.tensor<8x16xbf16, [replicated, local]>
  %10 = comm.reduce sum %q root 7 : !coco.tensor<8x16xf32, [local, local]>
  %11 = comm.send %x along 0 shift 1 : !coco.tensor<8x16xf16, [local, sliced<1>]>
  %12 = comm.send %0 along 1 shift -1 : !coco.tensor<8x16xbf16> -> !coco.tensor<8x16xbf16, [replicated, local]>
  func.return
}

// CHECK-LABEL: func.func @pipeline(
// CHECK-SAME:      attributes {coco.grid = #coco.grid<[2, 4]>} {
// CHECK-NEXT:    %0 = comm.all_reduce max %p over [1] {tag = 1 : i32} : !coco.tensor<8x16xbf16, [replicated, local]> -> !coco.tensor<8x16xbf16>{{$}}
// CHECK-NEXT:    %1 = comm.all_reduce sum %q over [1] : !coco.tensor<8x16xf32, [local, local]> -> !coco.tensor<8x16xf32, [local, replicated]>{{$}}
// CHECK-NEXT:    %2 = comm.all_reduce sum %q over [0, 1] : !coco.tensor<8x16xf32, [local, local]> -> !coco.tensor<8x16xf32>{{$}}
// CHECK-NEXT:    %3 = comm.all_reduce min %q : !coco.tensor<8x16xf32, [local, local]> -> !coco.tensor<8x16xf32>{{$}}
// CHECK-NEXT:    %4 = comm.reduce_scatter prod %p over [1] : !coco.tensor<8x16xbf16, [replicated, local]> -> !coco.tensor<8x16xbf16, [replicated, sliced<0>]>{{$}}
// CHECK-NEXT:    %5 = comm.reduce_scatter sum %q dim 1 over [1, 0] : !coco.tensor<8x16xf32, [local, local]> -> !coco.tensor<8x16xf32, [sliced<1>, sliced<1>]>{{$}}
// CHECK-NEXT:    %6 = comm.all_gather %x over [1] : !coco.tensor<8x16xf16, [local, sliced<1>]> -> !coco.tensor<8x16xf16, [local, replicated]>{{$}}
// CHECK-NEXT:    %7 = comm.all_gather %5 : !coco.tensor<8x16xf32, [sliced<1>, sliced<1>]> -> !coco.tensor<8x16xf32>{{$}}
// CHECK-NEXT:    %8 = comm.broadcast %p root 2 over [1] : !coco.tensor<8x16xbf16, [replicated, local]> -> !coco.tensor<8x16xbf16>{{$}}
// CHECK-NEXT:    %9 = comm.reduce min %p root 0 over [1] : !coco.tensor<8x16xbf16, [replicated, local]>{{$}}
// CHECK-NEXT:    %10 = comm.reduce sum %q root 7 : !coco.tensor<8x16xf32, [local, local]>{{$}}
// CHECK-NEXT:    %11 = comm.send %x along 0 shift 1 : !coco.tensor<8x16xf16, [local, sliced<1>]>{{$}}
// CHECK-NEXT:    %12 = comm.send %0 along 1 shift -1 : !coco.tensor<8x16xbf16> -> !coco.tensor<8x16xbf16, [replicated, local]>{{$}}
// CHECK-NEXT:    func.return{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "pipeline"
// GENERIC:         %0 = "comm.all_reduce"(%p) <{kind = #comm<collective_kind max>, axes = array<i64: 1>}> {tag = 1 : i32} : (!coco.tensor<8x16xbf16, [replicated, local]>) -> !coco.tensor<8x16xbf16>
// GENERIC:         %8 = "comm.broadcast"(%p) <{root = 2 : i64, axes = array<i64: 1>}> : (!coco.tensor<8x16xbf16, [replicated, local]>) -> !coco.tensor<8x16xbf16>

// -----

// Fused regions: a FusedAllReduce (reduce_scatter + sliced computation + all_gather), an
// elementwise fusion with one, two or no results, a fused send; with and without attr-dicts.

func.func @fused(%g: !coco.tensor<1024xf32, local>, %w: !coco.tensor<1024xf32>,
                 %lr: !coco.tensor<f32>) -> !coco.tensor<1024xf32> {
  %w2 = comm.fused all_reduce -> !coco.tensor<1024xf32> {
    %rs = comm.reduce_scatter sum %g : !coco.tensor<1024xf32, local> -> !coco.tensor<1024xf32, sliced<0>>
    %ws = coco.slice %w : !coco.tensor<1024xf32> -> !coco.tensor<1024xf32, sliced<0>>
    %step = coco.mul %lr, %rs : !coco.tensor<f32>, !coco.tensor<1024xf32, sliced<0>> -> !coco.tensor<1024xf32, sliced<0>>
    %new = coco.sub %ws, %step : !coco.tensor<1024xf32, sliced<0>>
    %ag = comm.all_gather %new : !coco.tensor<1024xf32, sliced<0>> -> !coco.tensor<1024xf32>
    comm.yield %ag : !coco.tensor<1024xf32>
  }
  %a, %b = comm.fused elementwise attributes {sym = "ew"} -> !coco.tensor<1024xf32>, !coco.tensor<1024xf32> {
    %0 = coco.neg %w2 : !coco.tensor<1024xf32>
    %1 = coco.exp %0 : !coco.tensor<1024xf32>
    comm.yield {k} %0, %1 : !coco.tensor<1024xf32>, !coco.tensor<1024xf32>
  }
  comm.fused elementwise {
    %2 = coco.neg %a : !coco.tensor<1024xf32>
    comm.yield
  }
  comm.fused elementwise {
    comm.yield
  }
  comm.fused elementwise attributes {sym = "empty"} {
    comm.yield {k}
  }
  %c = comm.fused send -> !coco.tensor<1024xf32, local> {
    %3 = coco.relu %b : !coco.tensor<1024xf32>
    %4 = comm.send %3 along 0 shift 1 : !coco.tensor<1024xf32> -> !coco.tensor<1024xf32, local>
    comm.yield %4 : !coco.tensor<1024xf32, local>
  }
  func.return %b : !coco.tensor<1024xf32>
}

// CHECK-LABEL: func.func @fused(
// CHECK-NEXT:    %w2 = comm.fused all_reduce -> !coco.tensor<1024xf32> {{{$}}
// CHECK-NEXT:      %rs = comm.reduce_scatter sum %g : !coco.tensor<1024xf32, local> -> !coco.tensor<1024xf32, sliced<0>>{{$}}
// CHECK-NEXT:      %ws = coco.slice %w : !coco.tensor<1024xf32> -> !coco.tensor<1024xf32, sliced<0>>{{$}}
// CHECK-NEXT:      %step = coco.mul %lr, %rs : !coco.tensor<f32>, !coco.tensor<1024xf32, sliced<0>> -> !coco.tensor<1024xf32, sliced<0>>{{$}}
// CHECK-NEXT:      %new = coco.sub %ws, %step : !coco.tensor<1024xf32, sliced<0>>{{$}}
// CHECK-NEXT:      %ag = comm.all_gather %new : !coco.tensor<1024xf32, sliced<0>> -> !coco.tensor<1024xf32>{{$}}
// CHECK-NEXT:      comm.yield %ag : !coco.tensor<1024xf32>{{$}}
// CHECK-NEXT:    }{{$}}
// CHECK-NEXT:    %a, %b = comm.fused elementwise attributes {sym = "ew"} -> !coco.tensor<1024xf32>, !coco.tensor<1024xf32> {{{$}}
// CHECK-NEXT:      %0 = coco.neg %w2 : !coco.tensor<1024xf32>{{$}}
// CHECK-NEXT:      %1 = coco.exp %0 : !coco.tensor<1024xf32>{{$}}
// CHECK-NEXT:      comm.yield {k} %0, %1 : !coco.tensor<1024xf32>, !coco.tensor<1024xf32>{{$}}
// CHECK-NEXT:    }{{$}}
// CHECK-NEXT:    comm.fused elementwise {{{$}}
// CHECK-NEXT:      %2 = coco.neg %a : !coco.tensor<1024xf32>{{$}}
// CHECK-NEXT:      comm.yield{{$}}
// CHECK-NEXT:    }{{$}}
// CHECK-NEXT:    comm.fused elementwise {{{$}}
// CHECK-NEXT:      comm.yield{{$}}
// CHECK-NEXT:    }{{$}}
// CHECK-NEXT:    comm.fused elementwise attributes {sym = "empty"} {{{$}}
// CHECK-NEXT:      comm.yield {k}{{$}}
// CHECK-NEXT:    }{{$}}
// CHECK-NEXT:    %c = comm.fused send -> !coco.tensor<1024xf32, local> {{{$}}
// CHECK-NEXT:      %3 = coco.relu %b : !coco.tensor<1024xf32>{{$}}
// CHECK-NEXT:      %4 = comm.send %3 along 0 shift 1 : !coco.tensor<1024xf32> -> !coco.tensor<1024xf32, local>{{$}}
// CHECK-NEXT:      comm.yield %4 : !coco.tensor<1024xf32, local>{{$}}
// CHECK-NEXT:    }{{$}}
// CHECK-NEXT:    func.return %b : !coco.tensor<1024xf32>{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "fused"
// GENERIC:         %w2 = "comm.fused"() <{kind = #comm<fusion_kind all_reduce>}> ({
// GENERIC:           "comm.yield"(%ag) : (!coco.tensor<1024xf32>) -> ()
// GENERIC-NEXT:    }) : () -> !coco.tensor<1024xf32>
// GENERIC:         %a, %b = "comm.fused"() <{kind = #comm<fusion_kind elementwise>}> ({
// GENERIC:         }) {sym = "ew"} : () -> (!coco.tensor<1024xf32>, !coco.tensor<1024xf32>)
// GENERIC:         "comm.fused"() <{kind = #comm<fusion_kind elementwise>}> ({
// GENERIC-NEXT:      %2 = "coco.neg"(%a)
// GENERIC-NEXT:      "comm.yield"() : () -> ()
// GENERIC-NEXT:    }) : () -> ()

// -----

// Overlap regions: a matmul pipelined with the collective that consumes it; one or two
// results; attr-dicts; a fused collective inside an overlap.

func.func @overlap(%a: !coco.tensor<64x32xf16, sliced<1>>, %b: !coco.tensor<32x16xf16, sliced<0>>) {
  %r = comm.overlap chunks 4 -> !coco.tensor<64x16xf16> {
    %p = coco.matmul %a, %b : !coco.tensor<64x32xf16, sliced<1>>, !coco.tensor<32x16xf16, sliced<0>> -> !coco.tensor<64x16xf16, local>
    %s = comm.all_reduce sum %p : !coco.tensor<64x16xf16, local> -> !coco.tensor<64x16xf16>
    comm.yield %s : !coco.tensor<64x16xf16>
  }
  %x, %y = comm.overlap chunks 2 attributes {sym = "ov"} -> !coco.tensor<64x16xf16, local>, !coco.tensor<64x16xf16> {
    %p = coco.matmul %a, %b : !coco.tensor<64x32xf16, sliced<1>>, !coco.tensor<32x16xf16, sliced<0>> -> !coco.tensor<64x16xf16, local>
    %f = comm.fused all_reduce -> !coco.tensor<64x16xf16> {
      %rs = comm.reduce_scatter sum %p : !coco.tensor<64x16xf16, local> -> !coco.tensor<64x16xf16, sliced<0>>
      %ag = comm.all_gather %rs : !coco.tensor<64x16xf16, sliced<0>> -> !coco.tensor<64x16xf16>
      comm.yield %ag : !coco.tensor<64x16xf16>
    }
    comm.yield %p, %f : !coco.tensor<64x16xf16, local>, !coco.tensor<64x16xf16>
  }
  func.return
}

// CHECK-LABEL: func.func @overlap(
// CHECK-NEXT:    %r = comm.overlap chunks 4 -> !coco.tensor<64x16xf16> {{{$}}
// CHECK-NEXT:      %p = coco.matmul %a, %b : !coco.tensor<64x32xf16, sliced<1>>, !coco.tensor<32x16xf16, sliced<0>> -> !coco.tensor<64x16xf16, local>{{$}}
// CHECK-NEXT:      %s = comm.all_reduce sum %p : !coco.tensor<64x16xf16, local> -> !coco.tensor<64x16xf16>{{$}}
// CHECK-NEXT:      comm.yield %s : !coco.tensor<64x16xf16>{{$}}
// CHECK-NEXT:    }{{$}}
// CHECK-NEXT:    %x, %y = comm.overlap chunks 2 attributes {sym = "ov"} -> !coco.tensor<64x16xf16, local>, !coco.tensor<64x16xf16> {{{$}}
// CHECK-NEXT:      %p_1 = coco.matmul %a, %b : !coco.tensor<64x32xf16, sliced<1>>, !coco.tensor<32x16xf16, sliced<0>> -> !coco.tensor<64x16xf16, local>{{$}}
// CHECK-NEXT:      %f = comm.fused all_reduce -> !coco.tensor<64x16xf16> {{{$}}
// CHECK-NEXT:        %rs = comm.reduce_scatter sum %p_1 : !coco.tensor<64x16xf16, local> -> !coco.tensor<64x16xf16, sliced<0>>{{$}}
// CHECK-NEXT:        %ag = comm.all_gather %rs : !coco.tensor<64x16xf16, sliced<0>> -> !coco.tensor<64x16xf16>{{$}}
// CHECK-NEXT:        comm.yield %ag : !coco.tensor<64x16xf16>{{$}}
// CHECK-NEXT:      }{{$}}
// CHECK-NEXT:      comm.yield %p_1, %f : !coco.tensor<64x16xf16, local>, !coco.tensor<64x16xf16>{{$}}
// CHECK-NEXT:    }{{$}}
// CHECK-NEXT:    func.return{{$}}

// GENERIC-LABEL: "func.func"() <{sym_name = "overlap"
// GENERIC:         %r = "comm.overlap"() <{chunks = 4 : i64}> ({
// GENERIC:         %x, %y = "comm.overlap"() <{chunks = 2 : i64}> ({
// GENERIC:         }) {sym = "ov"} : () -> (!coco.tensor<64x16xf16, local>, !coco.tensor<64x16xf16>)
