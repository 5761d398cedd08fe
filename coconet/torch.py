"""coconet in a PyTorch training loop: data-parallel optimizers whose `step()` is one compiled
coconet program -- the all-reduce of the gradients and the update, scheduled as CoCoNet does
(`ar-c`; `rs-c-ag`, ZeRO-1 style with the optimizer state sliced across ranks; or
`fuse(rs-c-ag)`, reduce-scatter + update + all-gather as one fused collective kernel; or
`auto`: the one of these, or the program as written, that the cost model ranks fastest on
this host for the job's ranks, coconet/autotune.py).

    model = Transformer(...)                                 # the same init on every rank
    opt = coconet.torch.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1,
                              schedule="fuse(rs-c-ag)")
    for x, y in loader:                                      # this rank's shard of the batch
        loss = loss_fn(model(x), y)
        loss.backward()                                      # local gradients: no DDP needed
        opt.step()                                           # reduce + update, one program
        opt.zero_grad()

Run it under torchrun (or mpiexec): the optimizer is collective, as `coconet.compile` is.

Where it runs. CPU parameters run on the cpu backend (the generated kernels on the host);
CUDA parameters on the cuda backend (the same kernels through NVRTC, NCCL for library
collectives), each rank on the GPU its parameters live on: the flat buffers are allocated there
and handed to the program through DLPack, so the update happens in the parameters' own memory.
`backend=` may name the backend, but it must be the one where the parameters are.

Where the tensors live. At construction the parameters of each dtype are moved, once, into
one flat buffer (padded so it divides among the ranks), and every `nn.Parameter` becomes a view
of it (`p.data`); their gradients are views of a second flat buffer. The program reads and
writes those buffers in place -- no copy of the user's tensors per step. Code that replaces
`p.grad` (e.g. `zero_grad(set_to_none=True)` from another object) still works: `step()` copies
such gradients into the buffer first. Gradients are averaged over the ranks, as DDP does.

With DDP: let coconet do the reduction -- register `local_gradients_hook` as DDP's
communication hook (DDP then only buckets, no all-reduce), or use `no_sync()`. Build the
optimizer before wrapping the model in DDP (DDP keeps references to the parameters' storage).

Algorithms: SGD with momentum (torch.optim.SGD), Adam with L2 weight decay (torch.optim.Adam),
AdamW with decoupled weight decay (torch.optim.AdamW), and LAMB (a trust ratio per parameter
tensor: one program over every tensor, each in its own padded segment), in f32 state over f32
or bf16 parameters. `state_dict()` gathers the sliced state into full per-parameter tensors in
torch.optim's layout (`exp_avg`, `exp_avg_sq`, `momentum_buffer`, `step`), and
`load_state_dict()` scatters it back, so checkpoints move between schedules and rank counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist

from coconet.core.program import CocoError

__all__ = ["LAMB", "SGD", "Adam", "AdamW", "CoconetOptimizer", "local_gradients_hook"]

SCHEDULES = ("ar-c", "rs-c-ag", "fuse(rs-c-ag)")

# Flat buffers are padded to a multiple of ranks x this many elements (16-byte vectors).
ALIGN = 4


def local_gradients_hook(state, bucket):
    """A DDP communication hook that leaves each rank's gradients local: the coconet
    optimizer's program reduces them (ddp.register_comm_hook(None, local_gradients_hook)).
    Unannotated on purpose: DDP refuses a `bucket` annotation other than the real
    dist.GradBucket, and this module's annotations are strings."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


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
class _Bucket:
    """The parameters of one dtype, flattened into one buffer, and their compiled step."""

    dtype: torch.dtype
    params: list[torch.nn.Parameter]
    offsets: list[int]
    numel: int  # padded
    flat_param: torch.Tensor
    flat_grad: torch.Tensor
    state: dict[str, torch.Tensor] = field(default_factory=dict)  # m, v or buf: pieces
    compiled: Any = None
    steps: int = 0


