// Minimized inputs the fuzzer (test/fuzz) found crashing or silently accepted: each is a
// clean one-line error now (coco_opt_errors.py runs them, this program with launch options
// out of range among them), and the fused regions, a plan.

// RUN: coco-opt %s -t plan | filecheck %s --check-prefix=PLAN
// PLAN: plan @f on grid [1]

func.func @f(%w: !coco.tensor<8xf32>) {
  func.return
}
