// RUN: COCO_ROUNDTRIP
// RUN: COCO_GENERIC_ROUNDTRIP
// RUN: coco-opt %s --split-input-file --print-op-generic | filecheck %s --check-prefix=GENERIC

// The numerics policy (docs/architecture.md §3.4.2): an op's own `numerics exact|fast` (a
// property, between its operands and its attributes) and a module's or function's
// `coco.numerics` default, printed as written and parsed back in both forms.

builtin.module attributes {coco.numerics = #coco<numerics fast>} {
  func.func @module_default(%x: !coco.tensor<8xf32, sliced<0>>) -> (!coco.tensor<8xf32, sliced<0>>, !coco.tensor<8xf32, sliced<0>>) {
    %e = coco.exp %x : !coco.tensor<8xf32, sliced<0>>
    %l = coco.log %x numerics exact : !coco.tensor<8xf32, sliced<0>>
    func.return %e, %l : !coco.tensor<8xf32, sliced<0>>, !coco.tensor<8xf32, sliced<0>>
  }
}

// CHECK:       builtin.module attributes {coco.numerics = #coco<numerics fast>} {
// CHECK-NEXT:    func.func @module_default
// CHECK-NEXT:      %e = coco.exp %x : !coco.tensor<8xf32, sliced<0>>{{$}}
// CHECK-NEXT:      %l = coco.log %x numerics exact : !coco.tensor<8xf32, sliced<0>>{{$}}

// GENERIC:       %e = "coco.exp"(%x) : (!coco.tensor<8xf32, sliced<0>>)
// GENERIC:       %l = "coco.log"(%x) <{numerics = #coco<numerics exact>}>
// GENERIC:       }) {coco.numerics = #coco<numerics fast>} : () -> ()

// -----

func.func @per_op(%x: !coco.tensor<8xf32, sliced<0>>, %y: !coco.tensor<8xbf16, sliced<0>>) -> !coco.tensor<8xbf16, sliced<0>> attributes {coco.numerics = #coco<numerics exact>} {
  %t = coco.tanh %x numerics fast : !coco.tensor<8xf32, sliced<0>>
  %s = coco.sigmoid %t numerics fast {note = "kept"} : !coco.tensor<8xf32, sliced<0>>
  %g = coco.gelu %y numerics fast : !coco.tensor<8xbf16, sliced<0>>
  %r = coco.rsqrt %y numerics fast : !coco.tensor<8xbf16, sliced<0>>
  %p = coco.pow %g, %r numerics fast : !coco.tensor<8xbf16, sliced<0>>
  func.return %p : !coco.tensor<8xbf16, sliced<0>>
}

// CHECK-LABEL: func.func @per_op
// CHECK-SAME:    attributes {coco.numerics = #coco<numerics exact>}
// CHECK-NEXT:    %t = coco.tanh %x numerics fast : !coco.tensor<8xf32, sliced<0>>{{$}}
// CHECK-NEXT:    %s = coco.sigmoid %t numerics fast {note = "kept"} : !coco.tensor<8xf32, sliced<0>>{{$}}
// CHECK-NEXT:    %g = coco.gelu %y numerics fast : !coco.tensor<8xbf16, sliced<0>>{{$}}
// CHECK-NEXT:    %r = coco.rsqrt %y numerics fast : !coco.tensor<8xbf16, sliced<0>>{{$}}
// CHECK-NEXT:    %p = coco.pow %g, %r numerics fast : !coco.tensor<8xbf16, sliced<0>>{{$}}

// GENERIC:       "coco.tanh"(%x) <{numerics = #coco<numerics fast>}>
