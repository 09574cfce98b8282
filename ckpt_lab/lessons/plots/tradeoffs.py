"""Memory against what it costs, one point per setting: peak against recompute or throughput,
with the budget drawn and what fits filled.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .style import (GIB, MIB, NEUTRAL_COLORS, PHASE_COLORS, POLICY_COLORS, PREDICTED, RUN_COLORS,
                   SERIES_COLORS, _axes)


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


def tradeoff_points(points: dict[str, tuple[float, float]], xlabel: str, ylabel: str, ax=None,
                    title=""):
    """One measured point per setting (x, y), labelled: e.g. kept MiB against FLOPs. Settings
    that land on the same point share it, their names joined by " = "."""
    fig, ax = _axes(ax, (5, 3.2))
    shared: dict[tuple, list[str]] = {}
    for name, (x, y) in points.items():
        shared.setdefault((round(x, 6), round(y, 6)), []).append(name)
    for i, ((x, y), names) in enumerate(shared.items()):
        ax.scatter([x], [y], s=40, color=SERIES_COLORS[i % len(SERIES_COLORS)], zorder=3)
        ax.annotate(" = ".join(names), (x, y), textcoords="offset points", xytext=(6, 4),
                    fontsize=8)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.set_ylim(bottom=0)
    ax.margins(x=0.25)
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
            where="post", color=PHASE_COLORS["recompute"],
            label="least recompute at each step peak (step model)")
    for (pu, cu), (pp, cp) in zip(uniform, planned):
        ax.annotate("", (pp / MIB, 100 * cp / total_cost), (pu / MIB, 100 * cu / total_cost),
                    arrowprops=dict(arrowstyle="->", color="tab:gray", lw=0.8))
    ax.plot([p / MIB for p, _ in uniform], [100 * c / total_cost for _, c in uniform], "o",
            color="k", mfc="none", ms=8, label="uniform segments (measured)")
    ax.plot([p / MIB for p, _ in planned], [100 * c / total_cost for _, c in planned], "o",
            color=PHASE_COLORS["forward"], label="planner's plan within that peak (measured)")
    ax.set(title=title, xlabel="step peak, activations (MiB)",
           ylabel="forward re-run (% of FLOPs)")
    ax.title.set_fontsize(10)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def combination_grid(rows: list, budget_bytes: int,
                     title="Which combination fits the budget, and at what recompute",
                     state_bytes: int = 0):
    """Small multiples, one panel per micro-batch count M: the measured peak (MiB) of each
    checkpoint policy at its own place on the x axis, labelled with its recompute (% of a
    step's FLOPs), fp32 (circle) just left of bf16 (square), so no two points share a place;
    colour = policy, filled = fits; the budget as a dashed line. Each row: dict(policy, M,
    precision, peak, recompute_share), peak the step peak (activations); with ``state_bytes``
    the points are total peaks (model state included) and the budget is one too."""
    Ms = sorted({r["M"] for r in rows})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    share = {r["policy"]: r["recompute_share"] for r in rows}
    colors = dict(zip(policies, RUN_COLORS[:1] + ("tab:brown", PHASE_COLORS["recompute"])))
    markers, offset = {"fp32": "o", "bf16": "s"}, {"fp32": -0.15, "bf16": 0.15}
    fig, axes = plt.subplots(1, len(Ms), figsize=(3.6 * len(Ms), 3.6), sharey=True, squeeze=False)
    top = (state_bytes + max(r["peak"] for r in rows)) / MIB * 1.1
    for ax, M in zip(axes[0], Ms):
        for r in (r for r in rows if r["M"] == M):
            total = state_bytes + r["peak"]
            fits = total <= budget_bytes
            x = policies.index(r["policy"]) + offset[r["precision"]]
            ax.plot([x], [total / MIB], markers[r["precision"]], color=colors[r["policy"]],
                    mfc=colors[r["policy"]] if fits else "none", ms=8)
        ax.axhline(budget_bytes / MIB, color="k", ls="--", lw=1)
        if state_bytes:
            ax.axhspan(0, state_bytes / MIB, color=NEUTRAL_COLORS[0], alpha=0.25, lw=0)
        ax.set_xticks(range(len(policies)),
                      [f"{p}\n+{100 * share[p]:.0f}%" for p in policies], fontsize=8)
        ax.set(title=f"M = {M} micro-batch{'es' if M > 1 else ''}", ylim=(0, top),
               xlim=(-0.6, len(policies) - 0.4))
        ax.set_xlabel("checkpoint, recompute (% of FLOPs)", fontsize=8)
    axes[0][0].set_ylabel("total peak (model state included), MiB" if state_bytes else
                          "step peak (activations), MiB")
    handles = [plt.Line2D([], [], ls="", marker="o", color=c) for c in colors.values()]
    handles += [plt.Line2D([], [], ls="", marker=m, color="tab:gray", mfc="none")
                for m in markers.values()]
    handles.append(plt.Line2D([], [], ls="--", color="k"))
    labels = [f"checkpoint: {p}" for p in colors] + list(markers) + ["budget"]
    if state_bytes:
        handles.append(plt.Rectangle((0, 0), 1, 1, color=NEUTRAL_COLORS[0], alpha=0.25, lw=0))
        labels.append("model state")
    fig.legend(handles, labels,
               fontsize=8, loc="lower center", ncol=len(handles), frameon=False)
    fig.suptitle(title + " (filled: fits)", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def capacity_scatter(rows, budget_bytes: int, ax=None,
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
                           label=s) for s in strategies]
    handles += [plt.Line2D([], [], color=PREDICTED, ls="--", lw=1, label="budget (85%)"),
                plt.Line2D([], [], ls="", marker="o", ms=12, mfc="none", color=PREDICTED,
                           label="cheapest that fits")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_yscale("log")
    ax.set(title=title + " · filled = fits", xlabel="recompute (% of a step's FLOPs)",
           ylabel="model state + activations (GiB)")
    fig.tight_layout()
    return fig


def throughput_panels(panels: dict, title="Tokens per second against the step peak "
                                          "(activations), at equal global batch",
                      ncols: int | None = None):
    """Small multiples, one panel per (machine, budget): each setup's measured step peak (x,
    MiB) against its tokens per second (y), coloured by checkpoint policy and labelled with its
    micro-batch x accumulation; hollow where it does not fit; the budget as a dashed line.

    ``panels`` maps a panel title to (budget_bytes, rows), rows as dicts with the fields of
    `ckpt_lab.training.throughput.ThroughputRow` (``dataclasses.asdict`` or a committed JSON file).
    ``ncols``: panels per row (all in one row by default; a machine per row with 2 budgets).
    """
    ncols = ncols or len(panels)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.3 * ncols, 3.3 * nrows + 0.3),
                             squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (name, (budget, rows)) in zip(axes.flat, panels.items()):
        for r in rows:
            color = POLICY_COLORS.get(r["policy"], "tab:gray")
            fits = r["peak_bytes"] <= budget
            ax.plot(r["peak_bytes"] / MIB, r["tokens_per_s"] / 1e3, "o", ms=9, color=color,
                    mfc=color if fits else "none")
            ax.annotate(f"{r['micro_batch']} x{r['accumulation']}",
                        (r["peak_bytes"] / MIB, r["tokens_per_s"] / 1e3), fontsize=7,
                        xytext=(5, 4), textcoords="offset points")
        ax.axvline(budget / MIB, color="k", ls="--", lw=1)
        top = max(r["tokens_per_s"] for r in rows) / 1e3
        ax.set(title=name, xlabel="step peak (activations), measured (MiB)", ylim=(0, top * 1.2),
               xlim=(0, max(r["peak_bytes"] for r in rows) / MIB * 1.15))
        ax.title.set_fontsize(9)
    for row in axes:
        row[0].set_ylabel("thousand tokens / s")
    names = {"none": "no checkpoint", "every": "full recomputation",
             "selective": "selective recomputation"}
    handles = [plt.Line2D([], [], ls="", marker="o", color=c) for c in POLICY_COLORS.values()]
    handles += [plt.Line2D([], [], ls="", marker="o", color="k", mfc="none"),
                plt.Line2D([], [], ls="--", color="k")]
    labels = [names[p] for p in POLICY_COLORS] + ["over the budget",
                                                  "budget (less the model state)"]
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=len(labels), frameon=False)
    fig.suptitle(title + " (label: micro-batch x accumulation)", fontsize=10)
    fig.tight_layout(rect=(0, 0.08 / nrows, 1, 1))
    return fig
