"""The 2-rank checkpoint checks of test_torch_checkpoints.py, run by torchrun: each rank writes
what it saw to DIR/rank<r>.json.

Under every schedule: `consolidate_state_dict(to=0)` on every rank, then `state_dict()` on
rank 0 alone, equals the state_dict every rank gathers together; rank 1 is told where the state
went; torch.distributed.checkpoint saves it (the test loads it at 1 rank); a step makes the consolidation stale; and `state_dict()` called on rank 0 alone without
it meets rank 1's `step()` with a message on both ranks, after which they train on together.
Last, `step()` on rank 0 alone ends within its step timeout, naming rank 1."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from optim_cases import SCHEDULES, SkipNet, train_skipping
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

import coconet.torch as ct
from coconet.core.program import CocoError


def same(a: dict, b: dict) -> bool:
    """Two torch.optim state_dicts hold the same groups and state, exactly."""
    if a["param_groups"] != b["param_groups"] or a["state"].keys() != b["state"].keys():
        return False
    return all(
        a["state"][k].keys() == b["state"][k].keys()
        and all(torch.equal(a["state"][k][n], b["state"][k][n]) for n in a["state"][k])
        for k in a["state"]
    )


def groups(model: torch.nn.Module) -> list[dict]:
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": matrices}, {"params": vectors, "weight_decay": 0.0}]


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    seen: dict[str, object] = {}
    for schedule in SCHEDULES:
        model = SkipNet()
        opt = ct.AdamW(groups(model), lr=0.01, weight_decay=0.1, schedule=schedule)
        train_skipping(model, opt, 3, rank=rank, world=world)
        together = opt.state_dict()  # every rank: gathered together
        # torch.distributed.checkpoint, loaded at 1 rank by the test
        dcp.save({"optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=out / schedule)
        opt.consolidate_state_dict(to=0)
        if rank == 0:
            alone = opt.state_dict()
            seen[f"{schedule} alone"] = same(alone, together)
            torch.save(alone, out / f"{schedule}.pt")
        else:
            try:
                opt.state_dict()
                seen[f"{schedule} elsewhere"] = "no error"
            except CocoError as e:
                seen[f"{schedule} elsewhere"] = str(e)
        # a step makes the consolidation stale: every rank gathers again, rank 1 included
        train_skipping(model, opt, 1, rank=rank, world=world, start=3)
        seen[f"{schedule} stale"] = not same(opt.state_dict(), together)

        # state_dict() on rank 0 alone, rank 1 stepping on: a replicated state (ar-c) needs
        # nobody else; a sliced one is refused on both ranks
        try:
            if rank == 0:
                seen[f"{schedule} lone"] = sorted(opt.state_dict()["state"])
            elif schedule != "ar-c":
                train_skipping(model, opt, 1, rank=rank, world=world, start=4)
                seen[f"{schedule} lone"] = "no error"
        except CocoError as e:
            seen[f"{schedule} lone"] = str(e)
        opt.zero_grad()  # (rank 1's refused step left its gradients)
        train_skipping(model, opt, 2, rank=rank, world=world, start=5)
        seen[f"{schedule} params"] = sum(
            float(p.detach().double().sum()) for p in model.parameters()
        )

    # step() on rank 0 alone: it ends within the step timeout, naming rank 1
    model = SkipNet()
    opt = ct.AdamW(model.parameters(), lr=0.01, schedule="fuse(rs-c-ag)", step_timeout=1)
    train_skipping(model, opt, 1, rank=rank, world=world)
    started = time.monotonic()
    if rank == 0:
        try:
            train_skipping(model, opt, 1, rank=rank, world=world, start=1)
            seen["alone"] = "no error"
        except CocoError as e:
            seen["alone"] = str(e)
        seen["alone seconds"] = time.monotonic() - started
    else:
        time.sleep(4)  # (alive, elsewhere, past rank 0's timeout)
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    # rank 0's all-reduce is still pending in gloo: no orderly teardown
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
