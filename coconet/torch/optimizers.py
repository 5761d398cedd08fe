"""SGD, Adam, AdamW and LAMB: torch.optim's options and state layout over a
`CoconetOptimizer`'s program."""

from __future__ import annotations

import math
from typing import Any

from coconet.core.program import CocoError
from coconet.torch.optimizer import CoconetOptimizer


def _own_keywords(kw: dict[str, Any]) -> dict[str, Any]:
    """coconet's own keywords (schedule, backend, max_grad_norm, step_timeout, overlap,
    bucket_cap_mb) out of `kw`;
    anything else is a TypeError, as torch.optim's constructors raise it. (torch.optim's
    `foreach`, `fused`, `capturable` and `differentiable`, which change how torch runs a step,
    not what it computes, are named parameters of each constructor: kept in the groups as
    torch keeps them, and ignored -- the step is already one fused program on the parameters'
    device, outside autograd.)"""
    own = {
        k: kw.pop(k)
        for k in (
            "schedule",
            "backend",
            "max_grad_norm",
            "step_timeout",
            "overlap",
            "bucket_cap_mb",
        )
        if k in kw
    }
    if kw:
        raise TypeError(f"unexpected keyword argument {next(iter(kw))!r}")
    return own


class SGD(CoconetOptimizer):
    """torch.optim.SGD with momentum (also Nesterov's), L2 weight decay and `maximize`; no
    dampening."""

    algorithm = "sgd"
    state_names = ("buf",)
    option_scalars = ("lr", "momentum", "wd")

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        momentum: float = 0.9,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
        **kw: Any,
    ):
        own = _own_keywords(kw)
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "maximize": maximize,
            "foreach": foreach,
            "differentiable": differentiable,
            "fused": fused,
        }
        super().__init__(params, defaults, **own)

    def _check_group(self, group: dict[str, Any]) -> None:
        if group.get("dampening", 0):
            raise CocoError(
                f"dampening={group['dampening']}: coconet's SGD has no dampening (torch's first "
                "step ignores it, which needs per-parameter state coconet does not keep)"
            )
        if group.get("nesterov") and float(group["momentum"]) <= 0:
            raise CocoError("nesterov=True needs momentum > 0 (as torch.optim.SGD does)")

    def group_key(self, group):
        return (bool(group.get("maximize")), bool(group.get("nesterov")))

    def group_scalars(self, group):
        return {
            "lr": float(group["lr"]),
            "momentum": float(group["momentum"]),
            "wd": float(group["weight_decay"]),
        }

    def _has_state(self, slot, group):
        # torch.optim.SGD keeps a momentum buffer only with momentum
        return super()._has_state(slot, group) and float(group["momentum"]) != 0

    def rule(self, i, g, w, state, opts, key, store):
        maximize, nesterov = key
        if maximize:
            g = (-g).named(f"gneg{i}")
        d = (g + opts["wd"] * w).named(f"d{i}")
        buf = (opts["momentum"] * state["buf"] + d).named(f"buf_new{i}")
        buf = store("buf", buf)
        direction = (d + opts["momentum"] * buf).named(f"nesterov{i}") if nesterov else buf
        return (w - opts["lr"] * direction).named(f"w_new{i}")


