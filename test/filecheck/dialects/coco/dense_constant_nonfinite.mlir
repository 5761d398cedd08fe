// RUN: COCO_ROUNDTRIP

// Non-finite values of a dense constant are spelled as in splats (inf, -inf, nan) and
// round-trip through the custom form. Not through the generic form: xDSL 0.74 prints them
// in a dense attribute as hex bit patterns, which its own parser reads back as integers.

func.func @dense_constant_nonfinite() {
  %0 = coco.constant dense<[[inf, -inf, nan], [-0.0, 1.0e-5, 65504.0]]> : !coco.tensor<2x3xf16>
  func.return
}

// CHECK-LABEL: func.func @dense_constant_nonfinite() {
// CHECK-NEXT:    %0 = coco.constant dense<{{\[\[}}inf, -inf, nan], [-0.0, 1.0e-05, 65504.0]]> : !coco.tensor<2x3xf16>{{$}}
// CHECK-NEXT:    func.return{{$}}
