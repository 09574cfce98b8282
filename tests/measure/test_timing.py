"""timing.forward_share: the part of a step spent in given modules' forwards."""
import time

import pytest
import torch
from torch import nn

from ckpt_lab.measure.timing import forward_share


class Sleep(nn.Module):
    """A module whose forward takes `seconds`: a clock the test controls."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def forward(self, x):
        time.sleep(self.seconds)
        return x


def test_share_is_the_fraction_of_the_step_spent_in_the_modules():
    a, b = Sleep(0.03), Sleep(0.01)
    step = lambda: b(a(torch.ones(1)))
    assert 0.65 < forward_share(step, [a], repeats=3) < 0.8        # 3 of 4 parts
    assert 0.9 < forward_share(step, [a, b], repeats=3) <= 1.0
    assert 0.15 < forward_share(step, [b], repeats=3) < 0.3


def test_hooks_are_removed_even_when_the_step_fails():
    a = Sleep(0.0)

    def step():
        a(torch.ones(1))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        forward_share(step, [a])
    assert not a._forward_hooks and not a._forward_pre_hooks


def test_bad_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="at least one module"):
        forward_share(lambda: None, [])
    with pytest.raises(ValueError, match="repeats"):
        forward_share(lambda: None, [Sleep(0.0)], repeats=0)
