"""ckpt_lab.checkpoint against a plain run and against torch.utils.checkpoint (the oracle)."""
import pytest
import torch
import torch.utils.checkpoint as tuc
from torch import nn

from ckpt_lab import CheckpointError, checkpoint, checkpoint_sequential, track_memory
from ckpt_lab.checkpoint import segment_starts
from oracle import same

IMPLS = ["hooks", "reentrant"]


def chain(depth=6, width=32, p=0.2, seed=0):
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh(), nn.Dropout(p)]
    return nn.Sequential(*layers)


def grads_of(model, x, run, seed=123):
    """Gradients of input and parameters after backward of a fixed loss."""
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    torch.manual_seed(seed)
    run(model, x).pow(2).sum().backward()
    return [x.grad] + [p.grad for p in model.parameters()]


X = torch.randn(16, 32)


def plain(m, x):
    return m(x)


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpoint_bitwise_equal_with_dropout(impl):
    m = chain()
    ref = grads_of(m, X, plain)
    ours = grads_of(m, X, lambda m, x: checkpoint(m, x, impl=impl))
    oracle = grads_of(m, X, lambda m, x: tuc.checkpoint(m, x, use_reentrant=impl == "reentrant"))
    assert same(ref, ours)
    assert same(oracle, ours)


@pytest.mark.parametrize("impl", IMPLS)
def test_without_rng_preservation_dropout_masks_differ(impl):
    m = chain()
    ref = grads_of(m, X, plain)
    off = grads_of(m, X, lambda m, x: checkpoint(m, x, impl=impl, preserve_rng_state=False))
    assert not same(ref, off)
    m.eval()  # no randomness: then it does not matter
    assert same(grads_of(m, X, plain),
                grads_of(m, X, lambda m, x: checkpoint(m, x, impl=impl, preserve_rng_state=False)))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("segments", [1, 2, 3, 5, 18])
def test_checkpoint_sequential_matches_plain_and_torch(impl, segments):
    m = chain()
    ref = grads_of(m, X, plain)
    ours = grads_of(m, X, lambda m, x: checkpoint_sequential(m, x, segments=segments, impl=impl))
    oracle = grads_of(m, X, lambda m, x: tuc.checkpoint_sequential(
        m, segments, x, use_reentrant=impl == "reentrant"))
    assert same(ref, ours)
    assert same(oracle, ours)


def peak(run, model, x):
    x = x.detach().clone().requires_grad_()
    torch.manual_seed(0)
    with track_memory() as mem:
        run(model, x).pow(2).sum().backward()
    model.zero_grad(set_to_none=True)
    return mem.peak_bytes


@pytest.mark.parametrize("impl", IMPLS)
def test_peak_within_one_percent_of_torch_at_every_segment_count(impl):
    torch.manual_seed(0)
    m = chain(depth=8, width=64)
    x = torch.randn(64, 64)
    n = len(m)
    for segments in range(1, n + 1):
        ours = peak(lambda m, x: checkpoint_sequential(m, x, segments=segments, impl=impl), m, x)
        theirs = peak(lambda m, x: tuc.checkpoint_sequential(
            m, segments, x, use_reentrant=impl == "reentrant"), m, x)
        assert abs(ours - theirs) <= 0.01 * theirs, (segments, ours, theirs)


def test_checkpointing_saves_memory_in_a_deep_chain():
    torch.manual_seed(0)
    m = chain(depth=16, width=64, p=0.0)
    x = torch.randn(1024, 64)   # activations dominate the parameter gradients
    full = peak(plain, m, x)
    four = peak(lambda m, x: checkpoint_sequential(m, x, segments=4), m, x)
    assert four < 0.6 * full


def test_boundaries_equal_segments_and_last_segment_is_plain():
    m = chain()
    n = len(m)
    assert segment_starts(n, segments=3) == [0, 6, 12]
    assert segment_starts(n, boundaries=[0, 6, 12]) == segment_starts(n, boundaries=[6, 12])
    assert segment_starts(7, segments=3) == [0, 2, 4]  # the last segment takes the remainder
    ref = grads_of(m, X, plain)
    ours = grads_of(m, X, lambda m, x: checkpoint_sequential(m, x, boundaries=[0, 5, 11]))
    assert same(ref, ours)
    # one segment = nothing checkpointed: same peak as no checkpoint at all
    torch.manual_seed(0)
    assert peak(lambda m, x: checkpoint_sequential(m, x, segments=1), m, X) == peak(plain, m, X)


@pytest.mark.parametrize("kwargs,match", [
    (dict(segments=0), "between 1 and"),
    (dict(segments=19), "between 1 and"),
    (dict(segments=2.0), "between 1 and"),
    (dict(boundaries=[]), "empty"),
    (dict(boundaries=[0, 5, 5]), "strictly increasing"),
    (dict(boundaries=[0, 30]), "strictly increasing"),
    (dict(), "exactly one"),
    (dict(segments=2, boundaries=[0, 3]), "exactly one"),
])
def test_checkpoint_sequential_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        checkpoint_sequential(chain(), X, **kwargs)


