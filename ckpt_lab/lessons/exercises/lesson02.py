"""Exercises of lesson 2: three predictions (what a checkpoint keeps, when PyTorch's checkpoint
is wrong, what checkpointing a lone conv saves) and one build task (a checkpoint that replays
the random generator). Every answer is measured."""
from __future__ import annotations

import functools

import torch
from torch import nn

from ckpt_lab.measure.memory import kept_after_forward

from .base import Exercise, _number, near

KINDS = {"right": "right", "wrong": "wrong", "wrong, silently": "wrong", "refuses": "refuses",
         "refuse": "refuses", "error": "refuses"}
WHY = {  # torch.utils.checkpoint.checkpoint(..., use_reentrant=False), per case of lesson 2
    "dropout (RNG)": "it saves the CPU generator's state (and each CUDA device's) and replays "
                     "it (preserve_rng_state=True), so the mask repeats",
    "input edited after forward": "it saves its input for autograd, whose version counter "
                                  "sees the in-place edit and raises",
    "saved tensor edited inside": "the recompute runs past the edit and hands backward the "
                                  "edited tensor; no saved tensor was there for autograd to check",
    "optimizer step before backward": "the recompute uses the updated bias; nothing it saved "
                                      "changed, so nothing tells it",
    "RReLU fills a saved buffer": "its early stop ends the recompute at RReLU's save, before the "
                                  "kernel fills the noise buffer (pytorch/pytorch#193671)",
    "recompute differs (metadata)": "it compares each recomputed tensor's shape with the "
                                    "forward's and raises CheckpointError",
}


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
def torch_verdicts() -> dict:
    """Measured: "right", "wrong" or "refuses" for each of lesson 2's six faults
    (`correctness.FAULTS`) under torch's non-reentrant checkpoint."""
    from ckpt_lab.checkpoint import cases as correctness
    return {case.name: KINDS[correctness.outcome(case, "torch non-reentrant")[0].lower()]
            for case in correctness.FAULTS}


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


def _verdicts(answer):
    expected = torch_verdicts()
    if not isinstance(answer, dict) or set(answer) != set(expected):
        return False, ("Give a dict with one entry per case, each 'right', 'wrong' or 'refuses': "
                       + ", ".join(repr(k) for k in expected) + ".")
    given = {k: KINDS.get(str(v).strip().lower()) for k, v in answer.items()}
    if None in given.values():
        return False, "Each value is 'right', 'wrong' or 'refuses'."
    misses = [k for k in expected if given[k] != expected[k]]
    wrong = sum(v == "wrong" for v in expected.values())
    if not misses:
        return True, (f"all {len(expected)}: torch's checkpoint was silently wrong in {wrong} of "
                      f"{len(expected)} cases.")
    return False, (f"{len(expected) - len(misses)} of {len(expected)}. " + " ".join(
        f"{k}: {expected[k]}, because {WHY.get(k, 'that is what the grid measured')}."
        for k in misses))


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
        yours = _grads(chain, answer, x)
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
    Exercise("02.torch_verdicts", "For each of the six faults, is PyTorch's non-reentrant "
             "checkpoint 'right', silently 'wrong', or does it 'refuse' (raise)? A dict "
             "{case: answer} over: " + ", ".join(repr(k) for k in WHY) + ".", _verdicts,
             expected=torch_verdicts),
    Exercise("02.conv_only_saving", "x + relu(bn(conv(x))) with only the conv checkpointed: "
             "what fraction of what the block keeps after its forward does that free: 0, 1/3 "
             "or 2/3?", _conv_only, expected=conv_only_saving),
    Exercise("02.my_checkpoint", "Build task: pass your checkpoint function (fn, x) -> fn(x), "
             "your minimal hooks design with the random generator replayed: it must give the "
             "gradients of a plain run through Dropout and keep fewer bytes.", _my_checkpoint),
]
