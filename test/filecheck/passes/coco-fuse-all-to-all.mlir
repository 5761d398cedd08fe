// RUN: coco-opt %s -p coco-fuse-all-to-all | filecheck %s
// RUN: coco-opt %s -p 'coco-fuse{mode=all_to_all}' | filecheck %s
// RUN: coco-opt %s -p coco-fuse | filecheck %s --check-prefix=AUTO
// RUN: coco-opt %s -p coco-fuse-all-to-all -t cuda | filecheck %s --check-prefix=CUDA
// RUN: coco-opt %s -p 'coco-schedule{name=fuse-a2a}' --verify-equivalence --equivalence-ranks 1,2,3,4 | filecheck %s --check-prefix=SCHED
// RUN: coco-opt %s -p 'coco-fuse-all-to-all{ops=back}' | filecheck %s --check-prefix=NAMED
// RUN: coco-opt %s --split-input-file --verify-diagnostics -p 'coco-fuse-all-to-all{ops=xa,xb,xc}' | filecheck %s --check-prefix=EXACT

// MoE's dispatch and combine: the scale and the cast to bf16 before the exchange
// (producers, on the sender's piece), the cast back, the weighted combine and the residual
// add after it (consumers, on the receiver's piece), and the update storing the result: one
// comm.fused all_to_all (one kernel: lowering/fused_all_to_all.py).
// CHECK-LABEL: func.func @moe
// CHECK-NEXT:    comm.fused all_to_all {
// CHECK-NEXT:      %u = coco.mul %x, %s
// CHECK-NEXT:      %c = coco.cast %u
// CHECK-NEXT:      %y = comm.all_to_all %c
// CHECK-NEXT:      %b = coco.cast %y
// CHECK-NEXT:      %m = coco.mul %b, %w
// CHECK-NEXT:      %z = coco.add %m, %r
// CHECK-NEXT:      coco.update %r, %z
// CHECK-NEXT:      comm.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return
// AUTO-LABEL: func.func @moe
// AUTO-NEXT:    comm.fused all_to_all {
// The kernel: entry flags; the sender's side over the boxes it sends (rows of its piece),
// staged in its symmetric buffer; done flags; the receiver's side over the boxes it
// receives, each element pulled from the peer holding it, the update stored in place.
// CUDA-LABEL: // ===== @moe =====
// CUDA:       COCO_KERNEL(k_fused_all_to_all,
// CUDA:         coco_bf16* const c_mine = (coco_bf16*)c_peers[me];
// CUDA:         coco_peers_entry(
// CUDA:         const coco_i64* const box_ = send_boxes + q_ * 4;
// CUDA:         COCO_BLOCK_STRIDE_LOOP(coco_i64, k_, lo_, hi_) {
// CUDA-NEXT:      const coco_i64 i = at0_ + k_;
// CUDA-NEXT:      const float x = x_in[i];
// CUDA-NEXT:      const float u = x * s;  // coco.mul %u
// CUDA-NEXT:      const coco_bf16 c_q = coco_bf16_from_f32((float)u);  // coco.cast %c
// CUDA-NEXT:      c_mine[i] = c_q;  // comm.all_to_all
// CUDA:         coco_peers_done(
// CUDA:         const coco_i64* const box_ = recv_boxes + q_ * 6;
// CUDA:         const coco_bf16* const c_from = (const coco_bf16*)c_peers[q_];
// CUDA:         COCO_BLOCK_STRIDE_LOOP(coco_i64, k_, lo_, hi_) {
// CUDA-NEXT:      const float y = coco_to_f32(c_from[at0_ + k_]);  // comm.all_to_all
// CUDA-NEXT:      const coco_i64 i = at1_ + k_;
// CUDA:           const float w = w_in[w_base + c0];
// CUDA:           const float z = m + r;  // coco.add %z
// CUDA-NEXT:      r_out[i] = z;
// CUDA-LABEL: // ===== @ulysses =====
// SCHED-LABEL: func.func @moe
// SCHED-NEXT:    comm.fused all_to_all {
func.func @moe(%x: !coco.tensor<8x6xf32, sliced<0>>, %s: !coco.tensor<f32>, %w: !coco.tensor<8x1xf32>, %r: !coco.tensor<8x6xf32, sliced<1>>) attributes {coco.grid = #coco.grid<[?]>} {
  %u = coco.mul %x, %s : !coco.tensor<8x6xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<8x6xf32, sliced<0>>
  %c = coco.cast %u : !coco.tensor<8x6xf32, sliced<0>> -> !coco.tensor<8x6xbf16, sliced<0>>
  %y = comm.all_to_all %c : !coco.tensor<8x6xbf16, sliced<0>> -> !coco.tensor<8x6xbf16, sliced<1>>
  %b = coco.cast %y : !coco.tensor<8x6xbf16, sliced<1>> -> !coco.tensor<8x6xf32, sliced<1>>
  %m = coco.mul %b, %w : !coco.tensor<8x6xf32, sliced<1>>, !coco.tensor<8x1xf32> -> !coco.tensor<8x6xf32, sliced<1>>
  %z = coco.add %m, %r : !coco.tensor<8x6xf32, sliced<1>>
  coco.update %r, %z : !coco.tensor<8x6xf32, sliced<1>>
  func.return
}

