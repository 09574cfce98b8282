"""The course's figures: memory timelines, side-by-side bars, stacked budgets, measured vs predicted.

Every function draws measured numbers handed to it (nothing is typed in), titles its axes with
units (MiB, ms), draws measurements as points or bars and predictions as lines, and returns the
matplotlib Figure. Pass ``ax`` to draw into an existing axes (the widgets redraw in place).
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ckpt_lab.memory import MemoryLog

MIB = 2 ** 20
PHASE_COLORS = {"forward": "tab:blue", "recompute": "tab:orange", "backward": "tab:green",
                "optimizer": "tab:purple"}
RUN_COLORS = ("black", "tab:gray", "tab:brown", "tab:olive", "tab:cyan", "tab:pink")  # not phases


def _axes(ax, figsize=(7, 3.5)):
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
        return fig, ax
    return ax.figure, ax


def phase_spans(log: MemoryLog, phase: str = "recompute") -> list[tuple[int, int]]:
    """(first, last) operation numbers of each unbroken run of ``phase`` in a timeline."""
    spans: list[tuple[int, int]] = []
    for p in log.timeline:
        if p.phase != phase:
            continue
        if spans and spans[-1][1] == p.step - 1:
            spans[-1] = (spans[-1][0], p.step)
        else:
            spans.append((p.step, p.step))
    return spans


def timeline(logs: dict[str, MemoryLog], ax=None, title="Live memory during one training step"):
    """Live MiB after each operation, one line per run, points coloured by phase.

    Each stretch of recompute operations is shaded, so the sawtooth of a segmented backward
    (one tooth per recomputed segment) stands out from the backward around it.
    """
    fig, ax = _axes(ax, (8, 3.5))
    for k, (name, log) in enumerate(logs.items()):
        steps = [p.step for p in log.timeline]
        live = [p.live_bytes / MIB for p in log.timeline]
        ax.plot(steps, live, lw=1.2, color=RUN_COLORS[k % len(RUN_COLORS)],
                label=f"{name} (peak {log.peak_bytes / MIB:.1f} MiB)")
        for first, last in phase_spans(log, "recompute"):
            ax.axvspan(first - 0.5, last + 0.5, color=PHASE_COLORS["recompute"], alpha=0.15,
                       lw=0)
        for phase, color in PHASE_COLORS.items():
            pts = [(p.step, p.live_bytes / MIB) for p in log.timeline if p.phase == phase]
            if pts and phase != "forward":
                ax.scatter(*zip(*pts), s=12 if phase == "recompute" else 4, color=color,
                           zorder=4 if phase == "recompute" else 3)
    handles, labels = ax.get_legend_handles_labels()
    for phase, color in PHASE_COLORS.items():
        if any(p.phase == phase for log in logs.values() for p in log.timeline) \
                and phase != "forward":
            handles.append(plt.Line2D([], [], ls="", marker="o", color=color))
            labels.append(f"{phase} ops" + (" (shaded)" if phase == "recompute" else ""))
    ax.legend(handles, labels, fontsize=8)
    ax.set(title=title, xlabel="operation (in order)", ylabel="live memory (MiB)")
    ax.set_ylim(bottom=0)
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


def stacked(breakdowns: dict[str, dict[str, int]], predicted: dict[str, int] | None = None,
            ax=None, title="Where the memory of a training step goes"):
    """Stacked bars of measured bytes per part (MiB); predicted totals as horizontal lines."""
    fig, ax = _axes(ax, (8, 4))
    labels = list(breakdowns)
    parts = list(dict.fromkeys(p for d in breakdowns.values() for p in d))
    bottoms = [0.0] * len(labels)
    for i, part in enumerate(parts):
        vals = [breakdowns[l].get(part, 0) / MIB for l in labels]
        ax.bar(labels, vals, bottom=bottoms, label=f"{part} (measured)", color=f"C{i}")
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    if predicted:
        for j, label in enumerate(labels):
            if label in predicted:
                ax.hlines(predicted[label] / MIB, j - 0.4, j + 0.4, colors="k", lw=2,
                          label="predicted total" if j == 0 else None)
    ax.set(title=title, ylabel="MiB")
    ax.legend(fontsize=8)
    ax.tick_params(axis="x", labelrotation=15)
    fig.tight_layout()
    return fig


def measured_vs_predicted(x, measured, predicted, xlabel: str, title: str, ax=None,
                          ylabel="MiB", scale=MIB, marker_x=None, label_predicted="predicted",
                          label_measured="measured", color=None):
    """Measured as points, predicted as a line; y divided by ``scale`` (MiB by default).

    Drawing several series into one ``ax``: give each its own ``color`` and labels.
    """
    fig, ax = _axes(ax)
    line, points = (color, color) if color is not None else ("C1", "C0")
    ax.plot(x, [p / scale for p in predicted], "-", color=line, label=label_predicted)
    ax.plot(x, [m / scale for m in measured], "o", color=points, label=label_measured)
    if marker_x is not None:
        ax.axvline(marker_x, color="gray", ls=":", label=f"{xlabel} = {marker_x}")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def budget_scatter(names, peak_bytes, cost, budget_bytes: int, fits=None, ax=None,
                   xlabel="recompute (GFLOP, counted)",
                   title="Which combination fits the budget, and at what cost"):
    """One point per configuration: measured peak (MiB) against a cost; the budget as a line.

    Points that fit are filled, the others hollow; ``fits`` defaults to peak <= budget.
    """
    if not len(names) == len(peak_bytes) == len(cost):
        raise ValueError("names, peak_bytes and cost must have the same length")
    fig, ax = _axes(ax, (8, 4))
    fits = [p <= budget_bytes for p in peak_bytes] if fits is None else list(fits)
    for i, (name, peak, c, ok) in enumerate(zip(names, peak_bytes, cost, fits)):
        ax.scatter([c], [peak / MIB], s=40, color=f"C{i % 10}",
                   facecolors=f"C{i % 10}" if ok else "none", label=name)
    ax.axhline(budget_bytes / MIB, color="k", ls="--", lw=1, label="budget")
    ax.set(title=title, xlabel=xlabel, ylabel="peak memory, measured (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ lessons 08, 09 and 10
# Figures of lesson 8 (capacity and out-of-memory), lesson 9 (checking the articles) and
# lesson 10 (your own model). Measured values are points or bars, predictions lines; no phase
# colour (PHASE_COLORS) stands for anything but its phase.
GIB = 2 ** 30
MEASURED = "tab:red"          # measured points
PREDICTED = "black"           # predicted lines
PART_COLORS = ("tab:gray", "tab:cyan", "tab:pink", "tab:olive", "tab:brown")  # not phases


def segments_label(strategy: str) -> str:
    """The course's words for a capacity-planner strategy: "every 4 blocks" -> "segments of 4"."""
    if strategy == "every block":
        return "segments of 1"
    if strategy.startswith("every ") and strategy.endswith(" blocks"):
        return f"segments of {strategy.split()[1]}"
    return strategy


