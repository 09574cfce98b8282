"""Step timing for lessons that compare strategies on a shared machine.

A CPU shared with other work slows whatever runs while the other work runs. Timing strategy A
five times and then strategy B five times lets that land on one of them; `seconds` runs them
in turn, round after round, and takes each one's median, so a busy spell slows all alike.
"""
from __future__ import annotations

import time
from typing import Callable

import torch


def _sync(device) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def seconds(steps: dict[str, Callable[[], object]], repeats: int = 5, device=None,
            after: Callable[[], object] | None = None) -> dict[str, float]:
    """Median wall seconds of each ``steps[name]()``, run in turn ``repeats`` times after one
    warm-up round; ``after()`` runs untimed after each call (e.g. ``model.zero_grad``)."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    if not steps:
        raise ValueError("seconds needs at least one step to time")
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats + 1):
        for name, step in steps.items():
            _sync(device)
            start = time.perf_counter()
            step()
            _sync(device)
            times[name].append(time.perf_counter() - start)
            if after is not None:
                after()
    return {name: sorted(t[1:])[repeats // 2] for name, t in times.items()}
