"""coconet.torch as a drop-in for torch.optim (issue #26), in one process (a 1-rank job; the
2-rank checks run under torchrun in test_torch_groups_2ranks): a parameter without a gradient
is left alone as torch.optim leaves it; param groups each with their own options in one
program; state_dict() in torch.optim's layout, loadable by torch.optim.AdamW and from it;
gradient clipping inside the step; torch.optim's keyword arguments."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the test extra installs torch")

from optim_cases import (  # noqa: E402
    CASE_IDS,
    CASES,
    SCHEDULES,
    ReferenceLamb,
    SkipNet,
    small_model,
    train,
    train_skipping,
)
from torchrun_job import torchrun_two  # noqa: E402 (after the importorskip)

import coconet.torch as ct  # noqa: E402 (after the importorskip)
from coconet.core.program import CocoError  # noqa: E402 (after the importorskip)

TIGHT = {"rtol": 1e-6, "atol": 1e-7}


def _same(ref: torch.nn.Module, mine: torch.nn.Module, **tol: float) -> None:
    for (name, a), b in zip(ref.named_parameters(), mine.parameters(), strict=True):
        torch.testing.assert_close(b, a, msg=lambda m, n=name: f"{n}: {m}", **(tol or TIGHT))


def _groups(model: torch.nn.Module, **second: object) -> list[dict]:
    """GPT's two groups: weight decay on matrices, none on biases (with `second`'s options)."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": matrices}, {"params": vectors, "weight_decay": 0.0, **second}]


# -- a parameter without a gradient ---------------------------------------------------------------


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("ours", "theirs", "options"), CASES, ids=CASE_IDS)
def test_a_parameter_without_a_gradient_is_left_alone_as_torch_does(
    ours, theirs, options, schedule
):
    """A never-used layer, one used every other step and one every third: same losses, same
    parameters, same state (no entry for the unused layer, the step counts per parameter)."""
    ref, mine = SkipNet(), SkipNet()
    start = {n: p.detach().clone() for n, p in mine.named_parameters()}
    ref_opt = theirs(ref.parameters(), **options)
    opt = ours(mine.parameters(), schedule=schedule, **options)
    want, _ = train_skipping(ref, ref_opt, 6)
    got, _ = train_skipping(mine, opt, 6)
    assert got == pytest.approx(want, rel=1e-6)
    _same(ref, mine)
    assert torch.equal(mine.unused.weight, start["unused.weight"])  # not even decayed
    sd, ref_sd = opt.state_dict(), ref_opt.state_dict()
    assert sd["state"].keys() == ref_sd["state"].keys()  # no entry for `unused`
    for k, entry in ref_sd["state"].items():
        assert sd["state"][k].keys() == entry.keys()
        for name, value in entry.items():
            torch.testing.assert_close(sd["state"][k][name], value, rtol=1e-6, atol=1e-8)
    # the common step ran as compiled, the others through the masked variant
    assert [k[0] for k in opt._programs] == [False, True]


def test_zero_gradients_kept_by_zero_grad_are_applied_as_torch_does():
    """zero_grad(set_to_none=False) keeps zero gradients, which torch.optim applies (weight
    decay, momentum) to a layer that backward does not reach; a layer never reached has
    none."""
    ref, mine = SkipNet(), SkipNet()
    options = {"lr": 0.01, "weight_decay": 0.1}
    train_skipping(ref, torch.optim.AdamW(ref.parameters(), **options), 5, set_to_none=False)
    opt = ct.AdamW(mine.parameters(), schedule="fuse(rs-c-ag)", **options)
    train_skipping(mine, opt, 5, set_to_none=False)
    _same(ref, mine)
    assert torch.equal(mine.unused.weight, SkipNet().unused.weight)


