"""What the coconet.torch optimizer tests share (test_torch_optim.py on the CPU,
test_torch_cuda.py on a GPU): each coconet optimizer beside torch.optim's, a small model and
the training loop both run."""

from __future__ import annotations

from collections.abc import Callable

import torch

import coconet.torch as ct

CASES = [
    (ct.SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}),
    (ct.Adam, torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.01}),
    (ct.AdamW, torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
]
CASE_IDS = ["sgd", "adam", "adamw"]
SCHEDULES = ["ar-c", "rs-c-ag", "fuse(rs-c-ag)"]


def small_model(
    widths: tuple[int, int, int] = (7, 5, 3),
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> torch.nn.Module:
    """Linear -> tanh -> linear, the same weights for the same arguments."""
    torch.manual_seed(0)
    n_in, hidden, n_out = widths
    layers = torch.nn.Sequential(
        torch.nn.Linear(n_in, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, n_out)
    )
    return layers.to(device=device, dtype=dtype)


def train(
    model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int = 1, batch: int = 6
) -> None:
    """`steps` optimizer steps on a mean-square loss of seeded random batches."""
    first = next(model.parameters())
    n_in = model[0].in_features
    gen = torch.Generator(device=first.device).manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(batch, n_in, generator=gen, device=first.device).to(first.dtype)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def check_state_dict_round_trip(
    make_model: Callable[[], torch.nn.Module],
    step: Callable[[torch.nn.Module, torch.optim.Optimizer, int, int], None],
) -> None:
    """coconet AdamW's state_dict() is torch.optim.AdamW's layout with its values, and
    continuing from it under another schedule (`fuse(rs-c-ag)`, the parameters copied into a
    fresh model) gives what continuing uninterrupted gives. `step(model, opt, steps, seed)`."""
    ref, mine = make_model(), make_model()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    opt = ct.AdamW(mine.parameters(), lr=0.01, schedule="rs-c-ag")
    step(ref, ref_opt, 4, 1)
    step(mine, opt, 4, 1)
    sd, ref_sd = opt.state_dict(), ref_opt.state_dict()
    assert sd["state"].keys() == ref_sd["state"].keys()
    for k, entry in ref_sd["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            got = sd["state"][k][name].to(entry[name].device)
            torch.testing.assert_close(got, entry[name], rtol=1e-5, atol=1e-7)
        assert float(sd["state"][k]["step"]) == float(entry["step"])
    fresh = make_model()
    with torch.no_grad():
        for p, q in zip(fresh.parameters(), mine.parameters(), strict=True):
            p.copy_(q)
    resumed = ct.AdamW(fresh.parameters(), lr=0.01, schedule="fuse(rs-c-ag)")
    resumed.load_state_dict(sd)
    step(mine, opt, 2, 7)
    step(fresh, resumed, 2, 7)
    for a, b in zip(mine.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


class SkipNet(torch.nn.Module):
    """A model some of whose layers receive no gradient on some steps: `a` and `b` always,
    `sometimes` on the steps where (t + rank) is even (at 2 ranks: on one rank each step),
    `rare` on rank 0 every third step, `unused` never."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(7, 6)
        self.sometimes = torch.nn.Linear(6, 6)
        self.rare = torch.nn.Linear(6, 6)
        self.unused = torch.nn.Linear(6, 3)
        self.b = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, t: int, rank: int = 0) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        if (t + rank) % 2 == 0:
            h = h + torch.tanh(self.sometimes(h))
        if rank == 0 and t % 3 == 0:
            h = h + torch.tanh(self.rare(h))
        return self.b(h)


def train_skipping(
    model: SkipNet,
    opt: torch.optim.Optimizer,
    steps: int,
    *,
    rank: int | None = None,
    world: int = 1,
    seed: int = 1,
    start: int = 0,
    set_to_none: bool = True,
    clip: float | None = None,
) -> tuple[list[float], list[float]]:
    """`steps` steps (numbered from `start`) on seeded global batches of 8, split into `world`
    shards. `rank=None` is the reference: the mean of every shard's loss, whose gradient is
    the average over the ranks (what DDP computes, a layer no shard used left without one);
    else this rank's shard alone (coconet averages in the step). With `clip`, the gradients'
    global norm is clipped: by `opt.clip_grad_norm_` for a coconet optimizer, else by
    torch.nn.utils.clip_grad_norm_. Returns the losses (the reference's, or this rank's) and
    the norms."""
    import coconet.torch as ct

    gen = torch.Generator().manual_seed(seed)
    losses, norms = [], []
    for t in range(start, start + steps):
        x = torch.randn(8, 7, generator=gen)
        shards = x.chunk(world)
        if rank is None:
            loss = sum(model(s, t, r).pow(2).mean() for r, s in enumerate(shards)) / world
        else:
            loss = model(shards[rank], t, rank).pow(2).mean()
        assert isinstance(loss, torch.Tensor)
        loss.backward()
        norm = None
        if clip is not None:
            if isinstance(opt, ct.CoconetOptimizer):
                norm = opt.clip_grad_norm_(clip)
            else:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        losses.append(float(loss.detach()))
        if norm is not None:
            norms.append(float(norm))
    return losses, norms


def reference_lamb_step(
    model: torch.nn.Module,
    state: dict[torch.nn.Parameter, list],
    lr: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
    wd: float = 0.01,
) -> None:
    """One LAMB step written out in PyTorch, per parameter tensor (f64 norms), as coconet
    computes it; a tensor without a gradient is skipped (its step count too)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is None:
                continue
            m, v, t = state.setdefault(p, [torch.zeros_like(p), torch.zeros_like(p), 0])
            t += 1
            state[p][2] = t
            m.mul_(betas[0]).add_((1 - betas[0]) * p.grad)
            v.mul_(betas[1]).add_((1 - betas[1]) * p.grad * p.grad)
            r = (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps) + wd * p
            wn, rn = p.double().norm(), r.double().norm()
            trust = float(wn / rn) if wn > 0 and rn > 0 else 1.0
            p.sub_(lr * trust * r)


class ReferenceLamb(torch.optim.Optimizer):
    """reference_lamb_step as a torch optimizer (for train_skipping)."""

    def __init__(self, params, model: torch.nn.Module, **options) -> None:
        super().__init__(params, {})
        self.model, self.options, self.moments = model, options, {}

    def step(self, closure=None):  # type: ignore[override]
        reference_lamb_step(self.model, self.moments, **self.options)
