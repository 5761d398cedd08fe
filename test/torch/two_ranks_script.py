"""The 2-rank checks of test_torch_groups.py, run by torchrun: each rank writes what it saw to
DIR/rank<r>.json. The reference for every check is torch.optim on the gradient averaged over
the ranks (the mean of every shard's loss), which is what DDP computes."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

# (optim_cases sits beside this script, on sys.path as its directory)
from optim_cases import CASE_IDS, CASES, SCHEDULES, ReferenceLamb, SkipNet, train_skipping

import coconet.torch as ct


@torch.no_grad()
def max_rel(ref: torch.nn.Module, mine: torch.nn.Module) -> float:
    """The largest difference of a parameter, relative to the parameter's largest element."""
    return max(
        float((a - b).abs().max()) / max(float(a.abs().max()), 1e-30)
        for a, b in zip(ref.parameters(), mine.parameters(), strict=True)
    )


def groups(model: torch.nn.Module) -> list[dict]:
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": matrices}, {"params": vectors, "weight_decay": 0.0, "lr": 0.02}]


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    errors: dict[str, float] = {}
    unused_moved: dict[str, float] = {}
    untouched = SkipNet().unused.weight.detach().clone()
    params_sum = 0.0

    # Parameters without a gradient on some ranks (DDP: updated with the average) or on all.
    cases = [*zip(CASE_IDS, CASES), ("lamb", (ct.LAMB, None, {"lr": 0.01}))]
    for name, (ours, theirs, options) in cases:
        ref = SkipNet()
        if theirs is None:
            ref_opt = ReferenceLamb(ref.parameters(), ref, **options)
        else:
            ref_opt = theirs(ref.parameters(), **options)
        train_skipping(ref, ref_opt, 6, world=world)
        for schedule in SCHEDULES:
            mine = SkipNet()
            opt = ours(mine.parameters(), schedule=schedule, **options)
            train_skipping(mine, opt, 6, rank=rank, world=world)
            errors[f"{name} {schedule}"] = max_rel(ref, mine)
            unused_moved[f"{name} {schedule}"] = float(
                (mine.unused.weight.detach() - untouched).abs().max()
            )
            params_sum += sum(float(p.detach().double().sum()) for p in mine.parameters())

    # Clipping the averaged gradients of two groups, by the method and by the option.
    ref = SkipNet()
    _, want = train_skipping(
        ref, torch.optim.AdamW(groups(ref), lr=0.01, weight_decay=0.1), 5, world=world, clip=0.05
    )
    norms_rel = 0.0
    for schedule in SCHEDULES:
        mine = SkipNet()
        opt = ct.AdamW(groups(mine), lr=0.01, weight_decay=0.1, schedule=schedule)
        _, got = train_skipping(mine, opt, 5, rank=rank, world=world, clip=0.05)
        errors[f"clip {schedule}"] = max_rel(ref, mine)
        norms_rel = max(norms_rel, *(abs(a - b) / b for a, b in zip(got, want, strict=True)))
        other = SkipNet()
        opt = ct.AdamW(
            groups(other), lr=0.01, weight_decay=0.1, schedule=schedule, max_grad_norm=0.05
        )
        train_skipping(other, opt, 5, rank=rank, world=world)
        errors[f"max_grad_norm {schedule}"] = max_rel(ref, other)

    # state_dict with two groups and the state sliced across the ranks (rs-c-ag): torch
    # continues from coconet's, and coconet (under another schedule) from torch's.
    options = {"lr": 0.01, "weight_decay": 0.1}
    ref, mine = SkipNet(), SkipNet()
    ref_opt = torch.optim.AdamW(groups(ref), **options)
    opt = ct.AdamW(groups(mine), schedule="rs-c-ag", **options)
    train_skipping(ref, ref_opt, 3, world=world)
    train_skipping(mine, opt, 3, rank=rank, world=world)
    theirs, ours = SkipNet(), SkipNet()
    with torch.no_grad():
        for p, q in zip(theirs.parameters(), mine.parameters(), strict=True):
            p.copy_(q)
        for p, q in zip(ours.parameters(), ref.parameters(), strict=True):
            p.copy_(q)
    torch_opt = torch.optim.AdamW(groups(theirs), **options)
    torch_opt.load_state_dict(opt.state_dict())  # (collective: gathers the slices)
    coco_opt = ct.AdamW(groups(ours), schedule="fuse(rs-c-ag)", **options)
    coco_opt.load_state_dict(ref_opt.state_dict())
    train_skipping(mine, opt, 3, rank=rank, world=world, start=3, seed=5)
    train_skipping(theirs, torch_opt, 3, world=world, start=3, seed=5)
    errors["state_dict into torch"] = max_rel(theirs, mine)
    train_skipping(ref, ref_opt, 3, world=world, start=3, seed=5)
    train_skipping(ours, coco_opt, 3, rank=rank, world=world, start=3, seed=5)
    errors["state_dict from torch"] = max_rel(ref, ours)

    # The fused step's gradient is read by peers from symmetric memory: backward writes it
    # there (the gradients are views of that buffer), so no step copies a gradient in; the
    # parameters live in the step's symmetric memory too (the fused all_gather assembles
    # them there), so none is copied in or out; a new param group moves both to the new
    # program's buffers.
    def core(m: SkipNet) -> list[torch.nn.Parameter]:
        return [*m.a.parameters(), *m.b.parameters()]

    def copies(o: ct.CoconetOptimizer, kind: str) -> int:
        counted = o.compiled.runner.copies_in.items()
        return sum(n for k, n in counted if k[0] == kind and k[1:].isdigit())

    ref, mine = SkipNet(), SkipNet()
    ref_opt = torch.optim.Adam(core(ref), lr=0.01)
    opt = ct.Adam(core(mine), lr=0.01, schedule="fuse(rs-c-ag)")
    train_skipping(ref, ref_opt, 2, world=world)
    train_skipping(mine, opt, 2, rank=rank, world=world)
    grad_copies, param_copies = [copies(opt, "g")], [copies(opt, "w")]
    adopted = [(s.adopted, s.params_adopted) for s in opt.segments]
    for m, o in ((ref, ref_opt), (mine, opt)):
        o.add_param_group({"params": list(m.sometimes.parameters()), "lr": 0.03})
    train_skipping(ref, ref_opt, 4, world=world, start=2)
    train_skipping(mine, opt, 4, rank=rank, world=world, start=2)
    errors["gradients and parameters in symmetric memory, add_param_group"] = max_rel(ref, mine)
    grad_copies.append(copies(opt, "g"))
    param_copies.append(copies(opt, "w"))
    adopted += [(s.adopted, s.params_adopted) for s in opt.segments]
    # (no staging buffer: the only symmetric buffers are arguments and flags)
    plan = opt.compiled.plan
    in_place = all(plan.arguments[f"w{i}"].symmetric for i in range(len(opt.segments))) and all(
        b.kind == "arg" or b.name.endswith("_flags") for b in plan.buffers if b.symmetric
    )

    # torch.nn.utils.clip_grad_norm_ on an optimizer's parameters: a warning, once.
    model = SkipNet()
    opt = ct.AdamW(model.parameters())  # (kept: a collected optimizer owns nothing)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            for p in model.parameters():
                p.grad = torch.ones_like(p)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    clip_warnings = sum("clip_grad_norm_" in str(w.message) for w in seen)
    del opt

    # DDP reducing the gradients itself: a warning; with coconet's hook: none.
    def ddp_warnings(hook: bool) -> int:
        model = SkipNet()
        opt = ct.AdamW(model.parameters(), lr=0.01)
        ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
        if hook:
            ddp.register_comm_hook(None, ct.local_gradients_hook)
        gen = torch.Generator().manual_seed(3)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for t in range(3):
                x = torch.randn(8, 7, generator=gen).chunk(world)[rank]
                ddp(x, 1, 1).pow(2).mean().backward()  # t + rank odd: `sometimes` unused
                opt.step()
                opt.zero_grad()
        return sum("identical on every rank" in str(w.message) for w in seen)

    result = {
        "errors": errors,
        "unused_moved": unused_moved,
        "norms_rel": norms_rel,
        "clip_warnings": clip_warnings,
        "ddp_warnings": ddp_warnings(False),
        "hook_warnings": ddp_warnings(True),
        "params_sum": params_sum,
        "grad_copies": grad_copies,
        "param_copies": param_copies,
        "adopted": adopted,
        "in_place": in_place,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
