"""One training loop for every model in `ckpt_lab.training.models`, measured step by step.

`train` runs N optimizer steps with a checkpoint policy, gradient accumulation over
micro-batches, optional mixed precision (bf16 autocast on CPU and CUDA; fp16 with a
`GradScaler` on CUDA) and AdamW, and returns one `StepRecord` per step: loss, time, tokens per
second and peak memory from `track_memory` (plus the CUDA allocator's peak on a GPU).

`save_run_state` / `load_run_state` store and restore a *training run* (model, optimizer, random
number generators, step) so it can be resumed. That is unrelated to gradient checkpointing,
which is about activations inside one step; the course calls these files "run state" so the
two are never confused.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..measure.memory import phase, track_memory

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class StepRecord:
    """What one optimizer step cost. Bytes are those allocated during the step and alive at
    its peak (activations, gradients, temporaries; optimizer state on the first step)."""

    step: int
    loss: float
    seconds: float
    tokens_per_s: float          # tokens for text models, images for the conv net
    peak_bytes: int | None       # track_memory's exact peak; None if measure_memory=False
    cuda_peak_bytes: int | None  # the CUDA allocator's peak, on a GPU
    phase_peaks: dict[str, int] = field(default_factory=dict)


@dataclass
class TrainResult:
    """The records of a run, and what is needed to continue it."""

    records: list[StepRecord]
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    next_step: int

    @property
    def losses(self) -> list[float]:
        """Loss of every step, in order."""
        return [r.loss for r in self.records]


def make_optimizer(model: torch.nn.Module, lr: float = 1e-3, weight_decay: float = 0.1,
                   betas: tuple[float, float] = (0.9, 0.95)) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases and norm weights)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas)


def _autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def _check_args(precision: str, device: torch.device, micro_batches: int, steps: int):
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("precision='fp16' needs a CUDA device (float16 autocast with a "
                         "GradScaler); on CPU use precision='bf16' or 'fp32'")
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be a positive int, got {micro_batches!r}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model: torch.nn.Module, batches, steps: int, *, policy=None, impl: str | None = None,
          micro_batches: int = 1, precision: str = "fp32", lr: float = 1e-3,
          weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.95),
          grad_clip: float | None = None, optimizer: torch.optim.Optimizer | None = None,
          scaler: torch.amp.GradScaler | None = None, start_step: int = 0,
          device: str | torch.device | None = None, seed: int | None = None,
          progress: bool = True, measure_memory: bool = True) -> TrainResult:
    """Train ``model`` for ``steps`` optimizer steps on ``batches.get(step)``.

    policy/impl: a checkpoint policy for ``model.set_policy`` (None keeps the model's own).
    micro_batches: each step's batch is split into this many equal micro-batches whose
    gradients accumulate before one optimizer step (same result as the whole batch).
    precision: "fp32", "bf16" (autocast, CPU or CUDA) or "fp16" (autocast + GradScaler, CUDA).
    optimizer/scaler/start_step: continue a run (see `load_run_state`); by default a fresh
    `make_optimizer(model, lr, weight_decay, betas)` and step 0.
    seed: if given, seed the global RNG (dropout) first, so two runs draw the same masks;
    leave it None when resuming (the run state restores the RNG).
    measure_memory: wrap each step in `track_memory` (exact bytes; costs some speed).
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    _check_args(precision, device, micro_batches, steps)
    if policy is not None or impl is not None:
        if not hasattr(model, "set_policy"):
            raise ValueError(f"a checkpoint policy needs a ckpt_lab.training.models model (one with "
                             f"set_policy); {type(model).__name__} has none. Leave policy=None "
                             "and checkpoint inside the model yourself.")
        model.set_policy(policy if policy is not None else model.policy, impl)
    model.to(device).train()
    if seed is not None:
        torch.manual_seed(seed)
    if optimizer is None:
        optimizer = make_optimizer(model, lr, weight_decay, betas)
    if scaler is None and precision == "fp16":
        scaler = torch.amp.GradScaler("cuda")
    records = []
    bar = tqdm(range(start_step, start_step + steps), disable=not progress, desc="train")
    for step in bar:
        x, y = batches.get(step)
        if len(x) % micro_batches:
            raise ValueError(f"the batch of {len(x)} rows does not split into "
                             f"{micro_batches} equal micro-batches; pick a divisor")
        x, y = x.to(device), y.to(device)
        _sync(device)
        start = time.perf_counter()
        with (track_memory() if measure_memory else contextlib.nullcontext()) as mem:
            loss = _step(model, optimizer, scaler, x, y, micro_batches, precision, device,
                         grad_clip)
        _sync(device)
        seconds = time.perf_counter() - start
        records.append(StepRecord(
            step=step, loss=loss, seconds=seconds,
            tokens_per_s=batches.tokens_per_batch() / seconds,
            peak_bytes=mem.peak_bytes if mem is not None else None,
            cuda_peak_bytes=mem.cuda_peak_bytes if mem is not None else None,
            phase_peaks=mem.phase_peaks() if mem is not None else {}))
        bar.set_postfix(loss=f"{loss:.3f}")
    return TrainResult(records, optimizer, scaler, start_step + steps)


def _step(model, optimizer, scaler, x, y, micro_batches, precision, device, grad_clip) -> float:
    """Forward and backward over the micro-batches, then one optimizer step; returns the loss."""
    total = 0.0
    for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        with _autocast(device, precision):
            loss = model(xm, ym) / micro_batches
        (scaler.scale(loss) if scaler is not None else loss).backward()
        total += loss.item()
    with phase("optimizer"):
        if scaler is not None:
            if grad_clip is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            scaler.step(optimizer)
            scaler.update()
        else:
            if grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return total


# --------------------------------------------------------------------------- run state
def save_run_state(path: str | os.PathLike, model: torch.nn.Module,
                   optimizer: torch.optim.Optimizer, step: int,
                   scaler: torch.amp.GradScaler | None = None) -> Path:
    """Save a training run (model, optimizer, RNG states, next step) to resume it later.

    This is a *run state* file, not gradient checkpointing (which trades activation memory
    for recomputation inside a step). Written to a temporary file, then moved into place with
    `os.replace`, so a crash never leaves a half-written file.
    """
    path = Path(path)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "step": int(step),
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_run_state(path: str | os.PathLike, model: torch.nn.Module,
                   optimizer: torch.optim.Optimizer,
                   scaler: torch.amp.GradScaler | None = None) -> int:
    """Restore what `save_run_state` wrote (in place) and return the step to continue from.

    Loads with ``torch.load(weights_only=True)``. Not related to gradient checkpointing.
    """
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng_cpu"])
    if state["rng_cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng_cuda"])
    return state["step"]
