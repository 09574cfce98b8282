"""Memory over a step, operation by operation: live bytes per phase (one panel per run), tensor
against allocator bytes, an exported allocator timeline, a timeline scaled to an article's
size, and the live bytes of a pipeline stage's schedule.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ckpt_lab.measure.memory import MemoryLog

from .style import MEASURED, MIB, PHASE_COLORS, RUN_COLORS, SERIES_COLORS, _axes


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
    fig, axes = _run_panels("timeline", runs, ax, 2.1, sharex=True, sharey=True)
    for a, (name, log) in zip(axes, runs):
        for first, last in phase_spans(log, "recompute"):
            a.axvspan(first - 0.5, last + 0.5, color=PHASE_COLORS["recompute"], alpha=0.15, lw=0)
        _phase_lines(a, log.timeline, MIB, lw=1.4)
        if log.timeline:
            top = max(log.timeline, key=lambda p: p.live_bytes)
            a.plot([top.step], [top.live_bytes / MIB], "v", color="black", ms=7, label="peak")
        for k, (label, value) in enumerate((levels or {}).items()):
            a.axhline(value / MIB, color=RUN_COLORS[1 + k % (len(RUN_COLORS) - 1)], ls="--",
                      lw=1, label=label)
        a.set_title(f"{name} (peak {log.peak_bytes / MIB:.2f} MiB)", fontsize=10)
        a.set_ylabel("live (MiB)")
    for a in axes:               # after every run is drawn: a limit set earlier would clip a later, higher run
        a.set_ylim(bottom=0)
    return _one_legend(fig, axes, title, first=PHASE_COLORS)


def allocator_timeline(logs: dict[str, MemoryLog], ax=None,
                       title="Tensor bytes and allocator bytes, operation by operation"):
    """Per run (one panel each, own y axis): tensor bytes after each operation, coloured by
    phase; the allocator's bytes after it (dashed black); what an operation held only while it
    ran, as a grey spike above that; both peaks marked, the allocator's named by its op.

    Needs logs measured with ``track_memory(allocator=True)``. Each panel in KiB below 1 MiB,
    in MiB above.
    """
    runs = list(logs.items())
    for name, log in runs:
        if log.allocator_peak_bytes is None:
            raise ValueError(f"{name!r} has no allocator bytes: measure it with "
                             "track_memory(allocator=True)")
    fig, axes = _run_panels("allocator_timeline", runs, ax, 2.3)
    for a, (name, log) in zip(axes, runs):
        top_bytes = max(log.allocator_peak_bytes, log.peak_bytes)
        unit, scale = ("MiB", MIB) if top_bytes >= MIB else ("KiB", 1024)
        points = [p for p in log.timeline if p.allocator_bytes is not None]
        steps = [p.step for p in points]
        _phase_lines(a, points, scale, lw=1.6, label="tensor bytes, {}")
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
    return _one_legend(fig, axes, title)


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


def _run_panels(what: str, runs: list, ax, height: float, **share):
    """(figure, one Axes per run): a new column of panels, ``height`` inches each, or the
    Axes passed in, which must be one per run."""
    if not runs:
        raise ValueError(f"{what} needs at least one run: {{name: MemoryLog}}")
    if ax is None:
        fig, grid = plt.subplots(len(runs), 1, figsize=(9.5, 0.9 + height * len(runs)),
                                 squeeze=False, **share)
        return fig, list(grid[:, 0])
    axes = list(ax) if isinstance(ax, (list, tuple)) else [ax]
    if len(axes) != len(runs):
        raise ValueError(f"{what} draws one run per Axes: got {len(runs)} runs and "
                         f"{len(axes)} Axes; pass one Axes per run (or ax=None)")
    return axes[0].figure, axes


def _phase_lines(a, points, scale: float, lw: float, label: str = "{}"):
    """Live bytes after each point, divided by ``scale``, one line per phase in its colour
    (``label`` formatted with the phase). A point belongs to its phase's line, and so does
    the point before it, so the lines join without gaps."""
    steps = [p.step for p in points]
    live = [p.live_bytes / scale for p in points]
    phases = [p.phase for p in points]
    for phase, color in PHASE_COLORS.items():
        if phase not in phases:
            continue
        ys = [y if ph == phase or (i + 1 < len(phases) and phases[i + 1] == phase)
              else float("nan") for i, (y, ph) in enumerate(zip(live, phases))]
        a.plot(steps, ys, lw=lw, color=color, label=label.format(phase))


def _one_legend(fig, axes, title, first=()):
    """Finish a column of run panels: one legend entry per label across them (``first``
    labels leading), right of the top panel; the x label under the bottom one; the title."""
    handles = {}
    for a in axes:
        for h, label in zip(*a.get_legend_handles_labels()):
            handles.setdefault(label, h)
    order = [l for l in first if l in handles] + [l for l in handles if l not in first]
    axes[0].legend([handles[l] for l in order], order, fontsize=8, loc="upper left",
                   bbox_to_anchor=(1.01, 1))
    axes[-1].set_xlabel("operation (in order)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
