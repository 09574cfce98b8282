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


# ------------------------------------------------------------------------------------------
# Lessons 4-7 (the price, transformers and selective recomputation, optimal schedules,
# combining techniques). Measured as bars or points, predicted as lines, recompute orange.
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


def block_terms(runs: dict, highlight=(), title="What one block keeps for backward, term by term"):
    """Small multiples, one panel per run (e.g. per sequence length): a horizontal bar per term
    (measured), the formula's bytes as a black tick; `highlight`ed terms in recompute orange.

    ``runs`` maps a panel title to (measured, predicted), two dicts term -> bytes.
    """
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs) + 2.6, 4.6), sharey=True,
                             squeeze=False)
    top = max(max(m.values()) for m, _ in runs.values()) / MIB
    for ax, (name, (measured, predicted)) in zip(axes[0], runs.items()):
        names = list(predicted)[::-1]
        y = range(len(names))
        colors = [PHASE_COLORS["recompute" if n in highlight else "forward"] for n in names]
        ax.barh(y, [measured.get(n, 0) / MIB for n in names], color=colors)
        ax.plot([predicted[n] / MIB for n in names], y, "|", color="k", ms=12, mew=2)
        total = sum(measured.values())
        ax.set_title(f"{name}: {total / MIB:.2f} MiB", fontsize=10)
        ax.set_xlabel("MiB")
        ax.set_xlim(0, top * 1.1)
        ax.set_yticks(list(y), names, fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=PHASE_COLORS["forward"]),
               plt.Rectangle((0, 0), 1, 1, color=PHASE_COLORS["recompute"]),
               plt.Line2D([], [], ls="", marker="|", color="k", ms=10, mew=2)]
    fig.legend(handles, ["kept (measured)", "kept, grows with s² (measured)", "formula"],
               fontsize=8, loc="lower center", ncol=3, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def attention_kinds(seqs, measured: dict, predicted: dict,
                    title="Kept bytes of one block against sequence length"):
    """Kept bytes against s for unfused ("manual") and fused ("sdpa") attention: measured as
    points (hollow: the attention core checkpointed), the formulas as lines; the unfused
    series in recompute orange (its s x s terms are what recomputation drops), fused in blue."""
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
    ax.set(title=title, xlabel="sequence length s (tokens)", ylabel="kept after forward (MiB)")
    ax.title.set_fontsize(9)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def plan_scatter(uniform, planned, front, total_cost: float,
                 title="Step peak against recompute: uniform segments and the planner's plans"):
    """Measured step peak (MiB) against the share of the forward re-run: uniform plans hollow,
    the planner's filled, each pair joined; the predicted Pareto front as an orange step line.

    ``uniform`` and ``planned`` are lists of (peak_bytes, recompute_cost) in the same order;
    ``front`` is `planner.pareto_front(...)`; costs are divided by ``total_cost``.
    """
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.step([p.peak_bytes / MIB for p in front], [100 * p.recompute_cost / total_cost for p in front],
            where="post", color=PHASE_COLORS["recompute"], label="Pareto front (step model)")
    for (pu, cu), (pp, cp) in zip(uniform, planned):
        ax.annotate("", (pp / MIB, 100 * cp / total_cost), (pu / MIB, 100 * cu / total_cost),
                    arrowprops=dict(arrowstyle="->", color="tab:gray", lw=0.8))
    ax.plot([p / MIB for p, _ in uniform], [100 * c / total_cost for _, c in uniform], "o",
            color="k", mfc="none", ms=8, label="uniform segments (measured)")
    ax.plot([p / MIB for p, _ in planned], [100 * c / total_cost for _, c in planned], "o",
            color=PHASE_COLORS["forward"], label="planner's plan within that peak (measured)")
    ax.set(title=title, xlabel="step peak (MiB)", ylabel="forward re-run (% of FLOPs)")
    ax.title.set_fontsize(10)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def layer_profile(profile, flops, title="What each layer keeps, passes on and needs in backward"):
    """Per layer of a chain (a `profile_layers` result): kept, passed-on and backward-work
    bytes as bars (measured), and its forward FLOPs below."""
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 4.4), sharex=True,
                               gridspec_kw={"height_ratios": (2, 1)})
    x = range(len(profile))
    w = 0.28
    a.bar([i - w for i in x], [p.act_bytes / MIB for p in profile], w,
          color=PHASE_COLORS["forward"], label="keeps for backward")
    a.bar(list(x), [p.out_bytes / MIB for p in profile], w, color="tab:gray", label="passes on")
    a.bar([i + w for i in x], [p.work_bytes / MIB for p in profile], w,
          color=PHASE_COLORS["backward"], label="backward's working memory")
    a.set(ylabel="MiB (measured)", title=title)
    a.title.set_fontsize(10)
    a.legend(fontsize=8)
    b.bar(list(x), [f / 1e6 for f in flops], 0.6, color="tab:gray")
    b.set(ylabel="MFLOP", xlabel="layer")
    b.set_xticks(list(x))
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
    ax.set(title=title, xlabel="measured step peak (MiB)", ylabel="model's peak (MiB)",
           xlim=(0, top), ylim=(0, top))
    ax.title.set_fontsize(10)
    ax.legend(fontsize=8)
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
    a.set(title="step peak", xlabel="layers L", ylabel="units of one activation")
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


