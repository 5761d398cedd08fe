"""coco-opt's `main` run in this process: what a test of its error contract needs from a run
(exit status, stdout, stderr, whether a traceback escaped), without starting an interpreter
and importing xDSL once per case (CI time, issue #27.4). The lit files beside this one still
start the real `coco-opt` for a few cases, so the entry point itself stays covered."""

from __future__ import annotations

import contextlib
import io
import traceback
from dataclasses import dataclass


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str

    @property
    def traceback(self) -> bool:
        return "Traceback" in self.stderr or "Traceback" in self.stdout

    def contract(self, rule: str | None = None) -> str:
        """The contract of an error, as one line: exit status 1, one `coco-opt: error:` line
        and first on stderr (starting with `[rule] ` when given), nothing on stdout, no
        traceback."""
        lines = self.stderr.splitlines()
        first = lines[0] if lines else ""
        head = "coco-opt: error: " + (f"[{rule}] " if rule else "")
        error_lines = sum(line.startswith("coco-opt: error:") for line in lines)
        return (
            f"rc={self.rc} error-lines={error_lines} "
            f"{'rule' if rule else 'first-is-error'}={first.startswith(head)} "
            f"stdout-empty={not self.stdout.strip()} traceback={self.traceback}"
        )


def run_coco_opt(args: list[str]) -> Run:
    """`coco-opt ARGS`: its exit status (SystemExit's code; 1 with the traceback on stderr for
    any other exception, as the interpreter would) and what it printed."""
    from coconet.tools.coco_opt import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            rc = 1
    return Run(rc, out.getvalue(), err.getvalue())
