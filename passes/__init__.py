"""coconet's passes, one file each, named after the pass (`split_allreduce.py` is
`coco-split-allreduce`; the fusion passes, one a mode, are the `fuse/` package).
`get_all_passes` is their registry; the schedule API adds `coco-schedule` to it
(coconet.schedule.get_all_passes, what coco-opt registers)."""

from collections.abc import Callable

from xdsl.passes import ModulePass


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    def split_allreduce() -> type[ModulePass]:
        from coconet.passes.split_allreduce import SplitAllReducePass

        return SplitAllReducePass

    def reorder() -> type[ModulePass]:
        from coconet.passes.reorder import ReorderPass

        return ReorderPass

    def as_slice() -> type[ModulePass]:
        from coconet.passes.as_slice import AsSlicePass

        return AsSlicePass

    def dce() -> type[ModulePass]:
        from coconet.passes.dce import DeadCodeEliminationPass

        return DeadCodeEliminationPass

    def fuse() -> type[ModulePass]:
        from coconet.passes.fuse.auto import FusePass

        return FusePass

    def fuse_elementwise() -> type[ModulePass]:
        from coconet.passes.fuse.elementwise import FuseElementwisePass

        return FuseElementwisePass

    def fuse_all_reduce() -> type[ModulePass]:
        from coconet.passes.fuse.all_reduce import FuseAllReducePass

        return FuseAllReducePass

    def fuse_send() -> type[ModulePass]:
        from coconet.passes.fuse.send import FuseSendPass

        return FuseSendPass

    def fuse_all_to_all() -> type[ModulePass]:
        from coconet.passes.fuse.all_to_all import FuseAllToAllPass

        return FuseAllToAllPass

    def fuse_all_gather() -> type[ModulePass]:
        from coconet.passes.fuse.all_to_all import FuseAllGatherPass

        return FuseAllGatherPass

    def fuse_reduction() -> type[ModulePass]:
        from coconet.passes.fuse.reduction import FuseReductionPass

        return FuseReductionPass

    def overlap() -> type[ModulePass]:
        from coconet.passes.overlap import OverlapPass

        return OverlapPass

    def sliced_send() -> type[ModulePass]:
        from coconet.passes.sliced_send import SlicedSendPass

        return SlicedSendPass

    def canonicalize() -> type[ModulePass]:
        from coconet.passes.canonicalize import CanonicalizePass

        return CanonicalizePass

    return {
        "coco-split-allreduce": split_allreduce,
        "coco-reorder": reorder,
        "coco-as-slice": as_slice,
        "coco-dce": dce,
        "coco-fuse": fuse,
        "coco-fuse-elementwise": fuse_elementwise,
        "coco-fuse-all-reduce": fuse_all_reduce,
        "coco-fuse-send": fuse_send,
        "coco-fuse-all-to-all": fuse_all_to_all,
        "coco-fuse-all-gather": fuse_all_gather,
        "coco-fuse-reduction": fuse_reduction,
        "coco-overlap": overlap,
        "coco-sliced-send": sliced_send,
        "coco-canonicalize": canonicalize,
    }
