// RUN: coco-opt %s -p 'coco-fuse{mode=all_reduce}' | filecheck %s
// RUN: not coco-opt %s -p 'coco-fuse{mode=all_reduce ops=nrs}' 2>&1 | filecheck %s --check-prefix=NORMS
// RUN: coco-opt %s -p 'coco-fuse{mode=all_reduce ops=lrs}' | filecheck %s --check-prefix=LONG

// A fused all_reduce takes the row-wise ops of a slice of whole rows (RMSNorm after the
// reduce_scatter and the residual add): one kernel, a block per row (row_collective.py).

func.func @rmsnorm(%x: !coco.tensor<16x64xf32, local>, %res: !coco.tensor<16x64xf32>, %w: !coco.tensor<64xf32>) -> (!coco.tensor<16x64xf32>, !coco.tensor<16x64xf32>) {
  %rs = comm.reduce_scatter sum %x : !coco.tensor<16x64xf32, local> -> !coco.tensor<16x64xf32, sliced<0>>
  %res_s = coco.slice %res : !coco.tensor<16x64xf32> -> !coco.tensor<16x64xf32, sliced<0>>
  %h_s = coco.add %rs, %res_s : !coco.tensor<16x64xf32, sliced<0>>
  %h = comm.all_gather %h_s : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x64xf32>
  %sq = coco.mul %h_s, %h_s : !coco.tensor<16x64xf32, sliced<0>>
  %ms = coco.reduce_dims mean %sq dims [1] keepdims : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x1xf32, sliced<0>>
  %eps = coco.constant 1.0e-06 : !coco.tensor<f32>
  %d = coco.add %ms, %eps : !coco.tensor<16x1xf32, sliced<0>>, !coco.tensor<f32> -> !coco.tensor<16x1xf32, sliced<0>>
  %r = coco.rsqrt %d : !coco.tensor<16x1xf32, sliced<0>>
  %n = coco.mul %h_s, %r : !coco.tensor<16x64xf32, sliced<0>>, !coco.tensor<16x1xf32, sliced<0>> -> !coco.tensor<16x64xf32, sliced<0>>
  %y_s = coco.mul %n, %w : !coco.tensor<16x64xf32, sliced<0>>, !coco.tensor<64xf32> -> !coco.tensor<16x64xf32, sliced<0>>
  %y = comm.all_gather %y_s : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x64xf32>
  func.return %h, %y : !coco.tensor<16x64xf32>, !coco.tensor<16x64xf32>
}

// CHECK-LABEL: func.func @rmsnorm(
// CHECK-NEXT:    %h, %y = comm.fused all_reduce -> !coco.tensor<16x64xf32>, !coco.tensor<16x64xf32> {
// CHECK-NEXT:      %rs = comm.reduce_scatter sum %x
// CHECK-NEXT:      %res_s = coco.slice %res
// CHECK-NEXT:      %h_s = coco.add %rs, %res_s
// CHECK-NEXT:      %h_1 = comm.all_gather %h_s
// CHECK-NEXT:      %sq = coco.mul %h_s, %h_s
// CHECK-NEXT:      %ms = coco.reduce_dims mean %sq dims [1] keepdims
// CHECK-NEXT:      %eps = coco.constant
// CHECK-NEXT:      %d = coco.add %ms, %eps
// CHECK-NEXT:      %r = coco.rsqrt %d
// CHECK-NEXT:      %n = coco.mul %h_s, %r
// CHECK-NEXT:      %y_s = coco.mul %n, %w
// CHECK-NEXT:      %y_1 = comm.all_gather %y_s
// CHECK-NEXT:      comm.yield %h_1, %y_1
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %h, %y

// A full reduction (a norm finished across blocks) and row reductions in one chain: refused.

func.func @rows_and_norm(%nx: !coco.tensor<16x64xf32, local>) -> (!coco.tensor<16x64xf32>, !coco.tensor<f32>) {
  %nrs = comm.reduce_scatter sum %nx : !coco.tensor<16x64xf32, local> -> !coco.tensor<16x64xf32, sliced<0>>
  %nmax = coco.reduce_dims max %nrs dims [1] keepdims : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x1xf32, sliced<0>>
  %nsub = coco.sub %nrs, %nmax : !coco.tensor<16x64xf32, sliced<0>>, !coco.tensor<16x1xf32, sliced<0>> -> !coco.tensor<16x64xf32, sliced<0>>
  %npart = coco.reduce sum %nsub : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<f32, local>
  %ntotal = comm.all_reduce sum %npart : !coco.tensor<f32, local> -> !coco.tensor<f32>
  %ny = comm.all_gather %nsub : !coco.tensor<16x64xf32, sliced<0>> -> !coco.tensor<16x64xf32>
  func.return %ny, %ntotal : !coco.tensor<16x64xf32>, !coco.tensor<f32>
}

// Greedy fusion leaves it as it is.
// CHECK-LABEL: func.func @rows_and_norm(
// CHECK-NEXT:    %nrs = comm.reduce_scatter sum %nx

// NORMS: [fuse-chain] a fused all_reduce with row reductions cannot also finish full reductions

// Rows too long for the shared memory a row kernel keeps between its phases fuse too: the
// kernel streams them (test/filecheck/lowering/row_streaming.mlir).

func.func @long_rows(%lx: !coco.tensor<8x16384xf32, local>) -> !coco.tensor<8x16384xf32> {
  %lrs = comm.reduce_scatter sum %lx : !coco.tensor<8x16384xf32, local> -> !coco.tensor<8x16384xf32, sliced<0>>
  %lmean = coco.reduce_dims mean %lrs dims [1] keepdims : !coco.tensor<8x16384xf32, sliced<0>> -> !coco.tensor<8x1xf32, sliced<0>>
  %lc = coco.sub %lrs, %lmean : !coco.tensor<8x16384xf32, sliced<0>>, !coco.tensor<8x1xf32, sliced<0>> -> !coco.tensor<8x16384xf32, sliced<0>>
  %ly = comm.all_gather %lc : !coco.tensor<8x16384xf32, sliced<0>> -> !coco.tensor<8x16384xf32>
  func.return %ly : !coco.tensor<8x16384xf32>
}

// LONG-LABEL: func.func @long_rows(
// LONG-NEXT:    %ly = comm.fused all_reduce -> !coco.tensor<8x16384xf32> {
// LONG-NEXT:      %lrs = comm.reduce_scatter sum %lx
// LONG-NEXT:      %lmean = coco.reduce_dims mean %lrs dims [1] keepdims
// LONG-NEXT:      %lc = coco.sub %lrs, %lmean
// LONG-NEXT:      %ly_1 = comm.all_gather %lc
// LONG-NEXT:      comm.yield %ly_1
