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
SERIES_COLORS = RUN_COLORS[1:]          # runs and settings that are not phases


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


def timeline(logs: dict[str, MemoryLog], ax=None, title="Live memory during one training step",
             levels: dict[str, float] | None = None):
    """Live MiB after each operation: one panel per run on shared axes, coloured by phase.

    Runs never share a panel, so a phase's colour (forward blue, recompute orange, backward
    green, optimizer purple) means one thing: the legend has one entry per phase, and the
    panel's title names its run and its peak, which is marked. Each stretch of recompute is
    shaded, so the sawtooth of a segmented backward (one tooth per recomputed segment) stands
    out. ``levels`` ({label: bytes}) draws reference levels, e.g. a prediction, as dashed lines.
    Pass ``ax``, one Axes per run, to draw into existing axes.
    """
    runs = list(logs.items())
    if not runs:
        raise ValueError("timeline needs at least one run: {name: MemoryLog}")
    if ax is None:
        fig, grid = plt.subplots(len(runs), 1, figsize=(9.5, 0.9 + 2.1 * len(runs)), sharex=True,
                                 sharey=True, squeeze=False)
        axes = list(grid[:, 0])
    else:
        axes = list(ax) if isinstance(ax, (list, tuple)) else [ax]
        if len(axes) != len(runs):
            raise ValueError(f"timeline draws one run per Axes: got {len(runs)} runs and "
                             f"{len(axes)} Axes; pass one Axes per run (or ax=None)")
        fig = axes[0].figure
    for a, (name, log) in zip(axes, runs):
        steps = [p.step for p in log.timeline]
        live = [p.live_bytes / MIB for p in log.timeline]
        phases = [p.phase for p in log.timeline]
        for first, last in phase_spans(log, "recompute"):
            a.axvspan(first - 0.5, last + 0.5, color=PHASE_COLORS["recompute"], alpha=0.15, lw=0)
        for phase, color in PHASE_COLORS.items():
            if phase not in phases:
                continue
            # a point belongs to its phase's line, and so does the point before it (no gaps)
            ys = [y if ph == phase or (i + 1 < len(phases) and phases[i + 1] == phase)
                  else float("nan") for i, (y, ph) in enumerate(zip(live, phases))]
            a.plot(steps, ys, lw=1.4, color=color, label=phase)
        if log.timeline:
            top = max(log.timeline, key=lambda p: p.live_bytes)
            a.plot([top.step], [top.live_bytes / MIB], "v", color="black", ms=7, label="peak")
        for k, (label, value) in enumerate((levels or {}).items()):
            a.axhline(value / MIB, color=RUN_COLORS[1 + k % (len(RUN_COLORS) - 1)], ls="--",
                      lw=1, label=label)
        a.set_title(f"{name} (peak {log.peak_bytes / MIB:.2f} MiB)", fontsize=10)
        a.set_ylabel("live (MiB)")
        a.set_ylim(bottom=0)
    handles = {}
    for a in axes:
        for h, l in zip(*a.get_legend_handles_labels()):
            handles.setdefault(l, h)
    order = [l for l in PHASE_COLORS if l in handles] + [l for l in handles if l not in PHASE_COLORS]
    axes[0].legend([handles[l] for l in order], order, fontsize=8, loc="upper left",
                   bbox_to_anchor=(1.01, 1))
    axes[-1].set_xlabel("operation (in order)")
    if title:
        fig.suptitle(title)
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
            ax=None, title="Where the memory of a training step goes", ylabel="MiB", scale=MIB):
    """Stacked bars of measured bytes per part (MiB, or ``ylabel`` after dividing by ``scale``);
    predicted totals as horizontal lines. A part is coloured by the phase that makes it
    (`PART_COLORS`): activations forward blue, gradients backward green, optimizer states
    purple."""
    fig, ax = _axes(ax, (9, 4))
    labels = list(breakdowns)
    parts = list(dict.fromkeys(p for d in breakdowns.values() for p in d))
    bottoms = [0.0] * len(labels)
    for i, part in enumerate(parts):
        vals = [breakdowns[l].get(part, 0) / scale for l in labels]
        ax.bar(labels, vals, bottom=bottoms, label=f"{part} (measured)", color=_part_color(part, i))
        bottoms = [b + v for b, v in zip(bottoms, vals)]
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


