"""What a refused schedule raises: `ScheduleError`, carrying the refusing rule and step."""

from __future__ import annotations

import re

from xdsl.ir import Operation

from coconet.core.program import CocoError

VERIFY_RULE = "schedule-verify"  # a pass left IR that does not verify: a pass bug


class ScheduleError(CocoError):
    """An illegal schedule request. `rule` is the refusing pass's rule (`split-allreduce-op`,
    `reorder-local`, ...; `schedule-*` for the API's own checks), `step` the pass spec that was
    refused (None for the API's own checks), `op` the op the pass refused (its `Refusal.op`,
    which coco-opt reports the location of)."""

    def __init__(
        self,
        message: str,
        rule: str | None = None,
        step: str | None = None,
        op: Operation | None = None,
    ):
        super().__init__(message)
        self.rule = rule
        self.step = step
        self.op = op


# a refusal message starts with its rule: `[rule-name] ...`
RULE_PREFIX = re.compile(r"^\[([A-Za-z0-9_.-]+)\]")


def schedule_error(rule: str, message: str) -> ScheduleError:
    return ScheduleError(f"[{rule}] {message}", rule)
