"""coconet.torch: optimizers whose step() is one compiled coconet program. In one process
(a 1-rank job) they must track torch.optim's own SGD/Adam/AdamW; under torchrun on 2 ranks a
small transformer LM (examples/torch_lm.py) must train with the same loss at every step as
DDP + torch.optim.AdamW, under every schedule, also behind DDP with the local-gradients hook;
state_dict() gathers the sliced state into torch.optim's layout and load_state_dict() puts it
back."""

from __future__ import annotations

import json
import textwrap

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the test extra installs torch")

from optim_cases import (  # noqa: E402
    CASE_IDS,
    CASES,
    SCHEDULES,
    check_state_dict_round_trip,
    small_model,
    train,
)
from torchrun_job import torchrun_two  # noqa: E402 (after the importorskip)

import coconet.torch as ct  # noqa: E402 (after the importorskip)
from coconet.core.program import CocoError  # noqa: E402 (after the importorskip)


def _model(dtype=torch.float32):
    return small_model(dtype=dtype)


def _train(model, opt, steps=4, seed=1):
    train(model, opt, steps, seed)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("ours", "theirs", "options"), CASES, ids=CASE_IDS)
def test_one_rank_tracks_torch_optim(ours, theirs, options, schedule):
    ref, mine = _model(), _model()
    _train(ref, theirs(ref.parameters(), **options))
    params = list(mine.parameters())
    _train(mine, ours(params, schedule=schedule, **options))
    for a, b in zip(ref.parameters(), mine.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    # the user's Parameters are still the module's, now views of the flat buffer
    assert params == list(mine.parameters())


def test_auto_picks_one_of_the_optimizer_schedules_and_tracks_torch_optim(monkeypatch):
    # a published profile: the choice is the cost model's, with nothing measured here
    monkeypatch.setenv("COCONET_PROFILE", "dgx-a100")
    ref, mine = _model(), _model()
    _train(ref, torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.1))
    opt = ct.AdamW(mine.parameters(), lr=0.01, weight_decay=0.1, schedule="auto")
    _train(mine, opt)
    for a, b in zip(ref.parameters(), mine.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    choice = opt.compiled.autotune
    assert choice["profile"] == "dgx-a100"
    assert choice["name"] in ("as-written", *ct.SCHEDULES)


def test_gradients_replaced_by_other_code_are_taken():
    ref, mine = _model(), _model()
    _train(ref, torch.optim.AdamW(ref.parameters(), lr=0.01))
    opt = ct.AdamW(mine.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(6, 7, generator=gen)
        mine.zero_grad(set_to_none=True)  # the module drops the optimizer's gradient views
        mine(x).pow(2).mean().backward()
        opt.step()
    for a, b in zip(ref.parameters(), mine.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_bf16_parameters_are_updated_in_place_with_f32_state():
    ref, mine = _model(), _model(torch.bfloat16)
    _train(ref, torch.optim.AdamW(ref.parameters(), lr=0.01))
    opt = ct.AdamW(mine.parameters(), lr=0.01, schedule="fuse(rs-c-ag)")
    _train(mine, opt)
    assert all(p.dtype == torch.bfloat16 for p in mine.parameters())
    assert opt.segments[0].state["m"].dtype == torch.float32
    for a, b in zip(ref.parameters(), mine.parameters(), strict=True):
        torch.testing.assert_close(b.float(), a, rtol=0.05, atol=0.02)


def test_state_dict_is_torch_optims_layout_and_round_trips_across_schedules():
    check_state_dict_round_trip(_model, lambda m, o, steps, seed: _train(m, o, steps, seed))


def test_refusals_are_one_clear_message():
    with pytest.raises(CocoError, match="schedule"):
        ct.AdamW(_model().parameters(), schedule="fast")
    with pytest.raises(CocoError, match="float32 or bfloat16"):
        ct.AdamW(_model(torch.float64).parameters())


def test_the_backend_is_the_one_of_the_parameters_device():
    """CPU parameters run on the cpu backend, CUDA ones on the cuda backend (checked here on
    the decision: this machine has no GPU); anything else is one clear refusal."""
    opt = ct.SGD(_model().parameters())
    assert (opt.backend, opt.device.type) == ("cpu", "cpu")
    cpu = torch.zeros(4)
    assert ct.parameters_device([cpu], None) == torch.device("cpu")
    assert ct.parameters_device([cpu], "cpu") == torch.device("cpu")
    with pytest.raises(CocoError, match="backend 'cuda' for parameters on cpu: the cpu backend"):
        ct.SGD(_model().parameters(), backend="cuda")
    meta = torch.zeros(4, device="meta")
    with pytest.raises(CocoError, match="parameters on cpu, meta: .* one device"):
        ct.parameters_device([cpu, meta], None)
    with pytest.raises(CocoError, match="parameters on meta: coconet runs on CPU tensors"):
        ct.parameters_device([meta], None)
    # What a GPU's parameters would get, without one: the device's own backend.
    assert ct.BACKEND_OF_DEVICE[torch.device("cuda", 1).type] == "cuda"
    with pytest.raises(CocoError, match="no parameters"):
        ct.parameters_device([], None)


def test_buffers_are_handed_over_without_a_copy():
    flat = torch.arange(8, dtype=torch.float32)
    view = ct._handed_over(flat)
    assert isinstance(view, np.ndarray)
    view[0] = 42.0  # the same memory
    assert flat[0] == 42.0
    bf16 = torch.ones(8, dtype=torch.bfloat16)
    as_np = ct._handed_over(bf16)
    assert as_np.dtype == ml_dtypes.bfloat16
    assert as_np.ctypes.data == bf16.data_ptr()


def test_two_ranks_train_a_transformer_with_the_losses_of_ddp_adamw():
    proc = torchrun_two("examples/torch_lm.py", "--steps", "12", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("CURVES "))
    curves = json.loads(line[len("CURVES ") :])
    want = curves.pop("torch AdamW + DDP")
    assert want[-1] < 0.7 * want[0]  # it trains
    assert len(curves) == 3
    for name, got in curves.items():
        for step, (a, b) in enumerate(zip(want, got, strict=True)):
            assert abs(a - b) <= 1e-4 * abs(a), (name, step, a, b)


DDP_HOOK_AND_STATE = textwrap.dedent(
    """
    import json, sys
    import torch, torch.distributed as dist
    sys.path.insert(0, "examples")
    import torch_lm
    import coconet.torch as ct

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    reference = torch_lm.train("torch", "", 6, 8, 3e-3)

    torch.manual_seed(0)
    model = torch_lm.TinyLM()
    opt = ct.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, schedule="rs-c-ag")
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, ct.local_gradients_hook)
    losses = []
    for x, y in torch_lm.batches(6, 8, rank, world):
        loss = torch.nn.functional.cross_entropy(ddp(x).reshape(-1, 64), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(torch_lm.mean_over_ranks(loss))
    sd = opt.state_dict()  # collective: gathers the sliced m and v
    n = sum(p.numel() for p in model.parameters())
    m_total = sum(float(e["exp_avg"].abs().sum()) for e in sd["state"].values())
    sliced = opt.segments[0].state["m"].numel()
    result = {"ref": reference, "hook": losses, "m": m_total, "sliced": sliced, "n": n,
              "entries": len(sd["state"])}
    with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:  # stdout of two ranks interleaves
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_behind_ddp_with_the_local_gradients_hook_and_a_gathered_state_dict(tmp_path):
    script = tmp_path / "hook.py"
    script.write_text(DDP_HOOK_AND_STATE)
    proc = torchrun_two(str(script), str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    for r in results.values():
        for a, b in zip(r["ref"], r["hook"], strict=True):
            assert abs(a - b) <= 1e-4 * abs(a)
        assert r["sliced"] < r["n"]  # ZeRO-1: each rank holds a slice of m
    # both ranks gathered the same full state, one entry per parameter
    assert results[0]["m"] == results[1]["m"] > 0
    assert results[0]["entries"] == results[1]["entries"] > 5


def _reference_lamb(model, steps, lr=0.01, betas=(0.9, 0.999), eps=1e-6, wd=0.01, seed=1):
    """LAMB written out in PyTorch, per parameter tensor (f64 norms), as coconet computes it."""
    state = {p: (torch.zeros_like(p), torch.zeros_like(p)) for p in model.parameters()}
    gen = torch.Generator().manual_seed(seed)
    for t in range(1, steps + 1):
        x = torch.randn(6, 7, generator=gen)
        model(x).pow(2).mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                m, v = state[p]
                m.mul_(betas[0]).add_((1 - betas[0]) * p.grad)
                v.mul_(betas[1]).add_((1 - betas[1]) * p.grad * p.grad)
                r = (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps) + wd * p
                wn, rn = p.double().norm(), r.double().norm()
                trust = float(wn / rn) if wn > 0 and rn > 0 else 1.0
                p.sub_(lr * trust * r)
                p.grad = None


@pytest.mark.parametrize("schedule", ["ar-c", "rs-c-ag", "fuse(rs-c-ag)"])
def test_lamb_takes_a_trust_ratio_per_parameter_tensor(schedule):
    ref, mine = _model(), _model()
    with torch.no_grad():
        ref[2].bias.zero_()  # a zero norm: trust ratio 1, the tensor still trains
        mine[2].bias.zero_()
    _reference_lamb(ref, steps=4)
    opt = ct.LAMB(mine.parameters(), lr=0.01, schedule=schedule)
    _train(mine, opt)
    for a, b in zip(ref.parameters(), mine.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=2e-5, atol=1e-6)
    assert mine[2].bias.abs().sum() > 0
    sd = opt.state_dict()
    assert len(sd["state"]) == 4
    assert sd["state"][0]["exp_avg"].shape == mine[0].weight.shape
    again = ct.LAMB(_model().parameters(), lr=0.01, schedule="ar-c")
    again.load_state_dict(sd)
    for s in ("exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(again.state_dict()["state"][3][s], sd["state"][3][s])
