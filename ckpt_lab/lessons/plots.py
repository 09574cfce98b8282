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


# ---------------------------------------------------------------------- lessons 11 and 12
SERIES_COLORS = RUN_COLORS[1:]          # runs and settings that are not phases


def grouped_bars(groups: dict[str, dict[str, float]], ylabel="MiB", title="", scale=MIB,
                 ax=None, predicted: dict | None = None, colors: dict | None = None,
                 label_predicted="predicted"):
    """Side-by-side bars, measured: ``groups`` maps an x label to {series: value}.

    ``predicted`` maps (group, series) to a value drawn as a black tick across that bar;
    ``colors`` maps a series to its colour (default: grays and browns, never a phase colour).
    """
    fig, ax = _axes(ax, (7, 3.2))
    series = list(dict.fromkeys(s for g in groups.values() for s in g))
    colors = colors or {s: SERIES_COLORS[i % len(SERIES_COLORS)] for i, s in enumerate(series)}
    width = 0.8 / len(series)
    ticked = False
    for j, s in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(groups))]
        vals = [g.get(s, 0) / scale for g in groups.values()]
        ax.bar(xs, vals, width * 0.95, color=colors[s], label=s)
        for x, name in zip(xs, groups):
            if predicted and (name, s) in predicted:
                ax.hlines(predicted[name, s] / scale, x - width / 2, x + width / 2, colors="k",
                          lw=2, label=None if ticked else label_predicted)
                ticked = True
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set(title=title, ylabel=ylabel)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def stacked_bands(breakdowns: dict[str, dict[str, float]], colors: dict[str, str],
                  hatches: dict[str, str] | None = None, ylabel="MiB", title="", scale=MIB,
                  ax=None):
    """Stacked bars of measured parts, one colour per part (``colors``); a part may share a
    colour with another and differ by its hatch (``hatches``), e.g. a copy of the same bytes."""
    fig, ax = _axes(ax, (8, 3.6))
    labels = list(breakdowns)
    parts = list(dict.fromkeys(p for d in breakdowns.values() for p in d))
    bottoms = [0.0] * len(labels)
    for part in parts:
        vals = [breakdowns[label].get(part, 0) / scale for label in labels]
        ax.bar(labels, vals, bottom=bottoms, color=colors[part], label=part,
               hatch=(hatches or {}).get(part), edgecolor="white", lw=0.5)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set(title=title, ylabel=ylabel)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def pipeline_times(orders: dict[int, list[tuple[str, int]]], forward=1.0, backward=2.0):
    """(op, micro-batch, start, end) of every operation of each stage, in the stages' own order,
    with a forward taking ``forward`` and a backward ``backward`` time units.

    A stage runs its operations in order; F(i) waits for F(i) of the stage before it, B(i)
    for B(i) of the stage after it. Time units are assumed, not measured.
    """
    stages = len(orders)
    done: dict = {}
    pos, free = [0] * stages, [0.0] * stages
    out: dict[int, list] = {r: [] for r in range(stages)}
    while any(pos[r] < len(orders[r]) for r in range(stages)):
        moved = False
        for r in range(stages):
            if pos[r] == len(orders[r]):
                continue
            op, i = orders[r][pos[r]]
            dep = ((r - 1, "F", i) if op == "F" and r > 0 else
                   (r + 1, "B", i) if op == "B" and r < stages - 1 else None)
            if dep is not None and dep not in done:
                continue
            start = max(free[r], done.get(dep, 0.0))
            free[r] = done[r, op, i] = start + (forward if op == "F" else backward)
            out[r].append((op, i, start, free[r]))
            pos[r] += 1
            moved = True
        if not moved:
            raise ValueError("the schedules wait on each other: no stage can run its next op")
    return out


