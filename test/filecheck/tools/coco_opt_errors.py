# RUN: python %s | filecheck %s

# coco-opt's error contract, exactly: exit status 1, one `coco-opt: error:` line as the
# first line of stderr (a parse error adds the source line and a caret), nothing on stdout,
# and no Python traceback; and each error's message. Every case runs coco-opt's `main` in
# this one process (Inputs/in_process.py); coco_opt_errors.mlir starts the real coco-opt for
# a few of them, and is the valid input the option cases use.

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
INPUTS = os.path.join(HERE, "Inputs")
VALID = os.path.join(HERE, "coco_opt_errors.mlir")
FUZZED = os.path.join(HERE, "fuzz_regressions.mlir")
sys.path.insert(0, INPUTS)

from in_process import run_coco_opt  # noqa: E402


def case(name, *args):
    """Run `coco-opt ARGS`: a line of its contract, then its stderr and its stdout."""
    run = run_coco_opt(list(args))
    print(f"== {name}: {run.contract()}")
    print(run.stderr + run.stdout, end="")


case("syntax-error", os.path.join(INPUTS, "syntax_error.mlir"))
# CHECK-LABEL: == syntax-error: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: {{.*}}syntax_error.mlir:5:1: ')' expected

case("unknown-op", os.path.join(INPUTS, "unknown_op.mlir"))
# CHECK-LABEL: == unknown-op: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: {{.*}}unknown_op.mlir:2:19: Operation coco.bogus is not registered
# CHECK-NEXT:    %0 = coco.bogus %a : !coco.tensor<8xf32>
# CHECK-NEXT:    ^^

# With --split-input-file the location is a line of the whole file, not of the chunk; the
# chunks before it were printed.
case("second-chunk", os.path.join(INPUTS, "second_chunk_error.mlir"), "--split-input-file")
# CHECK-LABEL: == second-chunk: rc=1 error-lines=1 first-is-error=True stdout-empty=False traceback=False
# CHECK-NEXT:  coco-opt: error: {{.*}}second_chunk_error.mlir:6:19: Operation coco.bogus is not registered
# CHECK:       func.func @ok()

case("unknown-pass", VALID, "-p", "nope")
# CHECK-LABEL: == unknown-pass: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: Unrecognized passes: ['nope']

# An unquoted option value with parentheses: xDSL raises a BaseException for it.
case("malformed-pipeline", VALID, "-p", "coco-schedule{name=fuse(rs-c-ag)}")
# CHECK-LABEL: == malformed-pipeline: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: malformed pass pipeline: Error parsing pass pipeline specification:
# CHECK:       (quote option values holding parentheses or commas: -p 'coco-schedule{name="fuse(rs-c-ag)"}')

case("bad-pass-option", VALID, "-p", "canonicalize{bogus=1}")
# CHECK-LABEL: == bad-pass-option: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: Provided arguments ["bogus"] not found in expected arguments []

# A pass refusing on the command line: at the op it is about.
case("pass-refusal", VALID, "-p", "coco-split-allreduce{ops=y dim=3}")
# CHECK-LABEL: == pass-refusal: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: {{.*}}coco_opt_errors.mlir:15:3: [split-allreduce-scalar] %y (comm.all_reduce) reduces a value of type !coco.tensor<8xf32, local>, which has no dim 3 to slice for a reduce_scatter

case("missing-file", os.path.join(INPUTS, "does_not_exist.mlir"))
# CHECK-LABEL: == missing-file: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: {{.*}}does_not_exist.mlir: No such file or directory

case("empty-input", os.path.join(INPUTS, "empty.mlir"))
# CHECK-LABEL: == empty-input: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: {{.*}}empty.mlir:2:1: Could not parse entire input!

# Without --verify-diagnostics a verifier error is an error too, on one line.
case("layout-error", os.path.join(INPUTS, "layout_error.mlir"))
# CHECK-LABEL: == layout-error: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: [all-reduce-input] all_reduce of %a : !coco.tensor<8xf32, sliced<0>>, which is sliced<0> on grid axis 0: all_reduce takes local or replicated tensors (all_gather a slice)
# CHECK-NOT:   {{.}}

case("split-input-file", os.path.join(INPUTS, "layout_error.mlir"), "--split-input-file")
# CHECK-LABEL: == split-input-file: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: [all-reduce-input] all_reduce of %a

case("element-type", os.path.join(INPUTS, "element_type.mlir"))
# CHECK-LABEL: == element-type: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: [unsupported-element-type] unsupported element type i8

# xDSL's own (IRDL) verifier messages span two lines; coco-opt keeps them on one.
case("not-a-tensor", os.path.join(INPUTS, "not_a_tensor.mlir"))
# CHECK-LABEL: == not-a-tensor: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: i32 should be of base attribute coco.tensor

case("constant-literal", os.path.join(INPUTS, "constant_literal.mlir"))
# CHECK-LABEL: == constant-literal: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: {{.*}}constant_literal.mlir:2:22: coco.constant of element type i32 needs an integer literal, got 1.5

# Minimized inputs the fuzzer (test/fuzz) found crashing or silently accepted, each a clean
# one-line error now (fuzz_regressions.mlir lowers the valid one).

# A file that is not UTF-8: xDSL's decoder said only `error: utf-8`; the byte is named now.
case("not-utf8", os.path.join(INPUTS, "not_utf8.mlir"))
# CHECK-LABEL: == not-utf8: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: {{.*}}not_utf8.mlir:4:7: the input is not UTF-8 text (byte 0xe9: invalid continuation byte)

# A float literal its type cannot hold: xDSL's FloatAttr raised OverflowError while parsing.
case("literal-overflow", os.path.join(INPUTS, "literal_overflow.mlir"))
# CHECK-LABEL: == literal-overflow: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: {{.*}}literal_overflow.mlir: a literal does not fit its type: float too large to pack with f format

# Launch options out of range: `block=0` divided by zero; a negative rank count printed a plan
# on grid [-2].
case("block-0", FUZZED, "-t", "plan{block=0}")
# CHECK-LABEL: == block-0: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: [launch-config] block must be an integer in 1..1024, got 0

case("block-2048", FUZZED, "-t", "cuda{block=2048}")
# CHECK-LABEL: == block-2048: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: [launch-config] block must be an integer in 1..1024, got 2048

case("max-blocks", FUZZED, "-t", "plan{max_blocks=-1}")
# CHECK-LABEL: == max-blocks: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: [launch-config] max_blocks must be an integer in 1..2147483648, got -1

case("ranks", FUZZED, "-t", "plan{ranks=-2}")
# CHECK-LABEL: == ranks: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT:  coco-opt: error: @f: a job needs at least 1 rank, but -2 were given
# CHECK-NOT:   plan @f

# The same input is fine with no errors.
case("valid", VALID)
# CHECK-LABEL: == valid: rc=0 error-lines=0 first-is-error=False stdout-empty=False traceback=False
# CHECK-NEXT:  builtin.module {
# CHECK-NEXT:    func.func @valid(%x: !coco.tensor<8xf32, local>) -> !coco.tensor<8xf32>
