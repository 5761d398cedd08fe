// RUN: coco-opt %s --split-input-file -t cuda | filecheck %s

// Elementwise kernels round every op to its element type (f16 through f32), read a
// replicated operand of a sliced result at this rank's offset, and draw dropout masks from
// the global element index.
func.func @chain(%x: !coco.tensor<256xf16, sliced<0>>, %r: !coco.tensor<256xf16>) {
  %f = comm.fused elementwise -> !coco.tensor<256xf16, sliced<0>> {
    %y = coco.add %x, %r : !coco.tensor<256xf16, sliced<0>>, !coco.tensor<256xf16> -> !coco.tensor<256xf16, sliced<0>>
    %d = coco.dropout %y, 0.25 seed 11 : !coco.tensor<256xf16, sliced<0>>
    comm.yield %d : !coco.tensor<256xf16, sliced<0>>
  }
  func.return
}
// CHECK:       #include "coco_device.h"
// CHECK-LABEL: COCO_KERNEL(k_fused, const coco_f16* __restrict__ in0, const coco_f16* __restrict__ in1, coco_f16* __restrict__ out0, coco_i64 begin, coco_i64 end, coco_i64 in1_base, coco_i64 goffset, coco_u64 stream0) {
// CHECK-NEXT:    COCO_KERNEL_BODY_BEGIN
// CHECK:         COCO_BLOCK_STRIDE_LOOP(coco_i64, j_, r_.begin, r_.end) {
// CHECK:           const coco_u64 gidx_ = (coco_u64)(goffset + i);
// CHECK:           const float x0 = coco_to_f32(in0[i]);
// CHECK:           const float x1 = coco_to_f32(in1[in1_base + i]);
// CHECK:           const float t0 = coco_round_f16((x0 + x1));  // coco.add %y
// CHECK:           const float t1 = coco_round_f16((coco_dropout_keep(11ull, gidx_, stream0, 4194304u) ? t0 * 0x1.5555560000000p+0f : 0.0f));  // coco.dropout %d
// CHECK:           out0[i] = coco_f16_from_f32(t1);
// CHECK:         COCO_KERNEL_BODY_END

// -----

// A full reduction: per-block partials in double, combined in block order by one block.
func.func @norm(%x: !coco.tensor<1000xbf16>) -> !coco.tensor<bf16> {
  %n = coco.reduce norm %x : !coco.tensor<1000xbf16> -> !coco.tensor<bf16>
  func.return %n : !coco.tensor<bf16>
}
// CHECK-LABEL: COCO_KERNEL(k_reduce_norm_bf16_partial, const coco_bf16* __restrict__ x, double* __restrict__ partials, coco_i64 n) {
// CHECK:         COCO_SHARED_DYN(double, acc_, 0);
// CHECK:         coco_sync_block();
// CHECK-LABEL: COCO_KERNEL(k_reduce_norm_bf16_finish,
// CHECK:         out[0] = coco_bf16_from_f32(coco_f64_to_f32_odd(sqrt(total)));

// -----

// A fused all_reduce: entry and done flags between same-index blocks of the group, the
// reduce_scatter combined from every peer in rank order in double, all_gather by push.
func.func @fused(%g: !coco.tensor<64xf32, local>) -> !coco.tensor<64xf32> {
  %r = comm.fused all_reduce -> !coco.tensor<64xf32> {
    %rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %h = coco.mul %rs, %rs : !coco.tensor<64xf32, sliced<0>>
    %ag = comm.all_gather %h : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<64xf32>
    comm.yield %ag : !coco.tensor<64xf32>
  }
  func.return %r : !coco.tensor<64xf32>
}
// CHECK-LABEL: COCO_KERNEL(k_fused_all_reduce,
// CHECK-SAME:    const coco_u64* __restrict__ rs0, const coco_u64* __restrict__ ag0, const coco_u64* __restrict__ flags, coco_u32 epoch, coco_i32 me, coco_i32 nranks
// CHECK:         coco_store_release_u32((coco_u32*)flags[p_] + (coco_u64)me * g_ + b_, epoch);
// CHECK:         coco_wait_flag_geq((coco_u32*)flags[me] + (coco_u64)p_ * g_ + b_, epoch);
// CHECK:         double x0_acc = ((double)((const float*)rs0[0])[rs0_base + i]);
// CHECK-NEXT:    for (coco_i32 p_ = 1; p_ < nranks; ++p_) x0_acc = x0_acc + ((double)((const float*)rs0[p_])[rs0_base + i]);
// CHECK:         for (coco_i32 p_ = 0; p_ < nranks; ++p_) ((float*)ag0[p_])[ag0_base + i] = t0;  // comm.all_gather
// CHECK:         coco_wait_flag_geq((coco_u32*)flags[me] + done_ + (coco_u64)p_ * g_ + b_, epoch);

// -----

// A full reduction inside a fused all_reduce (LAMB's sliced norms): per-thread partials, the
// block's partial in order, the rank's last block (an atomic ticket, no waiting between
// blocks of one rank) exchanging rank partials with its peers after the done-flags.
func.func @norm_inside(%g: !coco.tensor<64xf32, local>) -> (!coco.tensor<64xf32, sliced<0>>, !coco.tensor<f32>) {
  %x, %n = comm.fused all_reduce -> !coco.tensor<64xf32, sliced<0>>, !coco.tensor<f32> {
    %rs = comm.reduce_scatter sum %g : !coco.tensor<64xf32, local> -> !coco.tensor<64xf32, sliced<0>>
    %sq = coco.mul %rs, %rs : !coco.tensor<64xf32, sliced<0>>
    %part = coco.reduce sum %sq : !coco.tensor<64xf32, sliced<0>> -> !coco.tensor<f32, local>
    %total = comm.all_reduce sum %part : !coco.tensor<f32, local> -> !coco.tensor<f32>
    comm.yield %rs, %total : !coco.tensor<64xf32, sliced<0>>, !coco.tensor<f32>
  }
  func.return %x, %n : !coco.tensor<64xf32, sliced<0>>, !coco.tensor<f32>
}
// CHECK-LABEL: COCO_KERNEL(k_fused_all_reduce,
// CHECK-SAME:    float* __restrict__ red0, double* __restrict__ partials, coco_u32* __restrict__ counter, const coco_u64* __restrict__ exchange
// CHECK:         for (coco_i64 j_ = r_.begin + coco_thread_idx(); j_ < r_.end; j_ += coco_block_dim()) {
// CHECK:           acc0_ = acc0_ + (double)t0;
// CHECK:         partials[0 * coco_grid_dim() + coco_block_idx()] = a0_;
// CHECK:         last_ = coco_atomic_add_u32(counter, 1u) == coco_grid_dim() - 1;
// CHECK:         coco_wait_flag_geq((coco_u32*)flags[me] + done_ + (coco_u64)p_ * g_ + b_, epoch);
// CHECK:         if (coco_thread_idx() == 0 && last_) {
// CHECK:           ((double*)exchange[p_])[0 * nranks + me] = (double)((float)(rank0_));
// CHECK:           coco_wait_flag_geq((coco_u32*)flags[me] + xchg_ + p_, epoch);
// CHECK:           red0[0] = (float)(all0_);  // comm.all_reduce
// CHECK:           *counter = 0u;