# ------------------------------------------------------------- lessons 00-03 (tour, 1, 2, 3)
# A part of memory takes the colour of the phase that makes it; what no phase makes is grey.
PART_COLORS = {"parameters": "tab:gray", "activations": PHASE_COLORS["forward"],
               "gradients": PHASE_COLORS["backward"], "optimizer states": PHASE_COLORS["optimizer"],
               "master copy": "tab:brown"}
_SPARE_COLORS = ("tab:cyan", "tab:olive", "tab:pink", "tab:brown", "tab:gray")   # never a phase's


def _part_color(part: str, index: int) -> str:
    return PART_COLORS.get(part, _SPARE_COLORS[index % len(_SPARE_COLORS)])


VERDICTS = ("right", "WRONG, silently", "refuses")
VERDICT_COLORS = {"right": "#e5f5e0", "WRONG, silently": "tab:red", "refuses": "#d9d9d9"}


def verdict_of(outcome: str) -> str:
    """The kind of an outcome string: "right", "WRONG, silently" or "refuses"."""
    for kind in VERDICTS:
        if outcome.startswith(kind):
            return kind
    raise ValueError(f"an outcome starts with one of {VERDICTS}, got {outcome!r}")


def verdict_grid(table: dict[str, dict[str, str]], guesses: dict[str, str] | None = None,
                 guess_column: str | None = None, ax=None,
                 title="Is the gradient right? (measured)"):
    """Cases x implementations as a grid of measured outcomes: right, WRONG silently, refuses.

    ``table[case][implementation]`` is an outcome string that starts with its kind (the rest,
    e.g. "(CheckpointError)", is printed in the cell). Any number of rows and columns. With
    ``guesses`` ({case: kind}, "wrong" standing for "WRONG, silently") the cells of
    ``guess_column`` are outlined: solid where the guess was right, dashed where it was not,
    with the guess written in.
    """
    cases = list(table)
    columns = list(dict.fromkeys(c for row in table.values() for c in row))
    if ax is None:
        fig, ax = plt.subplots(figsize=(2.5 + 1.75 * len(columns), 1.2 + 0.5 * len(cases)))
    else:
        fig = ax.figure
    for i, case in enumerate(cases):
        for j, column in enumerate(columns):
            outcome = table[case].get(column)
            if outcome is None:
                continue
            kind = verdict_of(outcome)
            ax.add_patch(plt.Rectangle((j, i), 1, 1, facecolor=VERDICT_COLORS[kind],
                                       edgecolor="white", lw=1.5))
            detail = outcome[len(kind):].strip(" ,")
            text = kind.replace(", ", ",\n") + (f"\n{detail}" if detail else "")
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=7,
                    color="white" if kind == "WRONG, silently" else "black")
    if guesses and guess_column in columns:
        j = columns.index(guess_column)
        aliases = {"wrong": "WRONG, silently", "refuse": "refuses"}
        guesses = {k: aliases.get(str(v).strip().lower(), str(v).strip().lower()
                                  if str(v).strip().lower() in ("right", "refuses") else str(v))
                   for k, v in guesses.items()}
        for i, case in enumerate(cases):
            if case in guesses and guess_column in table[case]:
                hit = guesses[case] == verdict_of(table[case][guess_column])
                ax.add_patch(plt.Rectangle((j + 0.04, i + 0.04), 0.92, 0.92, fill=False, lw=2.2,
                                           ls="-" if hit else "--", edgecolor="black"))
                ax.text(j + 0.5, i + 0.9, f"you: {guesses[case].split(',')[0]}", ha="center",
                        va="bottom", fontsize=6.5, style="italic",
                        color="white" if verdict_of(table[case][guess_column]) ==
                        "WRONG, silently" else "black")
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(cases), 0)
    ax.set_xticks([j + 0.5 for j in range(len(columns))], columns, fontsize=8)
    ax.set_yticks([i + 0.5 for i in range(len(cases))], cases, fontsize=8)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=VERDICT_COLORS[k]) for k in VERDICTS]
    labels = list(VERDICTS)
    if guesses:
        handles += [plt.Rectangle((0, 0), 1, 1, fill=False, lw=2, ls=ls, edgecolor="black")
                    for ls in ("-", "--")]
        labels += ["your guess, right", "your guess, wrong"]
    ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


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


