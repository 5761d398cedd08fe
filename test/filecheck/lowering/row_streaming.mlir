// RUN: coco-opt %s --split-input-file -p 'coco-fuse{mode=all_reduce}' -t 'cuda{ranks=2}' | filecheck %s
// RUN: coco-opt %s --split-input-file -p 'coco-fuse{mode=all_reduce}' -t 'cuda{ranks=1}' | filecheck %s --check-prefix=ONE

// On one rank the collectives are identities: a plain row kernel reads x where it lies (no
// peer table, no flags), in the same phases.
// ONE-NOT:   coco_peers_
// ONE-LABEL: COCO_KERNEL(k_fused_all_reduce_rows,
// ONE:         const float* __restrict__ x_in,
// ONE:         const float x = x_in[x_base + i];
// ONE-NEXT:    const float h_s = x + res_s;  // coco.add %h_s

// The row form of a fused collective kernel keeps the element values a later phase reads in
// shared memory when they fit (lowering/row_collective.py, SHARED_ROW_BYTES = 40 KiB) and
// streams them otherwise: the later phase derives them again from global memory.

// AllReduce + residual + RMSNorm, rows of 1024 f32 (4 KiB): %h_s is kept in a shared row,
// written by the first pass and read back by the second.
func.func @rmsnorm_kept(%x: !coco.tensor<8x1024xf32, local>, %res: !coco.tensor<8x1024xf32>, %w: !coco.tensor<1024xf32>) -> (!coco.tensor<8x1024xf32>, !coco.tensor<8x1024xf32>) {
  %rs = comm.reduce_scatter sum %x : !coco.tensor<8x1024xf32, local> -> !coco.tensor<8x1024xf32, sliced<0>>
  %res_s = coco.slice %res : !coco.tensor<8x1024xf32> -> !coco.tensor<8x1024xf32, sliced<0>>
  %h_s = coco.add %rs, %res_s : !coco.tensor<8x1024xf32, sliced<0>>
  %h = comm.all_gather %h_s : !coco.tensor<8x1024xf32, sliced<0>> -> !coco.tensor<8x1024xf32>
  %sq = coco.mul %h_s, %h_s : !coco.tensor<8x1024xf32, sliced<0>>
  %ms = coco.reduce_dims mean %sq dims [1] keepdims : !coco.tensor<8x1024xf32, sliced<0>> -> !coco.tensor<8x1xf32, sliced<0>>
  %eps = coco.constant 1.0e-06 : !coco.tensor<f32>
  %d = coco.add %ms, %eps : !coco.tensor<8x1xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<8x1xf32, sliced<0>>
  %r = coco.rsqrt %d : !coco.tensor<8x1xf32, sliced<0>>
  %n = coco.mul %h_s, %r : !coco.tensor<8x1024xf32, sliced<0>>, !coco.tensor<8x1xf32, sliced<0>> -> !coco.tensor<8x1024xf32, sliced<0>>
  %y_s = coco.mul %n, %w : !coco.tensor<8x1024xf32, sliced<0>>, !coco.tensor<1024xf32> -> !coco.tensor<8x1024xf32, sliced<0>>
  %y = comm.all_gather %y_s : !coco.tensor<8x1024xf32, sliced<0>> -> !coco.tensor<8x1024xf32>
  func.return %h, %y : !coco.tensor<8x1024xf32>, !coco.tensor<8x1024xf32>
}

// CHECK-LABEL: ===== @rmsnorm_kept =====
// CHECK:       COCO_SHARED(float, h_s_row, 1024);
// The first pass keeps %h_s ...
// CHECK:       for (coco_i64 row_ = r_.begin; row_ < r_.end; row_ += 1024) {
// CHECK:         const float h_s = rs + res_s;  // coco.add %h_s
// CHECK:         h_s_row[e_] = h_s;
// CHECK:         ((float*)h_peers[me])[h_base + i] = h_s;  // comm.all_gather
// CHECK:         r_val[0] = r;
// ... and the second reads it back.
// CHECK:         const float h_s = h_s_row[e_];
// CHECK-NEXT:    const float r = r_val[0];
// CHECK-NEXT:    const float n = h_s * r;  // coco.mul %n

// -----

