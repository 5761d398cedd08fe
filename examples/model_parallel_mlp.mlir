// Megatron-style model parallelism: the MLP output projection
// [B, S, 4H/p] x [4H/p, H] (CoCoNet reference sec. 4.4; GPT-2 8.3B scaled down to B=2, S=16,
// H=64). Built also by model_parallel_mlp.py (whose build(F32) gives the fp32 variant).
// matmul of sliced operands -> local partial sums -> all_reduce -> + bias -> dropout (p = 0.1)
// -> + residual.
// Schedules: MM_AR_C (as written); MM_RS_C_AG; ol_MM_fuse_RS_C_AG (as for attention).

func.func @model_parallel_mlp(
    %x: !coco.tensor<2x16x256xf16, sliced<2>>,
    %w: !coco.tensor<256x64xf16, sliced<0>>,
    %b: !coco.tensor<64xf16>,
    %r: !coco.tensor<2x16x64xf16>
) -> !coco.tensor<2x16x64xf16> attributes {coco.grid = #coco.grid<[?]>} {
  %layer = coco.matmul %x, %w : !coco.tensor<2x16x256xf16, sliced<2>>, !coco.tensor<256x64xf16, sliced<0>> -> !coco.tensor<2x16x64xf16, local>
  %total = comm.all_reduce sum %layer : !coco.tensor<2x16x64xf16, local> -> !coco.tensor<2x16x64xf16>
  %biased = coco.add %total, %b : !coco.tensor<2x16x64xf16>, !coco.tensor<64xf16> -> !coco.tensor<2x16x64xf16>
  %dropped = coco.dropout %biased, 0.1 seed 2 : !coco.tensor<2x16x64xf16>
  %out = coco.add %dropped, %r : !coco.tensor<2x16x64xf16>
  func.return %out : !coco.tensor<2x16x64xf16>
}