# ---------------------------------------------------------------------- lessons 11 and 12
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


# ------------------------------------------------------------------ lessons 08, 09 and 10
# Figures of lesson 8 (capacity and out-of-memory), lesson 9 (checking the articles) and
# lesson 10 (your own model). Measured values are points or bars, predictions lines; no phase
# colour (PHASE_COLORS) stands for anything but its phase.
GIB = 2 ** 30
MEASURED = "tab:red"          # measured points
PREDICTED = "black"           # predicted lines
NEUTRAL_COLORS = ("tab:gray", "tab:cyan", "tab:pink", "tab:olive", "tab:brown")  # not phases


def capacity_bars(state_bytes: dict, activation_bytes: dict, leanest_bytes: dict,
                  budgets: dict, ax=None, title="Planned, not measured: model state + "
                  "activations per model"):
    """Per model: model state and activations (stacked bars, GiB, log scale), the leanest plan's
    total as a marker, and each GPU's budget as a dashed line."""
    fig, ax = _axes(ax, (7.5, 3.8))
    names = list(state_bytes)
    state = [state_bytes[n] / GIB for n in names]
    ax.bar(names, state, color=NEUTRAL_COLORS[0], label="model state (16 B/param)")
    ax.bar(names, [activation_bytes[n] / GIB for n in names], bottom=state,
           color=NEUTRAL_COLORS[1], label="activations, no checkpoint, micro-batch 8")
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
        ax.barh(labels, vals, left=left, color=("tab:red", *NEUTRAL_COLORS)[i], label=part)
        left = [a + b for a, b in zip(left, vals)]
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.2f} GiB", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.2 * max(left))
    ax.set(title=title, xlabel="GiB per layer")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
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
             color=[PHASE_COLORS["recompute"] if i < last else NEUTRAL_COLORS[0] for i in xs])
    left.plot(xs, [p.out_bytes / MIB for p in profile], "D", color=PREDICTED, ms=5)
    for b in list(boundaries)[1:]:
        left.axvline(b - 0.5, color=PREDICTED, ls="--", lw=1)
    handles = [plt.Rectangle((0, 0), 1, 1, color=PHASE_COLORS["recompute"],
                             label="saved, recomputed in backward"),
               plt.Rectangle((0, 0), 1, 1, color=NEUTRAL_COLORS[0], label="saved, last segment"),
               plt.Line2D([], [], ls="", marker="D", color=PREDICTED, label="output"),
               plt.Line2D([], [], ls="--", color=PREDICTED, lw=1, label="segment start")]
    left.legend(handles=handles, fontsize=7)
    left.set(title="per layer (measured)", xlabel="layer", ylabel="MiB", xticks=list(xs))
    names = list(measured)
    right.bar(names, [measured[k] / MIB for k in names], color=NEUTRAL_COLORS[1],
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


# ------------------------------------------------------ lesson 1: tensor vs allocator bytes
def allocator_timeline(logs: dict[str, MemoryLog], ax=None,
                       title="Tensor bytes and allocator bytes, operation by operation"):
    """Per run (one panel each, own y axis): tensor bytes after each operation, coloured by
    phase; the allocator's bytes after it (dashed black); what an operation held only while it
    ran, as a grey spike above that; both peaks marked, the allocator's named by its op.

    Needs logs measured with ``track_memory(allocator=True)``. Each panel in KiB below 1 MiB,
    in MiB above.
    """
    runs = list(logs.items())
    if not runs:
        raise ValueError("allocator_timeline needs at least one run: {name: MemoryLog}")
    for name, log in runs:
        if log.allocator_peak_bytes is None:
            raise ValueError(f"{name!r} has no allocator bytes: measure it with "
                             "track_memory(allocator=True)")
    if ax is None:
        fig, grid = plt.subplots(len(runs), 1, figsize=(9.5, 0.9 + 2.3 * len(runs)),
                                 squeeze=False)
        axes = list(grid[:, 0])
    else:
        axes = list(ax) if isinstance(ax, (list, tuple)) else [ax]
        if len(axes) != len(runs):
            raise ValueError(f"allocator_timeline draws one run per Axes: got {len(runs)} runs "
                             f"and {len(axes)} Axes")
        fig = axes[0].figure
    for a, (name, log) in zip(axes, runs):
        top_bytes = max(log.allocator_peak_bytes, log.peak_bytes)
        unit, scale = ("MiB", MIB) if top_bytes >= MIB else ("KiB", 1024)
        points = [p for p in log.timeline if p.allocator_bytes is not None]
        steps = [p.step for p in points]
        phases = [p.phase for p in points]
        live = [p.live_bytes / scale for p in points]
        for phase, color in PHASE_COLORS.items():
            if phase in phases:   # a point joins its phase's line, and so does the one before
                ys = [y if ph == phase or (i + 1 < len(phases) and phases[i + 1] == phase)
                      else float("nan") for i, (y, ph) in enumerate(zip(live, phases))]
                a.plot(steps, ys, lw=1.6, color=color, label=f"tensor bytes, {phase}")
        a.plot(steps, [p.allocator_bytes / scale for p in points], ls="--", lw=1,
               color="black", label="allocator bytes after the op")
        held = [p for p in points if p.transient_bytes]
        if held:
            a.vlines([p.step for p in held], [p.allocator_bytes / scale for p in held],
                     [(p.allocator_bytes + p.transient_bytes) / scale for p in held],
                     color="tab:gray", lw=2.5, label="held only while the op ran")
        top = max(points, key=lambda p: p.live_bytes)
        a.plot([top.step], [top.live_bytes / scale], "v", color="black", ms=7,
               label="tensor peak")
        at = log.allocator_peak_point()
        high = (at.allocator_bytes + at.transient_bytes) / scale
        a.plot([at.step], [high], "*", color="black", ms=11, label="allocator peak")
        a.annotate(at.op.split(".")[0], (at.step, high), xytext=(6, -4),
                   textcoords="offset points", fontsize=8, va="top")
        a.set_title(f"{name}: tensor peak {log.peak_bytes / scale:,.1f} {unit}, allocator "
                    f"peak {log.allocator_peak_bytes / scale:,.1f} {unit}", fontsize=10)
        a.set_ylabel(unit)
        a.set_ylim(0, 1.12 * top_bytes / scale)
    handles = {}
    for a in axes:
        for h, label in zip(*a.get_legend_handles_labels()):
            handles.setdefault(label, h)
    axes[0].legend(list(handles.values()), list(handles), fontsize=8, loc="upper left",
                   bbox_to_anchor=(1.01, 1))
    axes[-1].set_xlabel("operation (in order)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


# ------------------------------------------------------- lesson 08: allocator fragmentation
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


# -------------------- lessons 5 and 7: the loss at large vocabularies, throughput at equal batch
POLICY_COLORS = {"none": "k", "selective": "tab:brown", "every": PHASE_COLORS["recompute"]}


def vocab_panels(vocabs, shares, line_vocabs, line_shares, chunks, chunk_peaks, chunk_predicted,
                 floor_bytes: int | None = None,
                 title="The loss at large vocabularies, and chunked cross-entropy"):
    """Left: the loss's share of the step's peak against the vocabulary size (measured as points,
    the prediction as a line, which may run past the measured sizes). Right: the step's peak
    against the number of row chunks of the loss (measured points in recompute orange, the
    formula as a line; 1 chunk is the plain loss), with the floor no chunking removes."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    a.plot(line_vocabs, [100 * s for s in line_shares], "-", color="k",
           label="3NV / (the rest + 3NV), predicted")
    a.plot(vocabs, [100 * s for s in shares], "o", color="k", mfc="none", ms=8,
           label="measured")
    if line_vocabs[-1] > vocabs[-1]:
        a.annotate(f"{100 * line_shares[-1]:.0f}% (predicted)", (line_vocabs[-1], 100 * line_shares[-1]),
                   xytext=(-60, -16), textcoords="offset points", fontsize=7)
    a.set_xscale("log", base=2)
    a.set_xticks(line_vocabs, [f"{v // 1024}K" if v >= 1024 else str(v) for v in line_vocabs])
    a.set(title="what the loss holds at its peak, % of the step's peak", xlabel="vocabulary V",
          ylabel="% of the step peak", ylim=(0, 105))
    b.plot(chunks, [p / MIB for p in chunk_predicted], "-", color=PHASE_COLORS["recompute"],
           label="the rest + chunked_cross_entropy_peak_bytes")
    b.plot(chunks, [p / MIB for p in chunk_peaks], "o", color=PHASE_COLORS["recompute"], ms=8,
           mfc="none", label="measured (1 chunk: the plain loss)")
    if floor_bytes is not None:
        b.axhline(floor_bytes / MIB, color="tab:gray", ls=":", label="floor: the rest + 3 V x d")
    b.set_xscale("log", base=2)
    b.set_xticks(chunks, [str(k) for k in chunks])
    b.set(title=f"step peak at V = {vocabs[-1]:,}", xlabel="row chunks of the loss",
          ylabel="MiB", ylim=(0, max(chunk_peaks) / MIB * 1.1))
    for ax in (a, b):
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def throughput_panels(panels: dict, title="Tokens per second against the step's peak, "
                                          "at equal global batch"):
    """Small multiples, one panel per (machine, budget): each setup's measured step peak (x,
    MiB) against its tokens per second (y), coloured by checkpoint policy and labelled with its
    micro-batch x accumulation; hollow where it does not fit; the budget as a dashed line.

    ``panels`` maps a panel title to (budget_bytes, rows), rows as dicts with the fields of
    `ckpt_lab.throughput.ThroughputRow` (``dataclasses.asdict`` or a committed JSON file).
    """
    fig, axes = plt.subplots(1, len(panels), figsize=(4.3 * len(panels), 3.6), squeeze=False)
    for ax, (name, (budget, rows)) in zip(axes[0], panels.items()):
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
        ax.set(title=name, xlabel="step peak, measured (MiB)", ylim=(0, top * 1.2),
               xlim=(0, max(r["peak_bytes"] for r in rows) / MIB * 1.15))
        ax.title.set_fontsize(9)
    axes[0][0].set_ylabel("thousand tokens / s")
    names = {"none": "no checkpoint", "every": "full checkpointing",
             "selective": "selective recomputation"}
    handles = [plt.Line2D([], [], ls="", marker="o", color=c) for c in POLICY_COLORS.values()]
    handles += [plt.Line2D([], [], ls="", marker="o", color="k", mfc="none"),
                plt.Line2D([], [], ls="--", color="k")]
    labels = [names[p] for p in POLICY_COLORS] + ["over the budget", "budget"]
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=len(labels), frameon=False)
    fig.suptitle(title + " (label: micro-batch x accumulation)", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
