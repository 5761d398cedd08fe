// RUN: coco-opt %s --split-input-file -p coco-schedule -t 'traffic{ranks=1}' | filecheck %s --check-prefix=ONE
// RUN: coco-opt %s --split-input-file -p coco-schedule -t 'traffic{ranks=2}' | filecheck %s --check-prefix=TWO

// The traffic report (lowering/traffic.py): what each rank reads and writes per plan step,
// own memory and peers', against the floor the scheduled program sets. SGD and Adam under
// fuse(rs-c-ag) (examples/sgd.mlir, adam.mlir): on several ranks the one fused kernel moves
// the floor plus one slice of w, stored twice (the symmetric staging buffer peers pull, then
// w) -- 4n/p; on one rank its collectives are identities and it moves the floor. With w kept
// in symmetric memory by the caller (`{coco.symmetric}`), peers pull from w itself: the floor.

builtin.module attributes {coco.schedule = "fuse(rs-c-ag)"} {
  func.func @sgd(
      %g: !coco.tensor<4096xf32, local>,
      %w: !coco.tensor<4096xf32>,
      %lr: !coco.tensor<f32>
  ) attributes {coco.grid = #coco.grid<[?]>} {
    %g1 = comm.all_reduce sum %g : !coco.tensor<4096xf32, local> -> !coco.tensor<4096xf32>
    %0 = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    %w1 = coco.sub %w, %0 : !coco.tensor<4096xf32>
    coco.update %w, %w1 : !coco.tensor<4096xf32>
    func.return
  }
}
// n = 4096 f32: F = 12n + 4 at every p; T = F + 4n/p (the staging write) for p > 1, F at 1.
// ONE-LABEL: traffic @sgd on 1 rank(s), rank 0
// ONE-NEXT:    launch k_fused_all_reduce: own 32772r 16384w, peers 0r 0w
// ONE-NEXT:    floor read %g: 16384
// ONE-NEXT:    floor read %w (its slice): 16384
// ONE-NEXT:    floor read %lr: 4
// ONE-NEXT:    floor write %w: 16384
// ONE-NEXT:  total: 49156 bytes/rank, floor: 49156 bytes/rank (T/F = 1.000)
// TWO-LABEL: traffic @sgd on 2 rank(s), rank 0
// TWO-NEXT:    launch k_fused_all_reduce: own 16388r 24576w, peers 16384r 0w
// TWO-NEXT:    floor read %g: 16384
// TWO-NEXT:    floor read %w (its slice): 8192
// TWO-NEXT:    floor read %lr: 4
// TWO-NEXT:    floor write %w: 16384
// TWO-NEXT:    floor receive all_gather %w1: 8192
// The gradient, which peers read, is copied into symmetric memory by each call unless the
// caller writes it there itself: a line of its own, outside the total.
// TWO-NEXT:    copy into symmetric %g per call: own 16384r 16384w (not in the total: none where the caller writes into CompiledProgram.input_buffer('g'))
// TWO-NEXT:  total: 57348 bytes/rank, floor: 49156 bytes/rank (T/F = 1.167)

// -----

