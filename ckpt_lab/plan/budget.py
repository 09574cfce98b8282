"""A memory budget, as both planners take it: checked, searched by bisection, and refused.

`planner` (chains, from a per-layer profile) and `module_planner` (the blocks of any model,
from two recorded steps) both answer "the cheapest plan whose step peak fits this budget", and
both find the least peak a plan of some cost reaches by bisecting on the budget: what fits a
budget fits every larger one, and peaks are whole bytes.
"""
from __future__ import annotations

import numbers

class BudgetTooSmallError(ValueError):
    """No plan fits the budget; `minimum_bytes` is the least peak any plan reaches."""

    def __init__(self, budget_bytes: int, minimum_bytes: int):
        self.budget_bytes, self.minimum_bytes = budget_bytes, minimum_bytes
        super().__init__(
            f"budget of {budget_bytes:,} bytes is below the least peak any plan reaches, "
            f"{minimum_bytes:,} bytes; raise the budget, use a smaller batch, or split layers "
            "into smaller pieces.")


def budget_bytes_of(budget_bytes) -> int | None:
    """A budget as whole bytes (None for ``float("inf")``: no limit); refuses what is no size."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, numbers.Real) \
            or budget_bytes != budget_bytes or budget_bytes < 0:
        raise ValueError(f"budget_bytes must be a number of bytes >= 0, got {budget_bytes!r}")
    return int(budget_bytes) if budget_bytes != float("inf") else None


def least_budget_where(lo: int, hi: int, holds) -> int:
    """The least integer budget in (lo, hi] where ``holds(budget)`` is true, by bisection; it
    must hold at ``hi`` and keep holding as the budget grows (what fits a budget fits more)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid
    return hi
