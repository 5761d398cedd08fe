"""Lowering of scheduled coco/comm programs to execution plans and one CUDA translation unit
(written against the device layer, toolchain/coco_device.h). The runtime reads only the plan
(`plan.py`) and its kernels' signatures (`signature.py`); the compilers for the text live in
coconet.toolchain."""

from collections.abc import Callable

from xdsl.utils.target import Target


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

    return {"cuda": get_cuda, "plan": get_plan, "sass-report": get_sass_report}
