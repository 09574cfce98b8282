"""What each layer keeps: one layer's saved terms grouped and stacked, a block's terms measured
against the formula's, a chain's per-layer profile, and a plan drawn over that profile.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .style import GIB, MEASURED, MIB, NEUTRAL_COLORS, PHASE_COLORS, PREDICTED, _axes


LAYER_PARTS = {"T × T scores (softmax, dropout)": ("softmax output", "attention dropout mask",
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
    fig.legend(handles, ["kept (measured)", "kept, grows with T² (measured)", "formula"],
               fontsize=8, loc="lower center", ncol=3, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
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


def plan_profile(profile, boundaries, measured: dict, predicted: dict, budget_bytes: int,
                 activation_only: dict | None = None,
                 title="Your model: what each layer keeps, the plan, the step peak (activations)"):
    """Two panels. Left: each layer's saved bytes (bars; recompute orange for layers a
    checkpointed segment will recompute), its output (the marker: what a checkpoint keeps) and
    the plan's segment starts. Right: measured step peaks (bars) per plan, the step model's
    prediction (line marks), the activation model's (dotted marks), the budget."""
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
                   ms=40, mew=2, ls="", label="activation model")
    right.axhline(budget_bytes / MIB, color=PREDICTED, ls=":", lw=1, label="budget")
    right.set(title="step peak (activations)", ylabel="MiB")
    right.set_ylim(0, 1.35 * max(measured.values()) / MIB)
    right.legend(fontsize=7, loc="upper right", markerscale=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
