// RUN: coco-opt %s -p coco-table-form | filecheck %s
// RUN: coco-opt %s -p coco-table-form | coco-opt -p coco-table-form | filecheck %s
// RUN: coco-opt %s -t 'plan{ranks=4}' | filecheck %s --check-prefix=PLAN

// coco-table-form marks the fused all_reduce regions whose kernels are built for table
// launches: every one (one-shot included) where the function's regions hold several
// reduce_scatters (an optimizer over two tensors: one kernel text over both, extents and
// counts as arguments, one table launch), none where they hold one (extents as literals).
// Run again, the pass keeps what it wrote.
// CHECK-LABEL: func.func @two_tensors
// CHECK:         comm.fused all_reduce attributes {comm.table_ready} {
// CHECK:         comm.fused all_reduce attributes {comm.table_ready} {
// CHECK:         %r = comm.fused all_reduce one_shot attributes {comm.table_ready} -> !coco.tensor<8xf32> {
// PLAN-LABEL:  plan @two_tensors on grid [4]
// PLAN:          launch k_fused_all_reduce_table<<<{{.*}}>>>([%w0, %w1], [peers(%g0), peers(%g1)],
func.func @two_tensors(%g0: !coco.tensor<16xf32, local>, %g1: !coco.tensor<8xf32, local>, %w0: !coco.tensor<16xf32>, %w1: !coco.tensor<8xf32>, %h: !coco.tensor<8xf32, local>) -> !coco.tensor<8xf32> attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused all_reduce {
    %a0 = comm.reduce_scatter sum %g0 : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32, sliced<0>>
    %w0s = coco.slice %w0 : !coco.tensor<16xf32> -> !coco.tensor<16xf32, sliced<0>>
    %x0s = coco.sub %w0s, %a0 : !coco.tensor<16xf32, sliced<0>>
    %x0 = comm.all_gather %x0s : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32>
    coco.update %w0, %x0 : !coco.tensor<16xf32>
    comm.yield
  }
  comm.fused all_reduce {
    %a1 = comm.reduce_scatter sum %g1 : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32, sliced<0>>
    %w1s = coco.slice %w1 : !coco.tensor<8xf32> -> !coco.tensor<8xf32, sliced<0>>
    %x1s = coco.sub %w1s, %a1 : !coco.tensor<8xf32, sliced<0>>
    %x1 = comm.all_gather %x1s : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32>
    coco.update %w1, %x1 : !coco.tensor<8xf32>
    comm.yield
  }
  %r = comm.fused all_reduce one_shot -> !coco.tensor<8xf32> {
    %s = comm.all_reduce sum %h : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
    %d = coco.mul %s, %s : !coco.tensor<8xf32>
    comm.yield %d : !coco.tensor<8xf32>
  }
  func.return %r : !coco.tensor<8xf32>
}

// One tensor: nothing to batch, no mark (its kernel keeps literal extents).
// CHECK-LABEL: func.func @one_tensor
// CHECK:         comm.fused all_reduce {
// PLAN-LABEL:  plan @one_tensor on grid [4]
// PLAN:          launch k_fused_all_reduce{{(_[0-9]+)?}}<<<
func.func @one_tensor(%g0: !coco.tensor<16xf32, local>, %w0: !coco.tensor<16xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused all_reduce {
    %a0 = comm.reduce_scatter sum %g0 : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32, sliced<0>>
    %w0s = coco.slice %w0 : !coco.tensor<16xf32> -> !coco.tensor<16xf32, sliced<0>>
    %x0s = coco.sub %w0s, %a0 : !coco.tensor<16xf32, sliced<0>>
    %x0 = comm.all_gather %x0s : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32>
    coco.update %w0, %x0 : !coco.tensor<16xf32>
    comm.yield
  }
  func.return
}
