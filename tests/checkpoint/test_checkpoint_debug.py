"""``debug=True``: a refused recompute shows the operations of both runs, where they part."""
import pytest
import torch

from ckpt_lab import CheckpointError, checkpoint


class Narrowing:
    """Branches on a call counter: the recompute takes a narrower slice than the forward."""

    def __init__(self):
        self.calls = 0

    def __call__(self, t):
        self.calls += 1
        return torch.tanh(t[:, : 6 - self.calls]).exp()


@pytest.mark.parametrize("impl", ["hooks", "reentrant"])
def test_debug_shows_both_runs_and_marks_where_they_part(impl):
    x = torch.randn(3, 6, requires_grad=True)
    out = checkpoint(Narrowing(), x, impl=impl, debug=True)
    with pytest.raises(CheckpointError) as refused:
        out.sum().backward()
    text = str(refused.value)
    assert "in the recompute" in text                         # the check's own message first
    forward, recompute = text.split("The forward:\n")[1].split("\nThe recompute:\n")
    assert "aten.tanh" in forward and "aten.tanh" in recompute
    marked = [line for line in forward.splitlines() if line.startswith(">>")]
    assert len(marked) == 1 and "aten.slice" in marked[0] and "(3, 5)" in marked[0]
    assert "test_checkpoint_debug.py:" in marked[0]          # the caller's line


def test_without_debug_the_refusal_has_no_trace():
    x = torch.randn(3, 6, requires_grad=True)
    out = checkpoint(Narrowing(), x)
    with pytest.raises(CheckpointError) as refused:
        out.sum().backward()
    assert "debug=True" not in str(refused.value)


def test_debug_changes_no_gradient():
    x = torch.randn(3, 6, requires_grad=True)
    f = lambda t: torch.tanh(t).exp().sum()  # noqa: E731
    (plain,) = torch.autograd.grad(f(x), x)
    (ours,) = torch.autograd.grad(checkpoint(f, x, debug=True), x)
    assert torch.equal(plain, ours)
