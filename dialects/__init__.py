"""The coco (distributed tensors, computation) and comm (collectives, schedule regions)
dialects. Factories are lazy, as xDSL's registries expect."""

from collections.abc import Callable

from xdsl.ir import Dialect

from coconet.dialects import xdsl_lexer

xdsl_lexer.install()


def get_all_dialects() -> dict[str, Callable[[], Dialect]]:
    def get_coco() -> Dialect:
        from coconet.dialects.coco import Coco

        return Coco

    def get_comm() -> Dialect:
        from coconet.dialects.comm import Comm

        return Comm

    return {"coco": get_coco, "comm": get_comm}
