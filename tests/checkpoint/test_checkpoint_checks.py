"""The checks ckpt_lab.checkpoint layers on the two minimal designs, each against plain autograd.

Each test builds a case where a checkpoint without the check would give wrong gradients
silently: in-place edits (versions), random generators on nested arguments (RNG), a saved tensor
read twice, and the early-stop switch.
"""
import functools

import pytest
import torch
import torch.utils.checkpoint as tuc
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ckpt_lab import CheckpointError, checkpoint, checkpoint_sequential
from ckpt_lab.checkpoint.guards import probe

from custom_functions import ReadsTwice
from oracle import same

IMPLS = ["hooks", "reentrant"]


# ------------------------------------------------------------------------------- versions
def sigmoid_then_edit(x, edit=True):
    y = torch.sigmoid(x)
    z = y * x
    if edit:
        y.mul_(3)      # y was saved by sigmoid and by the multiply
    return z * x       # saves z: a recompute must run past the edit


@pytest.mark.parametrize("impl", IMPLS)
def test_saved_tensor_modified_in_place_inside_the_function_is_refused(impl):
    x = torch.randn(5, requires_grad=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        sigmoid_then_edit(x).sum().backward()              # plain autograd refuses
    y = checkpoint(sigmoid_then_edit, x, impl=impl).sum()
    with pytest.raises(CheckpointError, match="modified in place.*out-of-place"):
        y.backward()


def test_torch_returns_a_wrong_gradient_where_plain_autograd_refuses():
    """Why the check exists: the oracle itself is silently wrong here (z was computed before
    the edit, so the right gradient is that of the function without it)."""
    x = torch.randn(5, requires_grad=True)
    right = torch.autograd.grad(sigmoid_then_edit(x, edit=False).sum(), x)[0]
    tuc.checkpoint(sigmoid_then_edit, x, use_reentrant=False).sum().backward()
    assert not torch.allclose(x.grad, right)


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6))


class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = small_model()

    def run(self, x):
        return self.body(x)


GLOBAL_MODEL = small_model()


def through_global(x):
    return GLOBAL_MODEL(x)


def callers():
    """The same model reached as a module, a bound method, a closure, a partial, a global."""
    m = small_model()
    w = Wrapper()
    forward = m.forward                 # what checkpoint_modules wraps: a module's bound forward
    return {
        "bound method in a closure": ((lambda x: forward(x)), m),
        "module": (m, m),
        "bound method": (w.run, w.body),
        "closure": ((lambda x: torch.relu(m(x))), m),
        "partial": (functools.partial(lambda mod, x: mod(x), m), m),
        "global": (through_global, GLOBAL_MODEL),
    }


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("how", list(callers()))
def test_optimizer_step_between_forward_and_backward_is_refused(impl, how):
    fn, model = callers()[how]
    x = torch.randn(3, 6, requires_grad=True)
    model(x).sum().backward()                         # gradients for the optimizer to use
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    y = checkpoint(fn, x, impl=impl).sum()
    opt.step()                                        # before backward: the classic mistake
    with pytest.raises(CheckpointError, match=r"parameter '.*weight' of .*optimizer step"):
        y.backward()


@pytest.mark.parametrize("impl", IMPLS)
def test_a_bias_no_op_saves_is_still_checked(impl):
    """Plain autograd never saves a Linear's bias, so it cannot object; the recompute would use
    the new bias for the tanh it saves, so the checkpoint must."""
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    y = checkpoint(lambda t: torch.tanh(lin(t)), x, impl=impl).sum()
    with torch.no_grad():
        lin.bias.add_(1.0)
    with pytest.raises(CheckpointError, match="parameter 'bias' of Linear"):
        y.backward()


