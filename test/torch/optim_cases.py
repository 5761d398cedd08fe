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
