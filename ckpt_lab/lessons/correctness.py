"""The correctness catalogue: every case where a checkpoint can return other gradients than
plain autograd without a word, run through plain autograd, PyTorch's two designs and
ckpt_lab's two. Lesson 2 draws its grid from it; ``tests/test_checkpoint_adversarial.py``
holds ckpt_lab to it and pins PyTorch's outcomes.

A case builds fresh state, runs one forward and backward through a wrapper ``wrap(fn, *args)``
and returns what it is judged on: gradients, and the module state where the case is about
state. `outcome` compares one design with plain autograd, bitwise (CPU fp32):

* ``"right"``: the same values;
* ``"refuses"``: it raised (for ckpt_lab a ``CheckpointError`` naming the cause and the fix;
  plain autograd itself refuses a tensor modified in place after it was saved);
* ``"WRONG, silently"``: other values, or values where plain autograd refuses.

``Case.expected`` records each design's outcome on the pinned torch (2.13). Class 0 is lesson
2's six faults (`FAULTS`), each with the guard a real checkpoint needs against it; classes 1-7
follow issue 19: 1 nested outputs with a residual, 2 code that depends on grad mode, 3 modules
that change their own state in forward, 4 state changed between forward and backward, 5 an
optimizer step before backward with the module reached indirectly, 6 ``backward(inputs=...)``,
7 ``torch.compile`` (slow: inductor compiles C++). `LESSON_ROWS` are the rows lesson 2 shows:
the six faults and one case per class. A new case is one more entry in `CASES`; `grid` and
``plots.verdict_grid`` take any number of rows.
"""
from __future__ import annotations

import functools
import types
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tuc
from torch import nn

from ckpt_lab import CheckpointError, checkpoint

RIGHT, WRONG, REFUSES = "right", "WRONG, silently", "refuses"
DESIGNS = ("torch non-reentrant", "torch reentrant", "ckpt_lab hooks", "ckpt_lab reentrant")


def _torch(reentrant: bool):
    def wrap(fn, *args):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")        # torch's reentrant warns on some cases
            return tuc.checkpoint(fn, *args, use_reentrant=reentrant)
    return wrap


WRAPS = {
    "plain": lambda fn, *args: fn(*args),
    "torch non-reentrant": _torch(False),
    "torch reentrant": _torch(True),
    "ckpt_lab hooks": lambda fn, *args: checkpoint(fn, *args, impl="hooks"),
    "ckpt_lab reentrant": lambda fn, *args: checkpoint(fn, *args, impl="reentrant"),
}


@dataclass(frozen=True)
class Case:
    """One case: its class, how to run it, what each design does on torch 2.13."""

    cls: int
    name: str
    run: Callable                     # run(wrap) -> list of tensors (or None) to compare
    expected: dict                    # design -> RIGHT | REFUSES | WRONG
    refusal: str = ""                 # regex a ckpt_lab CheckpointError must match
    guard: str = ""                   # the check of a real checkpoint that catches it
    slow: bool = False
    exact: bool = True                # bitwise; else allclose (inductor fuses around the region)
    notes: str = field(default="", compare=False)


def _grads(tensors) -> list:
    return [None if t.grad is None else t.grad.clone() for t in tensors]


def _state(module: nn.Module) -> list:
    return [b.clone() for b in module.buffers()]


def _expect(torch_nr, torch_r, hooks, reentrant) -> dict:
    return dict(zip(DESIGNS, (torch_nr, torch_r, hooks, reentrant)))


# ------------------------------------------------------------- 0. lesson 2's six faults
def _lesson_input():
    """Seed 0; a linear layer and an input of lesson 2's size (256 x 64)."""
    torch.manual_seed(0)
    return nn.Linear(64, 64), torch.randn(256, 64, requires_grad=True)


def _dropout(wrap):
    lin, x = _lesson_input()
    net = nn.Sequential(lin, nn.Dropout(0.5), nn.Linear(64, 64))
    torch.manual_seed(1)
    wrap(net, x).square().sum().backward()
    return _grads([x, *net.parameters()])