// A consumer that also reads what a matmul computes from the result (%o) waits for that
// matmul: it stays out, and so does the matmul (an exchange with no consumer is a region
// too: the kernel moves the pieces itself). The producer read outside (%v) is yielded; %o
// is the next exchange's producer.
// CHECK-LABEL: func.func @ulysses
// CHECK-NEXT:    %v, %e = comm.fused all_to_all
// CHECK-NEXT:      %v_1 = coco.exp %q
// CHECK-NEXT:      %e_1 = comm.all_to_all %v_1
// CHECK-NEXT:      comm.yield %v_1, %e_1
// CHECK-NEXT:    }
// CHECK-NEXT:    %h = coco.matmul %e, %k
// CHECK-NEXT:    %back = comm.fused all_to_all
// CHECK-NEXT:      %o = coco.add %e, %h
// CHECK-NEXT:      %back_1 = comm.all_to_all %o
// CHECK-NEXT:      comm.yield %back_1
// AUTO-LABEL: func.func @ulysses
// AUTO:         %back = comm.fused all_to_all
// NAMED-LABEL: func.func @ulysses
// NAMED-NEXT:    %v = coco.exp %q
// NAMED-NEXT:    %e = comm.all_to_all %v
// NAMED-NEXT:    %h = coco.matmul %e, %k
// NAMED-NEXT:    %back = comm.fused all_to_all
// NAMED-NEXT:      %o = coco.add %e, %h
// NAMED-NEXT:      %back_1 = comm.all_to_all %o
func.func @ulysses(%q: !coco.tensor<8x8xf32, sliced<1>>, %k: !coco.tensor<8x8xf32>) -> (!coco.tensor<8x8xf32, sliced<1>>, !coco.tensor<8x8xf32, sliced<1>>) attributes {coco.grid = #coco.grid<[?]>} {
  %v = coco.exp %q : !coco.tensor<8x8xf32, sliced<1>>
  %e = comm.all_to_all %v : !coco.tensor<8x8xf32, sliced<1>> -> !coco.tensor<8x8xf32, sliced<0>>
  %h = coco.matmul %e, %k : !coco.tensor<8x8xf32, sliced<0>>, !coco.tensor<8x8xf32> -> !coco.tensor<8x8xf32, sliced<0>>
  %o = coco.add %e, %h : !coco.tensor<8x8xf32, sliced<0>>
  %back = comm.all_to_all %o : !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<8x8xf32, sliced<1>>
  func.return %v, %back : !coco.tensor<8x8xf32, sliced<1>>, !coco.tensor<8x8xf32, sliced<1>>
}

