"""Pictures of a model's structure: the six matmuls of a transformer block (lesson 4).

The sizes are read from the module handed in (its Linear layers and head count), never typed in:
the picture shows the block that the lesson then counts.
"""
from __future__ import annotations

from matplotlib.patches import FancyBboxPatch

from .style import _axes

MATMUL_COLOR = "tab:cyan"        # no phase's colour: a matmul runs in forward and recompute alike
ELEMENTWISE_COLOR = "tab:gray"


def block_sizes(block) -> dict:
    """H, n_h and F of a transformer block (ckpt_lab.training.models.Block), read from its layers."""
    return {"H": block.attn.qkv.in_features, "n_h": block.attn.n_head,
            "F": block.mlp.fc.out_features}


def _box(ax, x, y, text, matmul: bool, width, height=1.1):
    color = MATMUL_COLOR if matmul else ELEMENTWISE_COLOR
    ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                boxstyle="round,pad=0.04", facecolor=color,
                                alpha=0.35 if matmul else 0.15, edgecolor=color, lw=1.5))
    ax.text(x, y, text, ha="center", va="center", fontsize=7.5)


def _arrow(ax, start, end, **style):
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="->", lw=1, **style))


def _bracket(ax, x0, x1, y, text, up: bool = True):
    tick, place = (-0.1, "bottom") if up else (0.1, "top")
    ax.plot([x0, x0, x1, x1], [y + tick, y, y, y + tick], color="black", lw=1)
    ax.text((x0 + x1) / 2, y - 2 * tick, text, ha="center", va=place, fontsize=8,
            style="italic")


def block_matmuls(block, batch: int, seq: int, ax=None):
    """The six matmuls of one forward of `block` on `batch` x `seq` tokens, numbered in the
    order they run, each with its operand shapes; the element-wise steps between them in grey.
    Returns the Figure; `fig.matmuls` lists the six names in order."""
    sizes = block_sizes(block)
    fig, ax = _axes(ax, (12, 4.6))
    attention = [("LayerNorm", False), ("1  Q, K, V projection\n(BT × H)(H × 3H)", True),
                 ("2  Q Kᵀ, per head:\n(T × H/n_h)(H/n_h × T)", True),
                 ("scale, mask,\nsoftmax,\ndropout", False),
                 ("3  · V, per head:\n(T × T)(T × H/n_h)", True),
                 ("4  output projection\n(BT × H)(H × H)", True), ("dropout,\n+ input", False)]
    mlp = [("LayerNorm", False), ("5  up projection\n(BT × H)(H × F)", True), ("GELU", False),
           ("6  down projection\n(BT × F)(F × H)", True), ("dropout,\n+ input", False)]
    rows = ((3.0, attention), (0.9, mlp))
    widths = {True: 2.3, False: 1.2}
    for y, boxes in rows:
        x, edges = 0.0, []
        for text, matmul in boxes:
            w = widths[matmul]
            _box(ax, x + w / 2, y, text, matmul, w)
            edges.append((x, x + w))
            x += w + 0.45
        for (_, right), (left, _) in zip(edges, edges[1:]):
            _arrow(ax, (right + 0.02, y), (left - 0.02, y))
        if boxes is attention:
            core = (edges[2][0], edges[4][1])
            last = edges[-1]
        else:
            mlp_span, end = (edges[1][0], edges[3][1]), edges[-1][1]
    _bracket(ax, *core, 3.75, "attention core")
    _bracket(ax, *mlp_span, 0.15, "MLP: H → F → H", up=False)
    _arrow(ax, ((last[0] + last[1]) / 2, 2.45), (0.6, 1.45), connectionstyle="arc3,rad=0.05")
    ax.text(-0.15, 3.0, "x: B × T × H", ha="right", va="center", fontsize=8)
    ax.text(end + 0.15, 0.9, "to the next block", ha="left", va="center", fontsize=8)
    ax.set_xlim(-1.6, last[1] + 0.2)
    ax.set_ylim(-0.2, 4.2)
    ax.axis("off")
    ax.set_title(f"One transformer block, forward: six matmuls (cyan), element-wise steps (grey)"
                 f"\nB = {batch}, T = {seq}, H = {sizes['H']}, n_h = {sizes['n_h']}, "
                 f"F = {sizes['F']}; BT = the B × T tokens", fontsize=10)
    fig.tight_layout()
    fig.matmuls = [text.split("\n")[0][3:].rstrip(":").removesuffix(", per head")
                   for text, matmul in attention + mlp if matmul]
    return fig
