// Every user-facing error of coco-opt is one `coco-opt: error:` line on stderr (a parse
// error adds the source line and a caret), a non-zero exit, and never a Python traceback.
// Exact exit codes are checked by coco_opt_exit_codes.py.

// RUN: not coco-opt %S/Inputs/syntax_error.mlir 2>&1 | filecheck %s --check-prefix=SYNTAX
// SYNTAX-NOT:  Traceback
// SYNTAX:      coco-opt: error: {{.*}}syntax_error.mlir:5:1: ')' expected
// SYNTAX-NOT:  Traceback

// RUN: not coco-opt %S/Inputs/unknown_op.mlir 2>&1 | filecheck %s --check-prefix=UNKNOWN-OP
// UNKNOWN-OP-NOT:  Traceback
// UNKNOWN-OP:      coco-opt: error: {{.*}}unknown_op.mlir:2:19: Operation coco.bogus is not registered
// UNKNOWN-OP-NEXT:   %0 = coco.bogus %a : !coco.tensor<8xf32>
// UNKNOWN-OP-NEXT:   ^^
// UNKNOWN-OP-NOT:  Traceback

// With --split-input-file the location is a line of the whole file, not of the chunk.
// RUN: not coco-opt %S/Inputs/second_chunk_error.mlir --split-input-file 2>&1 | filecheck %s --check-prefix=CHUNK
// CHUNK-NOT:  Traceback
// CHUNK:      func.func @ok()
// CHUNK:      coco-opt: error: {{.*}}second_chunk_error.mlir:6:19: Operation coco.bogus is not registered
// CHUNK-NOT:  Traceback

// RUN: not coco-opt %s -p nope 2>&1 | filecheck %s --check-prefix=UNKNOWN-PASS
// UNKNOWN-PASS-NOT:  Traceback
// UNKNOWN-PASS:      coco-opt: error: Unrecognized passes: ['nope']
// UNKNOWN-PASS-NOT:  Traceback

// An unquoted option value with parentheses: xDSL raises a BaseException for it.
// RUN: not coco-opt %s -p 'coco-schedule{name=fuse(rs-c-ag)}' 2>&1 | filecheck %s --check-prefix=PIPELINE
// PIPELINE-NOT:  Traceback
// PIPELINE:      coco-opt: error: malformed pass pipeline: Error parsing pass pipeline specification:
// PIPELINE:      (quote option values holding parentheses or commas: -p 'coco-schedule{name="fuse(rs-c-ag)"}')
// PIPELINE-NOT:  Traceback

// RUN: not coco-opt %s -p 'canonicalize{bogus=1}' 2>&1 | filecheck %s --check-prefix=PASS-OPTION
// PASS-OPTION-NOT:  Traceback
// PASS-OPTION:      coco-opt: error: Provided arguments ["bogus"] not found in expected arguments []
// PASS-OPTION-NOT:  Traceback

// RUN: not coco-opt %S/Inputs/does_not_exist.mlir 2>&1 | filecheck %s --check-prefix=MISSING
// MISSING-NOT:  Traceback
// MISSING:      coco-opt: error: {{.*}}does_not_exist.mlir: No such file or directory
// MISSING-NOT:  Traceback

// RUN: not coco-opt %S/Inputs/empty.mlir 2>&1 | filecheck %s --check-prefix=EMPTY
// EMPTY-NOT:  Traceback
// EMPTY:      coco-opt: error: {{.*}}empty.mlir:2:1: Could not parse entire input!
// EMPTY-NOT:  Traceback

// Without --verify-diagnostics a verifier error is an error too, on one line.
// RUN: not coco-opt %S/Inputs/layout_error.mlir 2>&1 | filecheck %s --check-prefix=LAYOUT
// LAYOUT-NOT:  Traceback
// LAYOUT:      coco-opt: error: [all-reduce-input] all_reduce of %a : !coco.tensor<8xf32, sliced<0>>, which is sliced<0> on grid axis 0
// LAYOUT-NOT:  Traceback

// RUN: not coco-opt %S/Inputs/element_type.mlir 2>&1 | filecheck %s --check-prefix=ELEMENT
// ELEMENT-NOT:  Traceback
// ELEMENT:      coco-opt: error: [unsupported-element-type] unsupported element type i8
// ELEMENT-NOT:  Traceback

// xDSL's own (IRDL) verifier messages span two lines; coco-opt keeps them on one.
// RUN: not coco-opt %S/Inputs/not_a_tensor.mlir 2>&1 | filecheck %s --check-prefix=NOT-A-TENSOR
// NOT-A-TENSOR-NOT:  Traceback
// NOT-A-TENSOR:      coco-opt: error: i32 should be of base attribute coco.tensor
// NOT-A-TENSOR-NOT:  Traceback

// RUN: not coco-opt %S/Inputs/constant_literal.mlir 2>&1 | filecheck %s --check-prefix=LITERAL
// LITERAL-NOT:  Traceback
// LITERAL:      coco-opt: error: {{.*}}constant_literal.mlir:2:22: coco.constant of element type i32 needs an integer literal, got 1.5
// LITERAL-NOT:  Traceback

// The same input is fine with no errors: this file itself is valid.
// RUN: coco-opt %s 2>&1 | filecheck %s --check-prefix=VALID
// VALID-NOT:  error
// VALID:      func.func @valid(%x: !coco.tensor<8xf32, local>) -> !coco.tensor<8xf32>
// VALID-NOT:  error

func.func @valid(%x: !coco.tensor<8xf32, local>) -> !coco.tensor<8xf32> {
  %y = comm.all_reduce sum %x : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  func.return %y : !coco.tensor<8xf32>
}
