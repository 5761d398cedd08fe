// Minimized inputs the fuzzer (test/fuzz) found crashing or silently accepted, each a clean
// one-line error now (or, for the fused regions, a plan).

// A file that is not UTF-8: xDSL's decoder said only `error: utf-8`; the byte is named now.
// RUN: not coco-opt %S/Inputs/not_utf8.mlir 2>&1 | filecheck %s --check-prefix=UTF8
// UTF8-NOT:  Traceback
// UTF8:      coco-opt: error: {{.*}}not_utf8.mlir:4:7: the input is not UTF-8 text (byte 0xe9: invalid continuation byte)
// UTF8-NOT:  Traceback

// A float literal its type cannot hold: xDSL's FloatAttr raised OverflowError while parsing.
// RUN: not coco-opt %S/Inputs/literal_overflow.mlir 2>&1 | filecheck %s --check-prefix=OVERFLOW
// OVERFLOW:      coco-opt: error: {{.*}}literal_overflow.mlir: a literal does not fit its type: float too large to pack with f format
// OVERFLOW-NOT:  Traceback

// Launch options out of range: `block=0` divided by zero; a negative rank count printed a plan
// on grid [-2].
// RUN: not coco-opt %s -t 'plan{block=0}' 2>&1 | filecheck %s --check-prefix=BLOCK
// BLOCK: coco-opt: error: [launch-config] block must be an integer in 1..1024, got 0
// RUN: not coco-opt %s -t 'cuda{block=2048}' 2>&1 | filecheck %s --check-prefix=BLOCK-MAX
// BLOCK-MAX: coco-opt: error: [launch-config] block must be an integer in 1..1024, got 2048
// RUN: not coco-opt %s -t 'plan{max_blocks=-1}' 2>&1 | filecheck %s --check-prefix=BLOCKS
// BLOCKS: coco-opt: error: [launch-config] max_blocks must be an integer in 1..2147483648, got -1
// RUN: not coco-opt %s -t 'plan{ranks=-2}' 2>&1 | filecheck %s --check-prefix=RANKS
// RANKS:     coco-opt: error: @f: a job needs at least 1 rank, but -2 were given
// RANKS-NOT: plan @f

// RUN: coco-opt %s -t plan | filecheck %s --check-prefix=PLAN
// PLAN: plan @f on grid [1]

func.func @f(%w: !coco.tensor<8xf32>) {
  func.return
}
