"""A subset of PyTorch's own checkpoint tests, ported to ckpt_lab.

The originals are ``TestCheckpoint`` in PyTorch's test/test_utils.py and the checkpoint tests
of test/test_autograd.py (``TestAutograd``, ``TestNestedCheckpoint``), for torch 2.13; each test
here is named after the one it ports. They call ``ckpt_lab.checkpoint`` where PyTorch's call
``torch.utils.checkpoint.checkpoint`` (``use_reentrant=True`` is ``impl="reentrant"``) and assert
what PyTorch's assert, bit for bit where those compare values. Where ckpt_lab differs on purpose
(ckpt_lab/checkpoint/NOTES.md, note 15) the port asserts ckpt_lab's documented behaviour
instead, and its docstring says so. Tiny tensors throughout: the whole file runs in seconds.
"""
import contextlib

import pytest
import torch
import torch.utils.checkpoint as tuc
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ckpt_lab import CheckpointError, checkpoint, checkpoint_sequential
from oracle import same

IMPLS = ["hooks", "reentrant"]


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 10), nn.ReLU(), nn.Linear(10, 6), nn.ReLU(),
                         nn.Linear(6, 3), nn.ReLU())


def _grads(model, x, run):
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    out = run(x)
    out.sum().backward()
    return [out.detach(), x.grad] + [p.grad for p in model.parameters()]


# ------------------------------------------------------------------ test/test_utils.py
class _Counted(nn.Module):
    def __init__(self, calls):
        super().__init__()
        self.calls = calls

    def forward(self, x):
        self.calls.append(self)
        return x * torch.tensor(2.0)


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpoint_trigger(impl):
    """The first half of ten modules runs twice, the last segment once. (PyTorch's test counts
    in an attribute the forward increments; ckpt_lab replays module attributes, so such a
    counter reads as after one forward, as without a checkpoint: note 5. Counted outside.)"""
    calls = []
    modules = [_Counted(calls) for _ in range(10)]
    out = checkpoint_sequential(modules, torch.randn(3, 4, requires_grad=True), segments=2,
                                impl=impl)
    assert [calls.count(m) for m in modules] == [1] * 10
    out.sum().backward()
    assert [calls.count(m) for m in modules] == [2] * 5 + [1] * 5


def test_checkpoint_valid():
    """A reentrant checkpoint in a create_graph=True backward is refused (PyTorch: "torch.utils.
    checkpoint is incompatible"); the hooks design gives plain autograd's gradients."""
    model, x = _mlp(), torch.randn(1, 20, requires_grad=True)
    layers = list(model.children())
    out = checkpoint_sequential(layers, x, segments=2, impl="reentrant")
    with pytest.raises(CheckpointError, match="create_graph=True"):
        torch.autograd.grad(out, x, torch.ones(1, 3), create_graph=True)
    plain = torch.autograd.grad(model(x), x, torch.ones(1, 3), create_graph=True)
    ours = torch.autograd.grad(checkpoint_sequential(layers, x, segments=2, impl="hooks"), x,
                               torch.ones(1, 3), create_graph=True)
    assert same(plain, ours)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("form", ["list", "Sequential", "ModuleList"])
