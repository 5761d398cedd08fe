"""Checkpoints the usual ways with coconet.torch on 2 torchrun ranks (checkpoint_script.py):
the state consolidated on rank 0 and saved there alone, under every schedule, and a misused
state_dict() refused with the fix on every rank instead of a collective mismatch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

import coconet.torch as ct

sys.path.insert(0, str(Path(__file__).parent))
from optim_cases import SkipNet
from torchrun_job import torchrun_two

SCHEDULES = ["ar-c", "rs-c-ag", "fuse(rs-c-ag)"]


def _groups(model: torch.nn.Module) -> list[dict]:
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": matrices}, {"params": vectors, "weight_decay": 0.0}]


def _same(a: dict, b: dict) -> bool:
    """Two torch.optim state_dicts hold the same groups and state, exactly (a state entry
    that is all zeros at step 0 counts as no entry: what a fresh optimizer lists)."""

    def stepped(sd: dict) -> dict:
        return {k: e for k, e in sd["state"].items() if float(e.get("step", 1)) > 0}

    sa, sb = stepped(a), stepped(b)
    return (
        a["param_groups"] == b["param_groups"]
        and sa.keys() == sb.keys()
        and all(torch.equal(sa[k][n], sb[k][n]) for k in sa for n in sa[k])
    )


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_state_dict_consolidated_on_rank_0_and_a_lone_state_dict_refused(tmp_path):
    proc = torchrun_two(str(Path(__file__).with_name("checkpoint_script.py")), str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for schedule in SCHEDULES:
        assert r0[f"{schedule} alone"] is True, schedule
        saved = torch.load(tmp_path / f"{schedule}.pt")
        # torch's layout: matrices are indices 0-4, vectors 5-9; `unused` (3 and 8) has none
        assert sorted(saved["state"]) == [0, 1, 2, 4, 5, 6, 7, 9]
        assert all(set(e) == {"step", "exp_avg", "exp_avg_sq"} for e in saved["state"].values())
        elsewhere = r1[f"{schedule} elsewhere"]
        if schedule == "ar-c":  # every rank holds the whole state: state_dict() anywhere
            assert elsewhere == "no error"
        else:
            assert "consolidate_state_dict(to=0) gathered the state on rank 0" in elsewhere
        assert r0[f"{schedule} stale"] is True
        assert r1[f"{schedule} stale"] is True
        assert r0[f"{schedule} params"] == r1[f"{schedule} params"], schedule  # in step
    # torch.distributed.checkpoint's usual resume, at 1 rank, into a fresh optimizer under
    # each schedule: the state 2 ranks saved, every tensor
    for schedule in SCHEDULES:
        for resumed_under in ("ar-c", "fuse(rs-c-ag)"):
            model = SkipNet()
            opt = ct.AdamW(_groups(model), lr=0.01, weight_decay=0.1, schedule=resumed_under)
            state = {"optim": get_optimizer_state_dict(model, opt)}
            assert len(state["optim"]["state"]) == 10  # every tensor, to be filled
            # (SkipNet's `unused` layer never had state, so the checkpoint lacks it: DCP's
            # usual partial load, as with torch.optim's own optimizers)
            partial = DefaultLoadPlanner(allow_partial_load=True)
            dcp.load(state, checkpoint_id=tmp_path / schedule, planner=partial, no_dist=True)
            set_optimizer_state_dict(model, opt, state["optim"])
            want = torch.load(tmp_path / f"{schedule}.pt")
            assert _same(opt.state_dict(), want), (schedule, resumed_under)
    # a replicated state is saved on one rank as with torch.optim
    assert r0["ar-c lone"] == sorted(torch.load(tmp_path / "ar-c.pt")["state"])
    for schedule in ("rs-c-ag", "fuse(rs-c-ag)"):
        lone, stepping = r0[f"{schedule} lone"], r1[f"{schedule} lone"]
        assert "rank 0 is in state_dict() of the optimizer while another rank is in step()" in lone
        assert "rank 1 is in step() of the optimizer while another rank is in state_dict()" in (
            stepping
        )
        assert "consolidate_state_dict(to=0) on every rank" in stepping
    # a step on one rank only: bounded, and says who is missing
    assert (
        "step() of the optimizer on rank 0: rank(s) 1 did not arrive within the step "
        in (r0["alone"])
    )
    assert 0.9 < r0["alone seconds"] < 60  # (not before the timeout; bounded, loosely)
