"""Non-tensor arguments (None, numbers, flags) pass through a checkpoint untouched, both designs."""
import pytest
import torch

from ckpt_lab import checkpoint


def fn(x, mask, scale, flag=None):
    y = x * x * scale
    if mask is not None:
        y = y * mask
    return y.sum() if flag is None else y.mean()


@pytest.mark.parametrize("impl", ["hooks", "reentrant"])
@pytest.mark.parametrize("mask", [None, "tensor"])
def test_none_and_numbers_between_tensors(impl, mask):
    x = torch.randn(5, 3, requires_grad=True)
    m = torch.rand(5, 3) if mask else None
    fn(x, m, 2.0).backward()
    expected, x.grad = x.grad, None
    checkpoint(fn, x, m, 2.0, impl=impl).backward()
    assert torch.equal(x.grad, expected)


def test_keyword_none_with_hooks():
    x = torch.randn(4, requires_grad=True)
    fn(x, None, 3, flag=None).backward()
    expected, x.grad = x.grad, None
    checkpoint(fn, x, None, 3, flag=None).backward()
    assert torch.equal(x.grad, expected)