def test_checkpoint_and_test_checkpoint_module_list(impl, form):
    model = _mlp()
    layers = {"list": list(model.children()), "Sequential": model,
              "ModuleList": nn.ModuleList(model.children())}[form]
    x = torch.randn(1, 20)
    assert same(_grads(model, x, model),
                _grads(model, x, lambda t: checkpoint_sequential(layers, t, segments=2,
                                                                 impl=impl)))


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpoint_rng_cpu(impl):
    inp = torch.randn(2000).requires_grad_()
    first, second = nn.Dropout(), nn.Dropout()
    state = torch.get_rng_state()
    checkpoint(second, first(inp), impl=impl).sum().backward()
    with_checkpoint, inp.grad = inp.grad, None
    torch.set_rng_state(state)
    second(first(inp)).sum().backward()
    assert torch.equal(with_checkpoint, inp.grad)


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpoint_non_tensor(impl):
    x = torch.randn(1, 100, requires_grad=True)
    checkpoint(lambda a, b: a if b is None else a + b, x, None, impl=impl).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def _mixed(t1, t2, scale, t3):
    t4 = (t1 + t2 * t3) * scale
    t5 = (t1 * t2 + t3) * scale
    return scale, t4, None, True, t5, "bar", t1


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpoint_non_tensor_inputs_outputs(impl):
    """(PyTorch's runs the reentrant design, whose node a second backward finds freed; the
    hooks design returns the input itself, as plain autograd does, so it runs again.)"""
    t1, t2, t3 = torch.rand(10, requires_grad=True), torch.rand(10, requires_grad=True), \
        torch.rand(10)
    res = checkpoint(_mixed, t1, t2, 7, t3, impl=impl)
    ref = _mixed(t1, t2, 7, t3)
    assert res[0] == 7 and res[2] is None and res[3] is True and res[5] == "bar"
    assert all(torch.equal(res[i], ref[i]) for i in (1, 4, 6))
    res[1].sum().backward(retain_graph=True)
    res[4].sum().backward(retain_graph=True)
    res[6].sum().backward()
    if impl == "reentrant":
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            res[6].sum().backward()
    else:
        assert res[6] is t1
    ours = [t1.grad, t2.grad]
    t1.grad = t2.grad = None
    torch.autograd.backward([ref[1].sum(), ref[4].sum(), ref[6].sum()])
    assert same(ours, [t1.grad, t2.grad])


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpoint_no_tensors(impl):
    res = checkpoint(_mixed, 0.25, 0.5, 3, 0.75, impl=impl)
    assert res == _mixed(0.25, 0.5, 3, 0.75)


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpoint_partial_grad(impl):
    """The first half as PyTorch's. The second: no output requires grad; PyTorch's reentrant
    design raises its own error, ckpt_lab's gives what plain autograd gives (note 15)."""
    x, other = torch.randn(1, 4, requires_grad=True), torch.randn(1, 4)
    out = checkpoint(lambda a, b: (a, b), x, other, impl=impl)
    out[0].sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    x, other = torch.randn(1, 4), torch.randn(1, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="does not require grad"):
        (lambda a, b: a)(x, other).sum().backward()            # plain autograd
    with pytest.raises(RuntimeError, match="does not require grad"):
        checkpoint(lambda a, b: a, x, other, impl=impl).sum().backward()


# --------------------------------------------------------------- test/test_autograd.py
def test_access_saved_tensor_twice_without_recomputation_works():
    calls = []

    def foo(a):
        calls.append(1)
        b = a * a
        return torch.exp(a * b)

    a = torch.randn(5, requires_grad=True)
    d = checkpoint(foo, a)
    assert len(calls) == 1
    d.grad_fn._saved_result                     # outside backward: recomputes, then lets go
    assert len(calls) == 2
    d.grad_fn._saved_result
    assert len(calls) == 3
    d.sum().backward()
    assert len(calls) == 4
    with pytest.raises(RuntimeError, match="already been freed"):
        d.grad_fn._saved_result


def _flipping(first, then):
    """Runs ``first`` the first time it is called, ``then`` afterwards."""
    calls = []

    def fn(x):
        calls.append(1)
        return first(x) if len(calls) == 1 else then(x)
    return fn


def _three(x):
    return x.sin().exp().sin()


def _two(x):
    return x.sin().exp()


def _two_other(x):
    return x.sin().double().exp()


