"""CoCoNet's `fuse`: ops grouped into `comm.fused KIND` regions, one kernel (or one fused
collective) each. One pass a mode, `coco-fuse` the pipeline of them all:

    auto.py          coco-fuse: the modes in order (all_reduce, send, all_to_all,
                     elementwise), or the one `mode=` names
    elementwise.py   coco-fuse-elementwise: connected elementwise ops
    all_reduce.py    coco-fuse-all-reduce: a reduce_scatter's chain (`form=one_shot`: an
                     all_reduce as written, one_shot.py)
    send.py          coco-fuse-send: the computation feeding a send, and the send
    all_to_all.py    coco-fuse-all-to-all: an all_to_all and the computation on either side
                     (coco-fuse-all-gather: an all_gather and its computation)
    reduction.py     coco-fuse-reduction: a full reduction, its input's computation and the
                     all_reduce of its partial

and what they share, bottom to top: `spaces` (iteration spaces), `whole_reductions` (full
reductions moved onto a fused all_reduce's slice), `region` (what joins a set, building the
region), `checks` (the rules of a named set), `growing_plan` (the elementwise components'
incremental cycle check), `chain` (a fused all_reduce's chain growth).
"""
