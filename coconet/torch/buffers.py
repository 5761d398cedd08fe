"""The optimizers' flat buffers: how parameters of one group and dtype become one padded
segment the program updates in place, and how a buffer is handed to it without a copy."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import torch

from coconet.core.program import CocoError

# Flat buffers are padded to a multiple of ranks x this many elements (16-byte vectors).
ALIGN = 4


def _padded(n: int, unit: int) -> int:
    """n rounded up to a multiple of unit (at least one unit)."""
    return max(unit, -(-n // unit) * unit)


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a contiguous CPU tensor (bf16 as ml_dtypes.bfloat16): same memory."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _handed_over(t: torch.Tensor) -> Any:
    """A buffer as the program takes it, without a copy: a NumPy view of a CPU tensor (the
    cpu backend), the tensor itself on a GPU (the cuda backend adopts it through DLPack,
    ordered after the work PyTorch has queued on its current stream)."""
    return t if t.device.type == "cuda" else _numpy(t)


BACKEND_OF_DEVICE = {"cpu": "cpu", "cuda": "cuda"}


def parameters_device(params: Iterable[torch.Tensor], backend: str | None) -> torch.device:
    """The one device every parameter lives on, checked against `backend` (None: the backend of
    that device). Refused: parameters on several devices, a device no backend runs on (meta,
    mps, ...), and a backend that is not the parameters' own."""
    devices = sorted({str(p.device) for p in params})
    if not devices:
        raise CocoError("the optimizer got no parameters")
    if len(devices) > 1:
        raise CocoError(
            f"parameters on {', '.join(devices)}: a coconet optimizer updates parameters that "
            "live on one device (one optimizer per device)"
        )
    device = torch.device(devices[0])
    own = BACKEND_OF_DEVICE.get(device.type)
    if own is None:
        raise CocoError(
            f"parameters on {device}: coconet runs on CPU tensors (cpu backend) and CUDA "
            "tensors (cuda backend)"
        )
    if backend is not None and backend != own:
        raise CocoError(
            f"backend {backend!r} for parameters on {device}: the {own} backend is the one that "
            f"updates {device.type.upper()} tensors in place (leave backend= unset)"
        )
    return device


@dataclass
class _Segment:
    """Trainable parameters of one param group and dtype (LAMB: one parameter), flattened into
    one buffer padded to divide among the ranks; a program argument of its own."""

    group: int
    dtype: torch.dtype
    params: list[torch.nn.Parameter]
    slots: list[int]  # each parameter's position in the optimizer's trainable parameters
    offsets: list[int]
    numel: int  # padded
    flat_param: torch.Tensor
    flat_grad: torch.Tensor
    state: dict[str, torch.Tensor] = field(default_factory=dict)  # m, v or buf: pieces
    # masked steps: a keep mask and per-element bias corrections over the whole segment
    masks: dict[str, torch.Tensor] = field(default_factory=dict)
    # overlap with clipping: the gradients summed over the ranks (replicated), which backward's
    # bucket programs write and step()'s program reads
    reduced: torch.Tensor | None = None
    # whether flat_grad is a view of the common step's symmetric gradient buffer
    adopted: bool = False
    # whether flat_param is a view of the common step's symmetric parameter buffer
    params_adopted: bool = False


class _Marks:
    """Which trainable parameters backward accumulated a gradient into since the last
    `zero_grad()`: set by each parameter's post-accumulate-grad hook (which holds this object,
    not the optimizer)."""

    def __init__(self) -> None:
        self.marked = bytearray()

    def hook(self, slot: int) -> Callable[[torch.Tensor], None]:
        def mark(_p: torch.Tensor) -> None:
            self.marked[slot] = 1

        return mark