CPU_AND_CUDA = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_captured_saved_tensor_modified_before_backward_is_refused(device):
    c = torch.randn(5, device=device) * 1.0
    x = torch.randn(5, device=device, requires_grad=True)
    y = (x * c).sum()
    c.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()                                  # plain autograd: the mul saved c
    c = torch.randn(5, device=device) * 1.0
    y = checkpoint(lambda t: t * c, x).sum()
    c.add_(1)
    with pytest.raises(CheckpointError, match=r"saved for backward \(\(5,\), float32\)"):
        y.backward()


def test_keyword_and_nested_tensor_arguments_are_version_checked():
    x = torch.randn(4, requires_grad=True)

    def f(t, pair, scale=None):
        return torch.tanh(t + pair[1] * scale)

    b, s = torch.randn(4), torch.randn(4)
    y = checkpoint(f, x, [None, b], scale=s).sum()
    s.mul_(2)
    with pytest.raises(CheckpointError, match="keyword argument 'scale'"):
        y.backward()
    y = checkpoint(f, x, [None, b], scale=torch.randn(4)).sum()
    b.mul_(2)
    with pytest.raises(CheckpointError, match=r"argument 1\[1\]"):
        y.backward()


@pytest.mark.parametrize("impl", IMPLS)
def test_batch_norm_update_in_the_recompute_is_not_an_edit(impl):
    """BatchNorm saves its running statistics and the recompute updates them again: a second
    backward (retain_graph) must not mistake that for an in-place edit."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Tanh())
    x = torch.randn(8, 4, requires_grad=True)
    ref = torch.autograd.grad(m(x).sum(), x)[0]
    y = checkpoint(m, x, impl=impl).sum()
    y.backward(retain_graph=True)
    first = x.grad.clone()
    y.backward()
    assert torch.equal(first, ref) and torch.equal(x.grad, 2 * ref)


def test_probe_shares_the_version_counter_without_the_memory():
    t = torch.randn(256, 256) * 1.0
    alias = probe(t)
    assert alias.untyped_storage().nbytes() == 0
    v = t._version
    t[0].add_(1)                                       # through a view
    assert alias._version == t._version == v + 1


# ------------------------------------------------------------------------------------ RNG
def dropout_pair(pair, scale):
    a, b = pair
    return nn.functional.dropout(a * scale["s"], 0.5) + nn.functional.dropout(b, 0.5)


@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_dropout_on_tensors_nested_in_lists_and_dicts_is_replayed(device):
    """Only nested tensors say which CUDA generator to replay (today's torch looks at top-level
    arguments only)."""
    torch.manual_seed(0)
    a = torch.randn(64, 16, device=device, requires_grad=True)
    b = torch.randn(64, 16, device=device, requires_grad=True)
    s = torch.randn(16, device=device)

    def grads(run):
        a.grad = b.grad = None
        torch.manual_seed(7)
        run().square().sum().backward()
        return [a.grad, b.grad]

    ref = grads(lambda: dropout_pair([a, b], {"s": s}))
    ours = grads(lambda: checkpoint(dropout_pair, [a, b], {"s": s}))
    assert same(ref, ours)


class OnOtherDevice(torch.Tensor):
    """A storage-less tensor that says it lives on an MPS device (to test the refusal on CPU)."""

    @staticmethod
    def __new__(cls):
        return torch.Tensor._make_wrapper_subclass(cls, (2,), device=torch.device("mps"),
                                                   dtype=torch.float32)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"{func} on a pretend device")


@pytest.mark.parametrize("impl", IMPLS)
def test_device_whose_generator_is_not_replayed_is_refused(impl):
    x = torch.randn(2, requires_grad=True)
    with pytest.raises(CheckpointError, match="device 'mps'.*preserve_rng_state=False"):
        checkpoint(lambda t, extra: t * 2, x, {"k": [OnOtherDevice()]}, impl=impl)


# -------------------------------------------------------------- a saved tensor read twice


def test_a_saved_tensor_read_twice_needs_no_third_forward():
    calls = []

    def f(x):
        calls.append(1)
        return ReadsTwice.apply(torch.sin(x)).exp()

    x = torch.randn(6, requires_grad=True)
    ref = torch.autograd.grad(f(x).sum(), x)[0]
    calls.clear()
    y = checkpoint(f, x).sum()
    y.backward(retain_graph=True)
    assert len(calls) == 2 and torch.equal(x.grad, ref)       # forward + one recompute
    y.backward()                                              # a new backward recomputes once
    assert len(calls) == 3 and torch.equal(x.grad, 2 * ref)


# ------------------------------------------------------------------------------ early stop
class CountOp(TorchDispatchMode):
    """Counts the calls of one ATen op while active."""

    def __init__(self, op):
        super().__init__()
        self.op, self.n = op, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func.overloadpacket is self.op
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("early_stop", [True, False])
def test_early_stop_switch(early_stop):
    """tanh saves its output, the last tensor backward needs: with early stop the recompute
    ends there and never runs the rest of the function (neg, which saves nothing)."""
    f = lambda x: torch.tanh(x).neg()  # noqa: E731
    x = torch.randn(5, requires_grad=True)
    ref = torch.autograd.grad(f(x).sum(), x)[0]
    out = checkpoint(f, x, early_stop=early_stop).sum()
    with CountOp(torch.ops.aten.neg) as counted:
        out.backward()
    assert counted.n == (1 if early_stop else 2)          # backward's own neg (+ the recompute's)
    assert torch.equal(x.grad, ref)


def test_early_stop_gives_the_same_gradients_through_checkpoint_sequential():
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Dropout(0.2))
                        for _ in range(4)])
    x = torch.randn(5, 8)

    def grads(**kw):
        m.zero_grad(set_to_none=True)
        torch.manual_seed(3)
        checkpoint_sequential(m, x, segments=2, **kw).sum().backward()
        return [p.grad for p in m.parameters()]

    assert same(grads(early_stop=True), grads(early_stop=False))


def _poison_freed_memory(shape):
    """Allocate and free tensors full of 7s, as the rest of a training step would between
    forward and backward: an uninitialised buffer then holds 7s, not last step's values."""
    junk = [torch.full(shape, 7.0) for _ in range(32)]
    del junk


