"""The scenarios of the correctness catalogue (`ckpt_lab.checkpoint.cases`): how each case
builds fresh state, runs one forward and backward through a wrapper ``wrap(fn, *args)`` (plain
autograd, or a checkpoint design) and returns what it is judged on, gradients, and the module
state where the case is about state. Grouped by class: 0 lesson 2's six faults, then classes
1-7 of issue 19. Which design should get each one right is the catalogue's business, not theirs.
"""
from __future__ import annotations

import functools
import types
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


def _grads(tensors) -> list:
    return [None if t.grad is None else t.grad.clone() for t in tensors]


def _state(module: nn.Module) -> list:
    return [b.clone() for b in module.buffers()]



# ------------------------------------------------------------- 0. lesson 2's six faults
def _lesson_input():
    """Seed 0; a linear layer and an input of lesson 2's size (256 x 64)."""
    torch.manual_seed(0)
    return nn.Linear(64, 64), torch.randn(256, 64, requires_grad=True)


def dropout(wrap):
    lin, x = _lesson_input()
    net = nn.Sequential(lin, nn.Dropout(0.5), nn.Linear(64, 64))
    torch.manual_seed(1)
    wrap(net, x).square().sum().backward()
    return _grads([x, *net.parameters()])


def input_edited(wrap):
    lin, x = _lesson_input()
    t = x * 1.0                          # a non-leaf, like a layer's output, so it may be edited
    out = wrap(lambda u: lin(u).relu(), t)
    t.mul_(2)
    out.square().sum().backward()
    return _grads([x, *lin.parameters()])


def saved_edited(wrap):
    lin, x = _lesson_input()

    def f(t):
        y = torch.sigmoid(lin(t))
        z = y * t
        y.mul_(3)                        # y was saved by sigmoid and by the multiply
        return z * t                     # saves z: a recompute runs past the edit

    wrap(f, x * 1.0).square().sum().backward()
    return _grads([x, *lin.parameters()])


def step_before_backward(wrap):
    lin, x = _lesson_input()
    out = wrap(lambda t: torch.tanh(lin(t)), x)
    with torch.no_grad():
        lin.bias.add_(0.5)               # what opt.step() does to every parameter
    out.square().sum().backward()
    return _grads([x, *lin.parameters()])


def rrelu(wrap):
    lin, x = _lesson_input()
    net = nn.Sequential(lin, nn.RReLU())
    torch.manual_seed(1)
    out = wrap(net, x * 1.0)
    junk = [torch.full_like(x, 7.0) for _ in range(8)]   # other work allocates and frees memory
    del junk
    out.square().sum().backward()
    return _grads([x, *net.parameters()])


@dataclass
class _Shifty:
    """A function that branches on a call counter: narrower the second time it runs."""

    width: int
    calls: list = field(default_factory=list)

    def __call__(self, t):
        self.calls.append(1)
        return torch.tanh(t[:, : self.width - len(self.calls)])


def metadata(wrap):
    _, x = _lesson_input()
    wrap(_Shifty(64), x * 1.0).square().sum().backward()
    return _grads([x])


# ------------------------------------------------------------- 1. nested outputs + residual
def nested(kind):
    def run(wrap):
        torch.manual_seed(0)
        lin = nn.Linear(6, 6)
        x = torch.randn(3, 6, requires_grad=True)

        def block(t):
            y = torch.tanh(lin(t))
            if kind == "dict":
                return {"hidden": y}
            if kind == "list":
                return [y, y * 2]
            return y, {"aux": [y.exp()], "step": 3}

        out = wrap(block, x)
        y = (out["hidden"] if kind == "dict" else out[0] + out[1] if kind == "list"
             else out[0] + out[1]["aux"][0] * out[1]["step"])
        (y + x).square().sum().backward()         # the residual: x reaches the loss directly
        return _grads([x, *lin.parameters()])
    return run


# ---------------------------------------------------------------------- 2. grad mode
def grad_mode_branch(wrap):
    torch.manual_seed(0)
    lin = nn.Linear(6, 6)
    x = torch.randn(3, 6, requires_grad=True)

    def block(t):
        y = lin(t)
        return torch.tanh(y) if torch.is_grad_enabled() else torch.sigmoid(y)

    wrap(block, x).square().sum().backward()
    return _grads([x, *lin.parameters()])


PADDING = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])


def encoder_eval(wrap):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # enable_nested_tensor needs batch_first
        encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    x = torch.randn(2, 5, 8, requires_grad=True)
    wrap(lambda t, mask: encoder(t, src_key_padding_mask=mask), x, PADDING
         ).square().sum().backward()
    return _grads([x, *encoder.parameters()])