def test_non_modules_are_rejected():
    with pytest.raises(ValueError, match="not an nn.Module"):
        checkpoint_sequential([nn.ReLU(), torch.relu], X, segments=1)


def test_unknown_impl():
    with pytest.raises(ValueError, match="impl must be one of"):
        checkpoint(torch.relu, X, impl="magic")


def test_hooks_support_autograd_grad_kwargs_and_inputs_without_grad():
    torch.manual_seed(0)
    lin = nn.Linear(32, 32)

    def f(x, scale=1.0, bias=None):
        return torch.tanh(lin(x) * scale + bias)

    x = torch.randn(4, 32)            # no requires_grad: parameters still get gradients
    b = torch.randn(32, requires_grad=True)
    y_ref = f(x, scale=2.0, bias=b).sum()
    ref = torch.autograd.grad(y_ref, [lin.weight, b])
    y = checkpoint(f, x, scale=2.0, bias=b).sum()
    ours = torch.autograd.grad(y, [lin.weight, b])
    assert same(list(ref), list(ours))


def test_reentrant_does_what_torch_reentrant_cannot():
    """No input requiring grad, tensors as keyword arguments, torch.autograd.grad: the
    reentrant node takes the parameters the forward read (and keyword tensors) as inputs and
    differentiates its recompute with torch.autograd.grad, so each matches plain autograd."""
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    x0 = torch.randn(2, 4)
    ref = torch.autograd.grad(lin(x0).tanh().sum(), list(lin.parameters()))
    ours = torch.autograd.grad(checkpoint(lambda t: lin(t).tanh(), x0, impl="reentrant").sum(),
                               list(lin.parameters()))
    assert same(list(ref), list(ours))
    x = torch.randn(2, 4, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    f = lambda x, b: torch.tanh(lin(x) + b)  # noqa: E731
    ref = torch.autograd.grad(f(x, b).sum(), [x, b, lin.weight])
    ours = torch.autograd.grad(checkpoint(f, x, impl="reentrant", b=b).sum(),
                               [x, b, lin.weight])
    assert same(list(ref), list(ours))


@pytest.mark.parametrize("impl", IMPLS)
def test_input_modified_in_place_before_backward_is_caught(impl):
    lin = nn.Linear(8, 8)
    h = torch.randn(3, 8, requires_grad=True) * 1.0   # a non-leaf, so in-place is allowed
    y = checkpoint(lambda t: torch.tanh(lin(t)), h, impl=impl)
    h.mul_(2)
    with pytest.raises((CheckpointError, RuntimeError), match="modified|inplace"):
        y.sum().backward()


def test_in_place_op_on_the_input_inside_the_function_is_caught():
    lin = nn.Linear(8, 8)
    h = torch.randn(3, 8, requires_grad=True) * 1.0

    def f(t):
        t.mul_(2)          # changes the checkpoint's own input: the recompute would differ
        return torch.tanh(lin(t))

    y = checkpoint(f, h)
    with pytest.raises(CheckpointError, match="modified in place"):
        y.sum().backward()


@pytest.mark.parametrize("impl", IMPLS)
def test_recompute_with_a_different_shape_is_caught(impl):
    calls = []

    def f(x):
        calls.append(1)
        k = 4 if len(calls) == 1 else 3     # misbehaves on the second call
        return torch.tanh(x[:, :k]) * 2

    x = torch.randn(2, 6, requires_grad=True)
    y = checkpoint(f, x, impl=impl)
    with pytest.raises(CheckpointError, match="shape|dtype|saved"):
        y.sum().backward()


def test_nested_checkpoints_are_exact():
    m = chain(depth=4)

    def outer(x):
        x = checkpoint(m[:6], x)
        return checkpoint(m[6:], x)

    ref = grads_of(m, X, plain)
    assert same(ref, grads_of(m, X, lambda m, x: checkpoint(outer, x)))
    assert same(ref, grads_of(m, X, lambda m, x: checkpoint(outer, x, impl="reentrant")))


def test_no_grad_runs_plainly():
    lin = nn.Linear(4, 4)
    with torch.no_grad():
        y = checkpoint(lin, torch.randn(2, 4))
    assert y.grad_fn is None


def test_retain_graph_allows_a_second_backward():
    m = chain(depth=2, p=0.0)
    x = torch.randn(3, 32, requires_grad=True)
    y = checkpoint(m, x).sum()
    y.backward(retain_graph=True)
    first = x.grad.clone()
    y.backward()
    assert torch.equal(x.grad, 2 * first)


@pytest.mark.parametrize("impl", IMPLS)
def test_autocast_state_is_replayed(impl):
    m = chain(depth=2, p=0.0)
    x = torch.randn(4, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ref = m(x).float().sum()
    y_ref.backward()
    ref = x.grad.clone()
    x.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = checkpoint(m, x, impl=impl).float().sum()
    y.backward()
    assert torch.equal(ref, x.grad)
