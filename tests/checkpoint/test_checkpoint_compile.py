"""torch.compile of a function that calls ckpt_lab.checkpoint (catalogue class 7): the call is a
graph break, the checkpointed region runs eagerly, and training gets plain autograd's gradients
(bitwise under aot_eager; allclose under inductor, which fuses the code around it). Inductor
compiles C++ on CPU, so it gets one case."""
import pytest

from ckpt_lab.checkpoint.cases import CASES, RIGHT, outcome, reference

COMPILED = {c.name: c for c in CASES if c.cls == 7}
AOT = COMPILED["torch.compile, aot_eager"]


@pytest.mark.parametrize("design", ["ckpt_lab hooks", "ckpt_lab reentrant", "torch non-reentrant"])
def test_aot_eager_gives_plain_gradients(design):
    ref = reference(AOT)
    assert outcome(AOT, design, ref)[0] == RIGHT


def test_inductor_gives_plain_gradients():
    case = COMPILED["torch.compile, inductor"]
    assert outcome(case, "ckpt_lab hooks")[0] == RIGHT


@pytest.mark.parametrize("form", ["function", "callable module"])
def test_each_call_is_a_graph_break_and_the_code_around_it_compiles(form):
    """What compile makes of it: one graph break per call, graphs before, between and after.
    (Inside a loop Dynamo runs the enclosing frame eagerly instead: it cannot resume there.)"""
    import torch._dynamo
    from torch import nn
    from torch._dynamo.utils import counters

    import ckpt_lab
    ckpt = ckpt_lab.checkpoint.checkpoint if form == "function" else ckpt_lab.checkpoint
    torch.manual_seed(0)
    b1, b2 = (nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2))

    def f(x):
        x = ckpt(b1, x * 2)
        x = ckpt(b2, x * 2)
        return (x * 2).sum()

    x = torch.randn(4, 8, requires_grad=True)
    ref = torch.autograd.grad(f(x), [x, *b1.parameters(), *b2.parameters()])
    torch._dynamo.reset()
    counters.clear()
    out = torch.compile(f, backend="eager")(x)
    assert torch.equal(out, f(x))
    got = torch.autograd.grad(out, [x, *b1.parameters(), *b2.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert counters["stats"]["unique_graphs"] == 3
    assert sum(counters["graph_break"].values()) == 2
    torch._dynamo.reset()
