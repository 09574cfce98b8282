"""An out-of-memory fallback ladder that really runs the step at each rung.

Given a training-step function of a `StepConfig`, `run_with_fallback` tries it; on
`torch.OutOfMemoryError` (a real one on CUDA, or `SimulatedOutOfMemoryError` from
`track_memory(limit_bytes=...)`) it moves one rung down and tries again, logging each rung.
The rungs, in the source article's order by default:

* ``"densify"``: checkpoint more densely: off -> segments of `max_every` blocks -> of half that
  -> ... -> of 1 block (``checkpoint_every=k``: one checkpoint per run of k consecutive blocks);
* ``"accumulate"``: double the gradient accumulation steps, halving the micro-batch, so the
  effective batch (and the optimisation) stays the same;
* ``"shrink"``: halve the batch itself, which does change the optimisation (logged as such).

Each move is used until it can go no further before the next one is tried.

`chain_step` makes such a step for any model with ``set_policy`` (the course's chains): memory
is measured in that pass, under `track_memory`. Its bookkeeping costs the same per operation
however small, which would bias timings against accumulation (more, smaller operations), so
`median_seconds` times the same steps in a separate, untracked pass.
"""
from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field, replace

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..measure.memory import track_memory

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


# ------------------------------------------------------------- steps of the course's chains
def policy_for(config: StepConfig) -> str:
    """The checkpoint policy of a config: "none" or "every:<k>"."""
    return f"every:{config.checkpoint_every}" if config.checkpoint_every else "none"


def prepare(model, config: StepConfig) -> None:
    """Set the model's checkpoint policy from `config` and allocate (or zero) its parameter
    gradients: model state, not part of the step's peak."""
    model.set_policy(policy_for(config))
    for p in model.parameters():
        p.grad = torch.zeros_like(p) if p.grad is None else p.grad.zero_()


def _forward_backward(model, x, y, config: StepConfig) -> None:
    k = config.accumulation_steps
    for xm, ym in zip(x[:config.batch_size].chunk(k), y[:config.batch_size].chunk(k)):
        (model(xm, ym) / k).backward()


def run_config(model, x, y, config: StepConfig) -> None:
    """`prepare`, then forward and backward of `config` on the first batch_size rows of (x, y),
    accumulated over its micro-batches."""
    prepare(model, config)
    _forward_backward(model, x, y, config)


def chain_step(model, x, y, limit_bytes: int | None = None):
    """A `step(config)` for `run_with_fallback`: runs `config` under a simulated memory limit
    and returns its `MemoryLog` (``.peak_bytes``, ``.num_ops``)."""
    def step(config: StepConfig):
        prepare(model, config)
        with track_memory(limit_bytes=limit_bytes) as mem:
            _forward_backward(model, x, y, config)
        return mem
    return step


def config_flops(model, x, y, config: StepConfig) -> int:
    """FLOPs of one step of `config`, counted by PyTorch's FlopCounterMode."""
    prepare(model, config)
    with FlopCounterMode(display=False) as counter:
        _forward_backward(model, x, y, config)
    return counter.get_total_flops()


def median_seconds(model, x, y, configs, repeats: int = 5) -> list[float]:
    """Median seconds of forward and backward of each config, untracked, the configs
    interleaved in every repeat.

    On a CPU this is the process's CPU time with PyTorch on one thread: the work the step costs,
    which other programs sharing the machine do not inflate (wall-clock time on a busy machine
    varies several-fold). On CUDA it is wall-clock time between synchronisations.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    configs = list(configs)
    cuda = x.device.type == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(1)
    try:
        times = [[] for _ in configs]
        for c in configs:
            run_config(model, x, y, c)        # warm-up: allocations, lazy initialisation
        for _ in range(repeats):
            for c, ts in zip(configs, times):
                prepare(model, c)
                if cuda:
                    torch.cuda.synchronize(x.device)
                start = clock()
                _forward_backward(model, x, y, c)
                if cuda:
                    torch.cuda.synchronize(x.device)
                ts.append(clock() - start)
    finally:
        torch.set_num_threads(threads)
    return [sorted(ts)[len(ts) // 2] for ts in times]