// Producers and consumers together would close a cycle (the consumer %xc reads a sum of the
// producer %p, which waits for the region): the consumers join, the producer stays out.
// The dispatch form (local tensors) fuses as the sliced one does (named exactly, too).
// CHECK-LABEL: func.func @dispatch
// CHECK-NEXT:    %p = coco.mul %a, %a
// CHECK-NEXT:    %n = coco.reduce sum %p
// CHECK-NEXT:    %xb, %xc = comm.fused all_to_all
// CHECK-NEXT:      %xa = comm.all_to_all %p
// CHECK-NEXT:      %xb_1 = coco.exp %xa
// CHECK-NEXT:      %xc_1 = coco.mul %xa, %n
// CHECK-NEXT:      comm.yield %xb_1, %xc_1
// EXACT-LABEL: func.func @dispatch
// EXACT-NEXT:    %p = coco.mul %a, %a
// EXACT-NEXT:    %n = coco.reduce sum %p
// EXACT-NEXT:    %xb, %xc = comm.fused all_to_all
// EXACT-NEXT:      %xa = comm.all_to_all %p
// EXACT-NEXT:      %xb_1 = coco.exp %xa
// EXACT-NEXT:      %xc_1 = coco.mul %xa, %n
// EXACT-NEXT:      comm.yield %xb_1, %xc_1
func.func @dispatch(%a: !coco.tensor<8x4xf32, local>) -> (!coco.tensor<8x4xf32, local>, !coco.tensor<8x4xf32, local>) attributes {coco.grid = #coco.grid<[?]>} {
  %p = coco.mul %a, %a : !coco.tensor<8x4xf32, local>
  %n = coco.reduce sum %p : !coco.tensor<8x4xf32, local> -> !coco.tensor<f32, local>
  %xa = comm.all_to_all %p : !coco.tensor<8x4xf32, local>
  %xb = coco.exp %xa : !coco.tensor<8x4xf32, local>
  %xc = coco.mul %xa, %n : !coco.tensor<8x4xf32, local>, !coco.tensor<f32, local> -> !coco.tensor<8x4xf32, local>
  func.return %xb, %xc : !coco.tensor<8x4xf32, local>, !coco.tensor<8x4xf32, local>
}

// The refusals: each chunk below names its ops %xa, %xb, %xc (the EXACT run names those).

// -----

// (The named schedule fuse(a2a), which names every all_to_all, gives the computation
// between two exchanges to the first.)
// SCHED-LABEL: func.func @two_exchanges
// SCHED-NEXT:    %xb = comm.fused all_to_all
// SCHED-NEXT:      %xa = comm.all_to_all %x
// SCHED-NEXT:      %xb_1 = coco.mul %xa, %xa
// SCHED-NEXT:      comm.yield %xb_1
// SCHED-NEXT:    }
// SCHED-NEXT:    %xc = comm.fused all_to_all
// SCHED-NEXT:      %xc_1 = comm.all_to_all %xb
func.func @two_exchanges(%x: !coco.tensor<8x6xf32, sliced<0>>) -> !coco.tensor<8x6xf32, sliced<0>> attributes {coco.grid = #coco.grid<[?]>} {
  %xa = comm.all_to_all %x : !coco.tensor<8x6xf32, sliced<0>> -> !coco.tensor<8x6xf32, sliced<1>>
  %xb = coco.mul %xa, %xa : !coco.tensor<8x6xf32, sliced<1>>
  %xc = comm.all_to_all %xb : !coco.tensor<8x6xf32, sliced<1>> -> !coco.tensor<8x6xf32, sliced<0>>
  func.return %xc : !coco.tensor<8x6xf32, sliced<0>>
}

// EXACT-LABEL: // {{-----}}
// EXACT: [fuse-chain] a fused all_to_all holds exactly one comm.all_to_all and no other exchange; the named ops hold %xa (comm.all_to_all), %xc (comm.all_to_all)

// -----

func.func @matmul_producer(%x: !coco.tensor<8x6xf32, sliced<0>>, %w: !coco.tensor<6x6xf32>) -> !coco.tensor<8x6xf32, sliced<1>> attributes {coco.grid = #coco.grid<[?]>} {
  %xa = coco.matmul %x, %w : !coco.tensor<8x6xf32, sliced<0>>, !coco.tensor<6x6xf32> -> !coco.tensor<8x6xf32, sliced<0>>
  %xb = comm.all_to_all %xa : !coco.tensor<8x6xf32, sliced<0>> -> !coco.tensor<8x6xf32, sliced<1>>
  %xc = coco.exp %xb : !coco.tensor<8x6xf32, sliced<1>>
  func.return %xc : !coco.tensor<8x6xf32, sliced<1>>
}

// EXACT-LABEL: // {{-----}}
// EXACT: [fuse-chain] %xa (coco.matmul) cannot be part of a fused all_to_all (its all_to_all and elementwise computation of its input and result only)

