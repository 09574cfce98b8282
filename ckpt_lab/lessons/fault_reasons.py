"""Why each further row of lesson 2's grid comes out as it does, one short line a row.

The grid (`ckpt_lab.checkpoint.cases.LESSON_ROWS`) shows the six faults the lesson teaches, then
one case per further class of fault. The catalogue records *what* each design does on a case;
this says *why* PyTorch's checkpoint does it, so a reader of the grid is not left with a red
cell and no reason. Each entry names the torch designs it explains as silently wrong; the lesson
and tests/lessons/test_fault_reasons.py hold those names to the measured grid.
"""
from __future__ import annotations

NON_REENTRANT, REENTRANT = "torch non-reentrant", "torch reentrant"

# case name -> (the torch designs silently wrong on it, why, in one short line)
REASONS: dict[str, tuple[frozenset, str]] = {
    "dict output + residual": (
        frozenset({REENTRANT}),
        "reentrant tracks only tensors returned directly, none inside a dict"),
    "TransformerEncoder eval, padding mask": (
        frozenset({REENTRANT}),
        "no_grad forward takes the fast path, the recompute does not"),
    "parametrizations.spectral_norm": (
        frozenset({NON_REENTRANT, REENTRANT}),
        "the recompute runs a second power-iteration step on u and v"),
    "buffer modified in place before backward": (
        frozenset({NON_REENTRANT, REENTRANT}),
        "no op saves the buffer, so no version check sees the edit"),
    "optimizer step, module in a dict": (
        frozenset({NON_REENTRANT, REENTRANT}),
        "nothing saved inside to check; the recompute reads the new weight"),
    "backward(inputs=[weight])": (
        frozenset({REENTRANT}),
        "the weight is no input of the reentrant node, so it gets no gradient"),
    "torch.compile, aot_eager": (
        frozenset(),
        "every design replays the dropout mask, as without compile"),
}


def fooled(name: str) -> frozenset:
    """The torch designs a row's reason explains as silently wrong."""
    return REASONS[name][0]


def lines(cases) -> list[str]:
    """One line per case, "name: why", for printing below the grid."""
    return [f"{case.name}: {REASONS[case.name][1]}" for case in cases]