def attention_eval(wrap):
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8, requires_grad=True)
    wrap(lambda t, mask: attention(t, t, t, key_padding_mask=mask, need_weights=False)[0],
         x, PADDING).square().sum().backward()
    return _grads([x, *attention.parameters()])


# ------------------------------------------------------- 3. modules that change their state
def fake_quantize(wrap):
    from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver
    torch.manual_seed(0)
    fq = FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255)
    fq(torch.randn(10, 6))                         # the observer has seen data already
    model = nn.Sequential(nn.Linear(6, 6), fq, nn.Linear(6, 6))
    x = torch.randn(3, 6, requires_grad=True)
    wrap(model, x * 3).square().sum().backward()
    return _grads([x, *model.parameters()]) + _state(model)


def spectral(parametrized: bool):
    def run(wrap):
        torch.manual_seed(0)
        if parametrized:
            model = nn.utils.parametrizations.spectral_norm(nn.Linear(6, 6))
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")    # deprecated in favour of parametrizations
                model = nn.utils.spectral_norm(nn.Linear(6, 6))
        x = torch.randn(3, 6, requires_grad=True)
        wrap(model, x).square().sum().backward()
        return _grads([x, *model.parameters()]) + _state(model)
    return run


class StepCounter(nn.Module):
    """Scales its output by a step counter it keeps as a buffer (a schedule, a warm-up)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.register_buffer("step", torch.zeros(()))

    def forward(self, x):
        self.step += 1
        return torch.tanh(self.lin(x)) * self.step


def step_counter(wrap):
    torch.manual_seed(0)
    model = StepCounter()
    x = torch.randn(3, 6, requires_grad=True)
    wrap(model, x).square().sum().backward()
    return _grads([x, *model.parameters()]) + _state(model)


def batch_norm(wrap):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Tanh())
    x = torch.randn(8, 6, requires_grad=True)
    wrap(model, x).square().sum().backward()
    return _grads([x, *model.parameters()]) + _state(model)


# ------------------------------------------- 4. state changed between forward and backward
class Shifted(nn.Module):
    """Adds a buffer to a linear layer's output (no operation saves the buffer)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.register_buffer("shift", torch.full((6,), 2.0))

    def forward(self, x):
        return torch.tanh(self.lin(x) + self.shift)


def buffer_in_place(wrap):
    torch.manual_seed(0)
    model = Shifted()
    x = torch.randn(3, 6, requires_grad=True)
    out = wrap(model, x)
    model.shift.mul_(3)
    out.square().sum().backward()
    return _grads([x, *model.parameters()])


def buffer_replaced(wrap):
    torch.manual_seed(0)
    model = Shifted()
    x = torch.randn(3, 6, requires_grad=True)
    out = wrap(model, x)
    model.shift = torch.full((6,), 5.0)
    out.square().sum().backward()
    return _grads([x, *model.parameters()])


def parameter_replaced(wrap):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh())
    x = torch.randn(3, 6, requires_grad=True)
    old = model[0].weight
    out = wrap(model, x)
    model[0].weight = nn.Parameter(old.detach() * 2)
    out.square().sum().backward()
    return _grads([x, old, model[0].weight, model[0].bias])


# ------------------------------------ 5. an optimizer step, the module reached indirectly
def optimizer_step(how: str, bias_only: bool = False):
    def run(wrap):
        torch.manual_seed(0)
        lin = nn.Linear(6, 6)
        x = torch.randn(3, 6, requires_grad=True)
        if how == "dict":
            held = {"lin": lin}
            fn = lambda t: torch.tanh(held["lin"](t))  # noqa: E731
        elif how == "attribute":
            held = types.SimpleNamespace(lin=lin)
            fn = lambda t: torch.tanh(held.lin(t))  # noqa: E731
        else:
            fn = functools.partial(lambda t, weight, bias: torch.tanh(F.linear(t, weight, bias)),
                                   weight=lin.weight, bias=lin.bias)
        out = wrap(fn, x)
        with torch.no_grad():                       # what opt.step() does
            if not bias_only:
                lin.weight.add_(0.5)
            lin.bias.add_(0.5)
        out.square().sum().backward()
        return _grads([x, lin.weight, lin.bias])
    return run


# ----------------------------------------------------------------- 6. backward(inputs=...)
def partial_backward(kind: str):
    def run(wrap):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 6), nn.Tanh())
        x = torch.randn(3, 6, requires_grad=True)
        loss = wrap(model, x).square().sum()
        p = model[0].weight
        if kind == "parameter":
            loss.backward(inputs=[p])
            return _grads([x, p, model[0].bias])
        if kind == "parameter and input":
            loss.backward(inputs=[p, x])
            return _grads([x, p, model[0].bias])
        return list(torch.autograd.grad(loss, [p]))
    return run


