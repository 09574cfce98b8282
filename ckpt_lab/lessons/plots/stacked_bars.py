"""Stacked bars: where a step's memory goes (parts coloured by the phase that makes them),
bands of one GPU's memory, kept inputs under the last segment, model state under activations,
and the allocator's reserved bytes around its allocated ones.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .style import GIB, MIB, NEUTRAL_COLORS, PREDICTED, _axes, _part_color


def stacked(breakdowns: dict[str, dict[str, int]], predicted: dict[str, int] | None = None,
            ax=None, title="Where the memory of a training step goes", ylabel="MiB", scale=MIB):
    """Stacked bars of measured bytes per part (MiB, or ``ylabel`` after dividing by ``scale``);
    predicted totals as horizontal lines. A part is coloured by the phase that makes it
    (`PART_COLORS`): activations forward blue, gradients backward green, optimizer states
    purple."""
    fig, ax = _axes(ax, (9, 4))
    labels, bottoms = _stack(ax, breakdowns, scale, lambda part, i: dict(
        label=f"{part} (measured)", color=_part_color(part, i)))
    if predicted:
        for j, label in enumerate(labels):
            if label in predicted:
                ax.hlines(predicted[label] / scale, j - 0.4, j + 0.4, colors="k", lw=2,
                          label="predicted total" if j == 0 else None)
    ax.set(title=title, ylabel=ylabel)
    tops = bottoms + [predicted[l] / scale for l in labels if predicted and l in predicted]
    ax.set_ylim(0, 1.08 * max(tops))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.tick_params(axis="x", labelrotation=15)
    fig.tight_layout()
    return fig


def stacked_bands(breakdowns: dict[str, dict[str, float]], colors: dict[str, str],
                  hatches: dict[str, str] | None = None, ylabel="MiB", title="", scale=MIB,
                  ax=None):
    """Stacked bars of measured parts, one colour per part (``colors``); a part may share a
    colour with another and differ by its hatch (``hatches``), e.g. a copy of the same bytes."""
    fig, ax = _axes(ax, (max(8.0, 2 + 1.3 * len(breakdowns)), 3.6))  # room for 2-line labels
    _stack(ax, breakdowns, scale, lambda part, i: dict(
        color=colors[part], label=part, hatch=(hatches or {}).get(part), edgecolor="white",
        lw=0.5))
    ax.set(title=title, ylabel=ylabel)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def segment_units(counts, kept_inputs, last_segment, measured, ax=None,
                  title="Kept inputs + the last segment (units of one block's activations)"):
    """The predicted peak in units, stacked: S - 1 kept inputs under the last segment's layers;
    the measured peak (in the same units) as points on top."""
    fig, ax = _axes(ax, (7, 3.3))
    ax.bar(counts, kept_inputs, color="tab:gray", alpha=0.6, label="predicted: kept inputs (S - 1)")
    ax.bar(counts, last_segment, bottom=kept_inputs, color="tab:cyan", alpha=0.6,
           label="predicted: the last segment's blocks")
    ax.plot(counts, measured, "o", color="black", ms=5, label="measured")
    ax.set(title=title, xlabel="segments S", ylabel="units")
    ax.set_xticks(list(counts))
    ax.set_ylim(0, 1.25 * max(measured))
    ax.legend(fontsize=8, loc="upper center", ncol=3)
    fig.tight_layout()
    return fig


def capacity_bars(state_bytes: dict, activation_bytes: dict, leanest_bytes: dict,
                  budgets: dict, ax=None, title="Planned, not measured: model state + "
                  "activations per model", labels=("model state (16 B/param)",
                  "activations, no checkpoint, micro-batch 8",
                  "leanest plan: recursive, micro-batch 1"), log: bool = True):
    """Per model: model state and activations (stacked bars, GiB, log scale unless `log` is
    False), the leanest plan's total as a marker, and each GPU's budget as a dashed line;
    `labels` names the three."""
    fig, ax = _axes(ax, (7.5, 3.8))
    names = list(state_bytes)
    state = [state_bytes[n] / GIB for n in names]
    ax.bar(names, state, color=NEUTRAL_COLORS[0], label=labels[0])
    ax.bar(names, [activation_bytes[n] / GIB for n in names], bottom=state,
           color=NEUTRAL_COLORS[1], label=labels[1])
    ax.plot(names, [leanest_bytes[n] / GIB for n in names], "D", color=PREDICTED, ms=7,
            label=labels[2])
    for (label, nbytes), ls in zip(budgets.items(), ("--", ":", "-.")):
        ax.axhline(nbytes / GIB, color=PREDICTED, ls=ls, lw=1, label=f"85% of {label}")
    if log:
        ax.set_yscale("log")
    ax.set(title=title, ylabel="GiB (log scale)" if log else "GiB")
    ax.legend(fontsize=7, loc="upper left" if log else "upper right")
    fig.tight_layout()
    return fig


def reserved_vs_allocated(runs: dict,
                          title="Reserved (the allocator's cache included) against allocated "
                                "(tensors), per step (measured)"):
    """One panel per run: per training step, the bytes the CUDA caching allocator reserved (grey
    bar) and the bytes its tensors held (cyan bar inside it), read after the step; the grey above
    the cyan is cache. `runs`: name -> steps, each a dict with "seq", "allocated_bytes" and
    "reserved_bytes" (as gpu_check's fragmentation section writes them). Runs whose names share
    the text before the first comma (one machine's settings) share a y scale."""
    fig, axes = plt.subplots(1, len(runs), figsize=(3.4 * len(runs) + 1, 3.2), squeeze=False)
    group = {name: name.split(",")[0] for name in runs}
    top = {g: max(s["reserved_bytes"] for name, steps in runs.items() if group[name] == g
                  for s in steps) for g in group.values()}
    for a, (run, steps) in zip(axes[0], runs.items()):
        unit, name = (GIB, "GiB") if top[group[run]] >= GIB else (MIB, "MiB")
        xs = range(len(steps))
        a.bar(xs, [s["reserved_bytes"] / unit for s in steps], color=NEUTRAL_COLORS[0],
              label="reserved: memory_reserved()")
        a.bar(xs, [s["allocated_bytes"] / unit for s in steps], width=0.5,
              color=NEUTRAL_COLORS[1], label="allocated: memory_allocated()")
        a.set_xticks(list(xs), [str(s["seq"]) for s in steps], fontsize=7)
        a.set_ylim(0, 1.3 * top[group[run]] / unit)
        a.set(title=run, xlabel="sequence length of the step", ylabel=name)
        a.title.set_fontsize(9)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _stack(ax, breakdowns: dict[str, dict[str, float]], scale: float, style):
    """One bar per label, its parts stacked in the order they first appear, each divided by
    ``scale``; ``style(part, index)`` gives a part's bar keywords (colour, label, hatch).
    Returns the labels and each bar's top."""
    labels = list(breakdowns)
    parts = list(dict.fromkeys(p for d in breakdowns.values() for p in d))
    bottoms = [0.0] * len(labels)
    for i, part in enumerate(parts):
        vals = [breakdowns[label].get(part, 0) / scale for label in labels]
        ax.bar(labels, vals, bottom=bottoms, **style(part, i))
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    return labels, bottoms
