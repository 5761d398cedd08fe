// RUN: not coco-opt %s -p apply-pdl --verify-equivalence 2>&1 | filecheck %s
// RUN: coco-opt %s -p apply-pdl | filecheck %s --check-prefix=UNCHECKED
// RUN: not coco-opt %s -p apply-pdl --verify-equivalence 2>/dev/null | filecheck %s --check-prefix=NO-IR --allow-empty

// A pipeline that changes the program's meaning. No coconet pass does (that is the point),
// so xDSL's `apply-pdl` applies the PDL pattern below, which turns `w - lr * g` into
// `w + lr * g`. Without --verify-equivalence coco-opt prints the wrong program happily;
// with it, coco-opt names the output, rank count, rank and error, and exits 1.

// CHECK:      coco-opt: error: --verify-equivalence: the pipeline 'apply-pdl' changed the meaning of @sgd
// CHECK-NEXT: @sgd: NOT equivalent (bit-exact; 6 run(s) on 1, 2, 4 rank count(s)): 6 mismatch(es) in output(s) 'w'
// CHECK-NEXT:   output 'w' at 1 rank(s), seed 0: 16 of 16 element(s) differ; first differing rank 0; max abs error {{[0-9.e+-]+}}, max rel error {{[0-9.e+-]+}}; e.g. at [0]: before {{.*}}, after {{.*}}
// CHECK:        output 'w' at 4 rank(s), seed 1: 16 of 16 element(s) differ; first differing rank 0
// CHECK-NOT:  Traceback

// UNCHECKED: %w1 = coco.add %w, %s

// NO-IR-NOT: builtin.module

func.func @sgd(%g: !coco.tensor<16xf32, local>, %w: !coco.tensor<16xf32>, %lr: !coco.tensor<f32>) {
  %g1 = comm.all_reduce sum %g : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32>
  %s = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<16xf32> -> !coco.tensor<16xf32>
  %w1 = coco.sub %w, %s : !coco.tensor<16xf32>
  coco.update %w, %w1 : !coco.tensor<16xf32>
  func.return
}

pdl.pattern @sub_to_add : benefit(1) {
  %a = pdl.operand
  %b = pdl.operand
  %t = pdl.type
  %op = pdl.operation "coco.sub" (%a, %b : !pdl.value, !pdl.value) -> (%t : !pdl.type)
  pdl.rewrite %op {
    %new = pdl.operation "coco.add" (%a, %b : !pdl.value, !pdl.value) -> (%t : !pdl.type)
    pdl.replace %op with %new
  }
}