RRELU_NETS = {   # where RReLU's save falls among the last saved tensors
    "rrelu alone": lambda: nn.Sequential(nn.RReLU()),
    "linear, rrelu": lambda: nn.Sequential(nn.Linear(16, 16), nn.RReLU()),
    "twice": lambda: nn.Sequential(nn.Linear(16, 16), nn.RReLU(), nn.Linear(16, 16), nn.RReLU()),
    "rrelu, then linear": lambda: nn.Sequential(nn.RReLU(), nn.Linear(16, 16)),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("early_stop", [True, False])
@pytest.mark.parametrize("net", list(RRELU_NETS))
def test_an_op_that_fills_a_buffer_it_saved_runs_before_the_recompute_stops(
        impl, early_stop, net):
    """rrelu_with_noise saves its noise buffer, then fills it with a random slope per negative
    input. Stopping the recompute at its save hands backward an uninitialised buffer; the
    op must run first. Oracle: plain autograd, and PyTorch's checkpoint without early stop."""
    torch.manual_seed(0)
    net = RRELU_NETS[net]()
    x = torch.randn(32, 16, requires_grad=True)

    def grads(run):
        net.zero_grad(set_to_none=True)
        x.grad = None
        torch.manual_seed(1)
        out = run()
        _poison_freed_memory((32, 16))
        out.sum().backward()
        return [x.grad] + [p.grad for p in net.parameters()]

    plain = grads(lambda: net(x))
    with tuc.set_checkpoint_early_stop(False):
        oracle = grads(lambda: tuc.checkpoint(net, x, use_reentrant=False))
    kw = {"early_stop": early_stop} if impl == "hooks" else {}
    ours = grads(lambda: checkpoint(net, x, impl=impl, **kw))
    assert same(plain, oracle) and same(plain, ours)


def test_early_stop_still_skips_a_last_op_that_only_reads():
    """The stop waits for an op that writes what it saved, not for one that only reads: the
    last product of an attention core saves its inputs and is never re-run (lesson 4)."""
    q, k, v = (torch.randn(2, 3, 8, 4, requires_grad=True) for _ in range(3))
    core = lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1) @ v  # noqa: E731
    counts = {}
    for early_stop in (True, False):
        out = checkpoint(core, q, k, v, early_stop=early_stop).sum()
        with CountOp(torch.ops.aten.bmm) as counted:
            out.backward()
        counts[early_stop] = counted.n
    assert counts == {True: 1 + 4, False: 2 + 4}     # recompute + 4 in backward


