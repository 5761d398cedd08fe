// RUN: not coco-opt %s -p coco-schedule -t 'plan{ranks=3}' 2>&1 | filecheck %s
// RUN: coco-opt %s -p coco-schedule -t 'plan{ranks=4}' | filecheck %s --check-prefix=EVEN

// ol(mm,fuse(rs-c-ag)) splitting the columns: at 3 ranks the pieces are 4x3, 4x3 and 4x2, so a
// chunk of rows is another element range on each, and the fused kernel pulls a peer's chunk
// at its own range: refused with the rule before launch, as the enumerator refuses it (it used
// to run past the smaller piece). At 4 ranks the pieces are even and the chunks run.

builtin.module attributes {coco.schedule = "ol(mm,fuse(rs-c-ag))"} {
  func.func @mlp(%x: !coco.tensor<4x8xf32, sliced<1>>, %wt: !coco.tensor<8x8xf32, sliced<0>>, %b: !coco.tensor<8xf32>, %w0: !coco.tensor<4x8xf32>) attributes {coco.grid = #coco.grid<[?]>} {
    %h = coco.matmul %x, %wt : !coco.tensor<4x8xf32, sliced<1>>, !coco.tensor<8x8xf32, sliced<0>> -> !coco.tensor<4x8xf32, local>
    %s = comm.all_reduce sum %h : !coco.tensor<4x8xf32, local> -> !coco.tensor<4x8xf32>
    %y = coco.add %s, %b : !coco.tensor<4x8xf32>, !coco.tensor<8xf32> -> !coco.tensor<4x8xf32>
    coco.update %w0, %y : !coco.tensor<4x8xf32>
    func.return
  }
}

// CHECK: coco-opt: error: @mlp cannot run on 3 rank(s): [overlap-layout] the pieces of the overlapped value !coco.tensor<4x8xf32, sliced<1>> differ in size on a grid of [3] ranks (dim 1 of 8 in 3 parts): overlap chunks pieces of one size
// EVEN-LABEL: plan @mlp on grid [4]
// EVEN:         matmul %x, %wt -> %h rows [0, 1)
// EVEN:         [stream 1] launch k_fused_all_reduce<<<