# ------------------------------------------------------------------------ 7. torch.compile
def compiled(backend: str):
    # Inductor draws dropout masks with its own generator, so plain compiled code and an eager
    # region draw different ones: its case has no dropout (aot_eager runs ATen's, exactly).
    p = 0.2 if backend == "aot_eager" else 0.0

    def run(wrap):
        import torch._dynamo
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Dropout(p), nn.Linear(8, 8))
        x = torch.randn(4, 8, requires_grad=True)
        torch._dynamo.reset()
        step = torch.compile(lambda t: torch.tanh(wrap(model, t * 2)), backend=backend)
        torch.manual_seed(1)
        step(x).square().sum().backward()
        torch._dynamo.reset()
        return _grads([x, *model.parameters()])
    return run


# --------------------------------------- 8. Python state a forward changes (issue 28: 2, 5, 7)
class DynamicRope(nn.Module):
    """Hugging Face's dynamic RoPE (``rope_type="dynamic"``), reduced: a sequence longer than
    any seen re-registers the ``inv_freq`` buffer and records its length in a plain int."""

    def __init__(self, dim: int = 6):
        super().__init__()
        self.dim = dim
        self.register_buffer("inv_freq", self._frequencies(4), persistent=False)
        self.max_seq_len_cached = 4

    def _frequencies(self, length: int) -> torch.Tensor:
        base = 10000.0 * (length / 4) ** (self.dim / (self.dim - 2))
        return 1.0 / base ** (torch.arange(0, self.dim, 2, dtype=torch.float32) / self.dim)

    def forward(self, x):                          # x: (batch, sequence, dim)
        length = x.shape[1]
        if length > self.max_seq_len_cached:       # growth: scale the frequencies
            self.register_buffer("inv_freq", self._frequencies(length), persistent=False)
            self.max_seq_len_cached = length
        angles = torch.arange(length, dtype=torch.float32)[:, None] * self.inv_freq
        cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


def dynamic_rope(wrap):
    torch.manual_seed(0)
    rope, lin = DynamicRope(), nn.Linear(6, 6)
    x = torch.randn(2, 9, 6, requires_grad=True)
    wrap(lambda t: torch.tanh(rope(lin(t))), x).square().sum().backward()
    return _grads([x, *lin.parameters()]) + [rope.inv_freq.clone(),
                                             torch.tensor(rope.max_seq_len_cached)]