def test_gradients_written_in_place_or_replaced_count_and_none_does_not():
    model = SkipNet()
    opt = ct.SGD(model.parameters(), lr=0.1, momentum=0.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.zero_grad()
    model.a.weight.grad.fill_(1.0)  # in place into the optimizer's view, no backward
    model.b.weight.grad = torch.ones_like(model.b.weight)  # a tensor of its own
    model.sometimes.weight.grad = None
    opt.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {"a.weight", "b.weight"}
    torch.testing.assert_close(model.a.weight, before["a.weight"] - 0.1)


def test_a_zero_gradient_tensor_no_backward_reached_is_no_gradient():
    """DDP(gradient_as_bucket_view=True) swaps a parameter's defined `.grad` for its bucket
    view, zeroed where the parameter was unused on every rank (torch.optim's would be None,
    which DDP leaves alone): no gradient, so no decay and no moment update, as torch. Before
    the fix such a tensor counted as a gradient and a LayerDrop'd block decayed."""
    ref, mine = SkipNet(), SkipNet()
    options = {"lr": 0.01, "weight_decay": 0.1}
    ref_opt = torch.optim.AdamW(ref.parameters(), **options)
    opt = ct.AdamW(mine.parameters(), schedule="fuse(rs-c-ag)", **options)
    for model, o in ((ref, ref_opt), (mine, opt)):
        train_skipping(model, o, 2)
    before = mine.sometimes.weight.detach().clone()
    for model, o in ((ref, ref_opt), (mine, opt)):
        model.b(torch.tanh(model.a(torch.ones(2, 7)))).sum().backward()  # `sometimes` unused
        if model is mine:  # what DDP's bucket view leaves: zeros, not the optimizer's view
            model.sometimes.weight.grad = torch.zeros_like(model.sometimes.weight)
            model.sometimes.bias.grad = torch.zeros_like(model.sometimes.bias)
        o.step()
        o.zero_grad()
    assert torch.equal(mine.sometimes.weight, before)
    _same(ref, mine)
    assert float(opt.state_dict()["state"][2]["step"]) == 1  # `sometimes`: 1 of 3 steps


def test_lamb_skips_a_tensor_without_a_gradient():
    ref, mine = SkipNet(), SkipNet()
    want, _ = train_skipping(ref, ReferenceLamb(ref.parameters(), ref, lr=0.01), 6)
    for schedule in ("ar-c", "fuse(rs-c-ag)"):
        mine = SkipNet()
        opt = ct.LAMB(mine.parameters(), lr=0.01, schedule=schedule)
        got, _ = train_skipping(mine, opt, 6)
        assert got == pytest.approx(want, rel=1e-5)
        _same(ref, mine, rtol=2e-5, atol=1e-6)
        assert torch.equal(mine.unused.weight, SkipNet().unused.weight)
        assert float(opt.state_dict()["state"][2]["step"]) == 3  # `sometimes`: 3 of 6 steps


def test_frozen_parameters_are_left_out_and_a_gradient_later_is_refused():
    ref, mine = SkipNet(), SkipNet()
    for m in (ref, mine):
        m.a.weight.requires_grad_(False)
    train_skipping(ref, torch.optim.AdamW(ref.parameters(), lr=0.01), 3)
    opt = ct.AdamW(mine.parameters(), lr=0.01)
    assert all(mine.a.weight is not p for s in opt.segments for p in s.params)
    train_skipping(mine, opt, 3)
    _same(ref, mine)
    assert torch.equal(mine.a.weight, SkipNet().a.weight)
    assert 0 not in opt.state_dict()["state"]  # torch's index of a.weight, no state
    mine.a.weight.requires_grad_(True)
    with pytest.raises(CocoError, match="requires_grad=False when the optimizer was built"):
        train_skipping(mine, opt, 1)


# -- param groups ---------------------------------------------------------------------------------

GROUP_CASES = [
    (
        ct.SGD,
        torch.optim.SGD,
        {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01},
        {"momentum": 0.5},
    ),
    (ct.Adam, torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.01}, {"betas": (0.8, 0.99)}),
    (ct.AdamW, torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}, {"lr": 0.02, "eps": 1e-6}),
]