// The same block at a hidden size of 16384 (64 KiB a row): nothing is kept; the second pass
// re-reads %h_s where the first stored it (this rank's piece of %h in its symmetric buffer).
func.func @rmsnorm_streamed(%x: !coco.tensor<8x16384xf32, local>, %res: !coco.tensor<8x16384xf32>, %w: !coco.tensor<16384xf32>) -> (!coco.tensor<8x16384xf32>, !coco.tensor<8x16384xf32>) {
  %rs = comm.reduce_scatter sum %x : !coco.tensor<8x16384xf32, local> -> !coco.tensor<8x16384xf32, sliced<0>>
  %res_s = coco.slice %res : !coco.tensor<8x16384xf32> -> !coco.tensor<8x16384xf32, sliced<0>>
  %h_s = coco.add %rs, %res_s : !coco.tensor<8x16384xf32, sliced<0>>
  %h = comm.all_gather %h_s : !coco.tensor<8x16384xf32, sliced<0>> -> !coco.tensor<8x16384xf32>
  %sq = coco.mul %h_s, %h_s : !coco.tensor<8x16384xf32, sliced<0>>
  %ms = coco.reduce_dims mean %sq dims [1] keepdims : !coco.tensor<8x16384xf32, sliced<0>> -> !coco.tensor<8x1xf32, sliced<0>>
  %eps = coco.constant 1.0e-06 : !coco.tensor<f32>
  %d = coco.add %ms, %eps : !coco.tensor<8x1xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<8x1xf32, sliced<0>>
  %r = coco.rsqrt %d : !coco.tensor<8x1xf32, sliced<0>>
  %n = coco.mul %h_s, %r : !coco.tensor<8x16384xf32, sliced<0>>, !coco.tensor<8x1xf32, sliced<0>> -> !coco.tensor<8x16384xf32, sliced<0>>
  %y_s = coco.mul %n, %w : !coco.tensor<8x16384xf32, sliced<0>>, !coco.tensor<16384xf32> -> !coco.tensor<8x16384xf32, sliced<0>>
  %y = comm.all_gather %y_s : !coco.tensor<8x16384xf32, sliced<0>> -> !coco.tensor<8x16384xf32>
  func.return %h, %y : !coco.tensor<8x16384xf32>, !coco.tensor<8x16384xf32>
}

// CHECK-LABEL: ===== @rmsnorm_streamed =====
// CHECK:       COCO_KERNEL_BODY_BEGIN
// CHECK-NEXT:  COCO_SHARED(float, r_val, 1);
// CHECK-NEXT:  COCO_SHARED(double, ms_lanes, 32);
// CHECK-NOT:   COCO_SHARED
// CHECK:       for (coco_i64 row_ = r_.begin; row_ < r_.end; row_ += 16384) {
// CHECK:         for (coco_i64 e_ = lane_; e_ < 16384; e_ += 32) {
// CHECK:           const float h_s = rs + res_s;  // coco.add %h_s
// CHECK-NEXT:      const float sq = h_s * h_s;  // coco.mul %sq
// CHECK-NEXT:      acc0_ = acc0_ + (double)sq;
// CHECK-NEXT:      ((float*)h_peers[me])[h_base + i] = h_s;  // comm.all_gather
// CHECK-NEXT:    }
// CHECK:         r_val[0] = r;
// The second pass (no reduction: every thread takes elements) does not read the peers'
// inputs again: %h_s comes back from memory.
// CHECK:         COCO_BLOCK_STRIDE_LOOP(coco_i64, e_, 0, 16384) {
// CHECK-NOT:       x_peers
// CHECK:           const float h_s = ((float*)h_peers[me])[h_base + i];  // re-read, not kept
// CHECK-NEXT:      const float r = r_val[0];
// CHECK-NEXT:      const float n = h_s * r;  // coco.mul %n
// CHECK-NEXT:      const float w = w_in[w_base + c1];
// CHECK-NEXT:      const float y_s = n * w;  // coco.mul %y_s
// CHECK-NEXT:      ((float*)y_peers[me])[y_base + i] = y_s;  // comm.all_gather
// CHECK:       coco_peers_done

// -----

