// RUN: COCO_VERIFY

// What comm.all_to_all refuses, one refusal per chunk, each naming its rule.

// all-to-all-type: the shape stays
func.func @shape(%a: !coco.tensor<8x4xf32, sliced<0>>) {
  %0 = comm.all_to_all %a : !coco.tensor<8x4xf32, sliced<0>> -> !coco.tensor<4x8xf32, sliced<1>>
  func.return
}

// CHECK: [all-to-all-type] comm.all_to_all of %a : !coco.tensor<8x4xf32, sliced<0>> to !coco.tensor<4x8xf32, sliced<1>>: an all_to_all keeps the shape and the element type, only the layouts of the grid axes it spans change

// -----

// all-to-all-type: the element type stays
func.func @element_type(%a: !coco.tensor<8x4xf32, sliced<0>>) {
  %0 = comm.all_to_all %a : !coco.tensor<8x4xf32, sliced<0>> -> !coco.tensor<8x4xbf16, sliced<1>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [all-to-all-type] comm.all_to_all of %a : !coco.tensor<8x4xf32, sliced<0>> to !coco.tensor<8x4xbf16, sliced<1>>: an all_to_all keeps the shape and the element type

// -----

// all-to-all-layouts: a != b
func.func @same_dim(%a: !coco.tensor<8x4xf32, sliced<0>>) {
  %0 = comm.all_to_all %a : !coco.tensor<8x4xf32, sliced<0>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [all-to-all-layouts] comm.all_to_all of %a : !coco.tensor<8x4xf32, sliced<0>> to !coco.tensor<8x4xf32, sliced<0>> takes grid axis 0 from sliced<0> to sliced<0>: a spanned axis goes from sliced<a> to sliced<b> with a != b, or from local to local (the dispatch form)

// -----

// all-to-all-layouts: a replicated input
func.func @replicated(%a: !coco.tensor<8x4xf32>) {
  %0 = comm.all_to_all %a : !coco.tensor<8x4xf32> -> !coco.tensor<8x4xf32, sliced<1>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [all-to-all-layouts] comm.all_to_all of %a : !coco.tensor<8x4xf32> to !coco.tensor<8x4xf32, sliced<1>> takes grid axis 0 from replicated to sliced<1>

// -----

// all-to-all-layouts: sliced to local
func.func @sliced_to_local(%a: !coco.tensor<8x4xf32, sliced<0>>) {
  %0 = comm.all_to_all %a : !coco.tensor<8x4xf32, sliced<0>> -> !coco.tensor<8x4xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [all-to-all-layouts] comm.all_to_all of %a : !coco.tensor<8x4xf32, sliced<0>> to !coco.tensor<8x4xf32, local> takes grid axis 0 from sliced<0> to local

// -----

// all-to-all-layouts: an axis it does not span keeps its layout
func.func @unspanned(%a: !coco.tensor<8x4xf32, [sliced<0>, sliced<1>]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  %0 = comm.all_to_all %a over [0] : !coco.tensor<8x4xf32, [sliced<0>, sliced<1>]> -> !coco.tensor<8x4xf32, [sliced<1>, sliced<0>]>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [all-to-all-layouts] comm.all_to_all of %a : !coco.tensor<8x4xf32, [sliced<0>, sliced<1>]> to !coco.tensor<8x4xf32, [sliced<1>, sliced<0>]> changes grid axis 1 (sliced<1> -> sliced<0>), which it does not span

// -----

// all-to-all-layouts: sliced and local spanned axes at once
func.func @mixed(%a: !coco.tensor<8x4xf32, [sliced<0>, local]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  %0 = comm.all_to_all %a : !coco.tensor<8x4xf32, [sliced<0>, local]> -> !coco.tensor<8x4xf32, [sliced<1>, local]>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [all-to-all-layouts] comm.all_to_all of %a : !coco.tensor<8x4xf32, [sliced<0>, local]> to !coco.tensor<8x4xf32, [sliced<1>, local]> mixes sliced and local spanned axes

// -----

// all-to-all-local: dim 0 holds one equal block per member
func.func @blocks(%a: !coco.tensor<6x4xf32, local>) attributes {coco.grid = #coco.grid<[4]>} {
  %0 = comm.all_to_all %a : !coco.tensor<6x4xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [all-to-all-local] comm.all_to_all of %a : !coco.tensor<6x4xf32, local>: dim 0 of size 6 does not cut into 4 equal blocks, one per rank of the group

// -----

// all-to-all-local: a dim 0 another axis slices has no blocks
func.func @sliced_dim0(%a: !coco.tensor<8x4xf32, [sliced<0>, local]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  %0 = comm.all_to_all %a over [1] : !coco.tensor<8x4xf32, [sliced<0>, local]>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [all-to-all-local] comm.all_to_all of the local %a : !coco.tensor<8x4xf32, [sliced<0>, local]>: the dispatch form cuts dim 0 into one block per group member

// -----

// empty-slice: a rank would get no part of the dim it re-cuts
func.func @empty(%a: !coco.tensor<8x3xf32, sliced<0>>) attributes {coco.grid = #coco.grid<[4]>} {
  %0 = comm.all_to_all %a : !coco.tensor<8x3xf32, sliced<0>> -> !coco.tensor<8x3xf32, sliced<1>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [empty-slice] result #0 of comm.all_to_all of type !coco.tensor<8x3xf32, sliced<1>>: dim 1 of size 3 cannot be cut into 4 parts (grid [4]): some rank would hold no element of it

// -----

// mixed-radix-order: of a dim two axes cut, only the inner one can be re-cut
func.func @outer(%a: !coco.tensor<8x8xf32, [sliced<0>, sliced<0>]>) attributes {coco.grid = #coco.grid<[2, 2]>} {
  %0 = comm.all_to_all %a over [0] : !coco.tensor<8x8xf32, [sliced<0>, sliced<0>]> -> !coco.tensor<8x8xf32, [sliced<1>, sliced<0>]>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [mixed-radix-order] comm.all_to_all changes the slicing of dim 0 of !coco.tensor<8x8xf32, [sliced<0>, sliced<0>]> along grid axes [0]

// -----

// collective-axes
func.func @axes(%a: !coco.tensor<8x4xf32, sliced<0>>) {
  %0 = comm.all_to_all %a over [1] : !coco.tensor<8x4xf32, sliced<0>> -> !coco.tensor<8x4xf32, sliced<1>>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [collective-axes] comm.all_to_all spans axes [1], which are not distinct axes of the grid
