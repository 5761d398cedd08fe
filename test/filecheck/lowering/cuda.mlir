// RUN: coco-opt %s --split-input-file -t 'cuda{ranks=2}' | filecheck %s

// Elementwise kernels round every op to its element type (f16 through f32), read a
// replicated operand of a sliced result at this rank's offset, and draw dropout masks from
// the global element index, under the dropout's seed (an argument: layers that differ only
// in their seeds share one kernel).
func.func @chain(%x: !coco.tensor<256xf16, sliced<0>>, %r: !coco.tensor<256xf16>) {
  %f = comm.fused elementwise -> !coco.tensor<256xf16, sliced<0>> {
    %y = coco.add %x, %r : !coco.tensor<256xf16, sliced<0>>, !coco.tensor<256xf16> -> !coco.tensor<256xf16, sliced<0>>
    %d = coco.dropout %y, 0.25 seed 11 : !coco.tensor<256xf16, sliced<0>>
    comm.yield %d : !coco.tensor<256xf16, sliced<0>>
  }
  func.return
}
// CHECK:       #include "coco_device.h"
// Parameters and values are named after the program's SSA names.
// CHECK-LABEL: COCO_KERNEL(k_fused,
// CHECK-NEXT:      const coco_f16* __restrict__ x_in,
// CHECK-NEXT:      const coco_f16* __restrict__ r_in,
// CHECK-NEXT:      coco_f16* __restrict__ d_out,
// CHECK-NEXT:      coco_i64 begin,
// CHECK-NEXT:      coco_i64 end,
// CHECK-NEXT:      coco_i64 r_base,
// CHECK-NEXT:      coco_i64 goffset,
// CHECK-NEXT:      coco_u64 d_stream,
// CHECK-NEXT:      coco_u64 d_seed) {
// CHECK-NEXT:    COCO_KERNEL_BODY_BEGIN
// CHECK:         COCO_BLOCK_STRIDE_LOOP(coco_i64, j_, r_.begin, r_.end) {
// CHECK:           const coco_u64 gidx_ = (coco_u64)(goffset + i);
// CHECK:           const float x = coco_to_f32(x_in[i]);
// CHECK:           const float r = coco_to_f32(r_in[r_base + i]);
// CHECK:           const float y = coco_round_f16(x + r);  // coco.add %y
// CHECK:           const coco_f16 d_q = coco_f16_from_f32(coco_dropout_keep(d_seed, gidx_, d_stream, 4194304u) ? y * 0x1.5555560000000p+0f : 0.0f);  // coco.dropout %d
// CHECK:           d_out[i] = d_q;
// CHECK:         COCO_KERNEL_BODY_END

// -----

// A full reduction: per-block partials in double, combined in block order by one block.
func.func @norm(%x: !coco.tensor<1000xbf16>) -> !coco.tensor<bf16> {
  %n = coco.reduce norm %x : !coco.tensor<1000xbf16> -> !coco.tensor<bf16>
  func.return %n : !coco.tensor<bf16>
}
// CHECK-LABEL: COCO_KERNEL(k_reduce_norm_bf16_partial,
// CHECK-NEXT:      const coco_bf16* __restrict__ x,
// CHECK-NEXT:      double* __restrict__ partials,
// CHECK-NEXT:      coco_i64 n) {
// CHECK:         COCO_SHARED_DYN(double, acc_, 0);
// Whole vectors first, one accumulator per lane (coco_vector_threads(): every thread on a
// GPU, thread 0 of the block on the host), then the elements after them.
// CHECK:         const coco_i32 lanes_ = COCO_VEC_BYTES / 2;
// CHECK-NEXT:    const coco_range r_ = coco_chunk(n, coco_grid_dim(), coco_block_idx(), lanes_);
// CHECK-NEXT:    const bool vec_ = coco_vec_aligned(x + r_.begin);
// CHECK:           if (coco_thread_idx() < coco_vector_threads() && r_.begin / lanes_ + coco_thread_idx() < vend_ / lanes_) {
// CHECK:             for (coco_i64 v_ = r_.begin / lanes_ + coco_thread_idx(); v_ < vend_ / lanes_; v_ += coco_vector_threads()) {
// CHECK-NEXT:          COCO_VEC_IN(coco_bf16, x_v, lanes_, x + v_ * lanes_);
// CHECK:                 av[k_] = av[k_] + (double)coco_to_f32(x_v[k_]) * (double)coco_to_f32(x_v[k_]);
// CHECK:             a = av[0];
// CHECK:           for (coco_i64 i = vend_ + coco_thread_idx(); i < r_.end; i += coco_block_dim()) {
// CHECK-NEXT:        a = a + (double)coco_to_f32(x[i]) * (double)coco_to_f32(x[i]);
// CHECK:         coco_sync_block();
// CHECK-LABEL: COCO_KERNEL(k_reduce_norm_bf16_finish,
// CHECK:         out[0] = coco_bf16_from_f32(coco_f64_to_f32_odd(sqrt(total)));

