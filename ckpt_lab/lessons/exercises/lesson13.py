"""Exercises of lesson 13: torch.compile's activation memory budget.

Two committed predictions and one build task, each measured on the lesson's CPU-size MLP
(L = 8 blocks of Linear(H, H) and GELU, H = 256, 1,024 rows). The judges compile with
``aot_eager_decomp_partition``: the partitioner Inductor uses, so the same choice of what to
keep, with no C++ compile (about a second a budget instead of several); the lesson asserts that
its Inductor measurements give the same verdicts.
"""
from __future__ import annotations

import functools

import torch

from .base import Exercise, one_of

ROWS, WIDTH, DEPTH = 1024, 256, 8          # the lesson's CPU sizes
TASK_BUDGETS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
BACKEND = "aot_eager_decomp_partition"


def mlp(seed: int = 0) -> torch.nn.Sequential:
    """The lesson's model: DEPTH blocks of Linear(WIDTH, WIDTH) and GELU."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[m for _ in range(DEPTH)
                                 for m in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())])


def _loss(model, x):
    return model(x).pow(2).mean()


def _inputs() -> torch.Tensor:
    return torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(1))


def _compiled(budget: float):
    """(forward, model): the lesson's step compiled on its own code at ``budget``."""
    import torch._functorch.config as functorch_config

    from ckpt_lab.lessons import compiled
    model, x = mlp(), _inputs()
    step = torch.compile(compiled.own_code(_loss), backend=BACKEND)

    def forward():
        with functorch_config.patch(activation_memory_budget=budget):
            return step(model, x)
    return forward, model


@functools.lru_cache(maxsize=None)
def measured(budget: float) -> tuple[int, int]:
    """(kept bytes, step peak) of the lesson's step compiled at ``budget``, from the allocator."""
    from ckpt_lab.lessons import compiled
    row = compiled.measure(*_compiled(budget), warmup=0)
    return row["kept_bytes"], row["peak_bytes"]


def peak_verdict(kept: dict, peak: dict, low: float = 0.1, high: float = 1.0) -> str:
    """How the step peak moved from budget ``high`` to ``low``, against the kept bytes: 'as
    much' (within twice the kept bytes' fall), 'less' or 'not at all' (it fell under 5%)."""
    peak_ratio, kept_ratio = peak[low] / peak[high], kept[low] / kept[high]
    if peak_ratio >= 0.95:
        return "not at all"
    return "as much" if peak_ratio <= 2 * kept_ratio else "less"


def low_budget_peak() -> str:
    """Measured: how the step peak moves from budget 1.0 to 0.1."""
    kept, peak = ({b: measured(b)[i] for b in (1.0, 0.1)} for i in (0, 1))
    return peak_verdict(kept, peak)


_low_budget_peak = one_of(
    ("as much", "less", "not at all"), low_budget_peak,
    right="Not at all: at 0.1 the forward keeps almost nothing, so the backward must recompute "
          "the chain before its first gradient, and every recomputed activation is alive at "
          "once again, beside the gradients.",
    wrong="Measured: {expected}.",
    hints={"as much": "The kept bytes fall about fifteen-fold, but the step peak comes in the "
                      "backward: there the partitioner's recompute brings the activations back "
                      "before the first gradient. Measured: not at all.",
           "less": "It does not fall at all: the backward recomputes the whole chain before its "
                   "first gradient, so the activations are all alive again at once."},
    normalise=str.lower)


@functools.lru_cache(maxsize=None)
def reused_budget() -> float:
    """Measured: compile the step at budget 1.0, call it, then call it again with the budget
    set to 0.1 and no reset: the budget whose kept bytes the second call shows."""
    import torch._functorch.config as functorch_config

    from ckpt_lab.lessons import compiled
    model, x = mlp(), _inputs()
    step = torch.compile(compiled.own_code(_loss), backend=BACKEND)
    with functorch_config.patch(activation_memory_budget=1.0):
        step(model, x).backward()
    model.zero_grad(set_to_none=True)

    def forward():
        with functorch_config.patch(activation_memory_budget=0.1):
            return step(model, x)
    kept = compiled.measure(forward, model, warmup=0)["kept_bytes"]
    return min((1.0, 0.1), key=lambda b: abs(measured(b)[0] - kept))


_budget_reused = one_of(
    (1.0, 0.1), reused_budget,
    right="1.0: Dynamo found its graph for this code and its guards held (same shapes, dtypes, "
          "grad mode); the budget is no guard, so nothing was partitioned again. Set the budget "
          "before the first call, or torch._dynamo.reset() before changing it.",
    wrong="Measured: {expected}.",
    hints={0.1: "The second call kept what budget 1.0 keeps: Dynamo reused the graph it had "
                "compiled, because its guards check the inputs (shapes, dtypes, grad mode), not "
                "the budget. The budget is read only when a graph is partitioned."})


