"""Grids and schedules: the verdict grid of lesson 2 (right, silently wrong, refuses), pipeline
schedules in time, checkpoint segments over layer indices, and the out-of-memory ladder's paths.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .style import PHASE_COLORS, _axes


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


def segment_plans(plans: dict[str, list[tuple[int, int]]], layers: int, boundaries=(), ax=None,
                  title="Checkpoint segments: the plan requested and what each stage ran"):
    """One row per plan: its checkpointed segments (recomputed: orange) over the layer indices
    [start, end), each labelled with its layers, every other one hatched so that neighbours
    stay apart (the legend says so); stage boundaries dashed."""
    fig, ax = _axes(ax, (8, 0.6 + 0.45 * len(plans)))
    for row, spans in enumerate(plans.values()):
        for k, (a, b) in enumerate(spans):
            ax.barh(row, b - a, left=a, height=0.6, color=PHASE_COLORS["recompute"],
                    edgecolor="white", lw=2, hatch="//" if k % 2 else None)
            ax.text((a + b) / 2, row, f"{a}" if b - a == 1 else f"{a}–{b - 1}", ha="center",
                    va="center", fontsize=7, color="black",
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))
    for i, x in enumerate(boundaries):
        ax.axvline(x, ls="--", color="k", lw=1, label="stage boundary" if i == 0 else None)
    ax.set_yticks(range(len(plans)), list(plans), fontsize=8)
    ax.invert_yaxis()
    ax.set_xticks(range(layers + 1))
    ax.set_xlim(0, layers)
    ax.set(title=title, xlabel="layer index in model.layers() (0: embedding, last: head)")
    handles, names = ax.get_legend_handles_labels()
    segment = dict(facecolor=PHASE_COLORS["recompute"], edgecolor="white", lw=0.5)
    handles = [plt.Rectangle((0, 0), 1, 1, **segment),
               plt.Rectangle((0, 0), 1, 1, hatch="///", **segment)] + handles
    names = ["a checkpointed segment", "the next one, hatched only to tell them apart"] + names
    ax.legend(handles, names, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3),
              ncol=len(names), frameon=False, handlelength=3, handleheight=1.5)
    fig.tight_layout()
    return fig


def ladder_paths(paths: dict, notes: dict | None = None,
                 title="The out-of-memory ladder, three orders (measured)"):
    """Small multiples, one panel per order, on a shared (checkpointing, micro-batch) grid:
    x = blocks per segment (0 = none), y = micro-batch; each rung numbered in the order tried,
    x where it ran out of memory, a star where it fit; the panel's title names the order and
    `notes[order]` (its cost).
    `paths`: order -> [(checkpoint_every, micro_batch, fits), ...]; `notes`: order -> text."""
    xs = sorted({e for p in paths.values() for e, _, _ in p}, key=lambda e: (e != 0, -e))
    ys = sorted({m for p in paths.values() for _, m, _ in p})
    col = {e: i for i, e in enumerate(xs)}
    fig, axes = plt.subplots(1, len(paths), figsize=(3.3 * len(paths), 3.4), sharey=True,
                             squeeze=False)
    for ax, (name, path) in zip(axes[0], paths.items()):
        pts = [(col[e], ys.index(m)) for e, m, _ in path]
        ax.plot(*zip(*pts), "-", color="tab:gray", lw=1, zorder=1)
        for n, ((x, y), (_, _, fits)) in enumerate(zip(pts, path), 1):
            ax.plot(x, y, "*" if fits else "x", color="black", ms=14 if fits else 8, zorder=2)
            ax.annotate(str(n), (x, y), xytext=(5, 5), textcoords="offset points", fontsize=8)
        ax.set_xticks(range(len(xs)), ["none" if e == 0 else f"seg. of {e}" for e in xs],
                      rotation=30, fontsize=8)
        ax.set_xlim(-0.5, len(xs) - 0.5)
        ax.set_ylim(-0.5, len(ys) - 0.5)
        ax.set_title(name + (f"\n{notes[name]}" if notes and name in notes else ""), fontsize=9)
        ax.set_xlabel("checkpointing (blocks per segment)", fontsize=8)
    axes[0][0].set_yticks(range(len(ys)), [str(m) for m in ys])
    axes[0][0].set_ylabel("micro-batch")
    fig.suptitle(title + " · rungs numbered, x = out of memory, * = fits", fontsize=10)
    fig.tight_layout()
    return fig
