"""Measured points on predicted lines against one quantity: segment count, sequence length,
depth, vocabulary size; ratios of measured to predicted, and a model's parity with measurement.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .style import MEASURED, MIB, NEUTRAL_COLORS, PHASE_COLORS, PREDICTED, _axes


def measured_vs_predicted(x, measured, predicted, xlabel: str, title: str, ax=None,
                          ylabel="MiB", scale=MIB, marker_x=None, label_predicted="predicted",
                          label_measured="measured", color=None):
    """Measured as points, predicted as a line; y divided by ``scale`` (MiB by default).

    Drawing several series into one ``ax``: give each its own ``color`` and labels.
    """
    fig, ax = _axes(ax)
    line, points = (color, color) if color is not None else ("tab:gray", "black")   # no phase colour
    ax.plot(x, [p / scale for p in predicted], "-", color=line, label=label_predicted)
    ax.plot(x, [m / scale for m in measured], "o", color=points, label=label_measured)
    if marker_x is not None:
        ax.axvline(marker_x, color="gray", ls=":", label=f"{xlabel} = {marker_x}")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def segment_curve(counts, measured, predicted=None, guess=None, ax=None,
                  title="Peak memory against segment count", ylabel="peak (MiB)", scale=MIB):
    """Measured peaks as points against segment count; a prediction as a line; a guess dashed."""
    fig, ax = _axes(ax, (7, 3.3))
    if predicted is not None:
        ax.plot(counts, [p / scale for p in predicted], "-", color="tab:gray", label="predicted")
    ax.plot(counts, [m / scale for m in measured], "o", color="black", ms=5, label="measured")
    if guess is not None:
        ax.axvline(guess, color="black", ls="--", lw=1, label=f"your guess: {guess}")
    ax.set(title=title, xlabel="segments S", ylabel=ylabel)
    ax.set_xticks(list(counts))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def u_curves(panels: list, title="Step peak against the number of segments S"):
    """Small multiples, one per chain: the predicted peak over every S as a line, the measured
    points, the least predicted S marked. Each panel: dict(title, s, predicted, s_measured,
    measured, and optionally other={label: (s, values)} drawn dotted)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.4))
    for ax, p in zip(list(axes) if len(panels) > 1 else [axes], panels):
        ax.plot(p["s"], [v / MIB for v in p["predicted"]], "-", color=PREDICTED, lw=1.2,
                label="predicted")
        for label, (s, values) in p.get("other", {}).items():
            ax.plot(s, [v / MIB for v in values], ":", color=NEUTRAL_COLORS[0], label=label)
        ax.plot(p["s_measured"], [v / MIB for v in p["measured"]], "o", color=MEASURED,
                label="measured")
        best = min(zip(p["predicted"], p["s"]))[1]
        ax.axvline(best, color=NEUTRAL_COLORS[0], ls="--", lw=1, label=f"least: S = {best}")
        ax.set(title=p["title"], xlabel="segments S", ylabel="step peak (MiB)")
        ax.set_ylim(0, 1.15 * max(p["measured"]) / MIB)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def attention_kinds(seqs, measured: dict, predicted: dict,
                    title="Kept bytes of one block against sequence length"):
    """Kept bytes against T for unfused ("manual") and fused ("sdpa") attention: measured as
    points (hollow: the attention core checkpointed), the formulas as lines; the unfused
    series in recompute orange (its T x T terms are what recomputation drops), fused in blue."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    colors = {"manual": PHASE_COLORS["recompute"], "sdpa": PHASE_COLORS["forward"]}
    names = {"manual": "unfused", "sdpa": "fused (SDPA)"}
    for impl, color in colors.items():
        ax.plot(seqs, [p / MIB for p in predicted[impl]], "-", color=color,
                label=f"{names[impl]}: formula")
        ax.plot(seqs, [m / MIB for m in measured[impl]], "o", color=color,
                label=f"{names[impl]}: measured")
        ax.plot(seqs, [m / MIB for m in measured[f"{impl}, core checkpointed"]], "s",
                color=color, mfc="none", ms=11 if impl == "manual" else 7,
                label=f"{names[impl]}, core checkpointed")
    ax.set(title=title, xlabel="sequence length T (tokens)", ylabel="kept after forward (MiB)")
    ax.title.set_fontsize(9)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def depth_panels(depths, peaks: dict, predicted, forwards: dict, predicted_forwards,
                 title="Recursive bisection against segments, as the chain deepens"):
    """Left: step peak in units of one activation against depth (measured as points, one
    series per scheme; bisection's model as a dashed line). Right: layer forwards per layer
    and step (points, labelled as given; 1 + log2(L)/2 as a line). Depth on a log2 axis."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4))
    for (name, values), marker in zip(peaks.items(), ("o", "s", "^")):
        a.plot(depths, values, marker + "-", color="k" if marker != "^" else
               PHASE_COLORS["forward"], mfc="none" if marker != "^" else None,
               label=f"{name} (measured)")
    a.plot(depths, predicted, "--", color=PHASE_COLORS["recompute"],
           label="bisection_cost + gradient in flight")
    a.set(title="step peak (activations)", xlabel="layers L", ylabel="units of one activation")
    for (name, values), marker in zip(forwards.items(), ("^", "s")):
        b.plot(depths, values, marker, color="k" if marker == "s" else PHASE_COLORS["forward"],
               mfc="none" if marker == "s" else None, label=name)
    b.plot(depths, predicted_forwards, "-", color=PHASE_COLORS["recompute"],
           label="1 + log2(L) / 2 (predicted)")
    b.set(title="layer forwards per layer, one step", xlabel="layers L", ylabel="forwards / L")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def loss_share(vocabs, shares, line_vocabs, line_shares,
               title="What the loss holds at its peak, as a share of the step peak"):
    """The loss's share of the step peak (activations) against the vocabulary size V: measured
    as points, the prediction 3NV / (the rest + 3NV) as a line, which may run past the measured
    sizes (its last value annotated as predicted)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ax.plot(line_vocabs, [100 * s for s in line_shares], "-", color=PREDICTED,
            label="3NV / (the rest + 3NV), predicted")
    ax.plot(vocabs, [100 * s for s in shares], "o", color=MEASURED, mfc="none", ms=8,
            label="3NV / the measured step peak")
    if line_vocabs[-1] > vocabs[-1]:
        ax.annotate(f"{100 * line_shares[-1]:.0f}% (predicted)",
                    (line_vocabs[-1], 100 * line_shares[-1]), xytext=(-60, -16),
                    textcoords="offset points", fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_xticks(line_vocabs, [f"{v // 1024}K" if v >= 1024 else str(v) for v in line_vocabs])
    ax.set(title=title, xlabel="vocabulary V (words)", ylabel="% of the step peak", ylim=(0, 105))
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def chunk_peaks(chunks, peaks, predicted, floor_bytes: int | None = None,
                title="Step peak (activations) against the loss's chunks"):
    """The step peak against the number C of row chunks of the loss (1: the plain loss):
    measured points in recompute orange, the formula as a line, and the floor no chunking
    removes as a dotted line."""
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ax.plot(chunks, [p / MIB for p in predicted], "-", color=PHASE_COLORS["recompute"],
            label="the rest + chunked_cross_entropy_peak_bytes")
    ax.plot(chunks, [p / MIB for p in peaks], "o", color=PHASE_COLORS["recompute"], ms=8,
            mfc="none", label="measured (C = 1: the plain loss)")
    if floor_bytes is not None:
        ax.axhline(floor_bytes / MIB, color="tab:gray", ls=":", label="floor: the rest + 3 V H")
    ax.set_xscale("log", base=2)
    ax.set_xticks(chunks, [str(c) for c in chunks])
    ax.set(title=title, xlabel="row chunks C of the loss", ylabel="step peak (activations), MiB",
           ylim=(0, max(peaks) / MIB * 1.1))
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def ratio_points(labels, ratios: dict, ax=None, ylabel="measured / predicted",
                 title="Measured against predicted"):
    """measured/predicted per configuration, one marker series per predictor; 1.0 drawn."""
    fig, ax = _axes(ax, (8, 3.2))
    for (name, values), marker in zip(ratios.items(), "osD^"):
        ax.plot(labels, values, marker, ms=7, color=MEASURED if marker == "o" else PREDICTED,
                mfc="none" if marker != "o" else MEASURED, label=name)
    ax.axhline(1.0, color=PREDICTED, lw=1, ls="--", label="exact")
    ax.set(title=title, ylabel=ylabel)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def model_parity(measured, models: dict, title="Each plan's measured step peak against two models"):
    """Measured peak (x) against each model's prediction (y), one marker per model, with the
    diagonal where a model is exact; points below it are read low."""
    fig, ax = plt.subplots(figsize=(5.2, 4))
    top = max(max(measured), *(max(v) for v in models.values())) / MIB * 1.05
    ax.plot([0, top], [0, top], "-", color="k", lw=0.8, label="model = measured")
    for (name, predicted), marker in zip(models.items(), ("o", "s", "^", "D")):
        ax.plot([m / MIB for m in measured], [p / MIB for p in predicted], marker, mfc="none",
                ms=7, label=name)
    ax.set(title=title, xlabel="measured step peak, activations (MiB)",
           ylabel="model's step peak (MiB)",
           xlim=(0, top), ylim=(0, top))
    ax.title.set_fontsize(10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
