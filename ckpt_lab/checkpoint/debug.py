"""``debug=True``: when a check refuses a recompute, show the operations the forward and the
recompute ran, side by side, with the first that differs marked. (Design note 16, in NOTES.md.)

A refusal says which saved tensor (or output) differs; the trace says where the two runs went
apart: each ATen operation, the shape and dtype it returned, the tensors it saved, and the line
of your code that called it (the innermost frame outside torch and ckpt_lab's checkpoint). As
PyTorch's ``debug=True`` does, it costs a Python call per operation, so it is off by default.
"""
from __future__ import annotations

import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .guards import CheckpointError, describe

_SKIP = (os.sep + "torch" + os.sep, os.path.dirname(__file__) + os.sep)
SHOWN = 12                                       # rows shown on each side of the difference


class OpLog(TorchDispatchMode):
    """The operations one run dispatched, each with what it returned and where it was called."""

    def __init__(self):
        super().__init__()
        self.rows: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shown = describe(out) if isinstance(out, torch.Tensor) else ""
        self.rows.append(f"{func} {shown}  {_caller()}".rstrip())
        return out

    def saved(self, i: int, t: torch.Tensor):
        """Note that the run saved ``t`` for backward, as its ``i``-th saved tensor."""
        self.rows.append(f"    saves tensor {i} {describe(t)}")


def _caller() -> str:
    """``file:line`` of the innermost frame outside torch and this package."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not any(part in name for part in _SKIP):
            return f"({os.path.basename(name)}:{frame.f_lineno})"
        frame = frame.f_back
    return ""


class Trace:
    """The forward's log and the latest recompute's, for one checkpointed call."""

    def __init__(self):
        self.forward, self.recompute = OpLog(), None

    def start_recompute(self) -> OpLog:
        """A fresh log for a recompute."""
        self.recompute = OpLog()
        return self.recompute

    def explain(self, error: CheckpointError) -> CheckpointError:
        """``error`` with the two logs appended, the first row that differs marked ``>>``."""
        a, b = self.forward.rows, (self.recompute.rows if self.recompute else [])
        first = next((i for i, (u, v) in enumerate(zip(a, b)) if u != v), min(len(a), len(b)))
        lo, hi = max(first - SHOWN, 0), first + SHOWN

        def show(rows):
            lines = [f"{'>>' if i == first else '  '} {i:4d}  {r}"
                     for i, r in enumerate(rows[lo:hi], start=lo)]
            more = len(rows) - hi
            return "\n".join(lines + ([f"        ... {more} more"] if more > 0 else []))

        return CheckpointError(
            f"{error}\n\ndebug=True: the operations the two runs dispatched (rows {lo}-"
            f"{min(hi, max(len(a), len(b))) - 1} of {len(a)} in the forward, {len(b)} in the "
            f"recompute); they first differ at row {first}. (A recompute that stops early ends "
            f"where backward has what it needs; its detach calls are the checkpoint's own.)\n"
            f"The forward:\n{show(a)}\nThe recompute:\n{show(b)}")
