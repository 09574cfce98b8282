"""Recursive bisection: exact gradients, O(log L) measured peak, L log L measured forward work."""
import math

import pytest
import torch
from torch import nn

from ckpt_lab import checkpoint_recursive, checkpoint_sequential, track_memory
from ckpt_lab.plan.formulas import bisection_cost

IMPLS = ["hooks", "reentrant"]
BATCH, WIDTH = 8, 16
ACT_BYTES = BATCH * WIDTH * 4  # one fp32 activation between two layers


class Counted(nn.Module):
    """A frozen Linear + tanh that records each forward call, so recompute work is counted.

    With the weight frozen, the layer keeps exactly one activation for backward (tanh's
    output), which makes peaks read directly in units of ACT_BYTES.
    """

    def __init__(self, calls: list):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH).requires_grad_(False)
        self.calls = calls

    def forward(self, x):
        self.calls.append(1)
        return torch.tanh(self.lin(x))


def counted_chain(n):
    torch.manual_seed(0)
    calls = []
    return [Counted(calls) for _ in range(n)], calls


def measure(run, layers, calls):
    """Peak bytes and layer forwards of one forward+backward."""
    calls.clear()
    x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(0)).requires_grad_()
    with track_memory() as mem:
        run(layers, x).pow(2).sum().backward()
    return mem.peak_bytes, len(calls)


def grads(model, step, seed=5):
    model.zero_grad(set_to_none=True)
    x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(1)).requires_grad_()
    torch.manual_seed(seed)
    step(model, x).pow(2).sum().backward()
    return [x.grad] + [p.grad for p in model.parameters()]


def dropout_chain(n):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Dropout(0.2))
                           for _ in range(n)])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n,min_layers", [(12, 1), (13, 3), (5, 5)])
def test_gradients_bitwise_equal_to_plain(impl, n, min_layers):
    m = dropout_chain(n)
    ref = grads(m, lambda m, x: m(x))
    ours = grads(m, lambda m, x: checkpoint_recursive(m, x, min_layers=min_layers, impl=impl))
    assert all(torch.equal(a, b) for a, b in zip(ref, ours))


@pytest.mark.parametrize("impl", IMPLS)
def test_forward_work_grows_as_l_log_l(impl):
    for n in (16, 32, 64):
        layers, calls = counted_chain(n)
        _, forwards = measure(lambda ls, x: checkpoint_recursive(ls, x, impl=impl),
                              layers, calls)
        # One forward plus (L/2) log2 L recomputed layers, as formulas.bisection_cost predicts.
        assert forwards == n + n * int(math.log2(n)) // 2
        assert forwards == n + bisection_cost(n, ACT_BYTES, ACT_BYTES).recompute_layers


@pytest.mark.parametrize("impl", IMPLS)
def test_peak_grows_logarithmically(impl):
    peaks = {}
    for n in (16, 32, 64):
        layers, calls = counted_chain(n)
        peaks[n], _ = measure(lambda ls, x: checkpoint_recursive(ls, x, impl=impl),
                              layers, calls)
    plain, _ = measure(lambda ls, x: nn.Sequential(*ls)(x), *counted_chain(64))
    sqrt_seq, _ = measure(lambda ls, x: checkpoint_sequential(ls, x, segments=8, impl=impl),
                          *counted_chain(64))
    # Doubling the depth adds the same few activations each time: log growth, not sqrt or linear.
    step = peaks[32] - peaks[16]
    assert peaks[64] - peaks[32] == step
    assert 0 < step <= 2 * ACT_BYTES
    assert peaks[64] < sqrt_seq < plain
    assert peaks[64] < plain / 4


def test_hooks_peak_follows_the_formula_up_to_a_constant():
    # The formula counts kept inputs and one layer's activations; the measurement adds the
    # two gradient buffers live in backward and the scalar loss with its seed gradient, the
    # same bytes whatever the depth.
    offsets = set()
    for n in (16, 32, 64):
        layers, calls = counted_chain(n)
        peak, _ = measure(lambda ls, x: checkpoint_recursive(ls, x), layers, calls)
        offsets.add(peak - bisection_cost(n, ACT_BYTES, ACT_BYTES).peak_bytes)
    assert len(offsets) == 1 and 0 <= offsets.pop() <= 2 * ACT_BYTES + 8


def test_min_layers_at_least_the_depth_is_a_plain_run():
    layers, calls = counted_chain(8)
    plain = measure(lambda ls, x: nn.Sequential(*ls)(x), layers, calls)
    assert measure(lambda ls, x: checkpoint_recursive(ls, x, min_layers=8), layers, calls) == plain


def test_bad_arguments_get_clear_errors():
    x = torch.randn(2, WIDTH, requires_grad=True)
    m = dropout_chain(4)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="min_layers"):
            checkpoint_recursive(m, x, min_layers=bad)
    with pytest.raises(ValueError, match="at least one layer"):
        checkpoint_recursive([], x)
    with pytest.raises(ValueError, match="nn.Module"):
        checkpoint_recursive([torch.tanh], x)
    with pytest.raises(ValueError, match="impl"):
        checkpoint_recursive(m, x, impl="nested")
