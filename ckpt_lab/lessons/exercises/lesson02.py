"""Exercises of lesson 2: three predictions (what a checkpoint keeps, which bias a recompute
reads after an optimizer step, what checkpointing a lone conv saves) and one build task (a
checkpoint that replays the random generator). Every answer is measured."""
from __future__ import annotations

import functools

import torch
from torch import nn

from ckpt_lab.memory import kept_after_forward

from .base import Exercise, _number, near, one_of

BIAS_ANSWERS = ("the old bias", "the new bias", "refuses")


def _chain(width: int = 64, depth: int = 4):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])


@functools.lru_cache(maxsize=1)
def kept_tensors() -> float:
    """Measured: tokens x width tensors torch's non-reentrant checkpoint of 4 blocks keeps."""
    chain, x = _chain(), torch.randn(256, 64, requires_grad=True)
    kept = kept_after_forward(
        lambda t: torch.utils.checkpoint.checkpoint(chain, t, use_reentrant=False), x)
    return kept / (x.numel() * x.element_size())


@functools.lru_cache(maxsize=1)
def recompute_bias() -> str:
    """Measured: which bias torch's checkpoint recomputes with when an in-place update (what
    ``opt.step()`` does) changes a Linear's bias between the forward and the backward: "the old
    bias", "the new bias", or "refuses" (it raised)."""
    torch.manual_seed(0)
    lin, x = nn.Linear(64, 64), torch.randn(256, 64, requires_grad=True)
    out = torch.utils.checkpoint.checkpoint(lambda t: torch.tanh(lin(t)), x, use_reentrant=False)
    old = lin.bias.detach().clone()
    with torch.no_grad():
        lin.bias.add_(0.5)                   # the optimizer step, before backward
    try:
        out.square().sum().backward()
    except RuntimeError:
        return "refuses"

    def grad_through(bias):                  # x's gradient had the recompute used `bias`
        leaf = x.detach().requires_grad_(True)
        torch.tanh(nn.functional.linear(leaf, lin.weight, bias)).backward(2 * out.detach())
        return leaf.grad

    misses = {answer: (x.grad - grad_through(b)).abs().max().item()
              for answer, b in (("the old bias", old), ("the new bias", lin.bias.detach()))}
    closest = min(misses, key=misses.get)
    if misses[closest] > 1e-5:               # neither bias explains the gradient
        raise RuntimeError(f"the recompute used neither bias (misses {misses}); check the case")
    return closest


class ResBlock(nn.Module):
    """x + relu(bn(conv(x))), checkpointing nothing, the conv only, or the whole branch."""

    def __init__(self, channels: int, mode: str = "none"):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.mode = mode

    def branch(self, x):
        return self.relu(self.bn(self.conv(x)))

    def forward(self, x):
        ckpt = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
        if self.mode == "conv only":
            return x + self.relu(self.bn(ckpt(self.conv, x)))
        if self.mode == "whole branch":
            return x + ckpt(self.branch, x)
        return x + self.branch(x)


def resblock_kept(mode: str, shape=(4, 8, 16, 16)) -> int:
    """Measured: bytes a ResBlock keeps after its forward, for one checkpointing mode."""
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    return kept_after_forward(ResBlock(shape[1], mode), x)


@functools.lru_cache(maxsize=1)
def conv_only_saving() -> float:
    """Measured: the fraction of a ResBlock's kept bytes that checkpointing the conv alone frees."""
    plain = resblock_kept("none")
    return (plain - resblock_kept("conv only")) / plain


_kept = near(
    kept_tensors, 0.05, strict=True,
    right="one: its output, which the next layer needs. Everything the four blocks saved inside "
          "is dropped and rebuilt in backward.",
    low="The output is alive after the forward (it is returned, and whatever comes next needs "
        "it): one tensor stays.",
    high="Four is the plain chain. Inside the checkpoint nothing is kept: saved tensors become "
         "handles, and only the output survives the forward.")


_bias = one_of(
    BIAS_ANSWERS, recompute_bias, normalise=lambda a: a.strip().lower(),
    right="{expected}: the recompute runs the function again, and the function reads the bias "
          "as it is now, after the step. Nothing checks it: autograd's version counters guard "
          "only saved tensors, and no operation saves a bias (a Linear's backward needs its "
          "input and weight). The gradient is silently that of a network that never ran; "
          "ckpt_lab's parameter-version guard refuses instead.",
    wrong="Measured: {expected}.",
    hints={"the old bias": "Measured: {expected}. A checkpoint keeps only its inputs; the bias "
                           "is no input, so the recompute reads it from the module, as it is "
                           "when backward runs: after the step.",
           "refuses": "Measured: {expected}, silently. Autograd's version counters guard saved "
                      "tensors only, and no operation saves a bias: a Linear's backward needs "
                      "its input and weight, not its bias. Nothing notices the edit (ckpt_lab's "
                      "parameter-version guard does, and refuses)."})


def _conv_only(answer):
    expected = conv_only_saving()
    value = _number(answer)
    if abs(value - expected) < 0.05:
        return True, ("nothing: the conv saves only its input, and that input is the "
                      "checkpoint's argument, kept anyway (the residual add needs it too). Its "
                      "output sits outside, where batch norm saves it.")
    if value < 0.5:
        return False, (f"Measured {expected:.2f}. A third would be the conv's input, but the "
                       "checkpoint keeps its input: that is what it recomputes from.")
    return False, (f"Measured {expected:.2f}. Two thirds is what checkpointing the whole branch "
                   "frees (batch norm's input and the ReLU's output); around the conv alone, "
                   "both stay outside the checkpoint.")


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
        if answer(chain, x.detach().requires_grad_(True)) is None:
            raise NotImplementedError
        yours = _grads(chain, answer, x)
    except NotImplementedError:
        return False, ("not answered yet: your function returns None. Start from design 2 "
                       "(hooks_checkpoint): save torch.get_rng_state() in forward and restore it "
                       "around the recompute.")
    except Exception as e:  # the learner's code: report, do not raise
        return False, f"Your function raised {type(e).__name__}: {e}"
    if not all(torch.equal(a, b) for a, b in zip(plain, yours)):
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


EXERCISES = [
    Exercise("02.kept_tensors", "torch.utils.checkpoint.checkpoint(chain, x, use_reentrant=False) "
             "around 4 blocks Linear -> ReLU: after the forward, how many new tokens x width "
             "tensors does it keep (the input x, made before, is not counted): 0, 1 or 4?", _kept, expected=kept_tensors),
    Exercise("02.recompute_bias", "After a checkpointed forward, an optimizer step adds to a "
             "Linear's bias in place; then backward runs. Which bias does the recompute of "
             "torch.utils.checkpoint.checkpoint(..., use_reentrant=False) use: 'the old bias', "
             "'the new bias', or does it raise ('refuses')?", _bias,
             expected=recompute_bias),
    Exercise("02.conv_only_saving", "x + relu(bn(conv(x))) with only the conv checkpointed: "
             "what fraction of what the block keeps after its forward does that free: 0, 1/3 "
             "or 2/3?", _conv_only, expected=conv_only_saving),
    Exercise("02.my_checkpoint", "Build task: pass your checkpoint function (fn, x) -> fn(x), "
             "your minimal hooks design with the random generator replayed: it must give the "
             "gradients of a plain run through Dropout and keep fewer bytes.", _my_checkpoint),
]
