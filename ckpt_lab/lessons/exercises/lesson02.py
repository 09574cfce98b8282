"""Exercises of lesson 2: Checkpointing from scratch."""
from __future__ import annotations

import torch
from torch import nn

from ckpt_lab.checkpoint import checkpoint
from ckpt_lab.memory import kept_after_forward

from .base import Exercise, _close, _name_set


def _dropout_chain(width: int = 16, depth: int = 4):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.3)]
    return nn.Sequential(*layers)


def _grads(chain, run, x, seed: int = 1):
    chain.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    torch.manual_seed(seed)
    run(chain, x).square().sum().backward()
    return [p.grad.clone() for p in chain.parameters()] + [x.grad.clone()]


def _my_checkpoint(answer):
    if not callable(answer):
        return False, ("Pass your function itself, e.g. check('02.my_checkpoint', "
                       "hooks_checkpoint), taking (fn, x) and returning fn(x).")
    chain = _dropout_chain()
    x = torch.randn(64, 16)
    plain = _grads(chain, lambda f, t: f(t), x)
    try:
        yours = _grads(chain, answer, x)
    except Exception as e:  # the learner's code: report, do not raise
        return False, f"Your function raised {type(e).__name__}: {e}"
    if not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, yours)):
        return False, ("Gradients differ from a plain run. The chain has Dropout: save "
                       "torch.get_rng_state() in forward and restore it around the recompute.")
    xs = x.detach().requires_grad_(True)
    kept_plain = kept_after_forward(chain, xs)
    kept = kept_after_forward(lambda t: answer(chain, t), xs)
    if kept >= kept_plain:
        return False, (f"Gradients are right, but your forward keeps {kept:,} bytes, no less "
                       f"than a plain run ({kept_plain:,}). Run the function under "
                       "torch.no_grad() (reentrant) or pack saved tensors into handles (hooks).")
    return True, f"Gradients match a plain run and the forward keeps {kept:,} of {kept_plain:,} bytes."


class _ResBlock(nn.Module):
    """x + relu(bn(conv(x))), with the whole branch checkpointed when asked."""

    def __init__(self, channels: int, whole_branch: bool):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.whole_branch = whole_branch

    def branch(self, x):
        return self.relu(self.bn(self.conv(x)))

    def forward(self, x):
        if self.whole_branch:
            return x + checkpoint(self.branch, x)
        return x + self.branch(x)


def _branch_saving(answer):
    torch.manual_seed(0)
    x = torch.randn(4, 8, 16, 16, requires_grad=True)
    plain = kept_after_forward(_ResBlock(8, False), x)
    ckpt = kept_after_forward(_ResBlock(8, True), x)
    expected = plain - ckpt
    return _close(answer, expected, 0.01,
                  "Too few: with the whole branch checkpointed, both the BatchNorm's input "
                  "(the conv output) and the ReLU's output are dropped, each as large as x.",
                  "Too many: x itself is kept (it is the checkpoint's input and the residual "
                  "needs it) and the block's output is alive either way.")


RNG_LAYERS = {"Linear": lambda: nn.Linear(16, 16), "ReLU": nn.ReLU, "GELU": nn.GELU,
              "LayerNorm": lambda: nn.LayerNorm(16), "BatchNorm1d": lambda: nn.BatchNorm1d(16),
              "Dropout": lambda: nn.Dropout(0.5), "AlphaDropout": lambda: nn.AlphaDropout(0.5),
              "RReLU": nn.RReLU}


def layers_needing_rng() -> set[str]:
    """Measured: the layer types whose gradients change when the RNG state is not restored."""
    out = set()
    for name, make in RNG_LAYERS.items():
        torch.manual_seed(0)
        layer = nn.Sequential(nn.Linear(16, 16), make())
        x = torch.randn(32, 16)
        grads = []
        for preserve in (True, False):
            layer.zero_grad(set_to_none=True)
            torch.manual_seed(1)
            checkpoint(layer, x.requires_grad_(True), preserve_rng_state=preserve).sum().backward()
            grads.append(layer[0].weight.grad.clone())
        if not torch.equal(*grads):
            out.add(name)
    return out


def _rng_layers(answer):
    given, why = _name_set(answer, RNG_LAYERS, "layer names")
    if why:
        return False, why
    expected = layers_needing_rng()
    if given == expected:
        return True, (f"{sorted(given)}: only these draw random numbers in forward (RReLU "
                      "draws a slope for every negative input while training).")
    if given - expected:
        return False, (f"{sorted(given - expected)} compute the same thing every time they "
                       "run; a layer needs the RNG replayed only if it draws random numbers.")
    return False, ("A layer that draws random numbers in forward is missing from your set; run "
                   "the commented measurement for every layer before you check again.")


EXERCISES = [
    Exercise("02.my_checkpoint", "Pass your checkpoint function (fn, x) -> fn(x): it must give "
             "the gradients of a plain run through Dropout and keep fewer bytes.",
             _my_checkpoint),
    Exercise("02.branch_saving", "x of shape (4, 8, 16, 16) fp32, block x + relu(bn(conv(x))): "
             "how many bytes does checkpointing the whole branch save after the forward?",
             _branch_saving),
    Exercise("02.rng_layers", "Predict, then measure: which of Linear, ReLU, GELU, LayerNorm, "
             "BatchNorm1d, Dropout, AlphaDropout, RReLU give other gradients when the recompute "
             "does not replay the random generator (preserve_rng_state=False)? Give a set of "
             "names.", _rng_layers),
]