def test_a_hook_the_function_removes_after_its_last_save_is_not_left_behind():
    """The recompute stops early, before the removal (note 11): the hook it registered is
    removed all the same, and the module runs as before."""
    lin = nn.Linear(5, 5)

    def f(x):
        handle = lin.register_forward_hook(lambda m, i, o: o * 2)
        y = torch.tanh(lin(x)).neg()
        handle.remove()
        return y

    x = torch.randn(5, requires_grad=True)
    ref = torch.autograd.grad(f(x).sum(), x)[0]
    out = checkpoint(f, x).sum()
    with CountOp(torch.ops.aten.neg) as counted:
        out.backward()
    assert counted.n == 1 and torch.equal(x.grad, ref)      # stopped before neg
    assert not lin._forward_hooks


# ------------------------------------------------------- plain attributes of modules (note 5)
class Switchy(nn.Module):
    """Reads a flag and a tensor attribute that no buffer holds."""

    def __init__(self):
        super().__init__()
        self.lin, self.scale = nn.Linear(4, 4), torch.tensor(2.0)

    def forward(self, x):
        y = torch.tanh(self.lin(x))
        return torch.dropout(y, 0.5, self.training) * self.scale


@pytest.mark.parametrize("impl", IMPLS)
def test_attributes_changed_between_forward_and_backward_are_the_forwards_in_the_recompute(
        impl):
    """model.eval() and a new tensor attribute before backward: the recompute sees what the
    forward saw (plain autograd's graph holds it), and the module keeps its new state."""
    torch.manual_seed(0)
    model, x = Switchy(), torch.randn(8, 4, requires_grad=True)

    def grads(run):
        model.train()
        model.scale = torch.tensor(2.0)
        x.grad = None
        torch.manual_seed(1)
        out = run(model, x)
        model.eval()
        model.scale = torch.tensor(3.0)
        out.square().sum().backward()
        return [x.grad, *[p.grad.clone() for p in model.parameters()]]

    plain = grads(lambda m, t: m(t))
    model.zero_grad(set_to_none=True)
    assert same(plain, grads(lambda m, t: checkpoint(m, t, impl=impl)))
    assert not model.training and model.scale.item() == 3.0


@pytest.mark.parametrize("impl", IMPLS)
def test_hugging_face_dynamic_rope_is_exact(impl):
    """LlamaRotaryEmbedding with rope_type="dynamic" re-registers inv_freq and records the
    length in max_seq_len_cached in its forward (issue 28, item 2)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    config = transformers.LlamaConfig(
        hidden_size=8, num_attention_heads=2, max_position_embeddings=4,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    positions = torch.arange(9)[None]

    def grad(wrap):
        rope = LlamaRotaryEmbedding(config)
        x = torch.randn(1, 9, 4, generator=torch.Generator().manual_seed(0),
                        requires_grad=True)

        def f(t):
            cos, sin = rope(t, positions)
            return torch.tanh(t * cos + t.flip(-1) * sin)

        wrap(f, x).square().sum().backward()
        return [x.grad, rope.inv_freq, torch.tensor(rope.max_seq_len_cached)]

    assert same(grad(lambda f, t: f(t)), grad(lambda f, t: checkpoint(f, t, impl=impl)))
