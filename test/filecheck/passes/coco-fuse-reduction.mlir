// RUN: coco-opt %s --split-input-file -p coco-fuse-reduction | filecheck %s
// RUN: coco-opt %s --split-input-file -p 'coco-fuse{mode=reduction}' | filecheck %s
// RUN: coco-opt %s --split-input-file -p coco-fuse | filecheck %s --check-prefix=AUTO
// RUN: coco-opt %s --split-input-file -p coco-fuse-reduction -t 'plan{ranks=3}' | filecheck %s --check-prefix=PLAN
// (--verify-equivalence: the fused program equals the input on the sim at 1-4 ranks, or fails)
// RUN: coco-opt %s --split-input-file -p coco-fuse-reduction --verify-equivalence --equivalence-ranks 1,2,3,4 | filecheck %s --check-prefix=EQ
// RUN: coco-opt %s --split-input-file --verify-diagnostics -p 'coco-fuse-reduction{ops=amax}' | filecheck %s --check-prefix=NAMED

// An fp8 scale's amax: |w| of each rank's slice, its max and the all_reduce of the partial as
// one kernel; the scale computed from it stays outside (it reads the total).
// CHECK-LABEL: func.func @amax
// CHECK-NEXT:    %amax = comm.fused reduction -> !coco.tensor<f32> {
// CHECK-NEXT:      %a = coco.abs %w
// CHECK-NEXT:      %p = coco.reduce max %a
// CHECK-NEXT:      %amax_1 = comm.all_reduce max %p
// CHECK-NEXT:      comm.yield %amax_1
// CHECK-NEXT:    }
// CHECK-NEXT:    %c = coco.constant
// CHECK-NEXT:    %scale = coco.div %amax, %c
// The greedy coco-fuse leaves full reductions to their own kernels.
// AUTO-LABEL: func.func @amax
// AUTO-NOT:      comm.fused reduction
// One launch at 3 ranks (10 rows cut 4, 3, 3): the rank's partial exchanged in the kernel,
// no library all_reduce and no |w| in memory.
// PLAN-LABEL: plan @amax on grid [3]
// PLAN-NOT:     buffer %a :
// PLAN:         launch k_fused_reduction<<<{{.*}}>>>(%w, %amax,
// PLAN-NOT:     all_reduce
// PLAN:         launch k_div
// EQ-LABEL: func.func @amax
// EQ:         comm.fused reduction
// NAMED-LABEL: func.func @amax
// NAMED:         comm.fused reduction
func.func @amax(%w: !coco.tensor<10x4xf32, sliced<0>>) -> !coco.tensor<f32> attributes {coco.grid = #coco.grid<[?]>} {
  %a = coco.abs %w : !coco.tensor<10x4xf32, sliced<0>>
  %p = coco.reduce max %a : !coco.tensor<10x4xf32, sliced<0>> -> !coco.tensor<f32, local>
  %amax = comm.all_reduce max %p : !coco.tensor<f32, local> -> !coco.tensor<f32>
  %c = coco.constant 448.0 : !coco.tensor<f32>
  %scale = coco.div %amax, %c : !coco.tensor<f32>
  func.return %scale : !coco.tensor<f32>
}

// -----

// A clipping's norm of a replicated gradient (ar-c's): the square and the sum in one kernel,
// on each rank (no all_reduce); a norm and a max over the same scaled gradient share one
// kernel, which also stores the scaled gradient read after it.
// CHECK-LABEL: func.func @local
// CHECK-NEXT:    %gs, %sq, %bad = comm.fused reduction
// CHECK-NEXT:      %gs_1 = coco.mul %g, %k
// CHECK-NEXT:      %sq_1 = coco.reduce norm %gs_1
// CHECK-NEXT:      %d = coco.sub %gs_1, %gs_1
// CHECK-NEXT:      %z = coco.constant
// CHECK-NEXT:      %f = coco.cmp eq %d, %z
// CHECK-NEXT:      %o = coco.constant
// CHECK-NEXT:      %one = coco.constant
// CHECK-NEXT:      %nf = coco.select %f, %o, %one
// CHECK-NEXT:      %bad_1 = coco.reduce max %nf
// CHECK-NEXT:      comm.yield %gs_1, %sq_1, %bad_1
// CHECK-NEXT:    }
// PLAN-LABEL: plan @local on grid [3]
// PLAN:         launch k_fused_reduction<<<{{.*}}>>>(%g, %k, %gs, %sq, %bad,
// PLAN-NOT:     launch
// PLAN:         output
// (not named by ops=amax)
// NAMED-LABEL: // {{-----}}
// NAMED: [fuse-block] no op named %amax in the program
// EQ-LABEL: func.func @local
// EQ:         comm.fused reduction
func.func @local(%g: !coco.tensor<1000xf32>, %k: !coco.tensor<f32>) -> (!coco.tensor<1000xf32>, !coco.tensor<f32>, !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  %gs = coco.mul %g, %k : !coco.tensor<1000xf32>, !coco.tensor<f32> -> !coco.tensor<1000xf32>
  %sq = coco.reduce norm %gs : !coco.tensor<1000xf32> -> !coco.tensor<f32>
  %d = coco.sub %gs, %gs : !coco.tensor<1000xf32>
  %z = coco.constant 0.0 : !coco.tensor<f32>
  %f = coco.cmp eq %d, %z : !coco.tensor<1000xf32>, !coco.tensor<f32> -> !coco.tensor<1000xi1>
  %o = coco.constant 0.0 : !coco.tensor<f32>
  %one = coco.constant 1.0 : !coco.tensor<f32>
  %nf = coco.select %f, %o, %one : !coco.tensor<1000xi1>, !coco.tensor<f32>, !coco.tensor<f32> -> !coco.tensor<1000xf32>
  %bad = coco.reduce max %nf : !coco.tensor<1000xf32> -> !coco.tensor<f32>
  func.return %gs, %sq, %bad : !coco.tensor<1000xf32>, !coco.tensor<f32>, !coco.tensor<f32>
}