// -----

// A fused all_reduce: entry and done flags between same-index blocks of the group (the
// protocol's steps are functions of coco_device.h), the reduce_scatter combined from every
// peer in rank order in double, all_gather by pull (this rank's piece into its own symmetric
// buffer, found once per block, the peers' pieces read from theirs after the done flags, in
// the order rotated by the rank). Peers are reached in vectors where every address is 16-byte
// aligned -- a batch of peers' vectors loaded at once before the lanes' math, combined in rank
// order -- element by element elsewhere.
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
// CHECK-NEXT:      const coco_u64* __restrict__ g_peers,
// CHECK-NEXT:      const coco_u64* __restrict__ ag_peers,
// CHECK-NEXT:      const coco_i64* __restrict__ ag_bases,
// CHECK-NEXT:      const coco_u64* __restrict__ flags,
// CHECK-NEXT:      coco_u32* __restrict__ epoch_at,
// CHECK-NEXT:      coco_i32 me,
// CHECK-NEXT:      coco_i32 nranks,
// CHECK:         const coco_i32 lanes_ = COCO_VEC_BYTES / 4;
// CHECK-NEXT:    const coco_range r_ = coco_chunk(end - begin, coco_grid_dim(), coco_block_idx(), lanes_);
// CHECK-NEXT:    float* const ag_mine = (float*)ag_peers[me];
// CHECK-NEXT:    const coco_i32 group_ = coco_group(nranks);
// The launch's epoch comes from its site's counter on the device (a graph replay's arguments
// are those of its capture).
// CHECK:         coco_u32 epoch = 0u;
// CHECK:         if (coco_thread_idx() == 0) {
// CHECK-NEXT:      epoch = coco_epoch_next(epoch_at, coco_grid_dim());
// CHECK-NEXT:      coco_peers_entry(flags, me, nranks, epoch, coco_grid_dim(), coco_block_idx());
// CHECK:         coco_sync_block();
// CHECK-NEXT:    bool vec_ = coco_vec_aligned(ag_mine + (ag_base + begin));
// CHECK-NEXT:    for (coco_i32 p_ = 0; p_ < nranks; ++p_) {
// CHECK-NEXT:      vec_ = vec_ && coco_vec_aligned((const float*)g_peers[p_] + (g_base + begin));
// CHECK:         const coco_i64 vend_ = vec_ ? r_.begin + (r_.end - r_.begin) / lanes_ * lanes_ : r_.begin;
// CHECK-NEXT:    COCO_BLOCK_STRIDE_LOOP(coco_i64, v_, r_.begin / lanes_, vend_ / lanes_) {
// CHECK-NEXT:      const coco_i64 i0_ = begin + v_ * lanes_;
// CHECK-NEXT:      COCO_PEERS_VEC_IN(float, rs_peers_v, lanes_, g_peers, g_base + i0_, 0, group_, me);
// CHECK-NEXT:      COCO_VEC_OUT(float, ag_v, lanes_, ag_mine + (ag_base + i0_));
// CHECK-NEXT:      double rs_acc_v[lanes_];
// CHECK-NEXT:      COCO_FOR_LANES(k_, lanes_) {
// CHECK-NEXT:        rs_acc_v[k_] = (double)rs_peers_v[0][k_];
// CHECK:           COCO_FOR_PEER_SLOTS(s_, 1, s_ < group_) {
// CHECK-NEXT:        COCO_FOR_LANES(k_, lanes_) {
// CHECK-NEXT:          rs_acc_v[k_] = s_ < group_ ? rs_acc_v[k_] + (double)rs_peers_v[s_][k_] : rs_acc_v[k_];
// CHECK:           for (coco_i32 b_ = COCO_PEER_BATCH_; b_ < group_; b_ += COCO_PEER_BATCH_) {
// CHECK-NEXT:        COCO_PEERS_VEC_IN(float, more_v, lanes_, g_peers, g_base + i0_, b_, group_, me);
// CHECK-NEXT:        COCO_FOR_PEER_SLOTS(s_, 0, b_ + s_ < group_) {
// CHECK-NEXT:          COCO_FOR_LANES(k_, lanes_) {
// CHECK-NEXT:            rs_acc_v[k_] = b_ + s_ < group_ ? rs_acc_v[k_] + (double)more_v[s_][k_] : rs_acc_v[k_];
// CHECK:           COCO_FOR_LANES(k_, lanes_) {
// CHECK-NEXT:        const double rs_acc = rs_acc_v[k_];
// CHECK-NEXT:        const float rs = (float)rs_acc;  // comm.reduce_scatter
// CHECK-NEXT:        const float h = rs * rs;  // coco.mul %h
// CHECK-NEXT:        ag_v[k_] = h;  // comm.all_gather
// CHECK:           coco_vec_store(ag_v, ag_mine + (ag_base + i0_));
// CHECK:         COCO_BLOCK_STRIDE_LOOP(coco_i64, j_, vend_, r_.end) {
// CHECK:           double rs_acc = (double)((const float*)g_peers[0])[g_base + i];
// CHECK-NEXT:      for (coco_i32 p_ = 1; p_ < nranks; ++p_) {
// CHECK-NEXT:        rs_acc = rs_acc + (double)((const float*)g_peers[p_])[g_base + i];
// CHECK:           const float rs = (float)rs_acc;  // comm.reduce_scatter
// CHECK:           ag_mine[ag_base + i] = h;  // comm.all_gather
// CHECK:         coco_sync_block();
// CHECK:         if (coco_thread_idx() == 0) {
// CHECK-NEXT:      coco_peers_done(flags, me, nranks, epoch, coco_grid_dim(), coco_block_idx());
// CHECK:         coco_sync_block();
// CHECK-NEXT:    for (coco_i32 d_ = 1; d_ < nranks; ++d_) {
// CHECK-NEXT:      const coco_i32 q_ = (me + d_) % nranks;
// CHECK:           COCO_BLOCK_STRIDE_LOOP(coco_i64, v_, r_.begin / lanes_, qend_ / lanes_) {
// CHECK:             COCO_VEC_IN(float, x_, lanes_, (const float*)ag_peers[q_] + (ag_bases[q_] + i0_));
// CHECK-NEXT:        COCO_VEC_OUT(float, y_, lanes_, ag_mine + (ag_bases[q_] + i0_));
// CHECK:           COCO_BLOCK_STRIDE_LOOP(coco_i64, j_, qend_, r_.end) {
// CHECK:             ag_mine[ag_bases[q_] + i] = ((const float*)ag_peers[q_])[ag_bases[q_] + i];