class Scheduled(nn.Module):
    """Scales its output by a call counter that a forward pre-hook keeps as a plain attribute
    (a warm-up schedule, a step count for logging)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.calls = 0
        self.register_forward_pre_hook(Scheduled._count)

    @staticmethod
    def _count(module, args):
        module.calls += 1

    def forward(self, x):
        return torch.tanh(self.lin(x)) * (1.0 + 0.5 * self.calls)


def pre_hook_counter(wrap):
    torch.manual_seed(0)
    model = Scheduled()
    x = torch.randn(3, 6, requires_grad=True)
    wrap(model, x).square().sum().backward()
    return _grads([x, *model.parameters()]) + [torch.tensor(model.calls)]


def _double(module, args, out):
    return out * 2


def hook_inside(wrap):
    """The function registers a forward hook and removes it at its end, after its last saved
    tensor; a later forward shows whether the hook was left behind."""
    torch.manual_seed(0)
    lin = nn.Linear(6, 6)
    x = torch.randn(3, 6, requires_grad=True)

    def f(t):
        handle = lin.register_forward_hook(_double)
        y = torch.tanh(lin(t)) * 3                 # a multiply by a number saves nothing
        handle.remove()
        return y

    wrap(f, x).square().sum().backward()
    with torch.no_grad():
        later = lin(torch.ones(1, 6))
    return _grads([x, *lin.parameters()]) + [later]


# -------------------------------- 9. what only the reentrant design meets (issue 28: 3, 4, 15)
def gradient_penalty(wrap):
    """A gradient penalty (WGAN-GP): ``torch.autograd.grad(..., create_graph=True)``."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 1))
    x = torch.randn(4, 6, requires_grad=True)
    out = wrap(net, x)
    (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    (out.square().sum() + g.square().sum()).backward()
    return _grads([x, *net.parameters()])


def hook_on_input(wrap):
    torch.manual_seed(0)
    lin = nn.Linear(6, 6)
    x = torch.randn(3, 6, requires_grad=True)

    def f(t):
        t.register_hook(lambda g: g * 2)
        return torch.tanh(lin(t))

    wrap(f, x * 1.0).square().sum().backward()
    return _grads([x, *lin.parameters()])


def leaf_inside(wrap):
    """The function creates a leaf that requires grad (a scale it learns) and keeps it."""
    torch.manual_seed(0)
    lin = nn.Linear(6, 6)
    x = torch.randn(3, 6, requires_grad=True)
    made = []

    def f(t):
        made.append(torch.full((6,), 0.5, requires_grad=True))
        return torch.tanh(lin(t)) * made[-1]

    wrap(f, x).square().sum().backward()
    return _grads([x, *lin.parameters(), made[0]])


class Experts(nn.Module):
    """A mixture-of-experts layer that stores its load-balancing loss on ``self``."""

    def __init__(self):
        super().__init__()
        self.gate, self.experts = nn.Linear(6, 2), nn.ModuleList(nn.Linear(6, 6)
                                                                  for _ in range(2))
        self.aux_loss = None

    def forward(self, x):
        weights = torch.softmax(self.gate(x), dim=-1)
        self.aux_loss = weights.mean(0).square().sum()
        return sum(weights[:, i:i + 1] * e(x) for i, e in enumerate(self.experts))


def aux_loss(wrap):
    torch.manual_seed(0)
    model = Experts()
    x = torch.randn(4, 6, requires_grad=True)
    out = wrap(model, x)
    (out.square().sum() + model.aux_loss).backward()
    return _grads([x, *model.parameters()])


# ------------------------------------------ 10. arguments in containers (issue 28: item 6)
@dataclass
class Batch:
    """Arguments bundled in a dataclass, as training code often passes them."""

    bias: torch.Tensor


def edited_in_container(kind: str):
    """An additive mask in a dataclass or a mapping (Hugging Face's ``BatchEncoding`` is a
    ``UserDict``), edited in place before backward; no operation saves it."""
    def run(wrap):
        import collections
        torch.manual_seed(0)
        lin = nn.Linear(6, 6)
        x = torch.randn(3, 6, requires_grad=True)
        bias = torch.zeros(6)
        held = Batch(bias) if kind == "dataclass" else collections.UserDict(bias=bias)

        def f(t, batch):
            b = batch.bias if kind == "dataclass" else batch["bias"]
            return torch.tanh(lin(t) + b)

        out = wrap(f, x, held)
        bias.fill_(-1e4)                           # the next step's mask, written in place
        out.square().sum().backward()
        return _grads([x, *lin.parameters()])
    return run


# -------------------------------- 11. what the region itself read (issue 28: 9, 10, 11)
class _Blocks(nn.Module):
    """Blocks each checkpointed through a closure over the whole model."""

    def __init__(self, wrap):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(6, 6), nn.Tanh())
                                    for _ in range(3))
        self.wrap = wrap

    def forward(self, h):
        for i in range(3):
            h = self.wrap(lambda t, i=i: self.blocks[i](t), h)
        return h


def optimizer_in_backward(wrap):
    """torchtune's idiom: each parameter steps in its post-accumulate-grad hook, so a later
    block's weights change before an earlier block's backward."""
    torch.manual_seed(0)
    model = _Blocks(wrap)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(_sgd_step)
    x = torch.randn(3, 6, requires_grad=True)
    model(x).square().sum().backward()
    return _grads([x]) + [p.detach().clone() for p in model.parameters()]


def _sgd_step(p):
    with torch.no_grad():
        p.add_(p.grad, alpha=-0.1)
    p.grad = None


def own_parameter_changed(kind: str):
    """A parameter its own module changes in the forward: ``nn.Embedding(max_norm=...)``
    renormalises rows in place, ``nn.LazyLinear`` initialises itself on its first call."""
    def run(wrap):
        torch.manual_seed(0)
        if kind == "embedding":
            module = nn.Embedding(10, 6, max_norm=1.0)
            x = torch.tensor([[1, 2, 4], [4, 3, 9]])
            wrap(lambda i: torch.tanh(module(i)), x).square().sum().backward()
            return _grads([*module.parameters()]) + [module.weight.detach().clone()]
        module = nn.LazyLinear(6)
        x = torch.randn(3, 5, requires_grad=True)
        wrap(lambda t: torch.tanh(module(t)), x).square().sum().backward()
        return _grads([x, *module.parameters()])
    return run


def catches_exception(wrap):
    """``except Exception`` around the function's work, with a fallback that saves."""
    torch.manual_seed(0)
    lin = nn.Linear(6, 6)
    x = torch.randn(3, 6, requires_grad=True)

    def f(t):
        try:
            return torch.tanh(lin(t)) * 2
        except Exception:                          # noqa: BLE001 (a user's broad fallback)
            return torch.sigmoid(lin(t))

    wrap(f, x).square().sum().backward()
    return _grads([x, *lin.parameters()])