def _input_edited(wrap):
    lin, x = _lesson_input()
    t = x * 1.0                          # a non-leaf, like a layer's output, so it may be edited
    out = wrap(lambda u: lin(u).relu(), t)
    t.mul_(2)
    out.square().sum().backward()
    return _grads([x, *lin.parameters()])


def _saved_edited(wrap):
    lin, x = _lesson_input()

    def f(t):
        y = torch.sigmoid(lin(t))
        z = y * t
        y.mul_(3)                        # y was saved by sigmoid and by the multiply
        return z * t                     # saves z: a recompute runs past the edit

    wrap(f, x * 1.0).square().sum().backward()
    return _grads([x, *lin.parameters()])


def _step_before_backward(wrap):
    lin, x = _lesson_input()
    out = wrap(lambda t: torch.tanh(lin(t)), x)
    with torch.no_grad():
        lin.bias.add_(0.5)               # what opt.step() does to every parameter
    out.square().sum().backward()
    return _grads([x, *lin.parameters()])


def _rrelu(wrap):
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


def _metadata(wrap):
    _, x = _lesson_input()
    wrap(_Shifty(64), x * 1.0).square().sum().backward()
    return _grads([x])


# ------------------------------------------------------------- 1. nested outputs + residual
def _nested(kind):
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
def _grad_mode_branch(wrap):
    torch.manual_seed(0)
    lin = nn.Linear(6, 6)
    x = torch.randn(3, 6, requires_grad=True)

    def block(t):
        y = lin(t)
        return torch.tanh(y) if torch.is_grad_enabled() else torch.sigmoid(y)

    wrap(block, x).square().sum().backward()
    return _grads([x, *lin.parameters()])


PADDING = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])


def _encoder_eval(wrap):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # enable_nested_tensor needs batch_first
        encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    x = torch.randn(2, 5, 8, requires_grad=True)
    wrap(lambda t, mask: encoder(t, src_key_padding_mask=mask), x, PADDING
         ).square().sum().backward()
    return _grads([x, *encoder.parameters()])


def _attention_eval(wrap):
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8, requires_grad=True)
    wrap(lambda t, mask: attention(t, t, t, key_padding_mask=mask, need_weights=False)[0],
         x, PADDING).square().sum().backward()
    return _grads([x, *attention.parameters()])


# ------------------------------------------------------- 3. modules that change their state
def _fake_quantize(wrap):
    from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver
    torch.manual_seed(0)
    fq = FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255)
    fq(torch.randn(10, 6))                         # the observer has seen data already
    model = nn.Sequential(nn.Linear(6, 6), fq, nn.Linear(6, 6))
    x = torch.randn(3, 6, requires_grad=True)
    wrap(model, x * 3).square().sum().backward()
    return _grads([x, *model.parameters()]) + _state(model)


def _spectral(parametrized: bool):
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


def _step_counter(wrap):
    torch.manual_seed(0)
    model = StepCounter()
    x = torch.randn(3, 6, requires_grad=True)
    wrap(model, x).square().sum().backward()
    return _grads([x, *model.parameters()]) + _state(model)


def _batch_norm(wrap):
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


def _buffer_in_place(wrap):
    torch.manual_seed(0)
    model = Shifted()
    x = torch.randn(3, 6, requires_grad=True)
    out = wrap(model, x)
    model.shift.mul_(3)
    out.square().sum().backward()
    return _grads([x, *model.parameters()])


def _buffer_replaced(wrap):
    torch.manual_seed(0)
    model = Shifted()
    x = torch.randn(3, 6, requires_grad=True)
    out = wrap(model, x)
    model.shift = torch.full((6,), 5.0)
    out.square().sum().backward()
    return _grads([x, *model.parameters()])


def _parameter_replaced(wrap):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh())
    x = torch.randn(3, 6, requires_grad=True)
    old = model[0].weight
    out = wrap(model, x)
    model[0].weight = nn.Parameter(old.detach() * 2)
    out.square().sum().backward()
    return _grads([x, old, model[0].weight, model[0].bias])