@pytest.mark.parametrize(("ours", "theirs", "options", "second"), GROUP_CASES, ids=CASE_IDS)
def test_param_groups_each_with_their_options_in_one_fused_program(ours, theirs, options, second):
    ref, mine = SkipNet(), SkipNet()
    ref_opt = theirs(_groups(ref, **second), **options)
    opt = ours(_groups(mine, **second), schedule="fuse(rs-c-ag)", **options)
    assert [s.group for s in opt.segments] == [0, 1]
    # every segment's reduce-scatter + update + all-gather: one launch (of the table form)
    assert len(opt.compiled.plan.steps) == 1
    train_skipping(ref, ref_opt, 4)
    train_skipping(mine, opt, 4)
    _same(ref, mine)
    # a scheduler and a hand edit change the options per group, without compiling again
    programs = dict(opt._programs)
    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, [lambda e: 0.5**e, lambda e: 1 + e])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [lambda e: 0.5**e, lambda e: 1 + e])
    for t in range(4, 8):
        train_skipping(ref, ref_opt, 1, start=t, seed=t)
        train_skipping(mine, opt, 1, start=t, seed=t)
        ref_sched.step()
        sched.step()
    for o in (ref_opt, opt):
        o.param_groups[1]["weight_decay"] = 0.05
        o.param_groups[0]["lr"] = 0.001
    train_skipping(ref, ref_opt, 2, start=8)
    train_skipping(mine, opt, 2, start=8)
    _same(ref, mine)
    assert opt._programs == programs


def test_parameters_of_two_dtypes_and_groups_are_one_program():
    model = SkipNet()
    model.b.to(torch.bfloat16)
    opt = ct.AdamW(_groups(model), lr=0.01, schedule="fuse(rs-c-ag)")
    assert {(s.group, s.dtype) for s in opt.segments} == {
        (0, torch.float32),
        (0, torch.bfloat16),
        (1, torch.float32),
        (1, torch.bfloat16),
    }
    assert len(opt._programs) == 1
    before = model.b.weight.detach().clone()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    assert model.b.weight.dtype == torch.bfloat16
    assert not torch.equal(model.b.weight, before)


def test_state_dict_is_torch_optims_and_loads_both_ways():
    """With two groups and a layer without state: the same layout as torch.optim.AdamW's
    state_dict (groups, options, indices, entries); torch.optim.AdamW continues from coconet's
    state as coconet does, and coconet from torch's as torch does."""
    options = {"lr": 0.01, "weight_decay": 0.1}
    ref, mine = SkipNet(), SkipNet()
    ref_opt = torch.optim.AdamW(_groups(ref, lr=0.02), **options)
    opt = ct.AdamW(_groups(mine, lr=0.02), schedule="rs-c-ag", **options)
    train_skipping(ref, ref_opt, 4)
    train_skipping(mine, opt, 4)
    sd, ref_sd = opt.state_dict(), ref_opt.state_dict()
    assert sd["param_groups"] == ref_sd["param_groups"]
    assert list(sd["state"]) == sorted(ref_sd["state"])
    for k, entry in ref_sd["state"].items():
        assert list(sd["state"][k]) == list(entry)
        assert sd["state"][k]["step"].dtype == entry["step"].dtype == torch.float32

    # torch continues from coconet's state
    theirs = SkipNet()
    with torch.no_grad():
        for p, q in zip(theirs.parameters(), mine.parameters(), strict=True):
            p.copy_(q)
    torch_opt = torch.optim.AdamW(_groups(theirs, lr=0.02), **options)
    torch_opt.load_state_dict(sd)
    train_skipping(mine, opt, 3, start=4, seed=5)
    train_skipping(theirs, torch_opt, 3, start=4, seed=5)
    _same(theirs, mine)

    # coconet continues from torch's state
    ours = SkipNet()
    with torch.no_grad():
        for p, q in zip(ours.parameters(), ref.parameters(), strict=True):
            p.copy_(q)
    coco_opt = ct.AdamW(_groups(ours, lr=0.02), schedule="fuse(rs-c-ag)", **options)
    coco_opt.load_state_dict(ref_opt.state_dict())
    train_skipping(ref, ref_opt, 3, start=4, seed=5)
    train_skipping(ours, coco_opt, 3, start=4, seed=5)
    _same(ref, ours)
    with pytest.raises(CocoError, match="groups do not match"):
        coco_opt.load_state_dict({"state": {}, "param_groups": sd["param_groups"][:1]})