def pipeline_grid(orders: dict[int, list[tuple[str, int]]], ax=None, title="",
                  forward=1.0, backward=2.0):
    """One row per stage: forwards (blue) and backwards (green) in time, each cell labelled
    with its micro-batch; idle time is the bubble. On the right, the most micro-batches the
    stage holds (run forward, not yet backward)."""
    fig, ax = _axes(ax, (8, 0.5 + 0.45 * len(orders)))
    times = pipeline_times(orders, forward, backward)
    for r, ops in times.items():
        held = most = 0
        for op, i, start, end in ops:
            held += 1 if op == "F" else -1
            most = max(most, held)
            ax.barh(r, end - start, left=start, height=0.8, edgecolor="white",
                    color=PHASE_COLORS["forward" if op == "F" else "backward"])
            ax.text((start + end) / 2, r, str(i), ha="center", va="center", fontsize=7,
                    color="white")
        ax.text(ops[-1][3] + 0.3, r, f"holds ≤ {most}", va="center", fontsize=8)
    end = max(ops[-1][3] for ops in times.values())
    ax.set_xlim(0, end * 1.15)
    ax.set_yticks(range(len(orders)), [f"stage {r}" for r in orders])
    ax.invert_yaxis()
    ax.set(title=title, xlabel=f"time (forward = {forward:g}, backward = {backward:g} units, "
                               "assumed)")
    ax.legend([plt.Rectangle((0, 0), 1, 1, color=PHASE_COLORS[p]) for p in ("forward", "backward")],
              ["forward", "backward"], fontsize=7, loc="lower right")
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


def allocation_timeline(live_bytes: list[int], phases: list[str], ax=None,
                        title="An exported timeline: allocated bytes after each event"):
    """Allocated MiB after each allocator event, each point coloured by its phase."""
    fig, ax = _axes(ax, (8, 2.8))
    for phase in dict.fromkeys(phases):
        pts = [(i, b / MIB) for i, (b, p) in enumerate(zip(live_bytes, phases)) if p == phase]
        ax.scatter(*zip(*pts), s=3, color=PHASE_COLORS.get(phase, "tab:gray"), label=phase)
    ax.set(title=title, xlabel="allocator event", ylabel="MiB allocated")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, markerscale=4)
    fig.tight_layout()
    return fig


# The bands of one GPU's memory in lesson 12: state parts in the phase that makes them
# (gradients: backward green, Adam: optimizer purple, activations: forward blue), weights gray;
# a copy of the same bytes shares its colour, hatched (DDP's buckets, FSDP's gathered weights).
STATE_BANDS = {"weights": "tab:gray", "gradients": PHASE_COLORS["backward"],
               "buckets": PHASE_COLORS["backward"], "Adam": PHASE_COLORS["optimizer"],
               "gathered weights": "tab:gray", "activations & buffers": PHASE_COLORS["forward"]}
STATE_HATCHES = {"buckets": "//", "gathered weights": "//"}


def live_per_op(series: dict[str, list[int]], ax=None, predicted: dict[str, int] | None = None,
                labels: list[str] | None = None, title=""):
    """Live MiB after each operation of a schedule, one measured series per run (points and a
    thin line); a run's predicted peak as a dashed line in its colour."""
    fig, ax = _axes(ax, (6, 3))
    for i, (name, live) in enumerate(series.items()):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        ax.plot([b / MIB for b in live], "o-", ms=4, lw=0.8, color=color, label=name)
        if predicted and name in predicted:
            ax.axhline(predicted[name] / MIB, ls="--", lw=1, color=color,
                       label=f"{name}: predicted peak")
    if labels:
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set(title=title, xlabel="operation on this stage", ylabel="live MiB")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def segment_plans(plans: dict[str, list[tuple[int, int]]], layers: int, boundaries=(), ax=None,
                  title="Checkpoint segments: the plan requested and what each stage ran"):
    """One row per plan: its checkpointed segments (recomputed: orange) over the layer indices
    [start, end); stage boundaries dashed."""
    fig, ax = _axes(ax, (8, 0.6 + 0.45 * len(plans)))
    for row, spans in enumerate(plans.values()):
        for a, b in spans:
            ax.barh(row, b - a, left=a, height=0.6, color=PHASE_COLORS["recompute"],
                    edgecolor="white", lw=2)
    for i, x in enumerate(boundaries):
        ax.axvline(x, ls="--", color="k", lw=1, label="stage boundary" if i == 0 else None)
    ax.set_yticks(range(len(plans)), list(plans), fontsize=8)
    ax.invert_yaxis()
    ax.set_xticks(range(layers + 1))
    ax.set_xlim(0, layers)
    ax.set(title=title, xlabel="layer index in model.layers() (0: embedding, last: head)")
    if boundaries:
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig
