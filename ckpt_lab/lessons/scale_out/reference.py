"""Lesson 12's reference: the one-process run in the caller that every rank is compared with
(its loss and gradients, its bytes by kind), and the bands of lesson 12's figure, into which
`bands` sorts the bytes of a one-process, DDP or FSDP run."""
from __future__ import annotations

import torch

from ckpt_lab.measure.memory import track_memory
from ckpt_lab.training.models import build_model

from .ranks import _grads, _state_bytes, _zero_grads

BANDS = ("weights", "gradients", "buckets", "Adam", "gathered weights", "activations & buffers")


def single_step(cfg, x, y, policy="none", impl: str | None = None) -> tuple[float, dict]:
    """One process, whole global batch: the loss and every parameter's gradient."""
    model = build_model(cfg, policy=policy, impl=impl)
    loss = model(x, y)
    loss.backward()
    return loss.item(), _grads(model)


def one_process(cfg, x, y, policy="none", impl: str | None = None) -> dict:
    """One process, whole global batch, in the caller: bytes by kind, as `ddp_step` reports a
    rank's (gradients allocated before the measured forward + backward, then one Adam step)."""
    model = build_model(cfg, policy=policy, impl=impl)
    _zero_grads(model)
    with track_memory() as mem:
        model(x, y).backward()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt.step()
    return {"peak_bytes": mem.peak_bytes, **_state_bytes(model, opt)}


def bands(run: dict) -> dict[str, int]:
    """A run's bytes at its peak, by band: what `one_process`, `ddp_step` or `fsdp_step`
    returned, as the stacked bars of lesson 12 draw it (FSDP's peak split by its probe). DDP's
    buckets count once: where the gradients are views of them, they are the gradients' band."""
    at = run.get("at_peak", {"gathered": 0, "other": run["peak_bytes"]})
    buckets = 0 if run.get("grads_in_buckets") else run.get("bucket_bytes", 0)
    return {"weights": run["param_bytes"], "gradients": run["grad_bytes"],
            "buckets": buckets, "Adam": run["optimizer_bytes"],
            "gathered weights": at["gathered"], "activations & buffers": at["other"]}