// LayerNorm without a stored copy of the centered value %c, rows of 16384 bf16: each pass
// after the first re-reads %h_s and recomputes %c from it and the mean.
func.func @layernorm_streamed(%x: !coco.tensor<8x16384xbf16, local>, %res: !coco.tensor<8x16384xbf16>) -> (!coco.tensor<8x16384xbf16>, !coco.tensor<8x16384xbf16>) {
  %rs = comm.reduce_scatter sum %x : !coco.tensor<8x16384xbf16, local> -> !coco.tensor<8x16384xbf16, sliced<0>>
  %res_s = coco.slice %res : !coco.tensor<8x16384xbf16> -> !coco.tensor<8x16384xbf16, sliced<0>>
  %h_s = coco.add %rs, %res_s : !coco.tensor<8x16384xbf16, sliced<0>>
  %h = comm.all_gather %h_s : !coco.tensor<8x16384xbf16, sliced<0>> -> !coco.tensor<8x16384xbf16>
  %mean = coco.reduce_dims mean %h_s dims [1] keepdims : !coco.tensor<8x16384xbf16, sliced<0>> -> !coco.tensor<8x1xbf16, sliced<0>>
  %c = coco.sub %h_s, %mean : !coco.tensor<8x16384xbf16, sliced<0>>, !coco.tensor<8x1xbf16, sliced<0>> -> !coco.tensor<8x16384xbf16, sliced<0>>
  %c2 = coco.mul %c, %c : !coco.tensor<8x16384xbf16, sliced<0>>
  %var = coco.reduce_dims mean %c2 dims [1] keepdims : !coco.tensor<8x16384xbf16, sliced<0>> -> !coco.tensor<8x1xbf16, sliced<0>>
  %eps = coco.constant 1.0e-05 : !coco.tensor<bf16>
  %ve = coco.add %var, %eps : !coco.tensor<8x1xbf16, sliced<0>>, !coco.tensor<bf16> -> !coco.tensor<8x1xbf16, sliced<0>>
  %r = coco.rsqrt %ve : !coco.tensor<8x1xbf16, sliced<0>>
  %n_s = coco.mul %c, %r : !coco.tensor<8x16384xbf16, sliced<0>>, !coco.tensor<8x1xbf16, sliced<0>> -> !coco.tensor<8x16384xbf16, sliced<0>>
  %n = comm.all_gather %n_s : !coco.tensor<8x16384xbf16, sliced<0>> -> !coco.tensor<8x16384xbf16>
  func.return %h, %n : !coco.tensor<8x16384xbf16>, !coco.tensor<8x16384xbf16>
}

// CHECK-LABEL: ===== @layernorm_streamed =====
// CHECK:       COCO_KERNEL_BODY_BEGIN
// CHECK-NEXT:  COCO_SHARED(float, mean_val, 1);
// CHECK-NEXT:  COCO_SHARED(float, r_val, 1);
// CHECK-NEXT:  COCO_SHARED(double, mean_lanes, 32);
// CHECK-NEXT:  COCO_SHARED(double, var_lanes, 32);
// CHECK-NOT:   COCO_SHARED
// CHECK:         ((coco_bf16*)h_peers[me])[h_base + i] = h_s_q;  // comm.all_gather
// CHECK:         mean_val[0] = mean;
// CHECK:         const float h_s = coco_to_f32(((coco_bf16*)h_peers[me])[h_base + i]);  // re-read, not kept
// CHECK-NEXT:    const float mean = mean_val[0];
// CHECK-NEXT:    const float c = coco_round_bf16(h_s - mean);  // coco.sub %c
// CHECK-NEXT:    const float c2 = coco_round_bf16(c * c);  // coco.mul %c2
// CHECK:         r_val[0] = r;
// CHECK:         const float h_s = coco_to_f32(((coco_bf16*)h_peers[me])[h_base + i]);  // re-read, not kept
// CHECK-NEXT:    const float mean = mean_val[0];
// CHECK-NEXT:    const float c = coco_round_bf16(h_s - mean);  // coco.sub %c
// CHECK-NEXT:    const float r = r_val[0];
// CHECK-NEXT:    const coco_bf16 n_s_q = coco_bf16_from_f32(c * r);  // coco.mul %n_s

// -----