def test_checkpoint_detects_non_determinism():
    """As PyTorch's, with ckpt_lab's messages; determinism_check="none" keeps the metadata
    check on in ckpt_lab (it costs nothing: note 10), where PyTorch's turns it off."""
    a = torch.randn(5, requires_grad=True)
    with pytest.raises(CheckpointError, match="saved 2 tensors but the forward 3"):
        checkpoint(_flipping(_three, _two), a).sum().backward()
    with pytest.raises(CheckpointError, match="saved more tensors than the forward"):
        checkpoint(_flipping(_two, _three), a, early_stop=False).sum().backward()
    a.grad = None
    checkpoint(_flipping(_two, _three), a).sum().backward()     # early stop: never reached
    (plain,) = torch.autograd.grad(_two(a).sum(), a)
    assert torch.equal(a.grad, plain)
    with pytest.raises(CheckpointError, match="dtype float64"):
        checkpoint(_flipping(_two, _two_other), a).sum().backward()
    with pytest.raises(CheckpointError, match="debug=True: the operations"):
        checkpoint(_flipping(_two, _two_other), a, debug=True).sum().backward()
    with pytest.raises(CheckpointError, match="dtype float64"):
        checkpoint(_flipping(_two, _two_other), a, determinism_check="none").sum().backward()


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpointing_without_reentrant_with_context_fn(impl):
    """The forward's context sees the function's operations only; the recompute's sees the
    function's first. (PyTorch refuses context_fn with its reentrant design; ckpt_lab runs it
    in both: note 15.)"""
    x = torch.tensor(1.0, requires_grad=True)
    seen = _Ops()
    checkpoint(torch.exp, x, impl=impl, context_fn=lambda: (seen, contextlib.nullcontext()))
    assert seen.names == ["exp.default"]
    seen = _Ops()
    out = checkpoint(torch.exp, x, impl=impl, context_fn=lambda: (contextlib.nullcontext(), seen))
    out.backward()
    assert seen.names[0] == "exp.default" and set(seen.names) <= {"exp.default",
                                                                  "detach.default"}
    assert torch.equal(x.grad, torch.exp(x.detach()))


