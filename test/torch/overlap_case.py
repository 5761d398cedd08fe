"""The overlap check of test_torch_overlap.py, in one process or as a rank of a torchrun job
(`python overlap_case.py DIR`: each rank writes DIR/rank<r>.json): the same training with
overlap=True and overlap=False must leave every parameter bit for bit the same, through an
accumulation step (no_sync), a layer unused on one rank, a layer unused on every rank (the
masked variant, and Adam's step counts uneven in a bucket after it) and gradients that
backward put in tensors of their own (the module's zero_grad); and so must the same training
clipped (max_grad_norm=, and opt.clip_grad_norm_ between a backward and its step: the buckets
only reduce in backward), with the same norms."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import coconet.torch as ct

# 384 f32 elements a bucket: the first two weight matrices, the last, the f32 vectors, the bf16
# gain: four buckets
CAP_MB = 1536 / 2**20
# Clipped, a bucket is a run of a segment's parameters: in 256 f32 elements, `mid`'s weight is
# one alone, which a step with `mid` unused on every rank leaves without a gradient anywhere
CLIP_CAP_MB = 1024 / 2**20
CLIP_BUCKETS = 5
STEPS = 7
MAX_NORM = 0.2  # below most steps' norm: clipping acts


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.ln = nn.Linear(6, 16), nn.LayerNorm(16)
        self.mid, self.out = nn.Linear(16, 16), nn.Linear(16, 4)
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, 16).to(torch.bfloat16))

    def forward(self, x: torch.Tensor, skip_mid: bool = False) -> torch.Tensor:
        h = torch.tanh(self.ln(self.inp(x)) * self.gain.float())
        if not skip_mid:
            h = torch.tanh(self.mid(h))
        return self.out(h)


def train(
    overlap: bool, rank: int, world: int, clip: bool = False, schedule: str = "fuse(rs-c-ag)"
) -> tuple[Net, list[int], list[float]]:
    """STEPS steps of AdamW (two groups) on this rank's shard, `clip`ped at MAX_NORM (and at
    half of it on step 5, by opt.clip_grad_norm_); returns the model, per backward how many
    buckets had been launched when the first layer's weight gradient arrived (overlap: during
    backward), and each step's gradient norm (clip)."""
    model = Net()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
    clipping = {"max_grad_norm": MAX_NORM} if clip else {}
    opt = ct.AdamW(
        groups,
        lr=0.01,
        overlap=overlap,
        bucket_cap_mb=CLIP_CAP_MB if clip else CAP_MB,
        schedule=schedule,
        **clipping,
    )
    launched: list[int] = []
    norms: list[float] = []
    # registered after the optimizer's hooks: runs after them for this parameter
    model.inp.weight.register_post_accumulate_grad_hook(
        lambda _p: launched.append(sum(opt._launched))  # pyright: ignore[reportPrivateUsage]
    )
    gen = torch.Generator().manual_seed(1 + rank)

    def backward(skip_mid: bool = False) -> None:
        x = torch.randn(5, 6, generator=gen)
        model(x, skip_mid).pow(2).mean().backward()

    for step in range(STEPS):
        if step == 2:  # accumulation: the first micro-batch inside no_sync()
            with opt.no_sync():
                backward()
        if step == 6:  # the module's zero_grad: backward makes gradient tensors of its own
            model.zero_grad(set_to_none=True)
        # step 3: `mid` unused on the last rank only; step 4: on every rank
        backward(skip_mid=(step == 3 and rank == world - 1) or step == 4)
        norm = opt.clip_grad_norm_(MAX_NORM / 2) if clip and step == 5 else None
        opt.step()
        if clip:
            assert opt.last_grad_norm is not None
            assert norm is None or norm is opt.last_grad_norm
            norms.append(float(opt.last_grad_norm))
        opt.zero_grad()
    return model, launched, norms


# Clipped, the step after backward's reductions is written as rs-c-ag schedules it (sliced
# state; the torchrun job, the default schedule) or, under the other schedules, as ar-c does
# (replicated; one process), each to round as its schedule does.
def compare(rank: int = 0, world: int = 1, clip_schedules: tuple[str, ...] = ("ar-c",)) -> dict:
    out: dict = {}
    for clip, schedule in [(False, "fuse(rs-c-ag)"), *((True, s) for s in clip_schedules)]:
        ref, _, ref_norms = train(False, rank, world, clip, schedule)
        mine, launched, norms = train(True, rank, world, clip, schedule)
        pairs = zip(ref.parameters(), mine.parameters(), strict=True)
        out[f"clipped {schedule}" if clip else "unclipped"] = {
            "equal": [torch.equal(a, b) for a, b in pairs],
            "launched": launched,
            "sum": sum(float(p.detach().double().sum()) for p in mine.parameters()),
            "mid_moved": not torch.equal(Net().mid.weight, mine.mid.weight),
            "norms": norms,
            "ref_norms": ref_norms,
        }
    return out


if __name__ == "__main__":
    dist.init_process_group("gloo")
    result = compare(dist.get_rank(), dist.get_world_size(), ("fuse(rs-c-ag)",))
    out = Path(sys.argv[1]) / f"rank{dist.get_rank()}.json"
    out.write_text(json.dumps(result))  # (the ranks' stdout interleaves)
    dist.barrier()
    dist.destroy_process_group()
