// RUN: COCO_ROUNDTRIP
// RUN: COCO_GENERIC_ROUNDTRIP

// comm.all_to_all: the result type names the dim each spanned axis re-cuts (sliced<a> ->
// sliced<b>, a != b, uneven sizes included), or the dispatch form on local tensors (dim 0 cut
// into one block per member). Every element type, `over` on a 2-D grid, attr-dicts.

func.func @all_to_all(%x: !coco.tensor<8x6xf32, sliced<0>>, %h: !coco.tensor<5x7x3xbf16, sliced<2>>,
                      %i: !coco.tensor<16x4xi32, sliced<1>>, %l: !coco.tensor<4x9xi64, sliced<0>>,
                      %f: !coco.tensor<6x6xf16, sliced<0>>, %d: !coco.tensor<3x5xf64, sliced<1>>,
                      %e: !coco.tensor<12x2xf32, local>)
    attributes {coco.grid = #coco.grid<[3]>} {
  %0 = comm.all_to_all %x : !coco.tensor<8x6xf32, sliced<0>> -> !coco.tensor<8x6xf32, sliced<1>>
  %1 = comm.all_to_all %h : !coco.tensor<5x7x3xbf16, sliced<2>> -> !coco.tensor<5x7x3xbf16, sliced<0>>
  %2 = comm.all_to_all %i {k} : !coco.tensor<16x4xi32, sliced<1>> -> !coco.tensor<16x4xi32, sliced<0>>
  %3 = comm.all_to_all %l over [0] : !coco.tensor<4x9xi64, sliced<0>> -> !coco.tensor<4x9xi64, sliced<1>>
  %4 = comm.all_to_all %f : !coco.tensor<6x6xf16, sliced<0>> -> !coco.tensor<6x6xf16, sliced<1>>
  %5 = comm.all_to_all %d : !coco.tensor<3x5xf64, sliced<1>> -> !coco.tensor<3x5xf64, sliced<0>>
  %6 = comm.all_to_all %e : !coco.tensor<12x2xf32, local>
  func.return
}

// CHECK-LABEL: func.func @all_to_all(
// CHECK-SAME:      attributes {coco.grid = #coco.grid<[3]>} {
// CHECK-NEXT:    %0 = comm.all_to_all %x : !coco.tensor<8x6xf32, sliced<0>> -> !coco.tensor<8x6xf32, sliced<1>>{{$}}
// CHECK-NEXT:    %1 = comm.all_to_all %h : !coco.tensor<5x7x3xbf16, sliced<2>> -> !coco.tensor<5x7x3xbf16, sliced<0>>{{$}}
// CHECK-NEXT:    %2 = comm.all_to_all %i {k} : !coco.tensor<16x4xi32, sliced<1>> -> !coco.tensor<16x4xi32, sliced<0>>{{$}}
// CHECK-NEXT:    %3 = comm.all_to_all %l over [0] : !coco.tensor<4x9xi64, sliced<0>> -> !coco.tensor<4x9xi64, sliced<1>>{{$}}
// CHECK-NEXT:    %4 = comm.all_to_all %f : !coco.tensor<6x6xf16, sliced<0>> -> !coco.tensor<6x6xf16, sliced<1>>{{$}}
// CHECK-NEXT:    %5 = comm.all_to_all %d : !coco.tensor<3x5xf64, sliced<1>> -> !coco.tensor<3x5xf64, sliced<0>>{{$}}
// CHECK-NEXT:    %6 = comm.all_to_all %e : !coco.tensor<12x2xf32, local>{{$}}
// CHECK-NEXT:    func.return

// -----

// On a 2-D grid: one axis re-cut, the other kept; both axes at once, to one dim or each to its
// own (the types say it per axis); a dim two axes cut, changing the inner one; the dispatch
// form inside each row of a grid sized at launch.
func.func @all_to_all_2d(%x: !coco.tensor<8x8xf32, [sliced<0>, sliced<1>]>,
                         %y: !coco.tensor<8x8x4xf32, [sliced<0>, sliced<0>]>,
                         %z: !coco.tensor<8x8xf32, [sliced<0>, sliced<1>]>,
                         %e: !coco.tensor<6x4xf16, [local, local]>)
    attributes {coco.grid = #coco.grid<[2, ?]>} {
  %0 = comm.all_to_all %x over [1] : !coco.tensor<8x8xf32, [sliced<0>, sliced<1>]> -> !coco.tensor<8x8xf32, [sliced<0>, sliced<0>]>
  %1 = comm.all_to_all %y : !coco.tensor<8x8x4xf32, [sliced<0>, sliced<0>]> -> !coco.tensor<8x8x4xf32, [sliced<2>, sliced<2>]>
  %2 = comm.all_to_all %z : !coco.tensor<8x8xf32, [sliced<0>, sliced<1>]> -> !coco.tensor<8x8xf32, [sliced<1>, sliced<0>]>
  %3 = comm.all_to_all %y over [1] : !coco.tensor<8x8x4xf32, [sliced<0>, sliced<0>]> -> !coco.tensor<8x8x4xf32, [sliced<0>, sliced<1>]>
  %4 = comm.all_to_all %e over [1] : !coco.tensor<6x4xf16, [local, local]>
  func.return
}

// CHECK-LABEL: func.func @all_to_all_2d(
// CHECK-NEXT:    %0 = comm.all_to_all %x over [1] : !coco.tensor<8x8xf32, [sliced<0>, sliced<1>]> -> !coco.tensor<8x8xf32, [sliced<0>, sliced<0>]>{{$}}
// CHECK-NEXT:    %1 = comm.all_to_all %y : !coco.tensor<8x8x4xf32, [sliced<0>, sliced<0>]> -> !coco.tensor<8x8x4xf32, [sliced<2>, sliced<2>]>{{$}}
// CHECK-NEXT:    %2 = comm.all_to_all %z : !coco.tensor<8x8xf32, [sliced<0>, sliced<1>]> -> !coco.tensor<8x8xf32, [sliced<1>, sliced<0>]>{{$}}
// CHECK-NEXT:    %3 = comm.all_to_all %y over [1] : !coco.tensor<8x8x4xf32, [sliced<0>, sliced<0>]> -> !coco.tensor<8x8x4xf32, [sliced<0>, sliced<1>]>{{$}}
// CHECK-NEXT:    %4 = comm.all_to_all %e over [1] : !coco.tensor<6x4xf16, [local, local]>{{$}}
// CHECK-NEXT:    func.return
