// RUN: coco-opt %s --split-input-file --verify-diagnostics -p coco-table-form | filecheck %s

// Table-ready marks written by hand must be the pass's: on fused all_reduce regions only,
// on every one where the function's regions hold several reduce_scatters and on none where
// they hold one ([table-ready]); and a unit attribute ([unknown-attribute]).

// One reduce_scatter: nothing to batch.
// CHECK: coco-table-form-invalid.mlir:[[# @LINE + 2]]:3: [table-ready] the function's fused regions hold one reduce_scatter: none is table-ready, this one is not so marked
func.func @one(%g: !coco.tensor<16xf32, local>, %w: !coco.tensor<16xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused all_reduce attributes {comm.table_ready} {
    %a = comm.reduce_scatter sum %g : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32, sliced<0>>
    %x = comm.all_gather %a : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32>
    coco.update %w, %x : !coco.tensor<16xf32>
    comm.yield
  }
  func.return
}

// -----

// Two reduce_scatters: both regions are marked, or the one left out is refused.
// CHECK: coco-table-form-invalid.mlir:[[# @LINE + 8]]:3: [table-ready] the function's fused regions hold several reduce_scatters: every region is table-ready, this one is not so marked
func.func @partly(%g0: !coco.tensor<16xf32, local>, %g1: !coco.tensor<8xf32, local>, %w0: !coco.tensor<16xf32>, %w1: !coco.tensor<8xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused all_reduce attributes {comm.table_ready} {
    %a0 = comm.reduce_scatter sum %g0 : !coco.tensor<16xf32, local> -> !coco.tensor<16xf32, sliced<0>>
    %x0 = comm.all_gather %a0 : !coco.tensor<16xf32, sliced<0>> -> !coco.tensor<16xf32>
    coco.update %w0, %x0 : !coco.tensor<16xf32>
    comm.yield
  }
  comm.fused all_reduce {
    %a1 = comm.reduce_scatter sum %g1 : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32, sliced<0>>
    %x1 = comm.all_gather %a1 : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32>
    coco.update %w1, %x1 : !coco.tensor<8xf32>
    comm.yield
  }
  func.return
}

// -----

// An elementwise region builds no collective kernel.
// CHECK: coco-table-form-invalid.mlir:[[# @LINE + 2]]:3: [table-ready] comm.fused is marked table-ready, but only fused all_reduce regions build their kernels for table launches
func.func @elementwise(%x: !coco.tensor<16xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused elementwise attributes {comm.table_ready} {
    %y = coco.neg %x : !coco.tensor<16xf32>
    coco.update %x, %y : !coco.tensor<16xf32>
    comm.yield
  }
  func.return
}

// -----

// CHECK: [unknown-attribute] comm.fused has 'comm.table_ready' = 1 : i64: it is a unit attribute: its kernels are built to run as table launches
func.func @not_unit(%x: !coco.tensor<16xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused elementwise attributes {comm.table_ready = 1 : i64} {
    %y = coco.neg %x : !coco.tensor<16xf32>
    coco.update %x, %y : !coco.tensor<16xf32>
    comm.yield
  }
  func.return
}