builtin.module attributes {coco.schedule = "fuse(rs-c-ag)"} {
  func.func @adam(
      %g: !coco.tensor<4096xf32, local>,
      %w: !coco.tensor<4096xf32>,
      %m: !coco.tensor<4096xf32>,
      %v: !coco.tensor<4096xf32>,
      %lr: !coco.tensor<f32>,
      %beta1: !coco.tensor<f32>,
      %beta2: !coco.tensor<f32>,
      %eps: !coco.tensor<f32>,
      %step: !coco.tensor<f32>
  ) attributes {coco.grid = #coco.grid<[?]>} {
    %g1 = comm.all_reduce sum %g : !coco.tensor<4096xf32, local> -> !coco.tensor<4096xf32>
    %0 = coco.mul %beta1, %m : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    %1 = coco.constant 1.0 : !coco.tensor<f32>
    %2 = coco.sub %1, %beta1 : !coco.tensor<f32>
    %3 = coco.mul %2, %g1 : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    %m1 = coco.add %0, %3 : !coco.tensor<4096xf32>
    %4 = coco.mul %beta2, %v : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    %5 = coco.sub %1, %beta2 : !coco.tensor<f32>
    %6 = coco.mul %5, %g1 : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    %7 = coco.mul %6, %g1 : !coco.tensor<4096xf32>
    %v1 = coco.add %4, %7 : !coco.tensor<4096xf32>
    coco.update %m, %m1 : !coco.tensor<4096xf32>
    coco.update %v, %v1 : !coco.tensor<4096xf32>
    %8 = coco.pow %beta1, %step : !coco.tensor<f32>
    %9 = coco.sub %1, %8 : !coco.tensor<f32>
    %mhat = coco.div %m1, %9 : !coco.tensor<4096xf32>, !coco.tensor<f32> -> !coco.tensor<4096xf32>
    %10 = coco.pow %beta2, %step : !coco.tensor<f32>
    %11 = coco.sub %1, %10 : !coco.tensor<f32>
    %vhat = coco.div %v1, %11 : !coco.tensor<4096xf32>, !coco.tensor<f32> -> !coco.tensor<4096xf32>
    %12 = coco.mul %lr, %mhat : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    %13 = coco.sqrt %vhat : !coco.tensor<4096xf32>
    %14 = coco.add %13, %eps : !coco.tensor<4096xf32>, !coco.tensor<f32> -> !coco.tensor<4096xf32>
    %15 = coco.div %12, %14 : !coco.tensor<4096xf32>
    %w1 = coco.sub %w, %15 : !coco.tensor<4096xf32>
    coco.update %w, %w1 : !coco.tensor<4096xf32>
    func.return
  }
}
// F = 4 (3n + 4n/p) + 20 (28 bytes per parameter at 1 rank); T = F + 4n/p (32 at 1 rank).
// ONE-LABEL: traffic @adam on 1 rank(s), rank 0
// ONE-NEXT:    launch k_fused_all_reduce: own 65556r 49152w, peers 0r 0w
// ONE:         floor write %w: 16384
// ONE-NEXT:  total: 114708 bytes/rank, floor: 114708 bytes/rank (T/F = 1.000)
// TWO-LABEL: traffic @adam on 2 rank(s), rank 0
// TWO-NEXT:    launch k_fused_all_reduce: own 32788r 40960w, peers 16384r 0w
// TWO-NEXT:    floor read %g: 16384
// TWO-NEXT:    floor read %w (its slice): 8192
// TWO-NEXT:    floor read %m: 8192
// TWO-NEXT:    floor read %v: 8192
// TWO:         floor write %m: 8192
// TWO-NEXT:    floor write %v: 8192
// TWO-NEXT:    floor write %w: 16384
// TWO-NEXT:    floor receive all_gather %w1: 8192
// TWO-NEXT:    copy into symmetric %g per call: own 16384r 16384w
// TWO-NEXT:  total: 90132 bytes/rank, floor: 81940 bytes/rank (T/F = 1.100)

// -----

builtin.module attributes {coco.schedule = "fuse(rs-c-ag)"} {
  func.func @sgd_in_place(
      %g: !coco.tensor<4096xf32, local>,
      %w: !coco.tensor<4096xf32> {coco.symmetric},
      %lr: !coco.tensor<f32>
  ) attributes {coco.grid = #coco.grid<[?]>} {
    %g1 = comm.all_reduce sum %g : !coco.tensor<4096xf32, local> -> !coco.tensor<4096xf32>
    %0 = coco.mul %lr, %g1 : !coco.tensor<f32>, !coco.tensor<4096xf32> -> !coco.tensor<4096xf32>
    %w1 = coco.sub %w, %0 : !coco.tensor<4096xf32>
    coco.update %w, %w1 : !coco.tensor<4096xf32>
    func.return
  }
}
// One store of each updated element, into w, which peers pull from: T = F at every p. A caller
// passing its own array instead of input_buffer('w') pays a copy in and one out.
// ONE-LABEL: traffic @sgd_in_place on 1 rank(s), rank 0
// ONE-NEXT:    launch k_fused_all_reduce: own 32772r 16384w, peers 0r 0w
// ONE:         copy into and out of symmetric %w per call: own 32768r 32768w
// ONE-NEXT:  total: 49156 bytes/rank, floor: 49156 bytes/rank (T/F = 1.000)
// TWO-LABEL: traffic @sgd_in_place on 2 rank(s), rank 0
// TWO-NEXT:    launch k_fused_all_reduce: own 16388r 16384w, peers 16384r 0w
// TWO:         copy into symmetric %g per call: own 16384r 16384w
// TWO-NEXT:    copy into and out of symmetric %w per call: own 32768r 32768w
// TWO-NEXT:  total: 49156 bytes/rank, floor: 49156 bytes/rank (T/F = 1.000)
