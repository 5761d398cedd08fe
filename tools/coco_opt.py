"""`coco-opt`: xDSL's optimizer driver with the coco/comm dialects, coconet's passes and its
targets registered. Errors end in one message and exit 1, never a Python traceback."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import IO

from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import DiagnosticException, ParseError
from xdsl.xdsl_opt_main import xDSLOptMain

from coconet.dialects import get_all_dialects
from coconet.passes import get_all_passes


class CocoOptMain(xDSLOptMain):
    version_format = "coco-opt built on xdsl {xdsl_version}"

    def __init__(self, args: Sequence[str] | None = None):
        super().__init__(description="coconet modular optimizer driver", args=args)

    def register_all_dialects(self) -> None:
        super().register_all_dialects()
        registered = set(self.ctx.registered_dialect_names)
        for name, factory in get_all_dialects().items():
            if name not in registered:
                self.ctx.register_dialect(name, factory)

    def register_all_passes(self) -> None:
        super().register_all_passes()
        for name, factory in get_all_passes().items():
            self.register_pass(name, factory)

    def register_all_targets(self) -> None:
        super().register_all_targets()
        try:
            from coconet.lowering import get_all_targets
        except ImportError:
            return
        self.available_targets.update(get_all_targets())

    def parse_chunk(self, chunk: IO[bytes], file_extension: str, start_offset: int = 0) -> ModuleOp | None:
        module = super().parse_chunk(chunk, file_extension, start_offset)
        # Verify what the user wrote before any pass sees it, so a layout violation is
        # reported against their program (with no passes, xDSL would not verify at all).
        if module is not None and not self.args.disable_verify:
            module.verify()
        return module


def main(argv: Sequence[str] | None = None) -> None:
    warnings.filterwarnings("default", category=DeprecationWarning)
    from coconet.program import CocoError

    try:
        CocoOptMain(argv).run()
    except (ParseError, DiagnosticException, CocoError) as e:
        print(f"coco-opt: error: {e}", file=sys.stderr)
        sys.exit(1)
    except (ValueError, KeyError, FileNotFoundError, IsADirectoryError) as e:
        # xDSL reports unknown passes, bad pass options and bad files this way.
        msg = e.args[0] if e.args else str(e)
        print(f"coco-opt: error: {msg}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
