// RUN: coco-opt %s --split-input-file -p coco-schedule --verify-diagnostics | filecheck %s

// An SGD step on a static grid of 3 ranks over 2 elements: a split would leave a rank no
// element (uneven cuts are fine, empty ones are not), so only ar-c applies. Each chunk asks
// for a schedule (its `coco.schedule`, which coco-schedule applies given no name); a refused
// one prints its rule, at the op it is about when there is one.

// CHECK: {{^}}[schedule-unknown] no schedule named 'bogus'; named schedules: ar-c, rs-c-ag, fuse(rs-c-ag), fuse(ar-c), fuse(rs-c), ol(mm,fuse(rs-c-ag)), ol(ag,mm), ol(mm,rs), ol(ag,mm)+ol(mm,rs), sliced-send, fuse(sliced-send), ol(mm,rs)+fuse(sliced-send), ol(mm,rs,fuse(sliced-send),ag)
module attributes {coco.schedule = "bogus"} {
func.func @sgd3(%g: !coco.tensor<2xf32, local>, %w: !coco.tensor<2xf32>, %lr: !coco.tensor<f32>)
    attributes {coco.grid = #coco.grid<[3]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<2xf32, local> -> !coco.tensor<2xf32>
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<2xf32> -> !coco.tensor<2xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<2xf32>
  coco.update %w, %w1 : !coco.tensor<2xf32>
  func.return
}
}

// -----

// No name and no schedule of the module's own.
// CHECK: {{^}}[schedule-unknown] coco-schedule needs a schedule name (name=...), one of ar-c, rs-c-ag, fuse(rs-c-ag), fuse(ar-c), fuse(rs-c), ol(mm,fuse(rs-c-ag)), ol(ag,mm), ol(mm,rs), ol(ag,mm)+ol(mm,rs), sliced-send, fuse(sliced-send), ol(mm,rs)+fuse(sliced-send), ol(mm,rs,fuse(sliced-send),ag), fuse(a2a), fuse(ag), ol(fuse(ag),mm), ol(mm,a2a), ol(a2a,mm), or a module holding its own (coco.schedule = "PIPELINE")
func.func @sgd3(%g: !coco.tensor<2xf32, local>, %w: !coco.tensor<2xf32>, %lr: !coco.tensor<f32>)
    attributes {coco.grid = #coco.grid<[3]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<2xf32, local> -> !coco.tensor<2xf32>
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<2xf32> -> !coco.tensor<2xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<2xf32>
  coco.update %w, %w1 : !coco.tensor<2xf32>
  func.return
}

// -----

// CHECK: {{^}}[schedule-unknown] the schedule 'ol(mm,fuse(rs-c-ag))' needs a matmul whose only reader is an all_reduce, which @sgd3 lacks; schedules that apply to it: ar-c, fuse(ar-c)
module attributes {coco.schedule = "ol(mm,fuse(rs-c-ag))"} {
func.func @sgd3(%g: !coco.tensor<2xf32, local>, %w: !coco.tensor<2xf32>, %lr: !coco.tensor<f32>)
    attributes {coco.grid = #coco.grid<[3]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<2xf32, local> -> !coco.tensor<2xf32>
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<2xf32> -> !coco.tensor<2xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<2xf32>
  coco.update %w, %w1 : !coco.tensor<2xf32>
  func.return
}
}

// -----

// CHECK: {{^}}[schedule-unknown] the schedule 'sliced-send' needs a send of a value computed from an all_reduce, which @sgd3 lacks; schedules that apply to it: ar-c, fuse(ar-c)
module attributes {coco.schedule = "sliced-send"} {
func.func @sgd3(%g: !coco.tensor<2xf32, local>, %w: !coco.tensor<2xf32>, %lr: !coco.tensor<f32>)
    attributes {coco.grid = #coco.grid<[3]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<2xf32, local> -> !coco.tensor<2xf32>
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<2xf32> -> !coco.tensor<2xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<2xf32>
  coco.update %w, %w1 : !coco.tensor<2xf32>
  func.return
}
}

// -----

// A step of the schedule refuses: its rule, the step and the schedule, at the op.
module attributes {coco.schedule = "rs-c-ag"} {
func.func @sgd3(%g: !coco.tensor<2xf32, local>, %w: !coco.tensor<2xf32>, %lr: !coco.tensor<f32>)
    attributes {coco.grid = #coco.grid<[3]>} {
  // CHECK: errors.mlir:[[# @LINE + 1]]:3: [split-allreduce-empty] (coco-split-allreduce{ops=g1}, in schedule 'rs-c-ag') the reduce_scatter of %g1 (comm.all_reduce) of type !coco.tensor<2xf32, sliced<0>>: dim 0 of size 2 cannot be cut into 3 parts (grid [3]): some rank would hold no element of it
  %g1 = comm.all_reduce sum %g : !coco.tensor<2xf32, local> -> !coco.tensor<2xf32>
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<2xf32> -> !coco.tensor<2xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<2xf32>
  coco.update %w, %w1 : !coco.tensor<2xf32>
  func.return
}
}

// -----

// CHECK-LABEL: func.func @sgd3
// CHECK-NEXT:    %g1 = comm.all_reduce sum %g
// CHECK-NEXT:    comm.fused elementwise {
module attributes {coco.schedule = "ar-c"} {
func.func @sgd3(%g: !coco.tensor<2xf32, local>, %w: !coco.tensor<2xf32>, %lr: !coco.tensor<f32>)
    attributes {coco.grid = #coco.grid<[3]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<2xf32, local> -> !coco.tensor<2xf32>
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<2xf32> -> !coco.tensor<2xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<2xf32>
  coco.update %w, %w1 : !coco.tensor<2xf32>
  func.return
}
}

// -----

// A module's schedule is a pipeline coco-opt reads ...
// CHECK: {{^}}[schedule-pipeline] cannot parse the pipeline 'coco-split-allreduce{ops=g1': Error parsing pass pipeline specification:
module attributes {coco.schedule = "coco-split-allreduce{ops=g1"} {
func.func @sgd3(%g: !coco.tensor<2xf32, local>) -> !coco.tensor<2xf32> attributes {coco.grid = #coco.grid<[3]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<2xf32, local> -> !coco.tensor<2xf32>
  func.return %g1 : !coco.tensor<2xf32>
}
}

// -----

// ... and a string (the program rules refuse anything else before any pass runs).
// CHECK: {{^}}[unknown-attribute] builtin.module has 'coco.schedule' = 3 : i64: a schedule is a string, the pass pipeline or schedule name coco-schedule applies (coco.schedule = "coco-reorder{ops=x}")
module attributes {coco.schedule = 3} {
func.func @sgd3(%g: !coco.tensor<2xf32, local>) -> !coco.tensor<2xf32> attributes {coco.grid = #coco.grid<[3]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<2xf32, local> -> !coco.tensor<2xf32>
  func.return %g1 : !coco.tensor<2xf32>
}
}
