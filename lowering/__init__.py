"""Lowering of scheduled coco/comm programs to execution plans and one CUDA translation unit
(written against the device layer, toolchain/coco_device.h). The runtime reads only the plan
(`plan.py`) and its kernels' signatures (`signature.py`); the compilers for the text live in
coconet.toolchain. `get_all_passes`: the lowering's decisions, which coco-opt registers beside
coconet's schedule passes; `get_all_targets`: its `-t` targets."""

from collections.abc import Callable

from xdsl.passes import ModulePass
from xdsl.utils.target import Target


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """The lowering's decisions as passes (decisions.py): what `lower()` runs first, and
    coco-opt's `-p` prints."""

    def choose_topology() -> type[ModulePass]:
        from coconet.lowering.decisions import ChooseTopologyPass

        return ChooseTopologyPass

    def defer() -> type[ModulePass]:
        from coconet.lowering.decisions import DeferPass

        return DeferPass

    def segment() -> type[ModulePass]:
        from coconet.lowering.segments import SegmentPass

        return SegmentPass

    def table_form() -> type[ModulePass]:
        from coconet.lowering.decisions import TableFormPass

        return TableFormPass

    return {
        "coco-choose-topology": choose_topology,
        "coco-defer": defer,
        "coco-segment": segment,
        "coco-table-form": table_form,
    }


def get_all_targets() -> dict[str, Callable[[], type[Target]]]:
    def get_cuda() -> type[Target]:
        from coconet.lowering.targets import CudaTarget

        return CudaTarget

    def get_plan() -> type[Target]:
        from coconet.lowering.targets import PlanTarget

        return PlanTarget

    def get_sass_report() -> type[Target]:
        from coconet.lowering.targets import SassReportTarget

        return SassReportTarget

    def get_traffic() -> type[Target]:
        from coconet.lowering.targets import TrafficTarget

        return TrafficTarget

    return {
        "cuda": get_cuda,
        "plan": get_plan,
        "sass-report": get_sass_report,
        "traffic": get_traffic,
    }
