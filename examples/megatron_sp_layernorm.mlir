// A Megatron sequence-parallel block boundary with LayerNorm: the row-parallel MLP output
// projection [B, S, 4H/p] x [4H/p, H] (B=2, S=16, H=64) -> local partial sums -> all_reduce
// -> + bias -> dropout (p = 0.1) -> + residual (an output) -> LayerNorm over H. Built also by
// megatron_sp_layernorm.py (LayerNorm from the front end's helper, whose intermediates are
// unnamed; build(F32) gives the fp32 variant).
// Schedules: MM_AR_C (as written); MM_RS_C_AG (split along the sequence dim S, so LayerNorm
// reduces whole rows of each rank's slice: Megatron's sequence-parallel layout).

func.func @megatron_sp_layernorm(
    %x: !coco.tensor<2x16x256xf16, sliced<2>>,
    %w: !coco.tensor<256x64xf16, sliced<0>>,
    %b: !coco.tensor<64xf16>,
    %r: !coco.tensor<2x16x64xf16>,
    %gamma: !coco.tensor<64xf16>,
    %beta: !coco.tensor<64xf16>
) -> (!coco.tensor<2x16x64xf16>, !coco.tensor<2x16x64xf16>) attributes {coco.grid = #coco.grid<[?]>} {
  %layer = coco.matmul %x, %w : !coco.tensor<2x16x256xf16, sliced<2>>, !coco.tensor<256x64xf16, sliced<0>> -> !coco.tensor<2x16x64xf16, local>
  %total = comm.all_reduce sum %layer : !coco.tensor<2x16x64xf16, local> -> !coco.tensor<2x16x64xf16>
  %biased = coco.add %total, %b : !coco.tensor<2x16x64xf16>, !coco.tensor<64xf16> -> !coco.tensor<2x16x64xf16>
  %dropped = coco.dropout %biased, 0.1 seed 4 : !coco.tensor<2x16x64xf16>
  %hidden = coco.add %dropped, %r : !coco.tensor<2x16x64xf16>
  %0 = coco.reduce_dims mean %hidden dims [2] keepdims : !coco.tensor<2x16x64xf16> -> !coco.tensor<2x16x1xf16>
  %1 = coco.sub %hidden, %0 : !coco.tensor<2x16x64xf16>, !coco.tensor<2x16x1xf16> -> !coco.tensor<2x16x64xf16>
  %2 = coco.mul %1, %1 : !coco.tensor<2x16x64xf16>
  %3 = coco.reduce_dims mean %2 dims [2] keepdims : !coco.tensor<2x16x64xf16> -> !coco.tensor<2x16x1xf16>
  %4 = coco.constant 1.0e-05 : !coco.tensor<f16>
  %5 = coco.add %3, %4 : !coco.tensor<2x16x1xf16>, !coco.tensor<f16> -> !coco.tensor<2x16x1xf16>
  %6 = coco.rsqrt %5 : !coco.tensor<2x16x1xf16>
  %7 = coco.mul %1, %6 : !coco.tensor<2x16x64xf16>, !coco.tensor<2x16x1xf16> -> !coco.tensor<2x16x64xf16>
  %8 = coco.mul %7, %gamma : !coco.tensor<2x16x64xf16>, !coco.tensor<64xf16> -> !coco.tensor<2x16x64xf16>
  %out = coco.add %8, %beta : !coco.tensor<2x16x64xf16>, !coco.tensor<64xf16> -> !coco.tensor<2x16x64xf16>
  func.return %hidden, %out : !coco.tensor<2x16x64xf16>, !coco.tensor<2x16x64xf16>
}
