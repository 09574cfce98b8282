"""Forward-mode AD through a checkpoint (exact in both designs, as torch's non-reentrant one is)
and torch.func transforms (refused with what to do instead; exact the other way round)."""
import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.utils.checkpoint as tuc
from torch import nn

from ckpt_lab import CheckpointError, checkpoint

IMPLS = ["hooks", "reentrant"]


def _block():
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    return lambda t: torch.tanh(lin(t)).exp()


def _tangent(wrap, f, x, v):
    with fwAD.dual_level():
        return fwAD.unpack_dual(wrap(f, fwAD.make_dual(x, v))).tangent


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("impl", IMPLS)
def test_forward_mode_ad_gives_plain_tangents(impl, requires_grad):
    f, v = _block(), torch.randn(3, 4)
    x = torch.randn(3, 4, requires_grad=requires_grad)
    plain = _tangent(lambda g, t: g(t), f, x, v)
    assert torch.equal(_tangent(lambda g, t: checkpoint(g, t, impl=impl), f, x, v), plain)
    assert torch.equal(_tangent(lambda g, t: tuc.checkpoint(g, t, use_reentrant=False), f, x, v),
                       plain)


@pytest.mark.parametrize("impl", IMPLS)
def test_inside_a_torch_func_transform_it_refuses_and_says_what_to_do(impl):
    f, xs = _block(), torch.randn(5, 3, 4)
    with pytest.raises(CheckpointError, match=r"inside a torch.func transform.*"
                                              r"checkpoint\(torch.func.vmap\(f\), x\)"):
        torch.func.vmap(lambda t: checkpoint(f, t, impl=impl))(xs)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_transform_inside_the_checkpoint_is_exact(impl):
    f = _block()
    xs = torch.randn(5, 3, 4, requires_grad=True)
    plain = torch.autograd.grad(torch.func.vmap(f)(xs).square().sum(), xs)
    ours = torch.autograd.grad(checkpoint(torch.func.vmap(f), xs, impl=impl).square().sum(), xs)
    assert torch.equal(plain[0], ours[0])