// -----

// A full reduction inside a fused all_reduce (LAMB's sliced norms): per-thread partials (over
// the thread's vectors one accumulator per lane, the lanes combined pairwise, then its
// elements), the block's partial in order, the rank's last block (an atomic ticket, no waiting
// between blocks of one rank) exchanging rank partials with its peers after the done-flags.
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
// CHECK:           float* __restrict__ total_out,
// CHECK-NEXT:      double* __restrict__ partials,
// CHECK-NEXT:      coco_u32* __restrict__ counter,
// CHECK-NEXT:      const coco_u64* __restrict__ exchange,
// CHECK:         const coco_i64 vend_ = vec_ ? r_.begin + (r_.end - r_.begin) / lanes_ * lanes_ : r_.begin;
// Only a thread with whole vectors sets up lane accumulators (a host vector has 256 lanes; on
// the host thread 0 takes all of a block's vectors: coco_vector_threads()).
// CHECK-NEXT:    COCO_FOR_THREADS {
// CHECK-NEXT:      double acc0_ = 0;
// CHECK-NEXT:      if (coco_thread_idx() < coco_vector_threads() && r_.begin / lanes_ + coco_thread_idx() < vend_ / lanes_) {
// CHECK-NEXT:        double acc0_v[lanes_];
// CHECK:             for (coco_i64 v_ = r_.begin / lanes_ + coco_thread_idx(); v_ < vend_ / lanes_; v_ += coco_vector_threads()) {
// CHECK:                 acc0_v[k_] = acc0_v[k_] + (double)sq;
// CHECK:             coco_i32 s_ = lanes_ / 2;
// CHECK-NEXT:        while (s_ > 0) {
// CHECK-NEXT:          COCO_FOR_LANES(k_, s_) {
// CHECK-NEXT:            acc0_v[k_] = acc0_v[k_] + acc0_v[k_ + s_];
// CHECK:             acc0_ = acc0_v[0];
// CHECK-NEXT:      }
// CHECK-NEXT:      for (coco_i64 j_ = vend_ + coco_thread_idx(); j_ < r_.end; j_ += coco_block_dim()) {
// CHECK:             acc0_ = acc0_ + (double)sq;
// CHECK:         partials[coco_block_idx()] = a0_;
// CHECK:         last_[0] = coco_block_is_last(counter, coco_grid_dim());
// CHECK:         coco_peers_done(flags, me, nranks, epoch, coco_grid_dim(), coco_block_idx());
// CHECK:         if (coco_thread_idx() == 0 && last_[0]) {
// CHECK:           ((double*)exchange[p_])[me] = (double)(float)rank0_;
// CHECK:           coco_peers_exchange(flags, me, nranks, epoch, coco_grid_dim());
// CHECK:           total_out[0] = (float)all0_;  // comm.all_reduce
// CHECK:           counter[0] = 0u;
