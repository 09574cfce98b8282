"""Where ckpt_lab.checkpoint and torch.utils.checkpoint meet, and where they part on purpose.

Plain autograd is the oracle for gradients (bitwise on CPU fp32, dropout included);
``torch.utils.checkpoint`` shows what PyTorch does in the same case.
"""
import types
import warnings

import pytest
import torch
import torch.utils.checkpoint as tuc
from torch import nn

import ckpt_lab
from ckpt_lab import checkpoint

from custom_functions import ReadsTwice
from oracle import same


def test_the_module_is_a_module_and_calling_it_checkpoints():
    import ckpt_lab.checkpoint as module
    assert isinstance(module, types.ModuleType) and module is ckpt_lab.checkpoint
    assert module.checkpoint is not module and callable(module.checkpoint)
    x = torch.randn(3, requires_grad=True)
    checkpoint(torch.sin, x).sum().backward()
    assert torch.equal(x.grad, torch.cos(x))


def with_inner_grad(x):
    """Differentiates inside the function (a gradient penalty, a meta-learning step)."""
    a = x.sin().exp().sin()
    (ga,) = torch.autograd.grad(a.sum(), x, create_graph=True)
    return torch.nn.functional.dropout(ga * x.cos(), 0.3)


@pytest.mark.parametrize("early_stop", [True, False])
def test_torch_autograd_grad_inside_the_function(early_stop):
    x = torch.randn(7, requires_grad=True)

    def grad_of(run):
        torch.manual_seed(1)
        return torch.autograd.grad(run(x).square().sum(), x)[0]

    ref = grad_of(with_inner_grad)
    assert torch.equal(grad_of(lambda t: checkpoint(with_inner_grad, t, early_stop=early_stop)),
                       ref)
    assert torch.equal(grad_of(lambda t: tuc.checkpoint(with_inner_grad, t,
                                                        use_reentrant=False)), ref)


class KeepsMask(torch.autograd.Function):
    """a * m, saving m; records the tensor its backward gets back."""

    seen = []

    @staticmethod
    def forward(ctx, a, m):
        ctx.save_for_backward(m)
        return a * m

    @staticmethod
    def backward(ctx, g):
        (m,) = ctx.saved_tensors
        KeepsMask.seen.append(m)
        return g * m, None


@pytest.mark.parametrize("impl", ["hooks", "reentrant"])
def test_a_saved_input_without_grad_comes_back_as_the_same_object(impl):
    a = torch.randn(4, requires_grad=True)
    mask = torch.rand(4)
    KeepsMask.seen.clear()
    checkpoint(KeepsMask.apply, a, mask, impl=impl).sum().backward()
    assert KeepsMask.seen[-1] is mask
    KeepsMask.seen.clear()
    tuc.checkpoint(KeepsMask.apply, a, mask, use_reentrant=impl == "reentrant").sum().backward()
    assert (KeepsMask.seen[-1] is mask) == (impl == "hooks")   # torch's reentrant detaches it


def test_custom_function_reading_saved_tensors_twice():
    """torch raises; ckpt_lab hands back the tensors it already recomputed (two forwards)."""
    calls = []

    def f(x):
        calls.append(1)
        return ReadsTwice.apply(x.tanh())

    x = torch.randn(5, requires_grad=True)
    ref = torch.autograd.grad(f(x).sum(), x)[0]
    calls.clear()
    assert torch.equal(torch.autograd.grad(checkpoint(f, x).sum(), x)[0], ref)
    assert len(calls) == 2
    with pytest.raises(RuntimeError, match="already unpacked once"):
        tuc.checkpoint(f, x, use_reentrant=False).sum().backward()


def frozen_input_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))


def test_reentrant_without_a_grad_input_is_exact_where_torch_drops_parameter_grads():
    """The LoRA / frozen-embedding trap: the block's input does not require grad."""
    m = frozen_input_model()
    x = torch.randn(4, 8)                              # e.g. a frozen embedding's output
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = tuc.checkpoint(m, x, use_reentrant=True)
    assert not out.requires_grad                       # torch: no graph, no gradients at all
    ref = torch.autograd.grad(m(x).sum(), list(m.parameters()))
    for impl in ("reentrant", "hooks"):                # ckpt_lab: the parameters are inputs
        assert same(ref, torch.autograd.grad(checkpoint(m, x, impl=impl).sum(),
                                             list(m.parameters())))
    checkpoint(m, x.requires_grad_(), impl="reentrant").sum().backward()
    assert same(ref, [p.grad for p in m.parameters()])  # torch's fix: an input requiring grad


def test_no_output_requiring_grad_is_like_a_plain_run():
    m = frozen_input_model().requires_grad_(False)
    x = torch.randn(4, 8)
    out = checkpoint(m, x)
    assert not out.requires_grad and torch.equal(out, m(x))


def test_use_reentrant_is_refused_with_its_ckpt_lab_name():
    x = torch.randn(2, requires_grad=True)
    with pytest.raises(TypeError, match="impl="):
        checkpoint(torch.sin, x, use_reentrant=False)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(context_fn=False), TypeError, "callable that returns two context managers"),
    (dict(context_fn=lambda: None), TypeError, "tuple of two context managers"),
    (dict(context_fn=tuc.noop_context_fn, policy="save_matmuls"), ValueError, "not both"),
    (dict(determinism_check=False), ValueError, "'default', 'none', 'fingerprint'"),
])
def test_torch_arguments_with_bad_values_say_what_is_accepted(kwargs, error, match):
    x = torch.randn(2, requires_grad=True)
    with pytest.raises(error, match=match):
        checkpoint(torch.sin, x, **kwargs)


@pytest.mark.parametrize("impl", ["hooks", "reentrant"])
def test_a_grad_tensor_nested_in_a_list_gets_its_gradient(impl):
    """torch's reentrant checkpoint gives tensors nested in lists no gradient; ckpt_lab's
    flattens its arguments, so both designs give plain autograd's."""
    a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    f = lambda pair: torch.sin(pair[0] * pair[1])  # noqa: E731
    ref = torch.autograd.grad(f([a, b]).sum(), [a, b])
    assert same(ref, torch.autograd.grad(checkpoint(f, [a, b], impl=impl).sum(), [a, b]))


@pytest.mark.parametrize("impl", ["hooks", "reentrant"])
def test_minimal_designs_are_exact_without_randomness(impl):
    """The minimal forms of the file, as lesson 2 shows them: exact on a deterministic chain."""
    import ckpt_lab.checkpoint as ck
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh())
    x = torch.randn(5, 8, requires_grad=True)
    ref = torch.autograd.grad(m(x).sum(), [x, *m.parameters()])
    run = ck.minimal_reentrant if impl == "reentrant" else ck.minimal_hooks
    run(m, x).sum().backward()                 # reentrant: .backward() only, as in torch
    assert same(ref, [x.grad, *[p.grad for p in m.parameters()]])
