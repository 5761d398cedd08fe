// Dense constants of several element types next to all_reduces, so that every schedule
// (split, reorder onto slices, fused collectives) reads them at slices and broadcasts:
// a bias along the rows, a scale per row (6 rows: uneven slices at 4 ranks), a mask
// selecting elements, an f16 table that rounds its decimals, and i32 values at the type's
// limits. test_dense_constants.py checks the sim against NumPy and every schedule's kernels
// against the sim.

func.func @dense_constants(
    %x: !coco.tensor<6x8xf32, local>,
    %h: !coco.tensor<6x8xf16, local>,
    %n: !coco.tensor<8xi32, local>
) -> (!coco.tensor<6x8xf32>, !coco.tensor<6x8xf16>, !coco.tensor<8xi32>) attributes {coco.grid = #coco.grid<[?]>} {
  %s = comm.all_reduce sum %x : !coco.tensor<6x8xf32, local> -> !coco.tensor<6x8xf32>
  %bias = coco.constant dense<[0.1, -1.5, 2.0, inf, 0.3, -0.0, 1.0e-3, 7.25]> : !coco.tensor<8xf32>
  %biased = coco.add %s, %bias : !coco.tensor<6x8xf32>, !coco.tensor<8xf32> -> !coco.tensor<6x8xf32>
  %scale = coco.constant dense<[[0.5], [-2.0], [3.0], [0.1], [1.0e+30], [-0.75]]> : !coco.tensor<6x1xf32>
  %scaled = coco.mul %biased, %scale : !coco.tensor<6x8xf32>, !coco.tensor<6x1xf32> -> !coco.tensor<6x8xf32>
  %mask = coco.constant dense<[[true, true, true, false, false, true, true, false], [false, true, true, false, true, true, true, true], [true, true, true, false, true, false, true, false], [true, true, false, true, true, false, true, false], [true, true, false, true, true, true, false, true], [true, true, false, true, true, true, true, false]]> : !coco.tensor<6x8xi1>
  %zero = coco.constant 0.0 : !coco.tensor<f32>
  %masked = coco.select %mask, %scaled, %zero : !coco.tensor<6x8xi1>, !coco.tensor<6x8xf32>, !coco.tensor<f32> -> !coco.tensor<6x8xf32>
  %hs = comm.all_reduce sum %h : !coco.tensor<6x8xf16, local> -> !coco.tensor<6x8xf16>
  %table = coco.constant dense<[[-0.2334, -0.2558, 0.962, -1.1814, 0.738, -1.099, -0.3313, -0.8405], [1.4487, 0.5682, 2.4317, 0.6419, 0.845, 0.8407, -0.6066, -0.07], [1.3504, -0.3966, 0.1888, -0.0212, 0.6092, -0.3649, -0.1524, 0.2424], [0.103, -0.865, 0.8958, -1.2985, -1.2011, -1.2825, 0.967, -0.3606], [-0.971, -1.136, 0.4211, -1.0548, -1.2721, 0.614, -1.1967, -0.3224], [-0.0068, -0.4453, -0.0541, 1.3388, -0.5169, -1.2593, -1.8367, -0.2048]]> : !coco.tensor<6x8xf16>
  %shifted = coco.add %hs, %table : !coco.tensor<6x8xf16>
  %ns = comm.all_reduce sum %n : !coco.tensor<8xi32, local> -> !coco.tensor<8xi32>
  %limits = coco.constant dense<[3, -7, 2147483647, 0, -2147483648, 5, 1, -1]> : !coco.tensor<8xi32>
  %counts = coco.add %ns, %limits : !coco.tensor<8xi32>
  func.return %masked, %shifted, %counts : !coco.tensor<6x8xf32>, !coco.tensor<6x8xf16>, !coco.tensor<8xi32>
}
