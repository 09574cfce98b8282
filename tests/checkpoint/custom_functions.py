"""Custom autograd Functions that more than one checkpoint test file drives."""
import torch


class ReadsTwice(torch.autograd.Function):
    """x * x whose backward reads ctx.saved_tensors twice."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        (b,) = ctx.saved_tensors
        return g * (a + b)