class _ReadsTwice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, z):
        w = x * y * z
        out = w + w
        ctx.save_for_backward(x, y, z, w, out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        first = ctx.saved_tensors
        again = ctx.saved_tensors
        assert all(torch.equal(a, b) for a, b in zip(first, again))
        x, y, z = first[:3]
        return x * grad_out, y * grad_out, z * grad_out


def test_checkpointing_without_reentrant_custom_function_works():
    """PyTorch's raises on the second read of ctx.saved_tensors in backward; ckpt_lab hands the
    same tensors again (note 15). Gradients as plain autograd's."""
    x, y, z = (torch.tensor(v, requires_grad=True) for v in (1.0, 2.0, 3.0))
    checkpoint(_ReadsTwice.apply, x, y, z).backward()
    ours = [x.grad, y.grad, z.grad]
    x.grad = y.grad = z.grad = None
    _ReadsTwice.apply(x, y, z).backward()
    assert same(ours, [x.grad, y.grad, z.grad])


class _SavesY(torch.autograd.Function):
    seen = None

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(y)
        return x

    @staticmethod
    def backward(ctx, grad):
        (_SavesY.seen,) = ctx.saved_tensors
        return grad, None


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpointing_without_reentrant_saved_object_identity(impl):
    a, b = torch.tensor(2.0, requires_grad=True), torch.tensor(2.0)
    checkpoint(_SavesY.apply, a, b, impl=impl).backward()
    assert _SavesY.seen is b


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpointing_without_reentrant_input_requires_grad_False(impl):
    """An input that needs no grad: the module's parameters get plain autograd's gradients
    (PyTorch's reentrant design leaves them None; ckpt_lab's does not: note 8)."""
    torch.manual_seed(0)
    model, x = nn.Linear(2, 2), torch.randn(1, 2)
    checkpoint(model, x, impl=impl).sum().backward()
    ours = [p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()
    assert same(ours, [p.grad for p in model.parameters()])


class _NoGrad(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False)

    def forward(self, x):
        with torch.no_grad():
            return self.b(self.a(x))


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpointing_without_reentrant_detached_tensor(impl):
    """No output requires grad; ``out += a`` then does. PyTorch's reentrant design raises;
    ckpt_lab's gives plain autograd's gradient (note 15)."""
    module, a = _NoGrad(), torch.randn(2, 2, requires_grad=True)
    for _ in range(3):
        out = checkpoint(module, a, impl=impl)
        out += a
        out.sum().backward()
    assert torch.equal(a.grad, torch.full_like(a, 3.0))


def test_checkpointing_without_reentrant_parameter_used_in_an_out():
    w = torch.randn(10, 10, requires_grad=True)
    fired = []
    w.register_hook(lambda g: fired.append(1))
    x = torch.rand(10, 10, requires_grad=True)
    h = w[:, 0]
    checkpoint(lambda t: t * h, x).sum().backward()
    assert len(fired) == 1


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpointing_without_reentrant_arbitrary_input_output(impl):
    torch.manual_seed(0)
    layer = nn.Linear(5, 5)
    x = torch.randn(3, 5, requires_grad=True)
    out = checkpoint(lambda d: {"result": layer(d["tensor"])}, {"tensor": x}, impl=impl)
    assert isinstance(out, dict)
    out["result"].sum().backward()
    ours = [x.grad] + [p.grad for p in layer.parameters()]
    x.grad = None
    layer.zero_grad(set_to_none=True)
    layer(x).sum().backward()
    assert same(ours, [x.grad] + [p.grad for p in layer.parameters()])


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpointing_non_reentrant_autocast_cpu(impl):
    def foo(x, y, z):
        z = torch.mm(x, y)
        return z * y

    x, y, z = (torch.randn(4, 4, requires_grad=True) for _ in range(3))
    grads = []
    for run in (foo, lambda *a: checkpoint(foo, *a, impl=impl)):
        x.grad = y.grad = None
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            out = run(x, y, z)
        out.float().sum().backward()
        grads.append([x.grad, y.grad])
    assert same(*grads)


# -------------------------------------------- test/test_autograd.py, TestNestedCheckpoint
def _grad(fn):
    return lambda x: torch.autograd.grad(fn(x), x, create_graph=True)[0]


def _ckpt(fn):
    return lambda x: checkpoint(fn, x)


def _sum(fn):
    return lambda x: fn(x).sum()


def _inner_grads(x):
    a, b = x.sin().exp().sin(), x.sin().exp().sin()
    torch.autograd.grad(a, x)
    torch.autograd.grad(b, x)
    return x.sin()


@pytest.mark.parametrize("early_stop", [True, False])
@pytest.mark.parametrize("fn", [_three, _inner_grads], ids=["f", "g"])
def test_nested_checkpoint(fn, early_stop):
    """Checkpoints nested and differentiated twice, as PyTorch's (which compares with
    allclose); here bit for bit."""
    x = torch.randn((), requires_grad=True)

    def c(f):
        return lambda t: checkpoint(f, t, early_stop=early_stop)

    pairs = [(fn, c(fn)), (_grad(fn), _grad(c(fn))), (_grad(_grad(fn)), _grad(c(_grad(fn)))),
             (_grad(_grad(fn)), c(_grad(c(_grad(c(fn)))))),
             (_grad(_sum(_grad(_sum(fn)))), _grad(_sum(c(_grad(_sum(c(fn)))))))]
    for plain, ours in pairs:
        assert torch.equal(plain(x), ours(x))


def test_nested_checkpoint_two_children():
    x = torch.randn((), requires_grad=True)

    def f(t):
        return t.sin().exp().sin()

    def two(t):
        return checkpoint(f, t) * checkpoint(f, t)

    def plain(t):
        return f(t) * f(t)

    assert torch.equal(_grad(plain)(x), _grad(_ckpt(two))(x))
    assert torch.equal(_grad(_grad(plain))(x), _grad(_grad(_ckpt(two)))(x))


def test_nested_checkpoint_kwargs():
    x, y = torch.randn((), requires_grad=True), torch.randn((), requires_grad=True)

    def f(a, b=None):
        return a.sin() * b.cos()

    out = checkpoint(lambda a: checkpoint(f, a, b=y), x)
    ours = torch.autograd.grad(out, (x, y))
    assert same(list(ours), list(torch.autograd.grad(f(x, b=y), (x, y))))


# ---------------------------------------------- the selective checkpoint of PyTorch's tests
def test_selective_must_save_is_not_recomputed():
    """create_selective_checkpoint_contexts with mm saved: backward runs no recomputed mm."""
    def policy(ctx, op, *args, **kwargs):
        return tuc.CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default \
            else tuc.CheckpointPolicy.PREFER_RECOMPUTE

    x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    f = lambda a, b: torch.mm(a, b).sin().sum()  # noqa: E731
    out = checkpoint(f, x, w, context_fn=lambda: tuc.create_selective_checkpoint_contexts(policy))
    seen = _Ops()
    with seen:
        out.backward()
    assert seen.names.count("mm.default") == 2              # backward's own two, no recompute
    plain = torch.autograd.grad(f(x, w), (x, w))
    assert same(list(plain), [x.grad, w.grad])

