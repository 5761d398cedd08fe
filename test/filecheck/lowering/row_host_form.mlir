// RUN: coco-opt %s -p 'coco-fuse{mode=all_reduce}' -t 'cuda{ranks=2}' | filecheck %s

// A row phase prints twice: on a GPU, thread t walks lanes t, t + blockDim, ... of the row
// (neighbouring threads, neighbouring elements); on the host a run of 32 lanes at a time, one
// loop over the lanes for each piece of the body between its peer loops
// (lowering/host_lanes.py): the same elements in the same order per lane, vectorized.
// Values read after the peer loop live in tiles of one entry per lane; the index is
// computed again in each piece.
func.func @softmax_rows(%x: !coco.tensor<8x500xf32, local>) -> !coco.tensor<8x500xf32> {
  %scores = comm.reduce_scatter sum %x : !coco.tensor<8x500xf32, local> -> !coco.tensor<8x500xf32, sliced<0>>
  %m = coco.reduce_dims max %scores dims [1] keepdims : !coco.tensor<8x500xf32, sliced<0>> -> !coco.tensor<8x1xf32, sliced<0>>
  %d = coco.sub %scores, %m : !coco.tensor<8x500xf32, sliced<0>>, !coco.tensor<8x1xf32, sliced<0>> -> !coco.tensor<8x500xf32, sliced<0>>
  %e = coco.exp %d : !coco.tensor<8x500xf32, sliced<0>>
  %s = coco.reduce_dims sum %e dims [1] keepdims : !coco.tensor<8x500xf32, sliced<0>> -> !coco.tensor<8x1xf32, sliced<0>>
  %p_s = coco.div %e, %s : !coco.tensor<8x500xf32, sliced<0>>, !coco.tensor<8x1xf32, sliced<0>> -> !coco.tensor<8x500xf32, sliced<0>>
  %p = comm.all_gather %p_s : !coco.tensor<8x500xf32, sliced<0>> -> !coco.tensor<8x500xf32>
  func.return %p : !coco.tensor<8x500xf32>
}

// CHECK-LABEL: COCO_KERNEL(k_fused_all_reduce_rows,
// CHECK:       for (coco_i64 row_ = r_.begin; row_ < r_.end; row_ += 500) {
// CHECK-NEXT:    #ifdef COCO_TARGET_CUDA
// CHECK-NEXT:    COCO_FOR_THREADS {
// CHECK-NEXT:      for (coco_i64 lane_ = (coco_i64)coco_thread_idx(); lane_ < 32; lane_ += (coco_i64)coco_block_dim()) {
// CHECK-NEXT:        float acc0_ = -(1.0 / 0.0);
// CHECK-NEXT:        for (coco_i64 e_ = lane_; e_ < 500; e_ += 32) {
// CHECK:         #else
// CHECK-NEXT:    {
// CHECK-NEXT:      float acc0_t[32];
// CHECK-NEXT:      double scores_acc_t[32];
// CHECK-NEXT:      COCO_FOR_LANES(k_, 32) {
// CHECK-NEXT:        acc0_t[k_] = -(1.0 / 0.0);
// CHECK-NEXT:      }
// CHECK-NEXT:      for (coco_i64 run_ = 0; run_ < 500; run_ += 32) {
// CHECK-NEXT:        const coco_i64 width_ = 500 - run_ < 32 ? 500 - run_ : 32;
// CHECK-NEXT:        COCO_FOR_LANES(k_, width_) {
// CHECK-NEXT:          const coco_i64 i = begin + row_ + (run_ + (coco_i64)k_);
// CHECK-NEXT:          scores_acc_t[k_] = (double)((const float*)x_peers[0])[x_base + i];
// CHECK-NEXT:        }
// CHECK-NEXT:        for (coco_i32 p_ = 1; p_ < nranks; ++p_) {
// CHECK-NEXT:          COCO_FOR_LANES(k_, width_) {
// CHECK-NEXT:            const coco_i64 i = begin + row_ + (run_ + (coco_i64)k_);
// CHECK-NEXT:            scores_acc_t[k_] = scores_acc_t[k_] + (double)((const float*)x_peers[p_])[x_base + i];
// CHECK-NEXT:          }
// CHECK-NEXT:        }
// CHECK-NEXT:        COCO_FOR_LANES(k_, width_) {
// CHECK-NEXT:          const float scores = (float)scores_acc_t[k_];  // comm.reduce_scatter
// CHECK-NEXT:          acc0_t[k_] = coco_max(acc0_t[k_], (float)scores);
// CHECK-NEXT:          scores_row[run_ + (coco_i64)k_] = scores;
// CHECK-NEXT:        }
// CHECK-NEXT:      }
// CHECK-NEXT:      COCO_FOR_LANES(k_, 32) {
// CHECK-NEXT:        m_lanes[(coco_i64)k_] = acc0_t[k_];
// CHECK-NEXT:      }
// CHECK-NEXT:    }
// CHECK-NEXT:    #endif
// A block's chunk is whole rows of 500 elements: the pull takes vectors only where the chunk
// starts at a whole one (it took vectors from the vector before the chunk, and left the end
// of the chunk uncopied, when it did not).
// CHECK:       const bool qvec_ = {{.*}} && r_.begin % lanes_ == 0;