// A softmax of rows of 16384 f32 that nothing stores before the last pass: each pass sums
// the reduce_scatter from the peers' inputs again and recomputes exp(x - max).
func.func @softmax_streamed(%x: !coco.tensor<8x16384xf32, local>) -> !coco.tensor<8x16384xf32> {
  %rs = comm.reduce_scatter sum %x : !coco.tensor<8x16384xf32, local> -> !coco.tensor<8x16384xf32, sliced<0>>
  %max = coco.reduce_dims max %rs dims [1] keepdims : !coco.tensor<8x16384xf32, sliced<0>> -> !coco.tensor<8x1xf32, sliced<0>>
  %s = coco.sub %rs, %max : !coco.tensor<8x16384xf32, sliced<0>>, !coco.tensor<8x1xf32, sliced<0>> -> !coco.tensor<8x16384xf32, sliced<0>>
  %e = coco.exp %s : !coco.tensor<8x16384xf32, sliced<0>>
  %sum = coco.reduce_dims sum %e dims [1] keepdims : !coco.tensor<8x16384xf32, sliced<0>> -> !coco.tensor<8x1xf32, sliced<0>>
  %p_s = coco.div %e, %sum : !coco.tensor<8x16384xf32, sliced<0>>, !coco.tensor<8x1xf32, sliced<0>> -> !coco.tensor<8x16384xf32, sliced<0>>
  %p = comm.all_gather %p_s : !coco.tensor<8x16384xf32, sliced<0>> -> !coco.tensor<8x16384xf32>
  func.return %p : !coco.tensor<8x16384xf32>
}

// CHECK-LABEL: ===== @softmax_streamed =====
// CHECK:       COCO_KERNEL_BODY_BEGIN
// CHECK-NEXT:  COCO_SHARED(float, max_val, 1);
// CHECK-NEXT:  COCO_SHARED(float, sum_val, 1);
// CHECK-NEXT:  COCO_SHARED(float, max_lanes, 32);
// CHECK-NEXT:  COCO_SHARED(double, sum_lanes, 32);
// CHECK-NOT:   COCO_SHARED
// CHECK:         acc0_ = coco_max(acc0_, (float)rs);
// CHECK:         max_val[0] = max;
// CHECK:         double rs_acc = (double)((const float*)x_peers[0])[x_base + i];
// CHECK:         const float rs = (float)rs_acc;  // comm.reduce_scatter
// CHECK-NEXT:    const float max = max_val[0];
// CHECK-NEXT:    const float s = rs - max;  // coco.sub %s
// CHECK-NEXT:    const float e = (float)coco_exp((double)s);  // coco.exp %e
// CHECK-NEXT:    acc0_ = acc0_ + (double)e;
// CHECK:         sum_val[0] = sum;
// CHECK:         double rs_acc = (double)((const float*)x_peers[0])[x_base + i];
// CHECK:         const float rs = (float)rs_acc;  // comm.reduce_scatter
// CHECK-NEXT:    const float max = max_val[0];
// CHECK-NEXT:    const float s = rs - max;  // coco.sub %s
// CHECK-NEXT:    const float e = (float)coco_exp((double)s);  // coco.exp %e
// CHECK-NEXT:    const float sum = sum_val[0];
// CHECK-NEXT:    const float p_s = e / sum;  // coco.div %p_s

// -----

// Rows of 8192 f32 LayerNorm: only one row fits; the kernel keeps %c (it could only
// recompute it) and re-reads %h_s.
func.func @layernorm_mixed(%x: !coco.tensor<8x8192xf32, local>, %res: !coco.tensor<8x8192xf32>) -> (!coco.tensor<8x8192xf32>, !coco.tensor<8x8192xf32>) {
  %rs = comm.reduce_scatter sum %x : !coco.tensor<8x8192xf32, local> -> !coco.tensor<8x8192xf32, sliced<0>>
  %res_s = coco.slice %res : !coco.tensor<8x8192xf32> -> !coco.tensor<8x8192xf32, sliced<0>>
  %h_s = coco.add %rs, %res_s : !coco.tensor<8x8192xf32, sliced<0>>
  %h = comm.all_gather %h_s : !coco.tensor<8x8192xf32, sliced<0>> -> !coco.tensor<8x8192xf32>
  %mean = coco.reduce_dims mean %h_s dims [1] keepdims : !coco.tensor<8x8192xf32, sliced<0>> -> !coco.tensor<8x1xf32, sliced<0>>
  %c = coco.sub %h_s, %mean : !coco.tensor<8x8192xf32, sliced<0>>, !coco.tensor<8x1xf32, sliced<0>> -> !coco.tensor<8x8192xf32, sliced<0>>
  %c2 = coco.mul %c, %c : !coco.tensor<8x8192xf32, sliced<0>>
  %var = coco.reduce_dims mean %c2 dims [1] keepdims : !coco.tensor<8x8192xf32, sliced<0>> -> !coco.tensor<8x1xf32, sliced<0>>
  %eps = coco.constant 1.0e-05 : !coco.tensor<f32>
  %ve = coco.add %var, %eps : !coco.tensor<8x1xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<8x1xf32, sliced<0>>
  %r = coco.rsqrt %ve : !coco.tensor<8x1xf32, sliced<0>>
  %n_s = coco.mul %c, %r : !coco.tensor<8x8192xf32, sliced<0>>, !coco.tensor<8x1xf32, sliced<0>> -> !coco.tensor<8x8192xf32, sliced<0>>
  %n = comm.all_gather %n_s : !coco.tensor<8x8192xf32, sliced<0>> -> !coco.tensor<8x8192xf32>
  func.return %h, %n : !coco.tensor<8x8192xf32>, !coco.tensor<8x8192xf32>
}

