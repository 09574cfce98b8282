"""The course's palette, units and axes helper, shared by every figure module.

A phase's colour (forward blue, recompute orange, backward green, optimizer purple) stands for
that phase and nothing else; runs, settings and series that are not phases take greys, browns
and the other colours here. Measured values are points or bars, predictions lines.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ckpt_lab.lessons.units import GIB, MIB  # noqa: F401  (plots.MIB, plots.GIB)

PHASE_COLORS = {"forward": "tab:blue", "recompute": "tab:orange", "backward": "tab:green",
                "optimizer": "tab:purple"}
RUN_COLORS = ("black", "tab:gray", "tab:brown", "tab:olive", "tab:cyan", "tab:pink")  # not phases
SERIES_COLORS = RUN_COLORS[1:]          # runs and settings that are not phases
NEUTRAL_COLORS = ("tab:gray", "tab:cyan", "tab:pink", "tab:olive", "tab:brown")  # not phases
MEASURED = "tab:red"          # measured points (lessons 8-10)
PREDICTED = "black"           # predicted lines (lessons 8-10)

# A part of memory takes the colour of the phase that makes it; what no phase makes is grey.
PART_COLORS = {"parameters": "tab:gray", "activations": PHASE_COLORS["forward"],
               "gradients": PHASE_COLORS["backward"], "optimizer states": PHASE_COLORS["optimizer"],
               "master copy": "tab:brown"}
_SPARE_COLORS = ("tab:cyan", "tab:olive", "tab:pink", "tab:brown", "tab:gray")   # never a phase's

# Checkpoint policies (lessons 5 and 7): no checkpoint black, full recompute orange.
POLICY_COLORS = {"none": "k", "selective": "tab:brown", "every": PHASE_COLORS["recompute"]}

# The bands of one GPU's memory in lesson 12: state parts in the phase that makes them
# (gradients: backward green, Adam: optimizer purple, activations: forward blue), weights gray;
# a copy of the same bytes shares its colour, hatched (DDP's buckets, FSDP's gathered weights).
STATE_BANDS = {"weights": "tab:gray", "gradients": PHASE_COLORS["backward"],
               "buckets": PHASE_COLORS["backward"], "Adam": PHASE_COLORS["optimizer"],
               "gathered weights": "tab:gray", "activations & buffers": PHASE_COLORS["forward"]}
STATE_HATCHES = {"buckets": "//", "gathered weights": "//"}


def _part_color(part: str, index: int) -> str:
    """A memory part's colour (`PART_COLORS`), else a spare one that is no phase's."""
    return PART_COLORS.get(part, _SPARE_COLORS[index % len(_SPARE_COLORS)])


def _axes(ax, figsize=(7, 3.5)):
    """(figure, axes): a new figure of ``figsize`` when ``ax`` is None, else ``ax``'s own."""
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
        return fig, ax
    return ax.figure, ax
