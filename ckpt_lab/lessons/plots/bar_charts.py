"""Bars side by side: one measured bar per name (predictions as ticks, a guess dashed), two
panels of peak and time, grouped bars per series, a peak per technique, bars against a claimed
range, and ratios to a plain step per machine.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .style import MIB, NEUTRAL_COLORS, PHASE_COLORS, SERIES_COLORS, _axes


def bars(names, measured, ylabel: str, title: str, predicted=None, guess: dict | None = None,
         ax=None, scale: float = 1.0):
    """One measured bar per name; predictions as black ticks, a guess ({name: value}) as dashed.

    Values are divided by ``scale`` (e.g. MIB) before drawing; bars are grey (no phase).
    """
    if predicted is not None and len(predicted) != len(names):
        raise ValueError("predicted needs one value per name")
    fig, ax = _axes(ax, (6, 3.2))
    xs = range(len(names))
    ax.bar(xs, [m / scale for m in measured], color="tab:gray", width=0.6, label="measured")
    if predicted is not None:
        ax.hlines([p / scale for p in predicted], [x - 0.35 for x in xs], [x + 0.35 for x in xs],
                  colors="black", lw=2, label="predicted")
    for name, value in (guess or {}).items():
        x = list(names).index(name)
        ax.hlines(value / scale, x - 0.4, x + 0.4, colors="black", lw=1.5, ls="--",
                  label="your guess")
    ax.set_xticks(list(xs), list(names))
    ax.set(title=title, ylabel=ylabel)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def side_by_side(names, peak_bytes, seconds, title="Memory and time per training step"):
    """Two bar panels: peak MiB and step time in ms, one bar per run (all measured)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    colors = [f"C{i}" for i in range(len(names))]
    a.bar(names, [p / MIB for p in peak_bytes], color=colors)
    a.set(title="peak memory (measured)", ylabel="MiB")
    b.bar(names, [s * 1e3 for s in seconds], color=colors)
    b.set(title="step time (measured)", ylabel="ms")
    for ax in (a, b):
        ax.tick_params(axis="x", labelrotation=15)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def grouped_bars(groups: dict[str, dict[str, float]], ylabel="MiB", title="", scale=MIB,
                 ax=None, predicted: dict | None = None, colors: dict | None = None,
                 label_predicted="predicted", reference: float | None = None,
                 values: bool = False):
    """Side-by-side bars, measured: ``groups`` maps an x label to {series: value}.

    One colour per series (greys and browns, never a phase colour, unless ``colors`` maps a
    series to one); ``predicted`` maps (group, series) to a value drawn as a black tick across
    that bar; ``reference`` draws a dotted line (e.g. 1.0 for ratios to a baseline, with
    ``scale=1``); ``values`` writes each bar's value on it.
    """
    fig, ax = _axes(ax, (7, 3.2))
    series = list(dict.fromkeys(s for g in groups.values() for s in g))
    colors = colors or {s: SERIES_COLORS[i % len(SERIES_COLORS)] for i, s in enumerate(series)}
    width = 0.8 / max(len(series), 1)
    ticked, top = False, reference or 0
    for j, s in enumerate(series):
        placed = [(i + (j - (len(series) - 1) / 2) * width, name)
                  for i, name in enumerate(groups) if s in groups[name]]
        vals = [groups[name][s] / scale for _, name in placed]
        top = max([top] + vals)
        drawn = ax.bar([x for x, _ in placed], vals, width * 0.95, color=colors[s], label=s)
        if values:
            ax.bar_label(drawn, fmt="%.2f", fontsize=7)
        for x, name in placed:
            if predicted and (name, s) in predicted:
                ax.hlines(predicted[name, s] / scale, x - width / 2, x + width / 2, colors="k",
                          lw=2, label=None if ticked else label_predicted)
                ticked = True
    if reference is not None:
        ax.axhline(reference, color="black", ls=":", lw=1)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set(title=title, ylabel=ylabel)
    ax.set_ylim(0, 1.3 * top if (values or reference is not None) and top else None)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def technique_bars(measured: dict, predicted: dict | None = None, state_bytes: int = 0,
                   title="One step's peak under each technique"):
    """One bar per technique: the measured step peak (activations, MiB), stacked on the model
    state (grey) where ``state_bytes`` is given, so the bar's top is the total peak (model state
    included). Above each bar its ratio to the first bar's: the step peak's and, with a model
    state, the total peak's. The formula's step peak is a black tick where one is given."""
    predicted = predicted or {}
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    names = list(measured)
    base, state = measured[names[0]], state_bytes / MIB
    if state_bytes:
        ax.bar(names, [state] * len(names), color=NEUTRAL_COLORS[0], width=0.6,
               label="model state (weights, gradients, optimizer)")
    ax.bar(names, [measured[n] / MIB for n in names], bottom=state, width=0.6,
           color=PHASE_COLORS["forward"], label="step peak (activations), measured")
    ticks = [(i, state + predicted[n] / MIB) for i, n in enumerate(names) if n in predicted]
    if ticks:
        ax.plot(*zip(*ticks), "_", color="k", ms=40, mew=2, label="formula")
    for i, n in enumerate(names):
        text = f"step x{measured[n] / base:.2f}"
        if state_bytes:
            text += f"\ntotal x{(state_bytes + measured[n]) / (state_bytes + base):.2f}"
        ax.text(i, state + measured[n] / MIB, text, ha="center", va="bottom", fontsize=8)
    ax.set(title=title, ylabel="MiB")
    ax.title.set_fontsize(10)
    ax.set_ylim(0, (state + max(measured.values()) / MIB) * 1.3)
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8, loc="upper right", markerscale=0.4)
    fig.tight_layout()
    return fig