// -----

// Left alone: a reduction of an argument with nothing after it, an integer reduction (the
// kernel exchanges partials as doubles), and an all_reduce stating its accumulation (the
// kernel would round once, not in rank order), whose reduction fuses its computation alone.
// CHECK-LABEL: func.func @left
// CHECK-NEXT:    %plain = coco.reduce sum %x
// CHECK-NEXT:    %ix = coco.neg %i
// CHECK-NEXT:    %isum = coco.reduce sum %ix
// CHECK-NEXT:    %hp = comm.fused reduction -> !coco.tensor<f16, local> {
// CHECK-NEXT:      %hn = coco.neg %h
// CHECK-NEXT:      %hp_1 = coco.reduce sum %hn
// CHECK-NEXT:      comm.yield %hp_1
// CHECK-NEXT:    }
// CHECK-NEXT:    %hs = comm.all_reduce sum %hp acc f32
// NAMED-LABEL: // {{-----}}
// NAMED: [fuse-block] no op named %amax in the program
func.func @left(%x: !coco.tensor<64xf32>, %i: !coco.tensor<64xi32>, %h: !coco.tensor<64xf16, sliced<0>>) -> (!coco.tensor<f32>, !coco.tensor<i32>, !coco.tensor<f16>) attributes {coco.grid = #coco.grid<[?]>} {
  %plain = coco.reduce sum %x : !coco.tensor<64xf32> -> !coco.tensor<f32>
  %ix = coco.neg %i : !coco.tensor<64xi32>
  %isum = coco.reduce sum %ix : !coco.tensor<64xi32> -> !coco.tensor<i32>
  %hn = coco.neg %h : !coco.tensor<64xf16, sliced<0>>
  %hp = coco.reduce sum %hn : !coco.tensor<64xf16, sliced<0>> -> !coco.tensor<f16, local>
  %hs = comm.all_reduce sum %hp acc f32 : !coco.tensor<f16, local> -> !coco.tensor<f16>
  func.return %plain, %isum, %hs : !coco.tensor<f32>, !coco.tensor<i32>, !coco.tensor<f16>
}

// -----

// A named reduction (or the all_reduce of its partial: @amax) must have something to fuse.
// NAMED-LABEL: // {{-----}}
// NAMED: [fuse-reduction] %amax (coco.reduce) reads %w from memory and its partial is not all_reduced here: there is nothing to fuse into it
func.func @nothing(%w: !coco.tensor<64xf32>) -> !coco.tensor<f32> attributes {coco.grid = #coco.grid<[?]>} {
  %amax = coco.reduce max %w : !coco.tensor<64xf32> -> !coco.tensor<f32>
  func.return %amax : !coco.tensor<f32>
}

// -----

// A named integer reduction is refused.
// NAMED-LABEL: // {{-----}}
// NAMED: [fuse-reduction] %amax (coco.reduce) reduces i32: a fused reduction's kernel exchanges its partials as doubles, exact for float types only
func.func @ints(%i: !coco.tensor<64xi32>) -> !coco.tensor<i32> attributes {coco.grid = #coco.grid<[?]>} {
  %sq = coco.mul %i, %i : !coco.tensor<64xi32>
  %amax = coco.reduce max %sq : !coco.tensor<64xi32> -> !coco.tensor<i32>
  func.return %amax : !coco.tensor<i32>
}

// -----

// A reduction whose total nothing reads is not fused: dead code elimination (cse) would
// remove it from the region and leave no reduction there. Named, it is refused.
// CHECK-LABEL: func.func @dead
// CHECK-NOT:     comm.fused
// CHECK:         func.return %d
// NAMED-LABEL: // {{-----}}
// NAMED: [fuse-reduction] %amax : !coco.tensor<f32>, a reduction's total, is read by nothing
func.func @dead(%w: !coco.tensor<64xf32>) -> !coco.tensor<64xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %d = coco.neg %w : !coco.tensor<64xf32>
  %amax = coco.reduce max %d : !coco.tensor<64xf32> -> !coco.tensor<f32>
  func.return %d : !coco.tensor<64xf32>
}