def test_add_param_group_compiles_again_once_and_trains_the_new_group():
    ref, mine = SkipNet(), SkipNet()

    def core(m):
        return [*m.a.parameters(), *m.b.parameters()]

    ref_opt = torch.optim.Adam(core(ref), lr=0.01)
    opt = ct.Adam(core(mine), lr=0.01, schedule="fuse(rs-c-ag)")
    train_skipping(ref, ref_opt, 2)
    train_skipping(mine, opt, 2)
    for m, o in ((ref, ref_opt), (mine, opt)):
        o.add_param_group({"params": list(m.sometimes.parameters()), "lr": 0.03})
    assert len(opt.segments) == 2
    assert len(opt._programs) == 1
    train_skipping(ref, ref_opt, 4, start=2)
    train_skipping(mine, opt, 4, start=2)
    _same(ref, mine)
    # a refused group leaves the optimizer as it was
    with pytest.raises(CocoError, match="twice"):
        opt.add_param_group({"params": [mine.rare.weight, mine.rare.weight]})
    with pytest.raises(CocoError, match="float32 or bfloat16"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]})
    with pytest.raises(CocoError, match="amsgrad"):
        opt.add_param_group({"params": [mine.rare.weight], "amsgrad": True})
    assert len(opt.param_groups) == 2
    assert len(opt.segments) == 2


# -- torch.optim's keyword arguments ---------------------------------------------------------------


def test_torch_optims_keyword_arguments():
    params = list(SkipNet().parameters())
    for cls in (ct.SGD, ct.Adam, ct.AdamW):
        opt = cls(params, foreach=True, fused=False, differentiable=False)
        assert opt.param_groups[0]["foreach"] is True  # kept as torch keeps it, ignored
    ct.Adam(params, capturable=True, amsgrad=False)
    with pytest.raises(CocoError, match="amsgrad=True"):
        ct.AdamW(params, amsgrad=True)
    with pytest.raises(CocoError, match="dampening"):
        ct.SGD(params, dampening=0.1)
    with pytest.raises(CocoError, match="nesterov=True needs momentum"):
        ct.SGD(params, momentum=0.0, nesterov=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'betas'"):
        ct.SGD(params, betas=(0.9, 0.99))
    opt = ct.AdamW(params)
    opt.param_groups[0]["amsgrad"] = True  # by hand, after construction
    with pytest.raises(CocoError, match="amsgrad=True"):
        opt.step()


@pytest.mark.parametrize(
    ("ours", "theirs", "options"),
    [
        (ct.SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
        (ct.SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "maximize": True}),
        (ct.Adam, torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.1, "maximize": True}),
        (
            ct.Adam,
            torch.optim.Adam,
            {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True},
        ),
    ],
    ids=["sgd-nesterov", "sgd-maximize", "adam-maximize", "adam-decoupled"],
)
def test_nesterov_maximize_and_decoupled_decay_track_torch(ours, theirs, options):
    ref, mine = SkipNet(), SkipNet()
    train_skipping(ref, theirs(ref.parameters(), **options), 4)
    train_skipping(mine, ours(mine.parameters(), schedule="rs-c-ag", **options), 4)
    _same(ref, mine)


# -- clipping -------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_clip_grad_norm_inside_the_step_is_torchs(schedule):
    """opt.clip_grad_norm_ (and max_grad_norm=) clip by the global norm of every group's
    gradients as torch.nn.utils.clip_grad_norm_ does, and return that norm."""
    options = {"lr": 0.01, "weight_decay": 0.1}
    ref, mine, other = SkipNet(), SkipNet(), SkipNet()
    _, want = train_skipping(ref, torch.optim.AdamW(_groups(ref), **options), 5, clip=0.05)
    opt = ct.AdamW(_groups(mine), schedule=schedule, **options)
    _, got = train_skipping(mine, opt, 5, clip=0.05)
    assert max(want) > 0.05  # it clips
    assert got == pytest.approx(want, rel=1e-6)
    _same(ref, mine)
    by_option = ct.AdamW(_groups(other), schedule=schedule, max_grad_norm=0.05, **options)
    train_skipping(other, by_option, 5)
    _same(ref, other)
    assert float(by_option.last_grad_norm) == pytest.approx(want[-1], rel=1e-6)


