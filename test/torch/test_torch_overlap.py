"""coconet.torch with overlap=True: each bucket's program launched from backward (post-
accumulate-grad hooks) on a worker thread gives the parameters overlap=False gives, bit for
bit, in one process and on 2 torchrun ranks (overlap_case.py: accumulation under no_sync(), a
layer unused on one rank or on all, the masked variant, gradients in tensors of their own),
and so does it clipped (max_grad_norm=, opt.clip_grad_norm_: the buckets only reduce), with
the same norms;
the launches happen inside backward (counted from a hook on the first layer's gradient, never
timed); what overlap cannot do is refused with one message."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="the test extra installs torch")

from overlap_case import (  # noqa: E402 (after the importorskip)
    CAP_MB,
    CLIP_BUCKETS,
    MAX_NORM,
    Net,
    compare,
)
from torchrun_job import torchrun_two  # noqa: E402 (after the importorskip)

import coconet.torch as ct  # noqa: E402 (after the importorskip)
from coconet.core.program import CocoError  # noqa: E402 (after the importorskip)

BUCKETS = 4  # Net's parameters in buckets of CAP_MB


def _launches_and_equality(results: dict, skipped_here: bool) -> None:
    _launches_and_equality_of(results["unclipped"], skipped_here)
    for run, result in results.items():
        if run.startswith("clipped"):
            assert all(result["equal"]), (run, result["equal"])
            assert result["norms"] == result["ref_norms"], run  # the same floats
            assert max(result["norms"]) > MAX_NORM  # it clips
            # the reductions launch in backward (its own buckets: a step without `mid` leaves
            # one without a gradient anywhere, whose sum step() must not take from before)
            launched = result["launched"]
            assert launched[:4] == [0, CLIP_BUCKETS, 0, CLIP_BUCKETS], run


def _launches_and_equality_of(result: dict, skipped_here: bool) -> None:
    assert all(result["equal"]), result["equal"]
    assert result["mid_moved"]
    launched = result["launched"]
    # per backward (step 2 has two): step 0 learns the order (no launch); from step 1 on, the
    # first layer's weight gradient arrives last, with every bucket launched; no_sync()'s
    # backward launches none; a step with `mid` unused launches the buckets before its own
    assert launched[:4] == [0, BUCKETS, 0, BUCKETS]
    assert launched[4] == (2 if skipped_here else BUCKETS)
    assert launched[5] == 2
    assert launched[6:] == [BUCKETS, BUCKETS]


def test_overlap_gives_the_step_without_it_bit_for_bit_in_one_process():
    # (ar-c: the replicated form of the step after the reductions; the torchrun job the sliced)
    _launches_and_equality(compare(), skipped_here=True)


def test_two_ranks_overlap_gives_the_step_without_it_bit_for_bit(tmp_path):
    proc = torchrun_two("test/torch/overlap_case.py", str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # rank 0 launched `mid`'s buckets in backward on step 3, rank 1 (no gradient) in step()
    _launches_and_equality(results[0], skipped_here=False)
    _launches_and_equality(results[1], skipped_here=True)
    assert sorted(results[0]) == ["clipped fuse(rs-c-ag)", "unclipped"]
    for run in results[0]:  # the replicas agree
        assert results[0][run]["sum"] == results[1][run]["sum"]


def test_what_overlap_cannot_do_is_refused():
    model = Net()
    clipped = ct.AdamW(Net().parameters(), overlap=True, max_grad_norm=1.0)
    with pytest.raises(CocoError, match="clip_grad_norm_ on the parameters of an overlap"):
        torch.nn.utils.clip_grad_norm_(clipped.param_groups[0]["params"], 1.0)
    with pytest.raises(CocoError, match="bucket_cap_mb=0"):
        ct.AdamW(model.parameters(), overlap=True, bucket_cap_mb=0)
    opt = ct.AdamW(model.parameters(), overlap=True, bucket_cap_mb=CAP_MB)
    assert len(opt._buckets) > 1
    # declared at construction or not at all: buckets launched in backward before it is
    # called would have updated unclipped
    with pytest.raises(CocoError, match="no max_grad_norm= at construction"):
        opt.clip_grad_norm_(1.0)
    with pytest.raises(CocoError, match="clip_grad_norm_ on the parameters of an overlap"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    x = torch.randn(3, 6)
    for _ in range(2):  # the first step learns the launch order
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    model(x).sum().backward()  # launches every bucket
    with pytest.raises(CocoError, match="zero_grad\\(\\) between a backward and step"):
        opt.zero_grad()
    with pytest.raises(CocoError, match="state_dict\\(\\) between a backward and step"):
        opt.state_dict()
    with pytest.raises(CocoError, match="a second backward before step"):
        model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    with opt.no_sync():  # the supported way to accumulate
        model(x).sum().backward()
    model(x).sum().backward()
    opt.step()
