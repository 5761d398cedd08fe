// Megatron-style model parallelism: the self-attention output projection
// [B, S, H/p] x [H/p, H] (CoCoNet reference sec. 4.4; GPT-2 8.3B scaled down to B=2, S=16, H=64).
// Built also by model_parallel_attention.py (whose build(F32) gives the fp32 variant).
// x is sliced on its hidden dim and w on its rows, so the matmul gives local partial sums:
// all_reduce them, add the bias, dropout (p = 0.1), add the residual.
// Schedules: MM_AR_C (as written); MM_RS_C_AG (split, reorder bias/dropout/residual onto
// slices, all_gather the output); ol_MM_fuse_RS_C_AG (fuse RS + computation + AG and overlap
// it with the matmul).

func.func @model_parallel_attention(
    %x: !coco.tensor<2x16x64xf16, sliced<2>>,
    %w: !coco.tensor<64x64xf16, sliced<0>>,
    %b: !coco.tensor<64xf16>,
    %r: !coco.tensor<2x16x64xf16>
) -> !coco.tensor<2x16x64xf16> attributes {coco.grid = #coco.grid<[?]>} {
  %layer = coco.matmul %x, %w : !coco.tensor<2x16x64xf16, sliced<2>>, !coco.tensor<64x64xf16, sliced<0>> -> !coco.tensor<2x16x64xf16, local>
  %total = comm.all_reduce sum %layer : !coco.tensor<2x16x64xf16, local> -> !coco.tensor<2x16x64xf16>
  %biased = coco.add %total, %b : !coco.tensor<2x16x64xf16>, !coco.tensor<64xf16> -> !coco.tensor<2x16x64xf16>
  %dropped = coco.dropout %biased, 0.1 seed 1 : !coco.tensor<2x16x64xf16>
  %out = coco.add %dropped, %r : !coco.tensor<2x16x64xf16>
  func.return %out : !coco.tensor<2x16x64xf16>
}
