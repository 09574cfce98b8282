"""Exercises of lesson 13: torch.compile's activation memory budget.

Two committed predictions and one build task, each measured on the lesson's CPU-size MLP
(L = 8 blocks of Linear(H, H) and GELU, H = 256, 1,024 rows). The judges compile with
``aot_eager_decomp_partition``: the partitioner Inductor uses, so the same choice of what to
keep, with no C++ compile (about a second a budget instead of several); the lesson asserts that
its Inductor measurements give the same verdicts.

The build task reads the partitioner's choice from its graphs: the learner writes a backend
that records the forward and backward graphs AOTAutograd makes and counts the bytes the
forward saves for the backward. The judge runs it at three budgets and compares each count
with the allocator's: the bytes still allocated after a forward of the same step.
"""
from __future__ import annotations

import functools

import torch

from .base import Exercise, one_of

ROWS, WIDTH, DEPTH = 1024, 256, 8          # the lesson's CPU sizes
TASK_BUDGETS = (1.0, 0.5, 0.1)             # the build task's, as the lesson's sweep
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
                   "first gradient, so the activations are all alive again at once, as under "
                   "one checkpoint segment over the whole chain (lesson 3)."},
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
LOSS_BYTES = 4                              # the fp32 loss the forward returns, held meanwhile


def kept_for_backward(budget: float) -> int:
    """Measured: the bytes the step's forward leaves allocated for the backward at ``budget``
    (the allocator's count after the forward, less the loss it returns)."""
    return measured(budget)[0] - LOSS_BYTES


def _saved_for_backward(answer):
    from ckpt_lab.lessons import compiled
    if not callable(answer):
        return False, ("Pass your function itself: check('13.saved_for_backward', "
                       "saved_for_backward), taking (loss_fn, model, x, budget).")
    counted = {}
    for budget in TASK_BUDGETS:
        loss_fn = compiled.own_code(_loss)  # a fresh code object: Dynamo compiles anew
        try:
            got = answer(loss_fn, mlp(), _inputs(), budget)
        except NotImplementedError:
            got = None
        except Exception as e:  # the learner's code: report, do not raise
            return False, f"Your function raised {type(e).__name__}: {str(e).splitlines()[0]}"
        if got is None:
            return False, ("not answered yet: saved_for_backward returns None. Compile "
                           "loss_fn with a backend that keeps the graphs it is given, run one "
                           "step at the budget, and add up what the forward graph saves.")
        counted[budget] = got
        want = kept_for_backward(budget)
        if got == want:
            continue
        head = f"budget {budget}: you counted {got:,} bytes, the allocator {want:,}"
        if budget != 1.0 and got == counted.get(1.0):
            return False, (f"{head}, as at budget 1.0. The budget is read when the graph is "
                           "first partitioned: set it around the first call "
                           "(functorch_config.patch(activation_memory_budget=budget)).")
        if got == want + LOSS_BYTES:
            return False, (f"{head}. The forward graph's first output is the loss, which "
                           "the step returns: the saved tensors are the outputs after it.")
        if got > want:
            return False, (f"{head}. Some saved nodes are graph inputs (placeholders: the "
                           "weights and the batch), allocated before the step: skip them.")
        return False, (f"{head}. Count every output of the forward graph after the loss that "
                       "is not a placeholder: numel() x element_size() of its node.meta['val'].")
    return True, ("the partitioner's choice at budgets 1.0, 0.5 and 0.1, read from its "
                  "forward graph, to the byte of what the allocator held after the forward.")


EXERCISES = [
    Exercise("13.low_budget_peak", "The lesson's MLP step compiled at activation_memory_budget "
             "1.0 and at 0.1: at 0.1 the forward keeps about 15x fewer bytes for the backward. "
             "The partitioner draws no segments: a dropped tensor is rebuilt from the nearest "
             "kept one when the backward first needs it. How does the step peak (activations + "
             "gradients) move from 1.0 to 0.1: 'as much', 'less' or 'not at all'?",
             _low_budget_peak, low_budget_peak),
    Exercise("13.budget_reused", "The step was compiled and run at budget 1.0. You set "
             "activation_memory_budget to 0.1 and call the same compiled step again, without "
             "torch._dynamo.reset(). Which budget's choice of saved tensors does it run: 1.0 or "
             "0.1?", _budget_reused, reused_budget),
    Exercise("13.saved_for_backward", "Build task: write saved_for_backward(loss_fn, model, x, "
             "budget): compile loss_fn with an aot_autograd backend that records the forward "
             "and backward graphs, run one step at activation_memory_budget=budget, and return "
             "the bytes the forward graph saves for the backward (graph inputs not counted).",
             _saved_for_backward),
]
