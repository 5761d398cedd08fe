// AllReduce + residual + RMSNorm, the fused kernel of inference engines (vLLM, FlashInfer,
// TensorRT-LLM). Built also by allreduce_rmsnorm.py (RMSNorm from the front end's helper, whose
// intermediates are unnamed; build(F32) gives the fp32 variant).
// local partial sums [T, H] -> all_reduce -> + residual (an output: the new residual stream)
// -> x * rsqrt(mean(x^2 over H) + eps) * weight.
// Schedules: AR_C (as written); RS_C_AG (split along the tokens: each rank normalizes whole
// rows of its slice, then all_gathers the residual and the normalized rows).

func.func @allreduce_rmsnorm(
    %x: !coco.tensor<16x64xf16, local>,
    %residual: !coco.tensor<16x64xf16>,
    %weight: !coco.tensor<64xf16>
) -> (!coco.tensor<16x64xf16>, !coco.tensor<16x64xf16>) attributes {coco.grid = #coco.grid<[?]>} {
  %total = comm.all_reduce sum %x : !coco.tensor<16x64xf16, local> -> !coco.tensor<16x64xf16>
  %hidden = coco.add %total, %residual : !coco.tensor<16x64xf16>
  %0 = coco.mul %hidden, %hidden : !coco.tensor<16x64xf16>
  %1 = coco.reduce_dims mean %0 dims [1] keepdims : !coco.tensor<16x64xf16> -> !coco.tensor<16x1xf16>
  %2 = coco.constant 1.0e-06 : !coco.tensor<f16>
  %3 = coco.add %1, %2 : !coco.tensor<16x1xf16>, !coco.tensor<f16> -> !coco.tensor<16x1xf16>
  %4 = coco.rsqrt %3 : !coco.tensor<16x1xf16>
  %5 = coco.mul %hidden, %4 : !coco.tensor<16x64xf16>, !coco.tensor<16x1xf16> -> !coco.tensor<16x64xf16>
  %normed = coco.mul %5, %weight : !coco.tensor<16x64xf16>, !coco.tensor<64xf16> -> !coco.tensor<16x64xf16>
  func.return %hidden, %normed : !coco.tensor<16x64xf16>, !coco.tensor<16x64xf16>
}
