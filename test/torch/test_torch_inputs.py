"""What PyTorch users pass to a compiled program on the cpu backend: tensors are viewed, not
copied, so updates land in them -- contiguous or not, f32 or bf16 -- 0-d tensors and Python
numbers are scalars; what cannot be updated correctly (read-only, aliased, requires_grad) is
refused before anything runs, leaving the caller's data as it was."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the test extra installs torch")

import coconet  # noqa: E402 (after the importorskip)
from coconet.core.program import CocoError  # noqa: E402 (after the importorskip)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def sgd():
    step = coconet.compile(EXAMPLES / "sgd.mlir", backend="cpu")
    yield step
    step.close()


def test_a_contiguous_tensor_is_updated_in_place_without_a_copy(sgd):
    w = torch.ones(4096)
    out = sgd(g=torch.full((4096,), 2.0), w=w, lr=torch.tensor(0.25))
    assert out["w"] is w
    assert torch.all(w == 0.5)


def test_a_non_contiguous_tensor_is_updated_in_place(sgd):
    base = torch.ones(8192)
    w = base[::2]
    out = sgd(g=torch.full((4096,), 2.0), w=w, lr=0.25)
    assert out["w"] is w
    assert torch.all(base[::2] == 0.5)
    assert torch.all(base[1::2] == 1.0)


def test_a_tensor_that_requires_grad_is_refused(sgd):
    w = torch.ones(4096, requires_grad=True)
    with pytest.raises(CocoError, match="input 'w'.*detach"):
        sgd(g=torch.full((4096,), 2.0), w=w, lr=0.25)


def test_a_read_only_updated_array_is_refused_and_left_alone(sgd):
    w = np.ones(4096, np.float32)
    w.flags.writeable = False
    with pytest.raises(CocoError, match="input 'w' is updated in place.*read-only"):
        sgd(g=np.full(4096, 2.0, np.float32), w=w, lr=0.25)
    assert np.all(w == 1.0)


def test_an_updated_argument_aliasing_another_is_refused():
    step = coconet.compile(EXAMPLES / "adam.mlir", backend="cpu")
    try:
        mv = np.zeros(4096, np.float32)
        w = np.ones(4096, np.float32)
        with pytest.raises(CocoError, match="shares memory with input"):
            step(
                g=np.ones(4096, np.float32),
                w=w,
                m=mv,
                v=mv,
                lr=0.1,
                beta1=0.9,
                beta2=0.99,
                eps=1e-8,
                step=1.0,
            )
        assert np.all(w == 1.0)
        assert np.all(mv == 0.0)
    finally:
        step.close()


def test_bf16_tensors_go_in_as_their_bits():
    step = coconet.compile(EXAMPLES / "adam_bf16_grads.mlir", backend="cpu")
    try:
        g = torch.full((4096,), 0.5, dtype=torch.bfloat16)
        w = torch.ones(4096)
        m, v = torch.zeros(4096), torch.zeros(4096)
        step(g=g, w=w, m=m, v=v, lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, step=1.0)
        # first Adam step: mhat/sqrt(vhat) = sign(g) = 1, so w = 1 - lr (up to eps)
        torch.testing.assert_close(w, torch.full((4096,), 0.9), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(m, torch.full((4096,), 0.05), rtol=1e-6, atol=1e-7)
    finally:
        step.close()


def test_the_same_tensor_again_is_checked_again_where_it_changed(sgd):
    """A call passing the same tensors as the last reuses their checked views (the fast
    path); a tensor that since requires grad, or whose storage was swapped, is taken afresh."""
    g, w = torch.full((4096,), 2.0), torch.ones(4096)
    for _ in range(3):
        sgd(g=g, w=w, lr=0.125)
    assert torch.all(w == 0.25)
    w.data = torch.ones(4096)  # another storage under the same tensor
    sgd(g=g, w=w, lr=0.125)
    assert torch.all(w == 0.75), "the update lands in the tensor's new storage"
    w.requires_grad_()
    with pytest.raises(CocoError, match="input 'w'.*detach"):
        sgd(g=g, w=w, lr=0.125)
