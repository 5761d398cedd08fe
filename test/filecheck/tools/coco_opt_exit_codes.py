# RUN: python %s | filecheck %s

# coco-opt's error contract, exactly: exit status 1, one `coco-opt: error:` line as the
# first line of stderr, nothing on stdout, and no Python traceback.

import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
INPUTS = os.path.join(HERE, "Inputs")
VALID = os.path.join(HERE, "coco_opt_errors.mlir")

CASES = [
    ("syntax-error", [os.path.join(INPUTS, "syntax_error.mlir")]),
    ("unknown-op", [os.path.join(INPUTS, "unknown_op.mlir")]),
    ("unknown-pass", [VALID, "-p", "nope"]),
    ("bad-pass-option", [VALID, "-p", "canonicalize{bogus=1}"]),
    ("missing-file", [os.path.join(INPUTS, "does_not_exist.mlir")]),
    ("empty-input", [os.path.join(INPUTS, "empty.mlir")]),
    ("layout-error", [os.path.join(INPUTS, "layout_error.mlir")]),
    ("element-type", [os.path.join(INPUTS, "element_type.mlir")]),
    ("not-a-tensor", [os.path.join(INPUTS, "not_a_tensor.mlir")]),
    ("constant-literal", [os.path.join(INPUTS, "constant_literal.mlir")]),
    ("split-input-file", [os.path.join(INPUTS, "layout_error.mlir"), "--split-input-file"]),
]

coco_opt = shutil.which("coco-opt")
if coco_opt is None:
    sys.exit("coco-opt is not on PATH")

for name, args in CASES:
    proc = subprocess.run([coco_opt, *args], capture_output=True, text=True, timeout=60)
    lines = proc.stderr.splitlines()
    first = lines[0] if lines else ""
    error_lines = sum(line.startswith("coco-opt: error:") for line in lines)
    traceback = "Traceback" in proc.stderr or "Traceback" in proc.stdout
    print(
        f"{name}: rc={proc.returncode} error-lines={error_lines} "
        f"first-is-error={first.startswith('coco-opt: error: ')} "
        f"stdout-empty={not proc.stdout.strip()} traceback={traceback}"
    )

# CHECK:      syntax-error: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT: unknown-op: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT: unknown-pass: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT: bad-pass-option: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT: missing-file: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT: empty-input: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT: layout-error: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT: element-type: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT: not-a-tensor: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT: constant-literal: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
# CHECK-NEXT: split-input-file: rc=1 error-lines=1 first-is-error=True stdout-empty=True traceback=False
