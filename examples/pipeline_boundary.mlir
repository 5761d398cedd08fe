// A pipeline-stage boundary of a tensor-parallel transformer (CoCoNet reference
// secs. 4.5 and 8: GPT-3 175B across nodes; scaled down to B=2, S=16, H=64). Built also by
// pipeline_boundary.py.
// Grid [2, ?]: 2 stages x the tensor-parallel group of each; every tensor is local on the stage
// axis. In a stage: matmul of sliced operands, all_reduce over axis 1, bias, dropout, residual;
// then each rank sends the stage's output to the same rank of the next stage (CoCoNet's
// Send(out, GroupRank(GROUP + 1, RANK))) and returns what it received (stage 0: zeros).
// Schedules: AR_P2P_C (as written); RS_P2P_C_AG (split the all_reduce, reorder computation
// onto slices, sliced send: each rank sends only its slice, the next stage all_gathers it);
// ol_RS_fuse_P2P_C_AG (fuse the computation into the send; overlap RS, send and AG).

func.func @pipeline_boundary(
    %x: !coco.tensor<2x16x64xf16, [local, sliced<2>]>,
    %w: !coco.tensor<64x64xf16, [local, sliced<0>]>,
    %b: !coco.tensor<64xf16, [local, replicated]>,
    %r: !coco.tensor<2x16x64xf16, [local, replicated]>
) -> !coco.tensor<2x16x64xf16, [local, replicated]> attributes {coco.grid = #coco.grid<[2, ?]>} {
  %layer = coco.matmul %x, %w : !coco.tensor<2x16x64xf16, [local, sliced<2>]>, !coco.tensor<64x64xf16, [local, sliced<0>]> -> !coco.tensor<2x16x64xf16, [local, local]>
  %total = comm.all_reduce sum %layer over [1] : !coco.tensor<2x16x64xf16, [local, local]> -> !coco.tensor<2x16x64xf16, [local, replicated]>
  %biased = coco.add %total, %b : !coco.tensor<2x16x64xf16, [local, replicated]>, !coco.tensor<64xf16, [local, replicated]> -> !coco.tensor<2x16x64xf16, [local, replicated]>
  %dropped = coco.dropout %biased, 0.1 seed 3 : !coco.tensor<2x16x64xf16, [local, replicated]>
  %out = coco.add %dropped, %r : !coco.tensor<2x16x64xf16, [local, replicated]>
  %recv = comm.send %out along 0 shift 1 : !coco.tensor<2x16x64xf16, [local, replicated]>
  func.return %recv : !coco.tensor<2x16x64xf16, [local, replicated]>
}
