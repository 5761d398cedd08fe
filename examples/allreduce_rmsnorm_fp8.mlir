// AllReduce + residual + RMSNorm + fp8 quantize of the output: the inference epilogue of
// TensorRT-LLM / FlashInfer (the next GEMM reads fp8 activations). Built also by
// allreduce_rmsnorm_fp8.py (RMSNorm from the front end's helper, whose intermediates are
// unnamed; build(dtype, out=None) gives the epilogue without the quantize).
// local partial sums [T, H] (bf16) -> all_reduce -> + residual (an output: the new residual
// stream) -> x * rsqrt(mean(x^2 over H) + eps) * weight -> sat(normed / scale) in e4m3, with a
// static per-tensor scale passed in.
// Schedules: ar-c (as written); rs-c-ag (split along the tokens: each rank normalizes and
// quantizes whole rows of its slice, then all_gathers the residual and the fp8 rows);
// fuse(rs-c-ag) (ONE kernel: reduce_scatter, residual, RMSNorm, quantize, and an all_gather
// moving the output in fp8).

func.func @allreduce_rmsnorm_fp8(
    %x: !coco.tensor<16x64xbf16, local>,
    %residual: !coco.tensor<16x64xbf16>,
    %weight: !coco.tensor<64xbf16>,
    %scale: !coco.tensor<bf16>
) -> (!coco.tensor<16x64xbf16>, !coco.tensor<16x64xf8E4M3FN>) attributes {coco.grid = #coco.grid<[?]>} {
  %total = comm.all_reduce sum %x : !coco.tensor<16x64xbf16, local> -> !coco.tensor<16x64xbf16>
  %hidden = coco.add %total, %residual : !coco.tensor<16x64xbf16>
  %0 = coco.mul %hidden, %hidden : !coco.tensor<16x64xbf16>
  %1 = coco.reduce_dims mean %0 dims [1] keepdims : !coco.tensor<16x64xbf16> -> !coco.tensor<16x1xbf16>
  %2 = coco.constant 1.0e-06 : !coco.tensor<bf16>
  %3 = coco.add %1, %2 : !coco.tensor<16x1xbf16>, !coco.tensor<bf16> -> !coco.tensor<16x1xbf16>
  %4 = coco.rsqrt %3 : !coco.tensor<16x1xbf16>
  %5 = coco.mul %hidden, %4 : !coco.tensor<16x64xbf16>, !coco.tensor<16x1xbf16> -> !coco.tensor<16x64xbf16>
  %normed = coco.mul %5, %weight : !coco.tensor<16x64xbf16>, !coco.tensor<64xbf16> -> !coco.tensor<16x64xbf16>
  %q = coco.quantize %normed, %scale : !coco.tensor<16x64xbf16>, !coco.tensor<bf16> -> !coco.tensor<16x64xf8E4M3FN>
  func.return %hidden, %q : !coco.tensor<16x64xbf16>, !coco.tensor<16x64xf8E4M3FN>
}