# ------------------------------------ 5. an optimizer step, the module reached indirectly
def _optimizer_step(how: str, bias_only: bool = False):
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
def _partial_backward(kind: str):
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
def _compiled(backend: str):
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


_STEP = r"modified in place between the forward and the backward.*Call backward before"

CASES = [
    Case(0, "dropout (RNG)", _dropout, _expect(RIGHT, RIGHT, RIGHT, RIGHT), guard="RNG replay"),
    Case(0, "input edited after forward", _input_edited,
         _expect(REFUSES, REFUSES, REFUSES, REFUSES), guard="input versions",
         refusal=r"argument 0 .* was modified in place.*Clone it first",
         notes="plain autograd refuses too: Linear saved its input"),
    Case(0, "saved tensor edited inside", _saved_edited,
         _expect(WRONG, REFUSES, REFUSES, REFUSES), guard="saved-tensor versions",
         refusal=r"saved for backward.*modified in place after it was saved.*out-of-place",
         notes="plain autograd refuses too; torch's reentrant recompute runs under autograd"),
    Case(0, "optimizer step before backward", _step_before_backward,
         _expect(WRONG, WRONG, REFUSES, REFUSES), guard="parameter versions", refusal=_STEP,
         notes="plain autograd is right: Linear never saves its bias"),
    Case(0, "RReLU fills a saved buffer", _rrelu, _expect(WRONG, RIGHT, RIGHT, RIGHT),
         guard="early stop at an op boundary", notes="pytorch/pytorch#193671"),
    Case(0, "recompute differs (metadata)", _metadata,
         _expect(REFUSES, REFUSES, REFUSES, REFUSES), guard="metadata check",
         refusal=r"had shape .* in the recompute.*must run the same operations"),
    Case(1, "dict output + residual", _nested("dict"), _expect(RIGHT, WRONG, RIGHT, RIGHT)),
    Case(1, "list output + residual", _nested("list"), _expect(RIGHT, WRONG, RIGHT, RIGHT)),
    Case(1, "tuple holding a dict + residual", _nested("nested"),
         _expect(RIGHT, WRONG, RIGHT, RIGHT)),
    Case(2, "if torch.is_grad_enabled() branch", _grad_mode_branch,
         _expect(RIGHT, WRONG, RIGHT, RIGHT)),
    Case(2, "TransformerEncoder eval, padding mask", _encoder_eval,
         _expect(RIGHT, WRONG, RIGHT, RIGHT)),
    Case(2, "MultiheadAttention eval, padding mask", _attention_eval,
         _expect(RIGHT, WRONG, RIGHT, RIGHT)),
    Case(3, "FakeQuantize whose observer has seen data", _fake_quantize,
         _expect(WRONG, WRONG, RIGHT, RIGHT)),
    Case(3, "parametrizations.spectral_norm", _spectral(True),
         _expect(WRONG, WRONG, RIGHT, RIGHT)),
    Case(3, "nn.utils.spectral_norm", _spectral(False), _expect(WRONG, WRONG, RIGHT, RIGHT)),
    Case(3, "self.step += 1 buffer", _step_counter, _expect(WRONG, WRONG, RIGHT, RIGHT)),
    Case(3, "BatchNorm running statistics", _batch_norm, _expect(WRONG, WRONG, RIGHT, RIGHT),
         notes="gradients right everywhere; torch updates the statistics twice"),
    Case(4, "buffer modified in place before backward", _buffer_in_place,
         _expect(WRONG, WRONG, REFUSES, REFUSES),
         refusal=r"buffer 'shift' of Shifted was modified in place between the forward and "
                 r"the backward.*Change buffers after backward"),
    Case(4, "buffer replaced before backward", _buffer_replaced,
         _expect(WRONG, WRONG, RIGHT, RIGHT)),
    Case(4, "Parameter replaced before backward", _parameter_replaced,
         _expect(WRONG, WRONG, RIGHT, RIGHT)),
    Case(5, "optimizer step, module in a dict", _optimizer_step("dict"),
         _expect(WRONG, WRONG, REFUSES, REFUSES), refusal=_STEP,
         notes="plain autograd refuses too: Linear saved its weight"),
    Case(5, "optimizer step, partial(F.linear, weight=w)", _optimizer_step("partial"),
         _expect(WRONG, WRONG, REFUSES, REFUSES), refusal=_STEP),
    Case(5, "optimizer step, module as an attribute", _optimizer_step("attribute"),
         _expect(WRONG, WRONG, REFUSES, REFUSES), refusal=_STEP),
    Case(5, "bias-only step, partial(F.linear, bias=b)", _optimizer_step("partial", True),
         _expect(WRONG, WRONG, REFUSES, REFUSES), refusal=_STEP,
         notes="plain autograd is right: no op saves a bias; the recompute would use the new"),
    Case(6, "backward(inputs=[weight])", _partial_backward("parameter"),
         _expect(RIGHT, WRONG, RIGHT, RIGHT)),
    Case(6, "backward(inputs=[weight, x])", _partial_backward("parameter and input"),
         _expect(RIGHT, REFUSES, RIGHT, RIGHT)),
    Case(6, "torch.autograd.grad(loss, [weight])", _partial_backward("grad"),
         _expect(RIGHT, REFUSES, RIGHT, RIGHT)),
    Case(7, "torch.compile, aot_eager", _compiled("aot_eager"),
         _expect(RIGHT, RIGHT, RIGHT, RIGHT), slow=True),
    Case(7, "torch.compile, inductor", _compiled("inductor"),
         _expect(RIGHT, RIGHT, RIGHT, RIGHT), slow=True, exact=False,
         notes="compared with allclose: inductor fuses the code around the checkpoint"),
]