// CHECK-LABEL: ===== @layernorm_mixed =====
// CHECK:       COCO_KERNEL_BODY_BEGIN
// CHECK-NEXT:  COCO_SHARED(float, c_row, 8192);
// CHECK-NOT:   COCO_SHARED(float, h_s_row
// CHECK:         ((float*)h_peers[me])[h_base + i] = h_s;  // comm.all_gather
// CHECK:         const float h_s = ((float*)h_peers[me])[h_base + i];  // re-read, not kept
// CHECK-NEXT:    const float mean = mean_val[0];
// CHECK-NEXT:    const float c = h_s - mean;  // coco.sub %c
// CHECK:         c_row[e_] = c;
// CHECK:         const float c = c_row[e_];
// CHECK-NEXT:    const float r = r_val[0];
// CHECK-NEXT:    const float n_s = c * r;  // coco.mul %n_s

// -----

// The residual stream updated in place (vLLM's fused_add_rms_norm), rows of 16384: the
// second pass recomputes %t from %res, so the update waits for the last pass.
func.func @update_in_place(%x: !coco.tensor<8x16384xf32, local>, %res: !coco.tensor<8x16384xf32>) -> !coco.tensor<8x16384xf32> {
  %rs = comm.reduce_scatter sum %x : !coco.tensor<8x16384xf32, local> -> !coco.tensor<8x16384xf32, sliced<0>>
  %res_s = coco.slice %res : !coco.tensor<8x16384xf32> -> !coco.tensor<8x16384xf32, sliced<0>>
  %t = coco.add %rs, %res_s : !coco.tensor<8x16384xf32, sliced<0>>
  %h = comm.all_gather %t : !coco.tensor<8x16384xf32, sliced<0>> -> !coco.tensor<8x16384xf32>
  %sq = coco.mul %t, %t : !coco.tensor<8x16384xf32, sliced<0>>
  %ms = coco.reduce_dims mean %sq dims [1] keepdims : !coco.tensor<8x16384xf32, sliced<0>> -> !coco.tensor<8x1xf32, sliced<0>>
  %eps = coco.constant 1.0e-06 : !coco.tensor<f32>
  %d = coco.add %ms, %eps : !coco.tensor<8x1xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<8x1xf32, sliced<0>>
  %r = coco.rsqrt %d : !coco.tensor<8x1xf32, sliced<0>>
  %u = coco.add %rs, %res_s : !coco.tensor<8x16384xf32, sliced<0>>
  %y_s = coco.mul %u, %r : !coco.tensor<8x16384xf32, sliced<0>>, !coco.tensor<8x1xf32, sliced<0>> -> !coco.tensor<8x16384xf32, sliced<0>>
  %y = comm.all_gather %y_s : !coco.tensor<8x16384xf32, sliced<0>> -> !coco.tensor<8x16384xf32>
  coco.update %res, %h : !coco.tensor<8x16384xf32>
  func.return %y : !coco.tensor<8x16384xf32>
}

// CHECK-LABEL: ===== @update_in_place =====
// CHECK:       float* res_out,
// The first pass computes only what it reduces and writes (%u is left to the second).
// CHECK:         const float res = res_in[res_base + i];
// CHECK-NOT:     coco.add %u
// %h is assembled in %res: its symmetric buffer stages this rank's piece only, the element at
// its index within the piece.
// CHECK:         ((float*)h_peers[me])[i] = t;  // comm.all_gather
// CHECK-NOT:     res_out
// CHECK:         r_val[0] = r;
// CHECK:         const float res = res_in[res_base + i];
// CHECK:         const float u = rs + res_s;  // coco.add %u
// CHECK:         const float t = ((float*)h_peers[me])[i];  // re-read, not kept
// CHECK-NEXT:    res_out[h_base + i] = t;
// CHECK-NEXT:    ((float*)y_peers[me])[y_base + i] = y_s;  // comm.all_gather