class Adam(CoconetOptimizer):
    """torch.optim.Adam (bias-corrected, L2 weight decay added to the gradient, or decoupled
    with `decoupled_weight_decay=True`; `maximize`); no amsgrad."""

    algorithm = "adam"
    state_names = ("m", "v")
    option_scalars = ("omb1", "beta2", "omb2", "eps", "wd", "decay")
    bias_corrected = True
    decoupled = False

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool | None = None,
        **kw: Any,
    ):
        own = _own_keywords(kw)
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "maximize": maximize,
            "foreach": foreach,
            "capturable": capturable,
            "differentiable": differentiable,
            "fused": fused,
            "decoupled_weight_decay": (
                self.decoupled if decoupled_weight_decay is None else decoupled_weight_decay
            ),
        }
        super().__init__(params, defaults, **own)

    def group_key(self, group):
        return (bool(group.get("maximize")), bool(group.get("decoupled_weight_decay")))

    def group_scalars(self, group):
        beta1, beta2 = (float(b) for b in group["betas"])
        lr, wd = float(group["lr"]), float(group["weight_decay"])
        # f64 on the host, rounded once, as torch computes them in Python
        return {
            "omb1": 1 - beta1,
            "beta2": beta2,
            "omb2": 1 - beta2,
            "eps": float(group["eps"]),
            "wd": wd,
            "decay": 1 - lr * wd,
        }

    def _bias_corrections(self, k, steps):
        # torch's step size lr / (1 - beta1^t) and sqrt(1 - beta2^t)
        bc1, bc2 = super()._bias_corrections(k, steps)
        return float(self.param_groups[k]["lr"]) / bc1, math.sqrt(bc2)

    def rule(self, i, g, w, state, opts, key, store):
        from coconet.frontend import Sqrt

        # torch.optim.Adam's single-tensor step, op for op (its order of rounding)
        maximize, decoupled = key
        if maximize:
            g = (-g).named(f"gneg{i}")
        if decoupled:
            w = (w * opts["decay"]).named(f"wdecay{i}")
        else:
            g = (g + opts["wd"] * w).named(f"gwd{i}")
        m = (state["m"] + opts["omb1"] * (g - state["m"])).named(f"m_new{i}")  # lerp
        v = (opts["beta2"] * state["v"] + opts["omb2"] * g * g).named(f"v_new{i}")
        m = store("m", m)
        v = store("v", v)
        denom = (Sqrt(v) / opts["bc2"] + opts["eps"]).named(f"denom{i}")
        return (w - opts["bc1"] * m / denom).named(f"w_new{i}")


class AdamW(Adam):
    """torch.optim.AdamW (decoupled weight decay)."""

    algorithm = "adamw"
    decoupled = True

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        **kw: Any,
    ):
        super().__init__(
            params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, **kw
        )


class LAMB(CoconetOptimizer):
    """LAMB (You et al. 2020): Adam's direction plus decoupled weight decay, scaled per
    parameter tensor by the trust ratio ||w|| / ||r|| (1 where either norm is 0). One program
    over every parameter tensor at once -- CoCoNet's scattered tensors: each tensor keeps its own
    norm, and sits in its own segment of the flat buffers, padded to divide among the ranks."""

    algorithm = "lamb"
    state_names = ("m", "v")
    option_scalars = ("lr", "beta1", "beta2", "eps", "wd")
    bias_corrected = True
    per_tensor = True

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        **kw: Any,
    ):
        own = _own_keywords(kw)
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "foreach": foreach,
            "capturable": capturable,
            "differentiable": differentiable,
            "fused": fused,
        }
        super().__init__(params, defaults, **own)

    def group_scalars(self, group):
        beta1, beta2 = group["betas"]
        return {
            "lr": float(group["lr"]),
            "beta1": float(beta1),
            "beta2": float(beta2),
            "eps": float(group["eps"]),
            "wd": float(group["weight_decay"]),
        }

    def rule(self, i, g, w, state, opts, key, store):
        from coconet.frontend import Ite, Norm, Sqrt

        beta1, beta2 = opts["beta1"], opts["beta2"]
        m = (beta1 * state["m"] + (1 - beta1) * g).named(f"m_new{i}")
        v = (beta2 * state["v"] + (1 - beta2) * g * g).named(f"v_new{i}")
        m = store("m", m)
        v = store("v", v)
        r = ((m / opts["bc1"]) / (Sqrt(v / opts["bc2"]) + opts["eps"]) + opts["wd"] * w).named(
            f"r{i}"
        )
        w_norm, r_norm = Norm(w).named(f"w_norm{i}"), Norm(r).named(f"r_norm{i}")
        trust = Ite(w_norm > 0, Ite(r_norm > 0, w_norm / r_norm, 1.0), 1.0).named(f"trust{i}")
        return (w - opts["lr"] * trust * r).named(f"w_new{i}")