// -----

func.func @replicated_producer(%x: !coco.tensor<8x6xf32, sliced<0>>, %w: !coco.tensor<8x6xf32>) -> !coco.tensor<8x6xf32, sliced<1>> attributes {coco.grid = #coco.grid<[?]>} {
  %xa = coco.exp %w : !coco.tensor<8x6xf32>
  %xb = coco.mul %x, %xa : !coco.tensor<8x6xf32, sliced<0>>, !coco.tensor<8x6xf32> -> !coco.tensor<8x6xf32, sliced<0>>
  %xc = comm.all_to_all %xb : !coco.tensor<8x6xf32, sliced<0>> -> !coco.tensor<8x6xf32, sliced<1>>
  func.return %xc : !coco.tensor<8x6xf32, sliced<1>>
}

// EXACT-LABEL: // {{-----}}
// EXACT: [fuse-sizes] %xa (coco.exp) computes over a different iteration space than the all_to_all's input (the kernel computes each side on one piece)

// -----

func.func @apart(%x: !coco.tensor<8x6xf32, sliced<0>>, %z: !coco.tensor<8x6xf32, sliced<1>>) -> (!coco.tensor<8x6xf32, sliced<1>>, !coco.tensor<8x6xf32, sliced<1>>) attributes {coco.grid = #coco.grid<[?]>} {
  %xa = comm.all_to_all %x : !coco.tensor<8x6xf32, sliced<0>> -> !coco.tensor<8x6xf32, sliced<1>>
  %xb = coco.exp %z : !coco.tensor<8x6xf32, sliced<1>>
  %xc = coco.exp %xa : !coco.tensor<8x6xf32, sliced<1>>
  func.return %xb, %xc : !coco.tensor<8x6xf32, sliced<1>>, !coco.tensor<8x6xf32, sliced<1>>
}

// EXACT-LABEL: // {{-----}}
// EXACT: [fuse-connected] the named ops are not connected through their own values: they form 2 separate groups

// -----

func.func @cycle(%a: !coco.tensor<8x4xf32, local>) -> !coco.tensor<8x4xf32, local> attributes {coco.grid = #coco.grid<[?]>} {
  %xa = coco.mul %a, %a : !coco.tensor<8x4xf32, local>
  %n = coco.reduce sum %xa : !coco.tensor<8x4xf32, local> -> !coco.tensor<f32, local>
  %xb = coco.mul %xa, %n : !coco.tensor<8x4xf32, local>, !coco.tensor<f32, local> -> !coco.tensor<8x4xf32, local>
  %xc = comm.all_to_all %xb : !coco.tensor<8x4xf32, local>
  func.return %xc : !coco.tensor<8x4xf32, local>
}

// EXACT-LABEL: // {{-----}}
// EXACT: [fuse-cycle] fusing {%xa (coco.mul), %xb (coco.mul), %xc (comm.all_to_all)} would form a cycle: %n (coco.reduce) depends on the set and %xb (coco.mul) in the set depends on it

// -----

// An exchange whose result reaches nothing (no update, no return) is dead: nothing to fuse,
// and a region around it would lose it to dead-code elimination while %xa's update kept
// the region. Greedy fusion and the named schedule (which fuses %live) leave it as it is;
// named, it is refused.
func.func @dead_exchange(%a: !coco.tensor<8x4xf32, local>, %b: !coco.tensor<8x4xf32, local>) -> !coco.tensor<8x4xf32, local> attributes {coco.grid = #coco.grid<[?]>} {
  %xa = coco.mul %a, %a : !coco.tensor<8x4xf32, local>
  %xb = comm.all_to_all %xa : !coco.tensor<8x4xf32, local>
  %xc = coco.mul %xb, %xb : !coco.tensor<8x4xf32, local>
  coco.update %a, %xa : !coco.tensor<8x4xf32, local>
  %live = comm.all_to_all %b : !coco.tensor<8x4xf32, local>
  func.return %live : !coco.tensor<8x4xf32, local>
}

// EXACT-LABEL: // {{-----}}
// EXACT: coco-fuse-all-to-all.mlir:[[# @LINE - 8]]:3: [fuse-dead] the result of %xb (comm.all_to_all) reaches no update and no return: there is nothing to fuse (dead-code elimination removes it)
