"""Lesson 2's catalogue of cases where a checkpoint can return a silently wrong gradient.

Each `Case` is a function with a fault, the same function without it (its gradient is that
of the network that actually ran), and what happens between forward and backward. `grid`
runs every case through every implementation (a dict of ``wrap(fn, x) -> output``) and
says, per cell, whether the input's gradient is right, silently wrong, or refused with an
error; `ckpt_lab.lessons.plots.verdict_grid` draws the table. A new case is one more entry
in `cases` (the grid and the figure take any number of rows).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

RIGHT, WRONG = "right", "WRONG, silently"


@dataclass
class Case:
    """A fault, its fault-free twin, and the check of a real checkpoint that catches it."""

    name: str
    mechanism: str                               # the check that guards against it
    fn: Callable
    clean: Callable                              # the function without the fault
    between: Callable | None = None              # runs on the input between forward and backward
    modules: tuple[nn.Module, ...] = ()          # their state is restored after every run
    reset: Callable[[], None] = lambda: None     # called before every run


@dataclass
class _Shifty:
    """A function that branches on a call counter: narrower the second time it runs."""

    width: int
    calls: list = field(default_factory=list)

    def __call__(self, t):
        self.calls.append(1)
        return torch.tanh(t[:, : self.width - len(self.calls)])


def cases(width: int = 64, device="cpu") -> dict[str, Case]:
    """The six cases of lesson 2, built on `device` from seed 0."""
    torch.manual_seed(0)
    lin = nn.Linear(width, width).to(device)
    dropout_net = nn.Sequential(nn.Linear(width, width), nn.Dropout(0.5),
                                nn.Linear(width, width)).to(device)
    rrelu_net = nn.Sequential(nn.Linear(width, width), nn.RReLU()).to(device)
    shifty = _Shifty(width)

    def sigmoid_then_edit(t, edit=True):
        y = torch.sigmoid(lin(t))
        z = y * t
        if edit:
            y.mul_(3)                    # y was saved by sigmoid and by the multiply
        return z * t                     # saves z: a recompute runs past the edit

    def optimizer_step(_t):
        with torch.no_grad():
            lin.bias.add_(0.5)           # what opt.step() does to every parameter

    def scribble(t):                     # other work allocates and frees memory meanwhile
        junk = [torch.full_like(t, 7.0) for _ in range(8)]
        del junk

    def relu_lin(t):
        return lin(t).relu()

    def tanh_lin(t):
        return torch.tanh(lin(t))

    found = [
        Case("dropout (RNG)", "RNG replay", dropout_net, dropout_net),
        Case("input edited after forward", "input versions", relu_lin, relu_lin,
             lambda t: t.mul_(2)),
        Case("saved tensor edited inside", "saved-tensor versions", sigmoid_then_edit,
             lambda t: sigmoid_then_edit(t, edit=False)),
        Case("optimizer step before backward", "parameter versions", tanh_lin, tanh_lin,
             optimizer_step, modules=(lin,)),
        Case("RReLU fills a saved buffer", "early stop at an op boundary", rrelu_net, rrelu_net,
             scribble),
        Case("recompute differs (metadata)", "metadata check", shifty, shifty,
             reset=shifty.calls.clear),
    ]
    return {c.name: c for c in found}


def input_grad(wrap, case: Case, fn, x: torch.Tensor, between=None, seed: int = 1):
    """The gradient of x through ``wrap(fn, x)``; module states are restored afterwards."""
    leaf = x.detach().requires_grad_(True)
    t = leaf * 1.0                       # a non-leaf, like a layer's output, so it may be edited
    state = [{k: v.clone() for k, v in m.state_dict().items()} for m in case.modules]
    case.reset()
    torch.manual_seed(seed)
    try:
        out = wrap(fn, t)
        if between is not None:
            between(t)
        out.square().sum().backward()
    finally:
        for m, s in zip(case.modules, state):
            m.load_state_dict(s)         # undo an optimizer step for the next run
    return leaf.grad


def outcome(wrap, case: Case, x: torch.Tensor) -> str:
    """"right", "WRONG, silently" or "refuses (ErrorType)" for one case under one wrap."""
    right = input_grad(lambda f, t: f(t), case, case.clean, x)
    try:
        got = input_grad(wrap, case, case.fn, x, case.between)
    except Exception as e:               # a refusal is an outcome, not a failure
        return f"refuses ({type(e).__name__})"
    return RIGHT if torch.equal(got, right) else WRONG


def grid(found: dict[str, Case], wraps: dict[str, Callable], x: torch.Tensor) -> dict:
    """``table[case][implementation]``: the outcome of every case under every wrap."""
    return {name: {w: outcome(wrap, case, x) for w, wrap in wraps.items()}
            for name, case in found.items()}
