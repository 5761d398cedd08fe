"""Where coconet's optimizers meet torch's own tools: a DDP communication hook that leaves
the gradients local, and a warning when `torch.nn.utils.clip_grad_norm_` clips the local
gradients of a coconet optimizer's parameters."""

from __future__ import annotations

import functools
import weakref
from typing import Any, Protocol

import torch


def local_gradients_hook(state, bucket):
    """A DDP communication hook that leaves each rank's gradients local: the coconet
    optimizer's program reduces them (ddp.register_comm_hook(None, local_gradients_hook)).
    Unannotated on purpose: DDP refuses a `bucket` annotation other than the real
    dist.GradBucket, and this module's annotations are strings."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


# -- torch.nn.utils.clip_grad_norm_ on a coconet optimizer's parameters --------------------------


# The live coconet optimizers, for the clip_grad_norm_ wrapper to recognize their parameters.
class _Owner(Protocol):
    """A coconet optimizer, as the wrapper sees it."""

    def _warn_local_clipping(self, ids: set[int]) -> None: ...


_OWNERS: weakref.WeakSet[_Owner] = weakref.WeakSet()


def _install_clip_warning() -> None:
    """Wraps `torch.nn.utils.clip_grad_norm_` (once per process) so that, called on parameters
    a coconet optimizer on several ranks owns, it warns once that it clips LOCAL gradients.
    The wrapper calls the function it replaced with the same arguments and returns its result;
    `_uninstall_clip_warning` puts that function back (if nobody wrapped it again since)."""
    current = torch.nn.utils.clip_grad_norm_
    if getattr(current, "_coconet_wrapper", False):
        return
    original = current

    @functools.wraps(original)
    def clip_grad_norm_(parameters: Any, *args: Any, **kwargs: Any) -> Any:
        if _OWNERS:
            if isinstance(parameters, torch.Tensor):
                parameters = [parameters]
            else:
                parameters = list(parameters)
            ids = {id(p) for p in parameters}
            for owner in list(_OWNERS):
                owner._warn_local_clipping(ids)
        return original(parameters, *args, **kwargs)

    clip_grad_norm_._coconet_wrapper = True  # type: ignore[attr-defined]
    torch.nn.utils.clip_grad_norm_ = clip_grad_norm_


def _uninstall_clip_warning() -> None:
    current = torch.nn.utils.clip_grad_norm_
    if getattr(current, "_coconet_wrapper", False):
        torch.nn.utils.clip_grad_norm_ = current.__wrapped__  # type: ignore[attr-defined]