FAULTS = [c for c in CASES if c.cls == 0]
# lesson 2's grid: the six faults, then one case per class of issue 19
LESSON_ROWS = FAULTS + [next(c for c in CASES if c.name == name) for name in (
    "dict output + residual", "TransformerEncoder eval, padding mask",
    "parametrizations.spectral_norm", "buffer modified in place before backward",
    "optimizer step, module in a dict", "backward(inputs=[weight])", "torch.compile, aot_eager")]


def _same(a: list, b: list, exact: bool) -> bool:
    if len(a) != len(b):
        return False
    for u, v in zip(a, b):
        if (u is None) != (v is None):
            return False
        if u is not None and not (torch.equal(u, v) if exact
                                  else torch.allclose(u, v, rtol=1e-5, atol=1e-6)):
            return False
    return True


def reference(case: Case):
    """Plain autograd's result for the case, or the exception it raises."""
    try:
        return case.run(WRAPS["plain"])
    except RuntimeError as e:
        return e


def outcome(case: Case, design, ref=None) -> tuple[str, object]:
    """(RIGHT | REFUSES | WRONG, the exception or the result) of one design on a case; `design`
    is a name in `WRAPS` or a wrapper ``wrap(fn, *args)``."""
    wrap = WRAPS[design] if isinstance(design, str) else design
    ref = reference(case) if ref is None else ref
    try:
        got = case.run(wrap)
    except Exception as e:  # noqa: BLE001 (torch raises RuntimeError, ckpt_lab CheckpointError)
        return REFUSES, e
    if isinstance(ref, Exception):
        return WRONG, got
    return (RIGHT if _same(ref, got, case.exact) else WRONG), got


def grid(cases, wraps: dict) -> dict:
    """``table[case name][wrap name]``: "right", "WRONG, silently" or "refuses (ErrorType)"
    for every case under every wrap (a design name's wrap or your own), for lesson 2's grid."""
    table = {}
    for case in cases:
        ref = reference(case)
        table[case.name] = {}
        for name, wrap in wraps.items():
            label, detail = outcome(case, wrap, ref)
            table[case.name][name] = (f"{label} ({type(detail).__name__})" if label == REFUSES
                                      else label)
    return table


if __name__ == "__main__":
    print(f"{'case':48}" + "".join(f"{d:>21}" for d in DESIGNS))
    for name, row in grid(CASES, {d: WRAPS[d] for d in DESIGNS}).items():
        print(f"{name:48}" + "".join(f"{row[d].split(' (')[0]:>21}" for d in DESIGNS))
