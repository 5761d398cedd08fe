// Every user-facing error of coco-opt is one `coco-opt: error:` line on stderr (a parse
// error adds the source line and a caret), a non-zero exit, and never a Python traceback.
// coco_opt_errors.py checks every error (its exit status and message) in one process; these
// runs start the real coco-opt: an input error, a pass refusing on the command line (at the
// op it is about), and this valid input.

// RUN: not coco-opt %S/Inputs/syntax_error.mlir 2>&1 | filecheck %s --check-prefix=SYNTAX
// RUN: not coco-opt %s -p 'coco-split-allreduce{ops=y dim=3}' 2>&1 | filecheck %s --check-prefix=REFUSAL
// RUN: coco-opt %s 2>&1 | filecheck %s --check-prefix=VALID

func.func @valid(%x: !coco.tensor<8xf32, local>) -> !coco.tensor<8xf32> {
  // REFUSAL-NOT:  Traceback
  // REFUSAL:      coco-opt: error: {{.*}}coco_opt_errors.mlir:[[# @LINE + 2]]:3: [split-allreduce-scalar] %y (comm.all_reduce) reduces a value of type !coco.tensor<8xf32, local>, which has no dim 3 to slice for a reduce_scatter
  // REFUSAL-NOT:  {{.}}
  %y = comm.all_reduce sum %x : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  func.return %y : !coco.tensor<8xf32>
}

// SYNTAX-NOT:  Traceback
// SYNTAX:      coco-opt: error: {{.*}}syntax_error.mlir:5:1: ')' expected
// SYNTAX-NOT:  Traceback

// VALID-NOT:  error
// VALID:      func.func @valid(%x: !coco.tensor<8xf32, local>) -> !coco.tensor<8xf32>
// VALID-NOT:  error
