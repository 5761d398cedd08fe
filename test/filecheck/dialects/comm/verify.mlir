// RUN: COCO_VERIFY

// One refusal per chunk (--verify-diagnostics reports only the first error of a chunk):
// every layout rule and op verifier of the comm dialect, each naming its rule. The
// CHECK-LABEL on each chunk's separator keeps an error from being matched in another chunk.

// all-reduce-input
func.func @all_reduce_of_slice(%a: !coco.tensor<8xf32, sliced<0>>) {
  %0 = comm.all_reduce sum %a : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32>
  func.return
}

// CHECK: [all-reduce-input] all_reduce of %a : !coco.tensor<8xf32, sliced<0>>, which is sliced<0> on grid axis 0: all_reduce takes local or replicated tensors (all_gather a slice)

// -----

func.func @all_reduce_of_slice_on_spanned_axis(%a: !coco.tensor<8x8xf32, [local, sliced<1>]>) attributes {coco.grid = #coco.grid<[2, 4]>} {
  %0 = comm.all_reduce sum %a over [1] : !coco.tensor<8x8xf32, [local, sliced<1>]> -> !coco.tensor<8x8xf32, [local, replicated]>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [all-reduce-input] all_reduce of %a : !coco.tensor<8x8xf32, [local, sliced<1>]>, which is sliced<1> on grid axis 1: all_reduce takes local or replicated tensors (all_gather a slice)

// -----

// reduce-scatter-input
func.func @reduce_scatter_of_slice(%a: !coco.tensor<8xf32, sliced<0>>) {
  %0 = comm.reduce_scatter sum %a : !coco.tensor<8xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [reduce-scatter-input] reduce_scatter of %a : !coco.tensor<8xf32, sliced<0>>, which is already sliced on grid axis 0: reduce_scatter takes local or replicated tensors

// -----

// reduce-scatter-dim: the dim a reduce_scatter slices is a property of the op
func.func @reduce_scatter_dim(%a: !coco.tensor<8x4xf32, local>) {
  %0 = comm.reduce_scatter sum %a dim 2 : !coco.tensor<8x4xf32, local> -> !coco.tensor<8x4xf32, sliced<1>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [reduce-scatter-dim] reduce_scatter of %a : !coco.tensor<8x4xf32, local> along dim 2, which a rank-2 tensor does not have

// -----

func.func @reduce_scatter_dim_mismatch(%a: !coco.tensor<8x4xf32, local>) {
  %0 = comm.reduce_scatter sum %a dim 1 : !coco.tensor<8x4xf32, local> -> !coco.tensor<8x4xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] comm.reduce_scatter produces !coco.tensor<8x4xf32, sliced<1>> from its operands by the layout rules, but its result is declared as !coco.tensor<8x4xf32, sliced<0>>

// -----

// all-gather-input
func.func @all_gather_of_local(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.all_gather %a : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [all-gather-input] all_gather of %a : !coco.tensor<8xf32, local>, which is local on grid axis 0: all_gather takes sliced tensors

// -----

func.func @all_gather_of_replicated(%a: !coco.tensor<8xf32>) {
  %0 = comm.all_gather %a : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [all-gather-input] all_gather of %a : !coco.tensor<8xf32>, which is replicated on grid axis 0: all_gather takes sliced tensors

// -----

// broadcast-input
func.func @broadcast_of_slice(%a: !coco.tensor<8xf32, sliced<0>>) {
  %0 = comm.broadcast %a root 0 : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [broadcast-input] broadcast of %a : !coco.tensor<8xf32, sliced<0>>, sliced on grid axis 0: broadcast takes local or replicated tensors

// -----

// reduce-input
func.func @reduce_of_slice(%a: !coco.tensor<8xf32, sliced<0>>) {
  %0 = comm.reduce sum %a root 0 : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [reduce-input] reduce of %a : !coco.tensor<8xf32, sliced<0>>, sliced on grid axis 0: reduce takes local or replicated tensors

// -----

// collective-axes
func.func @axis_out_of_range(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.all_reduce sum %a over [1] : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [collective-axes] comm.all_reduce spans axes [1], which are not distinct axes of the grid [?]

// -----

func.func @repeated_axis(%a: !coco.tensor<8xf32, [local, local]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  %0 = comm.all_gather %a over [1, 1] : !coco.tensor<8xf32, [local, local]>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [collective-axes] comm.all_gather spans axes [1, 1], which are not distinct axes of the grid [2, 2]

// -----

func.func @no_axis(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.broadcast %a root 0 over [] : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [collective-axes] comm.broadcast spans axes [], which are not distinct axes of the grid [?]

// -----

func.func @negative_axis(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.all_reduce sum %a over [-1] : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [collective-axes] comm.all_reduce spans axes [-1], which are not distinct axes of the grid [?]

// -----

func.func @send_along_missing_axis(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.send %a along 1 shift 1 : !coco.tensor<8xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [collective-axes] comm.send along axis 1, which the grid [?] lacks

// -----

// send-shift
func.func @shift_zero(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.send %a along 0 shift 0 : !coco.tensor<8xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [send-shift] comm.send with shift 0 sends nothing

// -----

func.func @shift_past_the_axis(%a: !coco.tensor<8xf32, [local, local]>) attributes {coco.grid = #coco.grid<[2, 4]>} {
  %0 = comm.send %a along 0 shift -2 : !coco.tensor<8xf32, [local, local]>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [send-shift] comm.send along axis 0 with shift -2 reaches no rank: the axis has 2 rank(s)

// -----

// a reduction kind is a #comm<collective_kind ...>, not a string
func.func @all_reduce_kind(%a: !coco.tensor<8xf32, local>) {
  %0 = "comm.all_reduce"(%a) <{kind = "avg"}> : (!coco.tensor<8xf32, local>) -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: "avg" should be of base attribute comm.collective_kind

// -----

func.func @reduce_scatter_kind(%a: !coco.tensor<8xf32, local>) {
  %0 = "comm.reduce_scatter"(%a) <{kind = "xor"}> : (!coco.tensor<8xf32, local>) -> !coco.tensor<8xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: "xor" should be of base attribute comm.collective_kind

// -----

func.func @reduce_kind(%a: !coco.tensor<8xf32, local>) {
  %0 = "comm.reduce"(%a) <{kind = "mean", root = 0 : i64}> : (!coco.tensor<8xf32, local>) -> !coco.tensor<8xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: "mean" should be of base attribute comm.collective_kind

// -----

// collective-root
func.func @negative_root(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.broadcast %a root -1 : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [collective-root] root -1 is not a rank

// -----

func.func @root_outside_group(%a: !coco.tensor<8xf32, [local, local]>) attributes {coco.grid = #coco.grid<[2, 4]>} {
  %0 = comm.reduce sum %a root 4 over [1] : !coco.tensor<8xf32, [local, local]>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [collective-root] comm.reduce with root 4, but its group on the grid [2, 4] has only 4 rank(s)

// -----

// result-type: the declared result is not what the layout rules produce.
func.func @all_reduce_result(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.all_reduce sum %a : !coco.tensor<8xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] comm.all_reduce produces !coco.tensor<8xf32> from its operands by the layout rules, but its result is declared as !coco.tensor<8xf32, local>

// -----

func.func @reduce_scatter_result(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.reduce_scatter sum %a : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] comm.reduce_scatter produces !coco.tensor<8xf32, sliced<0>> from its operands by the layout rules, but its result is declared as !coco.tensor<8xf32>

// -----

func.func @all_gather_keeps_unspanned_axes(%a: !coco.tensor<8xf32, [local, sliced<0>]>) attributes {coco.grid = #coco.grid<[2, 4]>} {
  %0 = comm.all_gather %a over [1] : !coco.tensor<8xf32, [local, sliced<0>]> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] comm.all_gather produces !coco.tensor<8xf32, [local, replicated]> from its operands by the layout rules, but its result is declared as !coco.tensor<8xf32>

// -----

func.func @reduce_result(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.reduce sum %a root 0 : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] comm.reduce produces !coco.tensor<8xf32, local> from its operands by the layout rules, but its result is declared as !coco.tensor<8xf32>

// -----

func.func @send_result(%a: !coco.tensor<8xf32>) {
  %0 = comm.send %a along 0 shift 1 : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [result-type] comm.send produces !coco.tensor<8xf32, local> from its operands by the layout rules, but its result is declared as !coco.tensor<8xf32>

// -----

// empty-slice / layouts-per-axis apply to collectives too (6 over 4 ranks is uneven and
// legal; 3 over 4 would leave a rank nothing)
func.func @empty_reduce_scatter(%a: !coco.tensor<3xf32, local>) attributes {coco.grid = #coco.grid<[4]>} {
  %0 = comm.reduce_scatter sum %a : !coco.tensor<3xf32, local> -> !coco.tensor<3xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [empty-slice] result #0 of comm.reduce_scatter of type !coco.tensor<3xf32, sliced<0>>: dim 0 of size 3 cannot be cut into 4 parts (grid [4]): some rank would hold no element of it

// -----

func.func @collective_layouts_per_axis(%a: !coco.tensor<8xf32, local>) attributes {coco.grid = #coco.grid<[2, 4]>} {
  %0 = comm.all_reduce sum %a : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [layouts-per-axis] operand #0 (%a) of comm.all_reduce has type !coco.tensor<8xf32, local> with 1 layout(s), but the grid [2, 4] has 2 axis(es): write one layout per axis

// -----

// region-results / region-terminator
func.func @yields_too_many(%a: !coco.tensor<8xf32>) {
  %0 = comm.fused elementwise -> !coco.tensor<8xf32> {
    comm.yield %a, %a : !coco.tensor<8xf32>, !coco.tensor<8xf32>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [region-results] comm.fused declares results (!coco.tensor<8xf32>) but yields (!coco.tensor<8xf32>, !coco.tensor<8xf32>)

// -----

func.func @yields_other_type(%a: !coco.tensor<8xf32>) {
  %0 = comm.overlap chunks 2 -> !coco.tensor<8xf32, local> {
    comm.yield %a : !coco.tensor<8xf32>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [region-results] comm.overlap declares results (!coco.tensor<8xf32, local>) but yields (!coco.tensor<8xf32>)

// -----

func.func @yields_nothing(%a: !coco.tensor<8xf32>) {
  %0 = comm.fused elementwise -> !coco.tensor<8xf32> {
    comm.yield
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [region-results] comm.fused declares results (!coco.tensor<8xf32>) but yields ()

// -----

// A foreign terminator is refused as foreign first (program_rules.py runs before the op
// verifiers); test_program_rules.py checks [region-terminator] on the op itself.
func.func @other_terminator(%a: !coco.tensor<8xf32>) {
  comm.fused elementwise {
    "test.termop"() : () -> ()
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [foreign-op] test.termop in @other_terminator is not a coco or comm op

// -----

func.func @no_terminator(%a: !coco.tensor<8xf32>) {
  comm.fused elementwise {
    %0 = coco.neg %a : !coco.tensor<8xf32>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: Operation coco.neg terminates block in single-block region but is not a terminator

// -----

func.func @yield_outside_region(%a: !coco.tensor<8xf32>) {
  comm.yield %a : !coco.tensor<8xf32>
}

// CHECK-LABEL: // {{-----}}
// CHECK: 'comm.yield' expects parent op to be one of 'comm.fused', 'comm.overlap'

// -----

// a fusion kind is a #comm<fusion_kind ...>; fuse-elementwise / fuse-one-collective
func.func @fuse_kind(%a: !coco.tensor<8xf32>) {
  %0 = "comm.fused"() <{kind = "magic"}> ({
    "comm.yield"(%a) : (!coco.tensor<8xf32>) -> ()
  }) : () -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: "magic" should be of base attribute comm.fusion_kind

// -----

func.func @collective_in_elementwise_fusion(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.fused elementwise -> !coco.tensor<8xf32> {
    %1 = comm.all_reduce sum %a : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
    comm.yield %1 : !coco.tensor<8xf32>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-elementwise] an elementwise fusion holds no collective, but this one holds comm.all_reduce

// -----

// One elementwise kernel has no place for a reduction (the lowering used to crash on it).
func.func @reduction_in_elementwise_fusion(%a: !coco.tensor<8xf32>) -> !coco.tensor<f32> {
  %r = comm.fused elementwise -> !coco.tensor<f32> {
    %s = coco.reduce sum %a : !coco.tensor<8xf32> -> !coco.tensor<f32>
    comm.yield %s : !coco.tensor<f32>
  }
  func.return %r : !coco.tensor<f32>
}

// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-elementwise] an elementwise fusion holds elementwise ops, constants, slices and updates, but this one holds coco.reduce

// -----

func.func @matmul_in_elementwise_fusion(%a: !coco.tensor<4x4xf32>) -> !coco.tensor<4x4xf32> {
  %r = comm.fused elementwise -> !coco.tensor<4x4xf32> {
    %m = coco.matmul %a, %a : !coco.tensor<4x4xf32>
    comm.yield %m : !coco.tensor<4x4xf32>
  }
  func.return %r : !coco.tensor<4x4xf32>
}

// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-elementwise] an elementwise fusion holds elementwise ops, constants, slices and updates, but this one holds coco.matmul

// -----

func.func @region_in_elementwise_fusion(%a: !coco.tensor<8xf32>) -> !coco.tensor<8xf32> {
  %r = comm.fused elementwise -> !coco.tensor<8xf32> {
    %i = comm.fused elementwise -> !coco.tensor<8xf32> {
      %n = coco.neg %a : !coco.tensor<8xf32>
      comm.yield %n : !coco.tensor<8xf32>
    }
    comm.yield %i : !coco.tensor<8xf32>
  }
  func.return %r : !coco.tensor<8xf32>
}

// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-elementwise] an elementwise fusion holds elementwise ops, constants, slices and updates, but this one holds comm.fused

// -----

// What coco-fuse puts in an elementwise fusion stays legal.
func.func @elementwise_fusion_members(%a: !coco.tensor<8xf32>, %w: !coco.tensor<8xf32, sliced<0>>) -> !coco.tensor<8xf32> {
  %r = comm.fused elementwise -> !coco.tensor<8xf32> {
    %c = coco.constant 2.0 : !coco.tensor<f32>
    %m = coco.mul %c, %a : !coco.tensor<f32>, !coco.tensor<8xf32> -> !coco.tensor<8xf32>
    %s = coco.slice %m : !coco.tensor<8xf32> -> !coco.tensor<8xf32, sliced<0>>
    coco.update %w, %s : !coco.tensor<8xf32, sliced<0>>
    comm.yield %m : !coco.tensor<8xf32>
  }
  func.return %r : !coco.tensor<8xf32>
}

// CHECK-LABEL: // {{-----}}
// CHECK: func.func @elementwise_fusion_members
// CHECK-NOT: error

// -----

func.func @fused_all_reduce_without_reduce_scatter(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.fused all_reduce -> !coco.tensor<8xf32> {
    %1 = comm.all_reduce sum %a : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
    comm.yield %1 : !coco.tensor<8xf32>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-one-collective] a fused all_reduce holds one reduce_scatter per tensor chain, this one holds 0

// -----

func.func @fused_all_reduce_with_two(%a: !coco.tensor<8xf32, local>) {
  %0, %1 = comm.fused all_reduce -> !coco.tensor<8xf32, sliced<0>>, !coco.tensor<8xf32, sliced<0>> {
    %2 = comm.reduce_scatter sum %a : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32, sliced<0>>
    %3 = comm.reduce_scatter max %a : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32, sliced<0>>
    comm.yield %2, %3 : !coco.tensor<8xf32, sliced<0>>, !coco.tensor<8xf32, sliced<0>>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-one-collective] a fused all_reduce holds one reduce_scatter per tensor chain, and chains that scalars couple; this one holds 2 uncoupled ones

// -----

func.func @fused_all_to_all_with_two(%a: !coco.tensor<8x4xf32, sliced<0>>) {
  %0 = comm.fused all_to_all -> !coco.tensor<8x4xf32, sliced<0>> {
    %1 = comm.all_to_all %a : !coco.tensor<8x4xf32, sliced<0>> -> !coco.tensor<8x4xf32, sliced<1>>
    %2 = comm.all_to_all %1 : !coco.tensor<8x4xf32, sliced<1>> -> !coco.tensor<8x4xf32, sliced<0>>
    comm.yield %2 : !coco.tensor<8x4xf32, sliced<0>>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-one-collective] a fused all_to_all holds exactly one comm.all_to_all and no other collective, this one holds comm.all_to_all, comm.all_to_all

// -----

func.func @fused_all_to_all_with_a_matmul(%a: !coco.tensor<8x4xf32, sliced<0>>, %w: !coco.tensor<4x4xf32>) {
  %0 = comm.fused all_to_all -> !coco.tensor<8x4xf32, sliced<1>> {
    %1 = coco.matmul %a, %w : !coco.tensor<8x4xf32, sliced<0>>, !coco.tensor<4x4xf32> -> !coco.tensor<8x4xf32, sliced<0>>
    %2 = comm.all_to_all %1 : !coco.tensor<8x4xf32, sliced<0>> -> !coco.tensor<8x4xf32, sliced<1>>
    comm.yield %2 : !coco.tensor<8x4xf32, sliced<1>>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-one-collective] a fused all_to_all holds its all_to_all, elementwise ops, constants, slices and updates, but this one holds coco.matmul

// -----

// overlap-chunks
func.func @zero_chunks(%a: !coco.tensor<8xf32>) {
  %0 = comm.overlap chunks 0 -> !coco.tensor<8xf32> {
    comm.yield %a : !coco.tensor<8xf32>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [overlap-chunks] chunk count must be positive, got 0

// -----

func.func @negative_chunks() {
  comm.overlap chunks -2 {
    comm.yield
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [overlap-chunks] chunk count must be positive, got -2

// -----

// overlap-dim: an all_to_all form names a dim the all_to_all can be cut along
func.func @a2a_dim(%a: !coco.tensor<4x4x8xf32, sliced<1>>, %w: !coco.tensor<8x8xf32>) {
  %m = comm.overlap chunks 2 dim 1 -> !coco.tensor<4x4x8xf32, sliced<0>> {
    %x = comm.all_to_all %a : !coco.tensor<4x4x8xf32, sliced<1>> -> !coco.tensor<4x4x8xf32, sliced<0>>
    %m1 = coco.matmul %x, %w : !coco.tensor<4x4x8xf32, sliced<0>>, !coco.tensor<8x8xf32> -> !coco.tensor<4x4x8xf32, sliced<0>>
    comm.yield %m1 : !coco.tensor<4x4x8xf32, sliced<0>>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [overlap-dim] comm.all_to_all of !coco.tensor<4x4x8xf32, sliced<1>> cannot be chunked along dim 1: chunks cut a row dim that no grid axis slices before or after it (not dim 0 of the dispatch form); legal here: none

// -----

func.func @a2a_no_dim(%a: !coco.tensor<4x4x8xf32, sliced<1>>, %w: !coco.tensor<8x8xf32>) {
  %m = comm.overlap chunks 2 -> !coco.tensor<4x4x8xf32, sliced<0>> {
    %x = comm.all_to_all %a : !coco.tensor<4x4x8xf32, sliced<1>> -> !coco.tensor<4x4x8xf32, sliced<0>>
    %m1 = coco.matmul %x, %w : !coco.tensor<4x4x8xf32, sliced<0>>, !coco.tensor<8x8xf32> -> !coco.tensor<4x4x8xf32, sliced<0>>
    comm.yield %m1 : !coco.tensor<4x4x8xf32, sliced<0>>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [overlap-dim] an overlap of an all_to_all names the dim it chunks (`dim d`)

// -----

// ops inside regions are verified too
func.func @nested(%a: !coco.tensor<8xf32, sliced<0>>) {
  %0 = comm.overlap chunks 2 -> !coco.tensor<8xf32> {
    %1 = comm.all_reduce sum %a : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32>
    comm.yield %1 : !coco.tensor<8xf32>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [all-reduce-input] all_reduce of %a : !coco.tensor<8xf32, sliced<0>>, which is sliced<0> on grid axis 0: all_reduce takes local or replicated tensors (all_gather a slice)

// -----

// CHECK-LABEL: // {{-----}}
// CHECK: [send-input] comm.send along grid axis 0 of !coco.tensor<8x4xf32, [sliced<1>, local]>, which is sliced along that axis
func.func @send_of_slice(%x: !coco.tensor<8x4xf32, [sliced<1>, local]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  %y = comm.send %x along 0 shift 1 : !coco.tensor<8x4xf32, [sliced<1>, local]> -> !coco.tensor<8x4xf32, [local, local]>
  func.return
}

// -----

// CHECK-LABEL: // {{-----}}
// CHECK: [mixed-radix-order] comm.all_gather changes the slicing of dim 0 of !coco.tensor<8xf32, [sliced<0>, sliced<0>]> along grid axes [0], but that dim is cut by axes [0, 1]
func.func @gather_outer_axis(%x: !coco.tensor<8xf32, [sliced<0>, sliced<0>]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  %y = comm.all_gather %x over [0] : !coco.tensor<8xf32, [sliced<0>, sliced<0>]> -> !coco.tensor<8xf32, [replicated, sliced<0>]>
  func.return
}

// -----

func.func @overlap_two_producers(%a: !coco.tensor<8x8xf32>, %b: !coco.tensor<8x8xf32>) {
  %o, %o2 = comm.overlap chunks 2 -> !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32> {
    %c = coco.matmul %a, %b : !coco.tensor<8x8xf32>
    %d = coco.matmul %b, %a : !coco.tensor<8x8xf32>
    comm.yield %c, %d : !coco.tensor<8x8xf32>, !coco.tensor<8x8xf32>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [overlap-producer] an overlap region holds one matmul producer, this one holds 2

// -----

func.func @overlap_feeding_computation(%a: !coco.tensor<8x8xf32>, %b: !coco.tensor<8x8xf32>) {
  %o = comm.overlap chunks 2 -> !coco.tensor<8x8xf32> {
    %c = coco.matmul %a, %b : !coco.tensor<8x8xf32>
    %d = coco.add %c, %c : !coco.tensor<8x8xf32>
    comm.yield %d : !coco.tensor<8x8xf32>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [overlap-consumer] the matmul of an overlap region must feed a collective or a fused collective inside it, got coco.add

// -----

// Inside a fused all_reduce only updates and the yield read what an all_gather gathers (the
// fuzzer: a dead mul of it made the lowering fail with a KeyError).
// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-gather-readers] coco.mul reads %a1 : !coco.tensor<96xf32>, the all_gather of a fused all_reduce, inside the region
func.func @reads_the_gathered(%g1: !coco.tensor<96xf32, local>, %w1: !coco.tensor<96xf32>, %lr: !coco.tensor<f32>) attributes {coco.grid = #coco.grid<[?]>} {
  comm.fused all_reduce {
    %rs1 = comm.reduce_scatter sum %g1 : !coco.tensor<96xf32, local> -> !coco.tensor<96xf32, sliced<0>>
    %u1 = coco.mul %lr, %rs1 : !coco.tensor<f32>, !coco.tensor<96xf32, sliced<0>> -> !coco.tensor<96xf32, sliced<0>>
    %a1 = comm.all_gather %u1 : !coco.tensor<96xf32, sliced<0>> -> !coco.tensor<96xf32>
    %d = coco.mul %w1, %a1 : !coco.tensor<96xf32>
    comm.yield
  }
  func.return
}

// -----

// A fused reduction: full reductions, the all_reduces of their partials, elementwise ops.
// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-reduction] a fused reduction holds full reductions, the all_reduces of their partials, elementwise ops, constants and slices, but this one holds coco.matmul
func.func @reduction_holds_matmul(%a: !coco.tensor<8x8xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %t = comm.fused reduction -> !coco.tensor<f32> {
    %m = coco.matmul %a, %a : !coco.tensor<8x8xf32>
    %s = coco.reduce sum %m : !coco.tensor<8x8xf32> -> !coco.tensor<f32>
    comm.yield %s : !coco.tensor<f32>
  }
  func.return
}

// -----

// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-reduction] comm.all_reduce in a fused reduction combines the partial of one of its coco.reduce ops, of the same kind
func.func @reduction_other_kind(%a: !coco.tensor<8xf32, sliced<0>>) attributes {coco.grid = #coco.grid<[?]>} {
  %t = comm.fused reduction -> !coco.tensor<f32> {
    %n = coco.neg %a : !coco.tensor<8xf32, sliced<0>>
    %p = coco.reduce max %n : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<f32, local>
    %s = comm.all_reduce sum %p : !coco.tensor<f32, local> -> !coco.tensor<f32>
    comm.yield %s : !coco.tensor<f32>
  }
  func.return
}

// -----

// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-reduction] coco.mul reads %s : !coco.tensor<f32>, a reduction's total, inside the fused reduction: the kernel finishes its reductions last; read it after the region
func.func @reduction_total_read(%a: !coco.tensor<8xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %t = comm.fused reduction -> !coco.tensor<8xf32> {
    %n = coco.neg %a : !coco.tensor<8xf32>
    %s = coco.reduce sum %n : !coco.tensor<8xf32> -> !coco.tensor<f32>
    %m = coco.mul %a, %s : !coco.tensor<8xf32>, !coco.tensor<f32> -> !coco.tensor<8xf32>
    comm.yield %m : !coco.tensor<8xf32>
  }
  func.return
}

// -----

// A reduction whose total nothing reads: dead code elimination would remove it and leave the
// region without a reduction.
// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-reduction] %dead : !coco.tensor<f32>, a reduction's total, is read by nothing
func.func @reduction_total_unread(%a: !coco.tensor<8xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %t = comm.fused reduction -> !coco.tensor<8xf32> {
    %n = coco.neg %a : !coco.tensor<8xf32>
    %dead = coco.reduce sum %n : !coco.tensor<8xf32> -> !coco.tensor<f32>
    comm.yield %n : !coco.tensor<8xf32>
  }
  func.return
}

// -----

// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-reduction] the reductions of a fused reduction reduce tensors of one shape and layout (one iteration space), got %a : !coco.tensor<8xf32>, %b : !coco.tensor<4xf32>
func.func @reduction_two_spaces(%a: !coco.tensor<8xf32>, %b: !coco.tensor<4xf32>) attributes {coco.grid = #coco.grid<[?]>} {
  %t, %u = comm.fused reduction -> !coco.tensor<f32>, !coco.tensor<f32> {
    %s = coco.reduce sum %a : !coco.tensor<8xf32> -> !coco.tensor<f32>
    %r = coco.reduce sum %b : !coco.tensor<4xf32> -> !coco.tensor<f32>
    comm.yield %s, %r : !coco.tensor<f32>, !coco.tensor<f32>
  }
  func.return
}

// -----

// CHECK-LABEL: // {{-----}}
// CHECK: [fuse-reduction] the reductions of a fused reduction are all all_reduced, or none is
func.func @reduction_some_finished(%a: !coco.tensor<8xf32, sliced<0>>) attributes {coco.grid = #coco.grid<[?]>} {
  %t, %u = comm.fused reduction -> !coco.tensor<f32>, !coco.tensor<f32, local> {
    %p = coco.reduce max %a : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<f32, local>
    %s = comm.all_reduce max %p : !coco.tensor<f32, local> -> !coco.tensor<f32>
    %q = coco.reduce sum %a : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<f32, local>
    comm.yield %s, %q : !coco.tensor<f32>, !coco.tensor<f32, local>
  }
  func.return
}

// -----

// An all_to_all overlap holds the matmul and the all_to_all it pipelines with, nothing more
// (the fuzzer: a round trip after the expert matmul left the lowering without its buffer).
// CHECK-LABEL: // {{-----}}
// CHECK: [overlap-consumer] an overlap region holds the matmul and the all_to_all consuming it, but this one also holds comm.all_to_all, comm.all_to_all: compute it after the region
func.func @overlap_a2a_round_trip(%up: !coco.tensor<4x16x8xf32, sliced<0>>, %w1: !coco.tensor<4x8x8xf32, sliced<0>>) attributes {coco.grid = #coco.grid<[?]>} {
  %o = comm.overlap chunks 2 dim 1 -> !coco.tensor<4x16x8xf32, sliced<2>> {
    %m = coco.matmul %up, %w1 : !coco.tensor<4x16x8xf32, sliced<0>>, !coco.tensor<4x8x8xf32, sliced<0>> -> !coco.tensor<4x16x8xf32, sliced<0>>
    %fwd = comm.all_to_all %m : !coco.tensor<4x16x8xf32, sliced<0>> -> !coco.tensor<4x16x8xf32, sliced<2>>
    %back = comm.all_to_all %fwd : !coco.tensor<4x16x8xf32, sliced<2>> -> !coco.tensor<4x16x8xf32, sliced<0>>
    %again = comm.all_to_all %back : !coco.tensor<4x16x8xf32, sliced<0>> -> !coco.tensor<4x16x8xf32, sliced<2>>
    comm.yield %again : !coco.tensor<4x16x8xf32, sliced<2>>
  }
  func.return
}