def band_bars(values: dict, band: tuple, band_label: str, ax=None, ylabel="fraction",
              title="Measured against a claimed range"):
    """One measured bar per case (fractions shown as %), the claimed range as a shaded band."""
    fig, ax = _axes(ax, (6.5, 3.2))
    labels = list(values)
    bars = ax.bar(labels, [100 * v for v in values.values()], color=NEUTRAL_COLORS[1], label="measured")
    for bar, v in zip(bars, values.values()):
        ax.text(bar.get_x() + bar.get_width() / 2, 100 * v, f"{v:.1%}", ha="center", va="bottom",
                fontsize=8)
    ax.axhspan(100 * band[0], 100 * band[1], color=NEUTRAL_COLORS[0], alpha=0.25, label=band_label)
    ax.set(title=title, ylabel=ylabel + " (%)")
    ax.set_ylim(0, 100 * max(max(values.values()), band[1]) * 1.2)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def ratio_panels(panels: dict, title: str = "Cost of a step, as a multiple of a plain step",
                 kinds=("FLOPs", "time")):
    """Small multiples, one panel per machine: for each strategy one bar per kind of ratio to a
    plain step ("FLOPs" counted, "time" and "peak" measured, told apart by hatching); up to
    the plain step's 1.0 in blue, what comes on top in recompute orange.

    ``panels`` maps a panel title to {strategy: {kind: ratio}}; an empty or None panel (no
    committed GPU run) is left out.
    """
    hatches = {"FLOPs": None, "time": "//", "peak": ".."}
    panels = {name: groups for name, groups in panels.items() if groups}
    if not panels:
        raise ValueError("ratio_panels needs at least one panel with ratios")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.3), sharey=True,
                             squeeze=False)
    top = max(g[k] for groups in panels.values() for g in groups.values() for k in kinds if k in g)
    for ax, (name, groups) in zip(axes[0], panels.items()):
        ticks, labels, x = [], [], 0.0
        for group, ratios in groups.items():
            for kind in kinds:
                if kind not in ratios:
                    continue
                r, hatch = ratios[kind], hatches.get(kind)
                edge = "white" if hatch else None
                ax.bar(x, min(r, 1.0), color=PHASE_COLORS["forward"], width=0.8, hatch=hatch,
                       edgecolor=edge)
                if r > 1:
                    ax.bar(x, r - 1, bottom=1.0, color=PHASE_COLORS["recompute"], width=0.8,
                           hatch=hatch, edgecolor=edge)
                ax.text(x, r + 0.02 * top, f"x{r:.2f}", ha="center", va="bottom", fontsize=8)
                ticks.append(x)
                labels.append(f"{group}\n{kind}")
                x += 1
            x += 0.6
        ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.set_xticks(ticks, labels, fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.set_ylim(0, max(top, 1.0) * 1.15)
    axes[0][0].set_ylabel("x a plain step")
    handles = [plt.Rectangle((0, 0), 1, 1, color=PHASE_COLORS["forward"]),
               plt.Rectangle((0, 0), 1, 1, color=PHASE_COLORS["recompute"])]
    names = ["up to a plain step", "on top of it (recompute)"]
    for kind in kinds:
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="tab:gray", hatch=hatches.get(kind),
                                     edgecolor="white"))
        names.append({"FLOPs": "FLOPs (counted)"}.get(kind, f"{kind} (measured)"))
    fig.legend(handles, names, fontsize=8, loc="lower center", ncol=len(names), frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig
