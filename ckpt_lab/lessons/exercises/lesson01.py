"""Predictions of lesson 1: which part of a step grows with the batch, and what mixed
precision does to model state. Both answers are measured, never typed in."""
from __future__ import annotations

import functools

import torch

from .base import Exercise, name_set, near, not_quite

PARTS = ("parameters", "gradients", "optimizer states", "activations")
CONFIG = dict(block_size=64, width=128, depth=8)     # the lesson's CPU sizes


def step_parts(batch: int, config: dict = CONFIG, device="cpu") -> dict[str, int]:
    """Measured: the bytes each part of one fp32 AdamW step creates, at one batch size."""
    from ckpt_lab.measure.memory import track_memory
    from ckpt_lab.training.models import MLPConfig, build_model
    with track_memory() as p:
        model = build_model(MLPConfig(**config)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
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


EXERCISES = [
    Exercise("01.grows_with_batch", "Make the batch 4x larger: which parts of the step's "
             "memory grow? A set of 'parameters', 'gradients', 'optimizer states', "
             "'activations'.", _grows, expected=lambda: sorted(parts_that_grow())),
    Exercise("01.mixed_adam_bytes", "bf16 mixed precision with AdamW (bf16 weights and "
             "gradients, an fp32 master copy of the weights that the optimizer updates): how "
             "many bytes of model state per parameter?", _mixed,
             expected=mixed_adam_bytes_per_param),
]
