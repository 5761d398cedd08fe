// FSDP-style fp8 parameter all_gather (FSDP2's float8 all_gather, current scaling). Built also
// by fp8_allgather_matmul.py (build(F32) / build(BF16): the same GEMM gathering f32 or bf16).
// Each rank keeps an f32 master slice of the weight (sliced<0>); the slices are quantized to
// f8E4M3FN with one scale per tensor computed in the program:
//   amax = all_reduce max(max |w|);  scale = amax / 448;  wq = sat(w / scale) in e4m3
// then gathered in fp8 (1 byte an element on the wire), dequantized and multiplied with the
// replicated activations: y = x @ (wq * scale).
// Schedules: as written (ar-c's pipeline coco-fuse{mode=elementwise} folds the scale into the
// quantize kernel) and fuse(ag): quantize, the fp8 exchange and dequantize as one kernel. The
// split and fused all_reduce ones need an all_reduce of a tensor (this one's is a scalar);
// ol(ag,mm) needs the matmul to read the all_gather itself, here it reads the dequantized
// weight.

func.func @fp8_allgather_matmul(
    %w: !coco.tensor<64x32xf32, sliced<0>>,
    %x: !coco.tensor<16x64xf32>
) -> !coco.tensor<16x32xf32> attributes {coco.grid = #coco.grid<[?]>} {
  %0 = coco.abs %w : !coco.tensor<64x32xf32, sliced<0>>
  %1 = coco.reduce max %0 : !coco.tensor<64x32xf32, sliced<0>> -> !coco.tensor<f32, local>
  %amax = comm.all_reduce max %1 : !coco.tensor<f32, local> -> !coco.tensor<f32>
  %2 = coco.constant 448.0 : !coco.tensor<f32>
  %scale = coco.div %amax, %2 : !coco.tensor<f32>
  %wq = coco.quantize %w, %scale : !coco.tensor<64x32xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<64x32xf8E4M3FN, sliced<0>>
  %wg = comm.all_gather %wq : !coco.tensor<64x32xf8E4M3FN, sliced<0>> -> !coco.tensor<64x32xf8E4M3FN>
  %wd = coco.dequantize %wg, %scale : !coco.tensor<64x32xf8E4M3FN>, !coco.tensor<f32> -> !coco.tensor<64x32xf32>
  %y = coco.matmul %x, %wd : !coco.tensor<16x64xf32>, !coco.tensor<64x32xf32> -> !coco.tensor<16x32xf32>
  func.return %y : !coco.tensor<16x32xf32>
}
