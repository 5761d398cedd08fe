// Megatron-LM sequence parallelism (Korthikanti et al. 2022), the MLP block of a transformer
// layer scaled down to B=2, S=16, H=64. Built also by sequence_parallel_mlp.py (whose
// build(F32) gives the fp32 variant).
// The activations between tensor-parallel regions are sliced along the sequence (dim 1):
// all_gather the input -> column-parallel GEMM (each rank its 4H/p columns) -> GeLU ->
// row-parallel GEMM (partial sums) -> reduce_scatter back onto sequence slices -> + residual.
// Schedules: as written; ol(ag,mm) (the all_gather pipelined with the column-parallel GEMM:
// chunk k multiplies while chunk k+1 is gathered); ol(mm,rs) (the row-parallel GEMM pipelined
// with its reduce_scatter); ol(ag,mm)+ol(mm,rs) (both: async tensor parallelism).

func.func @sequence_parallel_mlp(
    %x: !coco.tensor<2x16x64xf16, sliced<1>>,
    %w1: !coco.tensor<64x256xf16, sliced<1>>,
    %w2: !coco.tensor<256x64xf16, sliced<0>>,
    %r: !coco.tensor<2x16x64xf16, sliced<1>>
) -> !coco.tensor<2x16x64xf16, sliced<1>> attributes {coco.grid = #coco.grid<[?]>} {
  %xg = comm.all_gather %x : !coco.tensor<2x16x64xf16, sliced<1>> -> !coco.tensor<2x16x64xf16>
  %h = coco.matmul %xg, %w1 : !coco.tensor<2x16x64xf16>, !coco.tensor<64x256xf16, sliced<1>> -> !coco.tensor<2x16x256xf16, sliced<2>>
  %a = coco.gelu %h : !coco.tensor<2x16x256xf16, sliced<2>>
  %y = coco.matmul %a, %w2 : !coco.tensor<2x16x256xf16, sliced<2>>, !coco.tensor<256x64xf16, sliced<0>> -> !coco.tensor<2x16x64xf16, local>
  %ys = comm.reduce_scatter sum %y dim 1 : !coco.tensor<2x16x64xf16, local> -> !coco.tensor<2x16x64xf16, sliced<1>>
  %out = coco.add %ys, %r : !coco.tensor<2x16x64xf16, sliced<1>>
  func.return %out : !coco.tensor<2x16x64xf16, sliced<1>>
}
