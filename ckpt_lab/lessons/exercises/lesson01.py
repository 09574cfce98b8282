"""Exercises of lesson 1: two predictions (which part of a step grows with the batch, what mixed
precision does to model state) and one build task (a function that predicts the bytes of every
part of a step, judged against track_memory on several models and optimizers). Every answer is
measured, never typed in."""
from __future__ import annotations

import functools

import torch

from .base import Exercise, name_set, near, not_quite

PARTS = ("parameters", "gradients", "optimizer states", "activations")
CONFIG = dict(block_size=64, width=128, depth=8)     # the lesson's CPU sizes
OPTIMIZERS = {                                       # the build task's optimizer names
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
    "sgd momentum": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-2),
}


def step_parts(batch: int, config: dict = CONFIG, device="cpu",
               optimizer: str = "adamw") -> dict[str, int]:
    """Measured: the bytes each part of one fp32 step creates, at one batch size (AdamW, or
    another of `OPTIMIZERS`)."""
    from ckpt_lab.measure.memory import track_memory
    from ckpt_lab.training.models import MLPConfig, build_model
    with track_memory() as p:
        model = build_model(MLPConfig(**config)).to(device)
    opt = OPTIMIZERS[optimizer](model.parameters())
    x = torch.randint(0, 256, (batch, config["block_size"]), device=device)
    with track_memory() as a:
        loss = model(x, x)
    with track_memory() as g:
        loss.backward()
        del loss
    with track_memory() as o:
        opt.step()
    return {"parameters": p.current_bytes, "gradients": g.current_bytes,
            "optimizer states": o.current_bytes, "activations": a.current_bytes}


@functools.lru_cache(maxsize=1)
def parts_that_grow() -> frozenset:
    """Measured: the parts whose bytes grow when the batch grows 4x (2 -> 8 rows)."""
    small, large = step_parts(2), step_parts(8)
    return frozenset(k for k in PARTS if large[k] > small[k])


def mixed_adam_parts(config: dict = CONFIG, batch: int = 2, device="cpu") -> dict[str, int]:
    """Measured: bf16 weights and gradients, an fp32 master copy that AdamW updates, bytes by part."""
    from ckpt_lab.measure.memory import track_memory
    from ckpt_lab.training.models import MLPConfig, build_model
    with track_memory() as w:
        half = build_model(MLPConfig(**config)).to(device, torch.bfloat16)
    with track_memory() as m:
        master = [p.detach().float().requires_grad_() for p in half.parameters()]
    opt = torch.optim.AdamW(master, lr=1e-3)
    x = torch.randint(0, 256, (batch, config["block_size"]), device=device)
    with track_memory() as g:
        half(x, x).backward()
    with track_memory() as o:
        for p, h in zip(master, half.parameters()):
            p.grad = h.grad.float()          # cast for the update, dropped after it
        opt.step()
        for p in master:
            p.grad = None
    return {"parameters": w.current_bytes, "gradients": g.current_bytes,
            "master copy": m.current_bytes, "optimizer states": o.current_bytes}


@functools.lru_cache(maxsize=1)
def mixed_adam_bytes_per_param() -> float:
    """Measured: model-state bytes per parameter of bf16 mixed precision with AdamW."""
    parts = mixed_adam_parts(dict(block_size=16, width=64, depth=2))
    from ckpt_lab.training.models import MLPConfig, build_model
    n = sum(p.numel() for p in build_model(MLPConfig(block_size=16, width=64, depth=2)).parameters())
    return sum(parts.values()) / n


def _grows_hints(given: set, expected: set) -> str:
    hints = []
    if "gradients" in given - expected:
        hints.append("a gradient has the shape of its parameter: backward sums the batch's "
                     "contributions into it")
    if "optimizer states" in given - expected:
        hints.append("Adam keeps two numbers per parameter, not per example")
    if "parameters" in given - expected:
        hints.append("the weights do not depend on the data")
    if expected - given:
        hints.append("the forward keeps activations for every token of the batch")
    return not_quite(hints)


_grows = name_set(
    PARTS, parts_that_grow, wrong=_grows_hints,
    right="only the activations: one set per token kept for backward. Gradients and Adam's "
          "states are one per parameter, whatever the batch.")

