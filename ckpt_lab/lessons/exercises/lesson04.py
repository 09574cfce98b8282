"""Exercises of lesson 4: The price."""
from __future__ import annotations

import torch
from torch import nn

from ckpt_lab.checkpoint import checkpoint
from ckpt_lab.memory import kept_after_forward

from .base import Exercise, _name_set

CANDIDATE_MODULES = {
    "Linear": lambda: nn.Linear(16, 16), "ReLU": nn.ReLU, "GELU": nn.GELU,
    "Dropout": lambda: nn.Dropout(0.5),
    "Linear->ReLU": lambda: nn.Sequential(nn.Linear(16, 16), nn.ReLU()),
    "ReLU->Linear": lambda: nn.Sequential(nn.ReLU(), nn.Linear(16, 16)),
    "Linear->ReLU->Linear": lambda: nn.Sequential(nn.Linear(16, 16), nn.ReLU(),
                                                  nn.Linear(16, 16)),
}


def checkpoint_saving_bytes() -> dict[str, int]:
    """Measured: bytes `checkpoint` saves after the forward of each candidate, x of (64, 16)."""
    torch.manual_seed(0)
    x = torch.randn(64, 16, requires_grad=True)
    out = {}
    for name, make in CANDIDATE_MODULES.items():
        m = make()
        out[name] = kept_after_forward(m, x) - kept_after_forward(lambda t: checkpoint(m, t), x)
    return out


def _no_saving_modules(answer):
    given, why = _name_set(answer, CANDIDATE_MODULES, "names")
    if why:
        return False, why
    saving = checkpoint_saving_bytes()
    expected = {n for n, b in saving.items() if b <= 0}
    if given == expected:
        return True, (f"{sorted(given)}: each keeps only a tensor that is alive anyway (its "
                      "input, which the checkpoint keeps, or its output). Measured savings: "
                      + ", ".join(f"{n} {b} B" for n, b in saving.items()))
    wrong = sorted(given - expected)
    if wrong:
        return False, (f"{wrong} keep something besides their input and output (a ReLU output "
                       "inside, a dropout mask): checkpointing drops it. Measure each with "
                       "kept_after_forward(m, x) against kept_after_forward(lambda t: "
                       "checkpoint(m, t), x).")
    return False, ("Something that saves nothing is missing: a module whose only saved tensor "
                   "is its input (kept by the checkpoint anyway) or its own output.")


def _mlp_for_policy():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))


def policy_cost(policy) -> dict[str, int]:
    """Measured for the (Linear 16->64, GELU, Linear 64->16) MLP on x of (64, 16): bytes kept
    after the forward and FLOPs of a step, plain, fully checkpointed and with ``policy``."""
    from torch.utils.flop_counter import FlopCounterMode
    mlp = _mlp_for_policy()
    x = torch.randn(64, 16, requires_grad=True)
    runs = {"plain": lambda t: mlp(t), "full": lambda t: checkpoint(mlp, t),
            "policy": lambda t: checkpoint(mlp, t, policy=policy)}
    out = {}
    for name, run in runs.items():
        out[f"{name}_bytes"] = kept_after_forward(run, x)
        with FlopCounterMode(display=False) as counter:
            run(x).sum().backward()
        out[f"{name}_flops"] = counter.get_total_flops()
    return out


def _selective_policy(answer):
    if not callable(answer):
        return False, ("Pass your policy itself: a function policy(op, *args, **kwargs) -> bool, "
                       "True to keep the op's output.")
    try:
        c = policy_cost(answer)
    except Exception as e:  # the learner's code: report, do not raise
        return False, f"Your policy raised {type(e).__name__}: {e}"
    summary = (f"kept {c['policy_bytes']:,} B (plain {c['plain_bytes']:,}, full checkpoint "
               f"{c['full_bytes']:,}); step FLOPs {c['policy_flops']:,} (plain "
               f"{c['plain_flops']:,})")
    if c["policy_flops"] > c["plain_flops"]:
        return False, (f"A matmul is re-run: {summary}. Return True for the matmul ops "
                       "(op.overloadpacket in ckpt_lab.selective.MATMUL_OPS: aten.addmm, aten.mm).")
    if c["policy_bytes"] >= c["plain_bytes"]:
        return False, (f"Nothing is dropped: {summary}. Return False for the GELU so its "
                       "output is recomputed.")
    return True, f"{summary}: the GELU output is dropped and no matmul is re-run."


EXERCISES = [
    Exercise("04.no_saving_modules", "Of Linear, ReLU, GELU, Dropout, Linear->ReLU, "
             "ReLU->Linear and Linear->ReLU->Linear (width 16): for which does checkpoint(m, x) "
             "keep no fewer bytes after the forward than m(x)? Give a set of names.",
             _no_saving_modules),
    Exercise("04.selective_policy", "Pass a policy(op, *args, **kwargs) -> bool for "
             "checkpoint(mlp, x, policy=...) on Linear(16, 64) -> GELU -> Linear(64, 16): it "
             "must keep fewer bytes than a plain run and re-run no matmul.", _selective_policy),
]