class CoconetOptimizer(torch.optim.Optimizer):
    """The shared machinery (see the module docstring); `SGD`, `Adam`, `AdamW` pick the
    algorithm."""

    algorithm = ""
    state_names: tuple[str, ...] = ()

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        defaults: dict[str, Any],
        *,
        schedule: str = "fuse(rs-c-ag)",
        backend: str | None = None,
    ):
        if schedule not in SCHEDULES and schedule != "auto":
            raise CocoError(
                f"schedule {schedule!r}: use one of {', '.join(SCHEDULES)}, or 'auto' (the one "
                "the cost model ranks fastest on this host: coconet/autotune.py)"
            )
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise CocoError("coconet optimizers take one parameter group (one set of options)")
        self.schedule = schedule
        self.device = parameters_device(self.param_groups[0]["params"], backend)
        self.backend = BACKEND_OF_DEVICE[self.device.type]
        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.buckets: list[_Bucket] = []
        by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
        for p in self.param_groups[0]["params"]:
            if p.dtype not in (torch.float32, torch.bfloat16):
                raise CocoError(f"a parameter of dtype {p.dtype}: use float32 or bfloat16")
            by_dtype.setdefault(p.dtype, []).append(p)
        for dtype, ps in by_dtype.items():
            self.buckets.append(self._flatten(dtype, ps))
        for b in self.buckets:
            b.compiled = self._compile(b)
            for name, (shape, _dt) in b.compiled.input_shapes().items():
                if name in self.state_names:
                    b.state[name] = torch.zeros(shape, dtype=torch.float32, device=self.device)

    # -- buffers -----------------------------------------------------------------------------

    def _layout(self, params: list[torch.nn.Parameter]) -> tuple[list[int], int]:
        """Where each parameter starts in the flat buffer, and the buffer's (padded) size:
        packed one after another, the whole padded to divide among the ranks."""
        offsets, total = [], 0
        for p in params:
            offsets.append(total)
            total += p.numel()
        return offsets, _padded(total, self.world * ALIGN)

    def _flatten(self, dtype: torch.dtype, params: list[torch.nn.Parameter]) -> _Bucket:
        offsets, padded = self._layout(params)
        flat_param = torch.zeros(padded, dtype=dtype, device=self.device)
        flat_grad = torch.zeros(padded, dtype=dtype, device=self.device)
        with torch.no_grad():
            for p, o in zip(params, offsets, strict=True):
                view = flat_param[o : o + p.numel()].view_as(p)
                view.copy_(p.data)
                p.data = view
                p.grad = flat_grad[o : o + p.numel()].view_as(p)
        return _Bucket(dtype, params, offsets, padded, flat_param, flat_grad)

    def _gather_grads(self, b: _Bucket) -> None:
        """Gradients that are not views of the flat buffer (replaced or set to None by other
        code) are copied in; a missing gradient counts as zero."""
        for p, o in zip(b.params, b.offsets, strict=True):
            view = b.flat_grad[o : o + p.numel()].view_as(p)
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
            p.grad = view

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the gradient buffers in place (the gradients stay views of them, whatever
        `set_to_none` says: backward accumulates into them)."""
        for b in self.buckets:
            b.flat_grad.zero_()
            for p, o in zip(b.params, b.offsets, strict=True):
                p.grad = b.flat_grad[o : o + p.numel()].view_as(p)

    # -- the program -------------------------------------------------------------------------

    def _compile(self, b: _Bucket) -> Any:
        import coconet

        program = self.build_program(b.numel, b.dtype)
        return coconet.compile(
            program, schedule=self.schedule, backend=self.backend, schedule_space="named"
        )

    def build_program(self, n: int, dtype: torch.dtype) -> Any:
        raise NotImplementedError

    def scalars(self, b: _Bucket) -> dict[str, float]:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for b in self.buckets:
            self._gather_grads(b)
            b.steps += 1
            inputs: dict[str, Any] = {
                "g": _handed_over(b.flat_grad),
                "w": _handed_over(b.flat_param),
            }
            inputs.update({k: _handed_over(v) for k, v in b.state.items()})
            inputs.update(self.scalars(b))
            inputs["gscale"] = 1.0 / self.world
            b.compiled(**inputs)
        return loss

    # -- state -------------------------------------------------------------------------------

    def _full(self, b: _Bucket, name: str) -> torch.Tensor:
        """A state tensor of the whole flat buffer (gathered from the ranks' slices)."""
        piece = b.state[name]
        if piece.numel() == b.numel or self.world == 1:
            return piece.clone()
        parts = [torch.empty_like(piece) for _ in range(self.world)]
        dist.all_gather(parts, piece)
        return torch.cat(parts)

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout: per-parameter state (full tensors, gathered: collective)."""
        state: dict[int, dict[str, Any]] = {}
        index = 0
        for b in self.buckets:
            fulls = {name: self._full(b, name) for name in b.state}
            for p, o in zip(b.params, b.offsets, strict=True):
                entry: dict[str, Any] = {"step": torch.tensor(float(b.steps))}
                for name, full in fulls.items():
                    entry[self.torch_name(name)] = full[o : o + p.numel()].view(p.shape).clone()
                state[index] = entry
                index += 1
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        groups[0]["params"] = list(range(index))
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict["param_groups"]
        self.param_groups[0].update({k: v for k, v in groups[0].items() if k != "params"})
        state = state_dict["state"]
        index = 0
        rank = dist.get_rank() if self.world > 1 else 0
        for b in self.buckets:
            fulls = {
                name: torch.zeros(b.numel, dtype=torch.float32, device=self.device)
                for name in b.state
            }
            steps = 0
            for p, o in zip(b.params, b.offsets, strict=True):
                entry = state.get(index, state.get(str(index), {}))
                steps = int(float(entry.get("step", 0)))
                for name, full in fulls.items():
                    saved = entry.get(self.torch_name(name))
                    if saved is not None:
                        full[o : o + p.numel()] = saved.reshape(-1).to(full.device)
                index += 1
            b.steps = steps
            for name, full in fulls.items():
                piece = b.state[name]
                if piece.numel() == b.numel:
                    piece.copy_(full)
                else:
                    n = piece.numel()
                    piece.copy_(full[rank * n : (rank + 1) * n])

    @staticmethod
    def torch_name(name: str) -> str:
        return {"m": "exp_avg", "v": "exp_avg_sq", "buf": "momentum_buffer"}[name]


def _scalar_kwargs(names: Iterable[str]) -> dict[str, Any]:
    from coconet.frontend import F32, Scalar

    return {n: Scalar(F32) for n in names}


def _program(name: str, n: int, dtype: torch.dtype, state: tuple[str, ...], scalars, body):
    """A data-parallel update program over n elements: g local (summed over the ranks, scaled
    by gscale), w replicated (updated), state f32 replicated (updated), f32 scalars."""
    from coconet import frontend
    from coconet.frontend import BF16, F32, AllReduce, Cast, Local, Replicated, Tensor, Update

    elt = BF16 if dtype == torch.bfloat16 else F32
    params = [
        ("g", Tensor(elt, [n], Local)),
        ("w", Tensor(elt, [n], Replicated)),
        *[(s, Tensor(F32, [n], Replicated)) for s in state],
        *[(s, t) for s, t in _scalar_kwargs((*scalars, "gscale")).items()],
    ]

    names = [n for n, _t in params]

    def update(*args):
        a = dict(zip(names, args, strict=True))
        gsum = AllReduce("+", a["g"])
        gavg = (Cast(F32, gsum) if elt is BF16 else gsum) * a["gscale"]
        wf = Cast(F32, a["w"]) if elt is BF16 else a["w"]
        new_w, new_state = body(gavg, wf, a)
        for s in state:
            Update(a[s], new_state[s])
        Update(a["w"], Cast(BF16, new_w) if elt is BF16 else new_w)

    update.__signature__ = _signature(params)  # type: ignore[attr-defined]
    return frontend.program(grid=[None], name=name)(update)


def _signature(params):
    import inspect

    return inspect.Signature(
        [
            inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=t)
            for n, t in params
        ]
    )


class SGD(CoconetOptimizer):
    """torch.optim.SGD with momentum (no dampening, no Nesterov) and L2 weight decay."""

    algorithm = "sgd"
    state_names = ("buf",)

    def __init__(
        self, params, lr: float = 1e-3, momentum: float = 0.9, weight_decay: float = 0.0, **kw: Any
    ):
        super().__init__(
            params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}, **kw
        )

    def build_program(self, n, dtype):
        def body(g, w, a):
            d = g + a["wd"] * w
            buf = a["momentum"] * a["buf"] + d
            return w - a["lr"] * buf, {"buf": buf}

        return _program("sgd_momentum", n, dtype, ("buf",), ("lr", "momentum", "wd"), body)

    def scalars(self, b):
        g = self.param_groups[0]
        return {"lr": g["lr"], "momentum": g["momentum"], "wd": g["weight_decay"]}


class Adam(CoconetOptimizer):
    """torch.optim.Adam (bias-corrected, L2 weight decay added to the gradient)."""

    algorithm = "adam"
    state_names = ("m", "v")
    decoupled = False

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        **kw: Any,
    ):
        super().__init__(
            params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}, **kw
        )

    def build_program(self, n, dtype):
        from coconet.frontend import Sqrt

        decoupled = self.decoupled

        def body(g, w, a):
            if not decoupled:
                g = g + a["wd"] * w
            m = a["beta1"] * a["m"] + (1 - a["beta1"]) * g
            v = a["beta2"] * a["v"] + (1 - a["beta2"]) * g * g
            mhat = m / a["bc1"]
            vhat = v / a["bc2"]
            if decoupled:
                w = w * (1 - a["lr"] * a["wd"])
            return w - a["lr"] * mhat / (Sqrt(vhat) + a["eps"]), {"m": m, "v": v}

        name = "adamw" if decoupled else "adam"
        scalars = ("lr", "beta1", "beta2", "eps", "wd", "bc1", "bc2")
        return _program(name, n, dtype, ("m", "v"), scalars, body)

    def scalars(self, b):
        g = self.param_groups[0]
        beta1, beta2 = g["betas"]
        return {
            "lr": g["lr"],
            "beta1": beta1,
            "beta2": beta2,
            "eps": g["eps"],
            "wd": g["weight_decay"],
            # bias corrections in f64 on the host, rounded once (torch computes them in Python)
            "bc1": 1 - math.pow(beta1, b.steps),
            "bc2": 1 - math.pow(beta2, b.steps),
        }


class AdamW(Adam):
    """torch.optim.AdamW (decoupled weight decay)."""

    algorithm = "adamw"
    decoupled = True

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        **kw: Any,
    ):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kw)


class LAMB(CoconetOptimizer):
    """LAMB (You et al. 2020): Adam's direction plus decoupled weight decay, scaled per
    parameter tensor by the trust ratio ||w|| / ||r|| (1 where either norm is 0). One program
    over every parameter tensor at once -- CoCoNet's scattered tensors: each tensor keeps its own
    norm, and sits in its own segment of the flat buffers, padded to divide among the ranks."""

    algorithm = "lamb"
    state_names = ("m", "v")

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        **kw: Any,
    ):
        super().__init__(
            params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}, **kw
        )

    def _layout(self, params: list[torch.nn.Parameter]) -> tuple[list[int], int]:
        """Each parameter in its own segment, padded to divide among the ranks (its norm is
        its own, and each segment is sliced across the ranks on its own)."""
        unit = self.world * ALIGN
        offsets, self.segments, total = [], [], 0
        for p in params:
            offsets.append(total)
            padded = _padded(p.numel(), unit)
            self.segments.append((total, padded))
            total += padded
        return offsets, total

    def _compile(self, b: _Bucket) -> Any:
        import coconet
        from coconet.compiled import CompiledProgram

        program = self.build_table_program([n for _o, n in self.segments], b.dtype)
        compiled = coconet.compile(
            program, schedule=self.schedule, backend=self.backend, schedule_space="named"
        )
        assert isinstance(compiled, CompiledProgram)  # the cpu or cuda backend (never sim)
        shapes = compiled.input_shapes()
        # one state piece per tensor and per name, in the order of the segments
        self.pieces = {
            s: [
                torch.zeros(shapes[f"{s}{i}"][0], dtype=torch.float32, device=self.device)
                for i in range(len(self.segments))
            ]
            for s in self.state_names
        }
        return compiled

    def build_table_program(self, sizes: list[int], dtype: torch.dtype) -> Any:
        from coconet import frontend
        from coconet.frontend import (
            BF16,
            F32,
            AllReduce,
            Cast,
            Ite,
            Local,
            Norm,
            Replicated,
            Sqrt,
            Tensor,
            Update,
        )

        elt = BF16 if dtype == torch.bfloat16 else F32
        params: list[tuple[str, Any]] = []
        for i, n in enumerate(sizes):
            params += [
                (f"g{i}", Tensor(elt, [n], Local)),
                (f"w{i}", Tensor(elt, [n], Replicated)),
                (f"m{i}", Tensor(F32, [n], Replicated)),
                (f"v{i}", Tensor(F32, [n], Replicated)),
            ]
        scalars = ("lr", "beta1", "beta2", "eps", "wd", "bc1", "bc2", "gscale")
        params += list(_scalar_kwargs(scalars).items())
        names = [n for n, _t in params]

        def lamb(*args):
            a = dict(zip(names, args, strict=True))
            for i in range(len(sizes)):
                gsum = AllReduce("+", a[f"g{i}"])
                gavg = (Cast(F32, gsum) if elt is BF16 else gsum) * a["gscale"]
                w = Cast(F32, a[f"w{i}"]) if elt is BF16 else a[f"w{i}"]
                m = a["beta1"] * a[f"m{i}"] + (1 - a["beta1"]) * gavg
                v = a["beta2"] * a[f"v{i}"] + (1 - a["beta2"]) * gavg * gavg
                Update(a[f"m{i}"], m)
                Update(a[f"v{i}"], v)
                r = (m / a["bc1"]) / (Sqrt(v / a["bc2"]) + a["eps"]) + a["wd"] * w
                w_norm, r_norm = Norm(w), Norm(r)
                trust = Ite(w_norm > 0, Ite(r_norm > 0, w_norm / r_norm, 1.0), 1.0)
                new_w = w - a["lr"] * trust * r
                Update(a[f"w{i}"], Cast(BF16, new_w) if elt is BF16 else new_w)

        lamb.__signature__ = _signature(params)  # type: ignore[attr-defined]
        return frontend.program(grid=[None], name="lamb")(lamb)

    scalars = Adam.scalars

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        b = self.buckets[0] if len(self.buckets) == 1 else None
        if b is None:
            raise CocoError("LAMB takes parameters of one dtype")
        self._gather_grads(b)
        b.steps += 1
        inputs: dict[str, Any] = {}
        for i, (o, n) in enumerate(self.segments):
            inputs[f"g{i}"] = _handed_over(b.flat_grad[o : o + n])
            inputs[f"w{i}"] = _handed_over(b.flat_param[o : o + n])
            for s in self.state_names:
                inputs[f"{s}{i}"] = _handed_over(self.pieces[s][i])
        inputs.update(self.scalars(b))
        inputs["gscale"] = 1.0 / self.world
        b.compiled(**inputs)
        return loss

    def _gathered(self, piece: torch.Tensor, n: int) -> torch.Tensor:
        if piece.numel() == n or self.world == 1:
            return piece.clone()
        parts = [torch.empty_like(piece) for _ in range(self.world)]
        dist.all_gather(parts, piece)
        return torch.cat(parts)

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout, one entry per parameter (gathered: collective)."""
        b = self.buckets[0]
        state: dict[int, dict[str, Any]] = {}
        for i, (p, (_o, n)) in enumerate(zip(b.params, self.segments, strict=True)):
            entry: dict[str, Any] = {"step": torch.tensor(float(b.steps))}
            for s in self.state_names:
                full = self._gathered(self.pieces[s][i], n)
                entry[self.torch_name(s)] = full[: p.numel()].view(p.shape).clone()
            state[i] = entry
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(b.params)))
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict["param_groups"]
        self.param_groups[0].update({k: v for k, v in groups[0].items() if k != "params"})
        b = self.buckets[0]
        rank = dist.get_rank() if self.world > 1 else 0
        for i, (p, (_o, n)) in enumerate(zip(b.params, self.segments, strict=True)):
            entry = state_dict["state"].get(i, state_dict["state"].get(str(i), {}))
            b.steps = int(float(entry.get("step", 0)))
            for s in self.state_names:
                full = torch.zeros(n, dtype=torch.float32, device=self.device)
                if self.torch_name(s) in entry:
                    full[: p.numel()] = entry[self.torch_name(s)].reshape(-1).to(full.device)
                piece = self.pieces[s][i]
                k = piece.numel()
                piece.copy_(full if k == n else full[rank * k : (rank + 1) * k])
