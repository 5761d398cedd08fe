"""What the coconet.torch optimizer tests share (test_torch_optim.py on the CPU,
test_torch_cuda.py on a GPU): each coconet optimizer beside torch.optim's, a small model and
the training loop both run."""

from __future__ import annotations

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
