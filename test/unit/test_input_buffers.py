"""`CompiledProgram.input_buffer`: an argument a fused kernel's peers read (a gradient under
`fuse(rs-c-ag)`) lives in symmetric memory, so every call copies the caller's value into it
(the traffic report prints that copy beside its total). A caller that writes into the buffer
itself and passes it saves the copy: the runner counts none (`copies_in`), and the results
are bit for bit those of the copying calls, on the cpu backend and on the strict GPU double."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from compiled_ranks import compiled_on_threads
from cuda_double import on_fake_gpus

import coconet
from coconet.compiled import CompiledProgram
from coconet.core import values as V
from coconet.core.program import CocoError
from coconet.lowering.lower_to_plan import lower
from coconet.runtime import sim
from coconet.runtime.executor import PlanRunner
from coconet.schedule import apply_schedule

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RANKS = 2
STEPS = 3


def _adam():
    program = coconet.load(str(EXAMPLES / "adam.mlir"))
    return program, apply_schedule(program, "fuse(rs-c-ag)")


def _steps(program) -> list[dict[str, np.ndarray]]:
    """Whole inputs of each step: the first step's, then new gradients."""
    first = sim.prepare_inputs(program, None, (RANKS,), seed=0)
    out = [first]
    for s in range(1, STEPS):
        g = sim.prepare_inputs(program, None, (RANKS,), seed=s)["g"]
        out.append({**first, "g": g})
    return out


def _on_threads(body) -> list[Any]:
    _, scheduled = _adam()
    plan = lower(scheduled, RANKS)
    return compiled_on_threads(scheduled, plan, lambda r, c: body(r, c, plan), pieces=True)


def test_a_gradient_written_into_the_symmetric_buffer_is_not_copied():
    program, _ = _adam()
    steps = _steps(program)

    def body(rank: int, compiled: CompiledProgram, plan) -> tuple:
        assert plan.arguments["g"].symmetric  # the peers read it
        coords = V.coords_of(rank, plan.grid_shape)

        def pieces(inputs):
            return {
                n: np.array(V.piece_of(inputs[n], b.type, coords, plan.grid_shape))
                for n, b in plan.arguments.items()
            }

        runs = []
        for written in (False, True):
            state = pieces(steps[0])  # the same start for both runs
            before = compiled.runner.copies_in["g"]
            got = []
            for inputs in steps:
                args = dict(state)
                g = pieces(inputs)["g"]
                if written:
                    buffer = compiled.input_buffer("g")
                    buffer[...] = g  # what a backward pass writing its gradient there does
                    args["g"] = buffer
                else:
                    args["g"] = g
                compiled(**args)
                got.append({n: state[n].copy() for n in ("w", "m", "v")})
            runs.append((got, compiled.runner.copies_in["g"] - before))
        return runs

    for (copied, n_copied), (written, n_written) in _on_threads(body):
        assert n_copied == STEPS  # one copy of g a call
        assert n_written == 0
        for a, b in zip(copied, written, strict=True):
            for name in a:
                np.testing.assert_array_equal(a[name].view(np.uint8), b[name].view(np.uint8))


def test_input_buffer_refusals():
    def body(rank: int, compiled: CompiledProgram, plan) -> None:
        with pytest.raises(CocoError, match="has no argument 'x'"):
            compiled.input_buffer("x")

    _on_threads(body)


def test_the_gpu_double_skips_the_copy_of_its_own_buffer():
    """The cuda backend's `holds`: the device array `array('g')` returned, filled on the
    compute stream and passed back, is not copied; a host array is."""
    program, scheduled = _adam()
    plan = lower(scheduled, RANKS)
    inputs = _steps(program)[0]

    def body(r: int, runner: PlanRunner, backend) -> tuple[int, int]:
        coords = V.coords_of(r, plan.grid_shape)
        pieces = {
            n: np.array(V.piece_of(inputs[n], b.type, coords, plan.grid_shape))
            for n, b in plan.arguments.items()
        }
        runner.set_inputs(pieces)
        copied = runner.copies_in["g"]
        own = backend.array("g")
        backend.device.copy_from_host(own, pieces["g"], backend._compute())
        runner.set_inputs({**pieces, "g": own}, fresh=["g"])
        runner.run()
        return copied, runner.copies_in["g"] - copied

    for copied, again in on_fake_gpus(plan, RANKS, body):
        assert copied == 1  # a host array: copied into the symmetric buffer
        assert again == 0  # the buffer itself
