# RUN: python %s | filecheck %s

# The invalid programs a fuzzer found accepted (or crashing, or hanging a tool downstream):
# each now ends in coco-opt's error contract, with or without a target that would have run
# into it: exit status 1, one `coco-opt: error: [rule] ...` line first on stderr, nothing on
# stdout, no Python traceback, and no hang (lit's time limit on this file). coco-opt's `main`
# runs each in this one process (Inputs/in_process.py).

import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "Inputs"))

from in_process import run_coco_opt

T8 = "!coco.tensor<8xf32>"

CASES = [
    (
        "misspelt-grid",
        "unknown-attribute",
        [],
        (
            f"func.func @f(%a: {T8}) attributes {{coco.gird = #coco.grid<[2]>}} {{\n"
            "  func.return\n}\n"
        ),
    ),
    (
        "op-attribute",
        "unknown-attribute",
        [],
        (
            f"func.func @f(%a: {T8}) {{\n"
            f"  %0 = coco.neg %a {{coco.bogus = 1 : i64}} : {T8}\n  func.return\n}}\n"
        ),
    ),
    (
        "stray-op",
        "module-ops",
        [],
        (
            f"%0 = coco.constant 1.0 : !coco.tensor<f32>\nfunc.func @f(%a: {T8}) {{\n"
            "  func.return\n}\n"
        ),
    ),
    (
        "foreign-op",
        "foreign-op",
        [],
        f'func.func @f(%a: {T8}) {{\n  "test.op"() : () -> ()\n  func.return\n}}\n',
    ),
    ("declaration", "function-declaration", [], f"func.func private @f(%a: {T8})\n"),
    (
        "grid-2^40",
        "grid-size",
        ["-t", "cuda"],
        (
            "func.func @f() attributes {coco.grid = #coco.grid<[1099511627776]>} {\n"
            "  func.return\n}\n"
        ),
    ),
    (
        "grid-2^64",
        "grid-size",
        ["-t", "cuda"],
        (
            "func.func @f() attributes {coco.grid = #coco.grid<[18446744073709551616]>} {\n"
            "  func.return\n}\n"
        ),
    ),
    (
        "dim-2^63",
        "tensor-size",
        ["-t", "plan{ranks=1}"],
        "func.func @f(%a: !coco.tensor<9223372036854775808xf32>) {\n  func.return\n}\n",
    ),
    (
        "use-before-def",
        "dominance",
        ["-t", "plan{ranks=1}"],
        (
            f"func.func @f(%a: {T8}) {{\n  %1 = coco.neg %0 : {T8}\n"
            f"  %0 = coco.neg %a : {T8}\n  func.return\n}}\n"
        ),
    ),
    (
        "own-result",
        "dominance",
        ["-t", "plan{ranks=1}"],
        f"func.func @f(%a: {T8}) {{\n  %0 = coco.add %a, %0 : {T8}\n  func.return\n}}\n",
    ),
    (
        "fused-reduce",
        "fuse-elementwise",
        ["-t", "plan{ranks=2}"],
        (
            f"func.func @f(%a: {T8}) -> !coco.tensor<f32> {{\n"
            "  %r = comm.fused elementwise -> !coco.tensor<f32> {\n"
            f"    %s = coco.reduce sum %a : {T8} -> !coco.tensor<f32>\n"
            "    comm.yield %s : !coco.tensor<f32>\n  }\n"
            "  func.return %r : !coco.tensor<f32>\n}\n"
        ),
    ),
    (
        "fused-func",
        "nested-function",
        ["-t", "plan{ranks=2}"],
        (
            f"func.func @f(%a: {T8}) {{\n  comm.fused elementwise {{\n"
            "    func.func @g() {\n      func.return\n    }\n    comm.yield\n  }\n"
            "  func.return\n}\n"
        ),
    ),
]

with tempfile.TemporaryDirectory() as tmp:
    for name, rule, args, text in CASES:
        path = os.path.join(tmp, f"{name}.mlir")
        with open(path, "w") as f:
            f.write(text)
        print(f"{name}: {run_coco_opt([path, *args]).contract(rule)}")

# CHECK:      misspelt-grid: rc=1 error-lines=1 rule=True stdout-empty=True traceback=False
# CHECK-NEXT: op-attribute: rc=1 error-lines=1 rule=True stdout-empty=True traceback=False
# CHECK-NEXT: stray-op: rc=1 error-lines=1 rule=True stdout-empty=True traceback=False
# CHECK-NEXT: foreign-op: rc=1 error-lines=1 rule=True stdout-empty=True traceback=False
# CHECK-NEXT: declaration: rc=1 error-lines=1 rule=True stdout-empty=True traceback=False
# CHECK-NEXT: grid-2^40: rc=1 error-lines=1 rule=True stdout-empty=True traceback=False
# CHECK-NEXT: grid-2^64: rc=1 error-lines=1 rule=True stdout-empty=True traceback=False
# CHECK-NEXT: dim-2^63: rc=1 error-lines=1 rule=True stdout-empty=True traceback=False
# CHECK-NEXT: use-before-def: rc=1 error-lines=1 rule=True stdout-empty=True traceback=False
# CHECK-NEXT: own-result: rc=1 error-lines=1 rule=True stdout-empty=True traceback=False
# CHECK-NEXT: fused-reduce: rc=1 error-lines=1 rule=True stdout-empty=True traceback=False
# CHECK-NEXT: fused-func: rc=1 error-lines=1 rule=True stdout-empty=True traceback=False