_mixed = near(
    mixed_adam_bytes_per_param, 0.5, strict=True,
    right="measured {expected:.2f}: 2 (bf16 weight) + 2 (bf16 gradient) + 4 (fp32 master copy) "
          "+ 8 (fp32 Adam moments), as much as fp32 training.",
    low="Measured {expected:.2f}. Halving everything gives 8, but the optimizer updates an fp32 "
        "master copy of the weights (4 bytes) and keeps its two moments in fp32 (8 bytes): "
        "mixed precision leaves model state where fp32 had it (lesson 7 measures what it does "
        "to activations and time).",
    high="Measured {expected:.2f}: the gradients here are bf16 (2 bytes); keeping them in fp32 "
         "(18 bytes) or both (20) are other arrangements.")


# The build task: predict_parts(config, B, optimizer) -> {part: bytes}, run on these steps.
TASK_STEPS = (  # (MLPConfig fields, B, optimizer): depths, widths, lengths and optimizers differ
    (dict(block_size=16, width=32, depth=2), 4, "adamw"),
    (dict(block_size=32, width=64, depth=5), 2, "sgd momentum"),
    (dict(block_size=8, width=48, depth=3), 8, "sgd"),
    (dict(block_size=24, width=40, depth=1), 3, "adamw"),
)
PART_HINTS = {
    "parameters": "every parameter is one fp32 number, 4 bytes: count them with "
                  "sum(p.numel() for p in build_model(config).parameters())",
    "gradients": "a gradient has its parameter's shape, 4 bytes per parameter, whatever B is",
    "optimizer states": "AdamW keeps two fp32 moments per parameter (8 bytes), SGD with "
                        "momentum one (4), plain SGD none",
    "activations": "per token the forward keeps L + 1 width-H vectors (the embedding's output "
                   "and each block's ReLU output) and the loss's log-softmax over V: "
                   "((L + 1) H + V) * 4 bytes, times N = B * T tokens",
}


def _close(predicted, measured: int) -> bool:
    """Within 0.5% (AdamW's step counters add 4 bytes per parameter tensor), or 64 bytes."""
    return abs(predicted - measured) <= max(64, 0.005 * measured)


def _predict_parts(answer):
    if not callable(answer):
        return False, ("Pass your function itself: check('01.predict_parts', predict_parts), "
                       "taking (config, B, optimizer).")
    from ckpt_lab.training.models import MLPConfig
    for fields, batch, optimizer in TASK_STEPS:
        config = MLPConfig(**fields)
        try:
            predicted = answer(config, batch, optimizer)
        except NotImplementedError:
            predicted = None
        except Exception as e:  # the learner's code: report, do not raise
            return False, f"Your function raised {type(e).__name__}: {e}"
        if predicted is None:
            return False, ("not answered yet: predict_parts returns None. Hint: which parts "
                           "depend on B? The others are a count times bytes per parameter.")
        if not isinstance(predicted, dict) or set(predicted) != set(PARTS):
            return False, f"Return a dict with exactly the keys {list(PARTS)}."
        measured = step_parts(batch, fields, optimizer=optimizer)
        for part in PARTS:
            if not _close(predicted[part], measured[part]):
                step = (f"L={config.depth}, H={config.width}, T={config.block_size}, B={batch}, "
                        f"{optimizer}")
                return False, (f"{part} at {step}: you predicted {predicted[part]:,} bytes, "
                               f"track_memory measured {measured[part]:,}. "
                               f"Hint: {PART_HINTS[part]}.")
    return True, (f"all four parts of {len(TASK_STEPS)} steps (three optimizers, depths, widths "
                  "and batches) within 0.5% of track_memory's measurement.")


EXERCISES = [
    Exercise("01.grows_with_batch", "Make the batch 4x larger: which parts of the step's "
             "memory grow? A set of 'parameters', 'gradients', 'optimizer states', "
             "'activations'.", _grows, expected=lambda: sorted(parts_that_grow())),
    Exercise("01.mixed_adam_bytes", "bf16 mixed precision with AdamW (bf16 weights and "
             "gradients, an fp32 master copy of the weights that the optimizer updates): how "
             "many bytes of model state per parameter?", _mixed,
             expected=mixed_adam_bytes_per_param),
    Exercise("01.predict_parts", "Build task: write predict_parts(config, B, optimizer) that "
             "returns the bytes of the four parts of one fp32 step of the lesson's MLP "
             "(config an MLPConfig, B rows of config.block_size tokens, optimizer 'adamw', "
             "'sgd momentum' or 'sgd'): {'parameters', 'gradients', 'optimizer states', "
             "'activations'}. It is run on several models and optimizers against track_memory.",
             _predict_parts),
]
