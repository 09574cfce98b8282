"""An out-of-memory fallback ladder that really runs the step at each rung.

Given a training-step function of a `StepConfig`, `run_with_fallback` tries it; on
`torch.OutOfMemoryError` (a real one on CUDA, or `SimulatedOutOfMemoryError` from
`track_memory(limit_bytes=...)`) it moves one rung down and tries again, logging each rung.
The rungs, in the source article's order by default:

* ``"densify"``: checkpoint more densely: off -> every `max_every` blocks -> half that -> ... -> 1;
* ``"accumulate"``: double the gradient accumulation steps, halving the micro-batch, so the
  effective batch (and the optimisation) stays the same;
* ``"shrink"``: halve the batch itself, which does change the optimisation (logged as such).

Each move is used until it can go no further before the next one is tried.
"""
from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, field, replace

import torch

MOVES = ("densify", "accumulate", "shrink")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepConfig:
    """checkpoint_every: blocks per checkpoint (0 = no checkpointing); micro_batch = batch // steps."""

    checkpoint_every: int = 0
    accumulation_steps: int = 1
    batch_size: int = 8

    def __post_init__(self):
        for name in ("accumulation_steps", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if isinstance(self.checkpoint_every, bool) or not isinstance(self.checkpoint_every, int) \
                or self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be an int >= 0 (0 = off), "
                             f"got {self.checkpoint_every!r}")
        if self.batch_size % self.accumulation_steps:
            raise ValueError(f"batch_size ({self.batch_size}) must be divisible by "
                             f"accumulation_steps ({self.accumulation_steps})")

    @property
    def micro_batch(self) -> int:
        """Examples per forward/backward."""
        return self.batch_size // self.accumulation_steps


@dataclass
class Rung:
    """One attempt: the configuration, whether it fit, and the error if not."""

    config: StepConfig
    fits: bool
    error: str = ""


@dataclass
class FallbackResult:
    """The first configuration that fit, what the step returned, and every rung tried."""

    config: StepConfig
    result: object
    rungs: list = field(default_factory=list)


class NoConfigFitsError(RuntimeError):
    """Every rung of the ladder ran out of memory."""

    def __init__(self, rungs):
        self.rungs = rungs
        super().__init__(f"all {len(rungs)} configurations ran out of memory, the last being "
                         f"{rungs[-1].config}; the model state alone may not fit: shard it or "
                         "use a larger device.")


def next_config(config: StepConfig, order=MOVES, max_every: int = 8):
    """The next rung down from `config`, and the move used; (None, None) at the bottom."""
    for move in order:
        if move == "densify":
            if config.checkpoint_every == 0:
                return replace(config, checkpoint_every=max_every), move
            if config.checkpoint_every > 1:
                return replace(config, checkpoint_every=config.checkpoint_every // 2), move
        elif move == "accumulate":
            if config.micro_batch % 2 == 0:
                return replace(config, accumulation_steps=config.accumulation_steps * 2), move
        elif move == "shrink":
            if config.batch_size > 1:
                half = config.batch_size // 2
                steps = min(config.accumulation_steps, half)
                while half % steps:
                    steps -= 1
                return replace(config, batch_size=half, accumulation_steps=steps), move
        else:
            raise ValueError(f"unknown move {move!r}; valid moves: {MOVES}")
    return None, None


def run_with_fallback(step, config: StepConfig, order=MOVES, max_every: int = 8,
                      max_rungs: int = 32) -> FallbackResult:
    """Run `step(config)`, walking down the ladder on out-of-memory until one fits."""
    order = tuple(order)
    if not order or any(m not in MOVES for m in order):
        raise ValueError(f"order must be a non-empty sequence of {MOVES}, got {order}")
    if isinstance(max_every, bool) or not isinstance(max_every, int) or max_every < 1:
        raise ValueError(f"max_every must be an int >= 1, got {max_every!r}")
    rungs = []
    while config is not None and len(rungs) < max_rungs:
        try:
            result = step(config)
        except torch.OutOfMemoryError as err:
            rungs.append(Rung(config, False, str(err).splitlines()[0]))
            log.warning("out of memory with %s: %s", config, rungs[-1].error)
            del err
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            config, move = next_config(config, order, max_every)
            if move == "shrink":
                log.warning("shrinking the batch changes the effective batch size")
            continue
        rungs.append(Rung(config, True))
        log.info("fits: %s", config)
        return FallbackResult(config, result, rungs)
    raise NoConfigFitsError(rungs)