def technique_bars(measured: dict, predicted: dict | None = None,
                   title="One step's peak under each technique"):
    """One bar per technique (measured peak, MiB) with its ratio to the first bar; the
    formula's peak as a black tick where one is given."""
    predicted = predicted or {}
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    names = list(measured)
    base = measured[names[0]]
    ax.bar(names, [measured[n] / MIB for n in names], color=PHASE_COLORS["forward"], width=0.6,
           label="step peak (measured)")
    ticks = [(i, predicted[n] / MIB) for i, n in enumerate(names) if n in predicted]
    if ticks:
        ax.plot(*zip(*ticks), "_", color="k", ms=40, mew=2, label="formula")
    for i, n in enumerate(names):
        ax.text(i, measured[n] / MIB, f"x{measured[n] / base:.2f}", ha="center", va="bottom",
                fontsize=8)
    ax.set(title=title, ylabel="MiB")
    ax.title.set_fontsize(10)
    ax.set_ylim(0, max(measured.values()) / MIB * 1.15)
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def combination_grid(rows: list, budget_bytes: int,
                     title="Which combination fits the budget, and at what recompute"):
    """Small multiples, one panel per micro-batch count: measured peak (MiB) against recompute
    (% of a step's FLOPs); colour = checkpoint policy, marker = precision, filled = fits; the
    budget as a dashed line. Each row: dict(policy, k, precision, peak, recompute_share)."""
    ks = sorted({r["k"] for r in rows})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    colors = dict(zip(policies, RUN_COLORS[:1] + ("tab:brown", PHASE_COLORS["recompute"])))
    markers = {"fp32": "o", "bf16": "s"}
    fig, axes = plt.subplots(1, len(ks), figsize=(3.6 * len(ks), 3.4), sharey=True, squeeze=False)
    top = max(r["peak"] for r in rows) / MIB * 1.1
    for ax, k in zip(axes[0], ks):
        for r in (r for r in rows if r["k"] == k):
            fits = r["peak"] <= budget_bytes
            ax.plot([100 * r["recompute_share"]], [r["peak"] / MIB], markers[r["precision"]],
                    color=colors[r["policy"]], mfc=colors[r["policy"]] if fits else "none", ms=8)
        ax.axhline(budget_bytes / MIB, color="k", ls="--", lw=1)
        ax.set(title=f"{k} micro-batch{'es' if k > 1 else ''}", xlabel="recompute, % of a step's FLOPs",
               ylim=(0, top))
    axes[0][0].set_ylabel("step peak, measured (MiB)")
    handles = [plt.Line2D([], [], ls="", marker="o", color=c) for c in colors.values()]
    handles += [plt.Line2D([], [], ls="", marker=m, color="tab:gray", mfc="none")
                for m in markers.values()]
    handles.append(plt.Line2D([], [], ls="--", color="k"))
    fig.legend(handles, [f"checkpoint: {p}" for p in colors] + list(markers) + ["budget"],
               fontsize=8, loc="lower center", ncol=len(handles), frameon=False)
    fig.suptitle(title + " (filled: fits)", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