def capacity_bars(state_bytes: dict, activation_bytes: dict, leanest_bytes: dict,
                  budgets: dict, ax=None, title="Planned, not measured: model state + "
                  "activations per model"):
    """Per model: model state and activations (stacked bars, GiB, log scale), the leanest plan's
    total as a marker, and each GPU's budget as a dashed line."""
    fig, ax = _axes(ax, (7.5, 3.8))
    names = list(state_bytes)
    state = [state_bytes[n] / GIB for n in names]
    ax.bar(names, state, color=PART_COLORS[0], label="model state (16 B/param)")
    ax.bar(names, [activation_bytes[n] / GIB for n in names], bottom=state,
           color=PART_COLORS[1], label="activations, no checkpoint, micro-batch 8")
    ax.plot(names, [leanest_bytes[n] / GIB for n in names], "D", color=PREDICTED, ms=7,
            label="leanest plan: recursive, micro-batch 1")
    for (label, nbytes), ls in zip(budgets.items(), ("--", ":", "-.")):
        ax.axhline(nbytes / GIB, color=PREDICTED, ls=ls, lw=1, label=f"85% of {label}")
    ax.set_yscale("log")
    ax.set(title=title, ylabel="GiB (log scale)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


LAYER_PARTS = {"s × s scores (softmax, dropout)": ("softmax output", "attention dropout mask",
                                                   "attention dropout output (for x V)"),
               "MLP at its intermediate width": ("GeLU input (intermediate)", "SiLU output",
                                                 "MLP down-projection input (intermediate)",
                                                 "gate output (SiLU input)", "up output")}


def layer_parts(terms: dict) -> dict:
    """Group one layer's saved terms (formulas.transformer_layer_terms) into the scores, the
    MLP's wide tensors and the rest (hidden-wide tensors, masks, the fused kernel's logsumexp)."""
    parts = {name: sum(terms.get(t, 0) for t in members) for name, members in LAYER_PARTS.items()}
    parts["hidden-wide tensors and the rest"] = sum(terms.values()) - sum(parts.values())
    return parts


def layer_bars(terms_by_variant: dict, ax=None, title="One layer's saved bytes (planned)"):
    """Horizontal stacked bars, one per variant, of `layer_parts` in GiB, the total written."""
    fig, ax = _axes(ax, (8, 2.8))
    labels = list(terms_by_variant)
    parts = {v: layer_parts(t) for v, t in terms_by_variant.items()}
    left = [0.0] * len(labels)
    for i, part in enumerate(next(iter(parts.values()))):
        vals = [parts[v][part] / GIB for v in labels]
        ax.barh(labels, vals, left=left, color=("tab:red", *PART_COLORS)[i], label=part)
        left = [a + b for a, b in zip(left, vals)]
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.2f} GiB", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.2 * max(left))
    ax.set(title=title, xlabel="GiB per layer")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def capacity_scatter(rows, budget_bytes: int, ax=None, label=segments_label,
                     title="Which plans fit, and what they recompute (planned)"):
    """One point per (strategy, micro-batch) row of `capacity.strategy_rows`: the planned total
    (GiB) against recompute (% of a step's FLOPs). Colour = micro-batch, marker = strategy,
    filled = fits; the budget is a dashed line and the cheapest fit is ringed."""
    fig, ax = _axes(ax, (8, 4))
    micros = sorted({r.micro_batch for r in rows}, reverse=True)
    strategies = list(dict.fromkeys(r.strategy for r in rows))
    markers = dict(zip(strategies, "osv^<>PX"))
    colors = dict(zip(micros, ("tab:gray", "tab:cyan", "tab:pink", "tab:olive", "tab:brown")))
    for r in rows:
        c = colors[r.micro_batch]
        ax.scatter(100 * r.recompute_overhead, r.total_bytes / GIB, marker=markers[r.strategy],
                   s=45, edgecolors=c, facecolors=c if r.fits else "none", lw=1.3)
    fitting = [r for r in rows if r.fits]
    if fitting:
        best = min(fitting, key=lambda r: (r.recompute_overhead, r.accumulation_steps))
        ax.scatter(100 * best.recompute_overhead, best.total_bytes / GIB, s=260,
                   facecolors="none", edgecolors=PREDICTED, lw=1.2)
    ax.axhline(budget_bytes / GIB, color=PREDICTED, ls="--", lw=1)
    handles = [plt.Line2D([], [], ls="", marker="o", color=colors[m], label=f"micro-batch {m}")
               for m in micros]
    handles += [plt.Line2D([], [], ls="", marker=markers[s], color="k", mfc="none",
                           label=label(s)) for s in strategies]
    handles += [plt.Line2D([], [], color=PREDICTED, ls="--", lw=1, label="budget (85%)"),
                plt.Line2D([], [], ls="", marker="o", ms=12, mfc="none", color=PREDICTED,
                           label="cheapest that fits")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_yscale("log")
    ax.set(title=title + " · filled = fits", xlabel="recompute (% of a step's FLOPs)",
           ylabel="model state + activations (GiB)")
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


def ladder_paths(paths: dict, notes: dict | None = None, ax=None,
                 title="The out-of-memory ladder, three orders (measured)"):
    """Each order's rungs on a (checkpointing, micro-batch) grid: x = blocks per segment (0 =
    none), y = micro-batch; x marks a rung that ran out of memory, a star the one that fit.
    `paths`: order -> [(checkpoint_every, micro_batch, fits), ...]; `notes`: order -> text."""
    fig, ax = _axes(ax, (8, 3.6))
    xs = sorted({e for p in paths.values() for e, _, _ in p}, key=lambda e: (e != 0, -e))
    ys = sorted({m for p in paths.values() for _, m, _ in p})
    col = {e: i for i, e in enumerate(xs)}
    for k, (name, path) in enumerate(paths.items()):
        color = RUN_COLORS[k % len(RUN_COLORS)]
        off = 0.08 * (k - (len(paths) - 1) / 2)
        pts = [(col[e] + off, ys.index(m) + off) for e, m, _ in path]
        ax.plot(*zip(*pts), "-", color=color, lw=1.2, alpha=0.8,
                label=name + (f": {notes[name]}" if notes and name in notes else ""))
        for (x, y), (_, _, fits) in zip(pts, path):
            ax.plot(x, y, "*" if fits else "x", color=color, ms=13 if fits else 7)
    ax.set_xticks(range(len(xs)), ["none" if e == 0 else f"segments of {e}" for e in xs])
    ax.set_yticks(range(len(ys)), [str(m) for m in ys])
    ax.set(title=title + " · x = out of memory, * = fits", xlabel="checkpointing",
           ylabel="micro-batch")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def scaled_timeline(logs: dict, scale: float, lines: dict | None = None, ax=None,
                    title="Live memory during one step (measured), at the article's size"):
    """Live memory after each operation, multiplied by `scale` (to the article's tensor size),
    in MiB, one line per run; `lines`: label -> bytes drawn as dashed levels (the article's)."""
    fig, ax = _axes(ax, (8, 3.4))
    for k, (name, log) in enumerate(logs.items()):
        ax.plot([p.step for p in log.timeline], [p.live_bytes * scale / MIB for p in log.timeline],
                lw=1.2, color=RUN_COLORS[k % len(RUN_COLORS)],
                label=f"{name}: peak {log.peak_bytes * scale / MIB:,.0f} MiB")
    for (label, nbytes), ls in zip((lines or {}).items(), ("--", ":", "-.")):
        ax.axhline(nbytes / MIB, color=MEASURED, ls=ls, lw=1.2, label=label)
    ax.set(title=title, xlabel="operation (in order)", ylabel="live memory (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
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
            ax.plot(s, [v / MIB for v in values], ":", color=PART_COLORS[0], label=label)
        ax.plot(p["s_measured"], [v / MIB for v in p["measured"]], "o", color=MEASURED,
                label="measured")
        best = min(zip(p["predicted"], p["s"]))[1]
        ax.axvline(best, color=PART_COLORS[0], ls="--", lw=1, label=f"least: S = {best}")
        ax.set(title=p["title"], xlabel="segments S", ylabel="step peak (MiB)")
        ax.set_ylim(0, 1.15 * max(p["measured"]) / MIB)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def band_bars(values: dict, band: tuple, band_label: str, ax=None, ylabel="fraction",
              title="Measured against a claimed range"):
    """One measured bar per case (fractions shown as %), the claimed range as a shaded band."""
    fig, ax = _axes(ax, (6.5, 3.2))
    labels = list(values)
    bars = ax.bar(labels, [100 * v for v in values.values()], color=PART_COLORS[1], label="measured")
    for bar, v in zip(bars, values.values()):
        ax.text(bar.get_x() + bar.get_width() / 2, 100 * v, f"{v:.1%}", ha="center", va="bottom",
                fontsize=8)
    ax.axhspan(100 * band[0], 100 * band[1], color=PART_COLORS[0], alpha=0.25, label=band_label)
    ax.set(title=title, ylabel=ylabel + " (%)")
    ax.set_ylim(0, 100 * max(max(values.values()), band[1]) * 1.2)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def plan_profile(profile, boundaries, measured: dict, predicted: dict, budget_bytes: int,
                 activation_only: dict | None = None,
                 title="Your model: what each layer keeps, the plan, and the step peak"):
    """Two panels. Left: each layer's saved bytes (bars; recompute orange for layers a
    checkpointed segment will recompute), its output (the marker: what a checkpoint keeps) and
    the plan's segment starts. Right: measured step peaks (bars) per plan, the step model's
    prediction (line marks), the activation-only model's (dotted marks), the budget."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6),
                                      gridspec_kw={"width_ratios": [1.6, 1]})
    n, last = len(profile), list(boundaries)[-1]
    xs = range(n)
    left.bar(xs, [p.act_bytes / MIB for p in profile],
             color=[PHASE_COLORS["recompute"] if i < last else PART_COLORS[0] for i in xs])
    left.plot(xs, [p.out_bytes / MIB for p in profile], "D", color=PREDICTED, ms=5)
    for b in list(boundaries)[1:]:
        left.axvline(b - 0.5, color=PREDICTED, ls="--", lw=1)
    handles = [plt.Rectangle((0, 0), 1, 1, color=PHASE_COLORS["recompute"],
                             label="saved, recomputed in backward"),
               plt.Rectangle((0, 0), 1, 1, color=PART_COLORS[0], label="saved, last segment"),
               plt.Line2D([], [], ls="", marker="D", color=PREDICTED, label="output"),
               plt.Line2D([], [], ls="--", color=PREDICTED, lw=1, label="segment start")]
    left.legend(handles=handles, fontsize=7)
    left.set(title="per layer (measured)", xlabel="layer", ylabel="MiB", xticks=list(xs))
    names = list(measured)
    right.bar(names, [measured[k] / MIB for k in names], color=PART_COLORS[1],
              label="measured step peak")
    right.plot(names, [predicted[k] / MIB for k in names], "_", color=PREDICTED, ms=40, mew=2,
               label="step model")
    if activation_only:
        right.plot(names, [activation_only[k] / MIB for k in names], "_", color=MEASURED,
                   ms=40, mew=2, ls="", label="activation-only model")
    right.axhline(budget_bytes / MIB, color=PREDICTED, ls=":", lw=1, label="budget")
    right.set(title="step peak", ylabel="MiB")
    right.set_ylim(0, 1.35 * max(measured.values()) / MIB)
    right.legend(fontsize=7, loc="upper right", markerscale=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
