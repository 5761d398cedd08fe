// RUN: not coco-opt %s -p 'coco-schedule{name=bogus}' 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not coco-opt %s -p 'coco-schedule' 2>&1 | filecheck %s --check-prefix=NONAME
// RUN: not coco-opt %s -p 'coco-schedule{name="ol(mm,fuse(rs-c-ag))"}' 2>&1 | filecheck %s --check-prefix=NOFIT
// RUN: not coco-opt %s -p 'coco-schedule{name=sliced-send}' 2>&1 | filecheck %s --check-prefix=NOSEND
// RUN: not coco-opt %s -p 'coco-schedule{name=rs-c-ag}' 2>&1 | filecheck %s --check-prefix=EMPTY
// RUN: coco-opt %s -p 'coco-schedule{name=ar-c}' | filecheck %s --check-prefix=ARC

// An SGD step on a static grid of 3 ranks over 2 elements: a split would leave a rank no
// element (uneven cuts are fine, empty ones are not), so only ar-c applies.

func.func @sgd3(%g: !coco.tensor<2xf32, local>, %w: !coco.tensor<2xf32>, %lr: !coco.tensor<f32>)
    attributes {coco.grid = #coco.grid<[3]>} {
  %g1 = comm.all_reduce sum %g : !coco.tensor<2xf32, local> -> !coco.tensor<2xf32>
  %d = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<2xf32> -> !coco.tensor<2xf32>
  %w1 = coco.sub %w, %d : !coco.tensor<2xf32>
  coco.update %w, %w1 : !coco.tensor<2xf32>
  func.return
}

// UNKNOWN-NOT: Traceback
// UNKNOWN:     coco-opt: error: [schedule-unknown] no schedule named 'bogus'; named schedules: ar-c, rs-c-ag, fuse(rs-c-ag), fuse(rs-c), ol(mm,fuse(rs-c-ag)), ol(ag,mm), ol(mm,rs), ol(ag,mm)+ol(mm,rs), sliced-send, fuse(sliced-send), ol(mm,rs)+fuse(sliced-send)

// NONAME:      coco-opt: error: [schedule-unknown] coco-schedule needs a schedule name (name=...)

// NOFIT:       coco-opt: error: [schedule-unknown] the schedule 'ol(mm,fuse(rs-c-ag))' needs a matmul whose only reader is an all_reduce, which @sgd3 lacks; schedules that fit it: ar-c, rs-c-ag, fuse(rs-c-ag)

// NOSEND:      coco-opt: error: [schedule-unknown] the schedule 'sliced-send' needs a send of a value computed from an all_reduce, which @sgd3 lacks

// EMPTY-NOT:  Traceback
// EMPTY:      coco-opt: error: [split-allreduce-empty] (coco-split-allreduce{ops=g1}, in schedule 'rs-c-ag') the reduce_scatter of %g1 (comm.all_reduce) of type !coco.tensor<2xf32, sliced<0>>: dim 0 of size 2 cannot be cut into 3 parts

// ARC-LABEL: func.func @sgd3
// ARC-NEXT:    %g1 = comm.all_reduce sum %g
// ARC-NEXT:    comm.fused elementwise {