# ----------------------------------------------------------------------- the build task
def _right_answer(peaks: dict, limit: int, budgets) -> float | None:
    return next((b for b in budgets if peaks[b] <= limit), None)


def _cases(peaks: dict) -> list[int]:
    """Limits that tell a right search from a wrong one: one every budget meets, none does, the
    lowest peak (several budgets meet it), and one the largest and the smallest fitting budget
    answer differently."""
    ordered = sorted(set(peaks.values()))
    limits = [peaks[TASK_BUDGETS[0]], ordered[0], ordered[0] - 1]
    for limit in ordered:
        fitting = [b for b in TASK_BUDGETS if peaks[b] <= limit]
        if len(fitting) >= 2 and fitting[0] != TASK_BUDGETS[0]:
            limits.append(limit)
            break
    return limits


class _Measured(Exception):
    """Raised by the probe's peak_at: the learner's function does measure."""


def _unanswered(answer) -> bool:
    """Whether ``answer`` returns without measuring anything (the lesson's stub does), found
    before any compile: its peak_at raises at the first call."""
    def peak_at(budget):
        raise _Measured
    try:
        answer(peak_at, 1, TASK_BUDGETS)
    except _Measured:
        return False
    except NotImplementedError:
        return True
    except Exception:  # the learner's code: judged, with its error, on the real measurements
        return False
    return True


def _pick_budget(answer):
    if not callable(answer):
        return False, ("Pass your function itself: check('13.pick_budget', pick_budget), "
                       "taking (peak_at, limit, budgets).")
    if _unanswered(answer):
        return False, ("not answered yet: pick_budget returns without measuring. Hint: walk "
                       "the budgets from the largest down, measure each with peak_at(budget), "
                       "and return the first whose peak is at most the limit; None if none is.")
    peaks = {b: measured(b)[1] for b in TASK_BUDGETS}
    for limit in _cases(peaks):
        asked = []

        def peak_at(budget):
            if budget not in peaks:
                raise ValueError(f"no measurement at budget {budget!r}; use one of the budgets "
                                 "given")
            asked.append(budget)
            return peaks[budget]
        try:
            got = answer(peak_at, limit, TASK_BUDGETS)
        except Exception as e:  # the learner's code: report, do not raise
            return False, f"Your function raised {type(e).__name__}: {e}"
        want = _right_answer(peaks, limit, TASK_BUDGETS)
        if got != want:
            fitting = [b for b in TASK_BUDGETS if peaks[b] <= limit]
            head = f"limit {limit / 2**20:.2f} MiB: you returned {got!r}, the answer is {want!r}"
            if got in fitting:
                return False, (f"{head}. {got!r} fits, but so does {want!r}, which keeps more "
                               "and recomputes less: the largest budget that fits is the "
                               "fastest step.")
            return False, (f"{head} (budgets that fit: {fitting or 'none'}). The step peak is "
                           "not monotone in the budget, so a bisection can skip the answer: "
                           "scan from the largest budget down.")
        needed = len(TASK_BUDGETS) if want is None else TASK_BUDGETS.index(want) + 1
        if len(set(asked)) > needed:
            return False, (f"limit {limit / 2**20:.2f} MiB: the right budget, {want!r}, but you "
                           f"measured {len(set(asked))} budgets where {needed} suffice. Each "
                           "measurement is a compile: stop at the first budget that fits.")
    return True, (f"the right budget for {len(_cases(peaks))} limits, each after the fewest "
                  "measurements: the largest budget that fits is the fastest step that fits.")


EXERCISES = [
    Exercise("13.low_budget_peak", "The lesson's MLP step compiled at activation_memory_budget "
             "1.0 and at 0.1: at 0.1 the forward keeps about 15x fewer bytes for the backward. "
             "How does the step peak move from 1.0 to 0.1: 'as much', 'less' or 'not at all'?",
             _low_budget_peak, low_budget_peak),
    Exercise("13.budget_reused", "The step was compiled and run at budget 1.0. You set "
             "activation_memory_budget to 0.1 and call the same compiled step again, without "
             "torch._dynamo.reset(). Which budget's choice of saved tensors does it run: 1.0 or "
             "0.1?", _budget_reused, reused_budget),
    Exercise("13.pick_budget", "Build task: write pick_budget(peak_at, limit, budgets) that "
             "returns the largest of `budgets` (given from the largest down) whose measured "
             "step peak, peak_at(budget), is at most `limit` bytes, or None when none is, "
             "measuring as few budgets as it can (each measurement is a compile).",
             _pick_budget),
]
