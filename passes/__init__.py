"""coconet's passes, one file each, named after the pass (`split_allreduce.py` is
`coco-split-allreduce`). `get_all_passes` is the registry coco-opt and the schedule API use."""

from collections.abc import Callable

from xdsl.passes import ModulePass


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    passes: dict[str, Callable[[], type[ModulePass]]] = {}
    return passes