def test_clip_grad_norm_returns_the_norm_after_the_step():
    model = SkipNet()
    opt = ct.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.full_like(p, 2.0)
    norm = opt.clip_grad_norm_(1.0)
    assert math.isnan(float(norm))  # computed by the step
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    assert float(norm) == pytest.approx(2.0 * math.sqrt(n), rel=1e-6)
    assert opt.last_grad_norm is norm
    with pytest.raises(CocoError, match="2-norm"):
        opt.clip_grad_norm_(1.0, norm_type=math.inf)
    with pytest.raises(CocoError, match="error_if_nonfinite"):
        opt.clip_grad_norm_(1.0, error_if_nonfinite=True)


def test_torch_clip_grad_norm_stays_torchs_on_one_rank():
    """The wrapper coconet puts around torch.nn.utils.clip_grad_norm_ returns what torch's
    does and, on one rank (where local gradients are the averaged ones), says nothing."""
    model = SkipNet()
    opt = ct.AdamW(model.parameters())
    assert opt in ct._OWNERS
    assert getattr(torch.nn.utils.clip_grad_norm_, "_coconet_wrapper", False)
    for p in model.parameters():
        p.grad = torch.full_like(p, 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        norm = torch.nn.utils.clip_grad_norm_((p for p in model.parameters()), 1.0)
    n = sum(p.numel() for p in model.parameters())
    assert float(norm) == pytest.approx(2.0 * math.sqrt(n), rel=1e-6)
    # and it can be taken back: torch's own function again
    ct._uninstall_clip_warning()
    assert torch.nn.utils.clip_grad_norm_ is torch.nn.utils.clip_grad.clip_grad_norm_
    ct.AdamW(SkipNet().parameters())
    assert getattr(torch.nn.utils.clip_grad_norm_, "_coconet_wrapper", False)
    torch.testing.assert_close(
        model.a.weight.grad, torch.full_like(model.a.weight, 1.0 / math.sqrt(n)), rtol=1e-5, atol=0
    )


# -- 2 ranks --------------------------------------------------------------------------------------


def test_two_ranks_skip_clip_groups_and_warnings(tmp_path):
    """torchrun on 2 ranks (two_ranks_script.py): parameters used on one rank only or on
    none, under every schedule, for SGD, Adam, AdamW and LAMB; clipping the averaged
    gradients of two groups; a state_dict of two groups' sliced state into torch.optim.AdamW
    and back; the warnings for local clipping and for DDP's own reduction; gradients written
    by backward into the fused step's symmetric buffers (no copy), also after a new group."""
    proc = torchrun_two(
        str(Path(__file__).with_name("two_ranks_script.py")), str(tmp_path), timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, r in enumerate(results):
        for name, err in r["errors"].items():
            assert err <= 2e-6, (rank, name, err)
        for name, moved in r["unused_moved"].items():
            assert moved == 0.0, (rank, name)
        assert r["norms_rel"] <= 1e-6, rank
        assert r["clip_warnings"] == 1, rank  # once, for two calls
        assert r["ddp_warnings"] == 1, rank
        assert r["hook_warnings"] == 0, rank
        assert r["grad_copies"] == [0, 0], rank  # backward wrote them where peers read
        assert r["param_copies"] == [0, 0], rank  # the parameters live where peers pull
        assert r["adopted"] == [[True, True]] * 3, rank
        assert r["in_place"], rank
    assert results[0]["params_sum"] == results[1]["params_sum"]  # the replicas agree


def test_torch_profiler_shows_the_step_and_each_step_of_its_plan(tmp_path):
    """Under torch.profiler a step is torch.optim's `Optimizer.step#AdamW.step` range with a
    range per kernel, collective and copy of coconet's plan inside, in the Chrome trace too;
    without the profiler nothing is traced."""
    from coconet.runtime.trace import step_name

    model = small_model()
    opt = ct.AdamW(model.parameters(), lr=0.01, schedule="fuse(rs-c-ag)")
    train(model, opt, 1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        train(model, opt, 2)
    names = {e.key for e in prof.key_averages()}
    assert "Optimizer.step#AdamW.step" in names
    plan = opt.compiled.plan
    wanted = {f"coconet {step_name(step)[0]}" for step in plan.steps}
    assert wanted, plan
    assert wanted <= names, wanted - names
    assert {e.count for e in prof.key_averages() if e.key in wanted} == {2}
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    assert all(name in trace.read_text() for name in wanted)
    assert opt.compiled.runner.tracer is None  # (traced only while profiled)
