"""plots.block_matmuls: lesson 4's picture of a transformer block reads its sizes from the
module, numbers the six matmuls in the order they run, and draws them apart from the
element-wise steps."""
import matplotlib

matplotlib.use("Agg")

from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

from ckpt_lab.lessons import plots  # noqa: E402
from ckpt_lab.lessons.plots import diagrams  # noqa: E402
from ckpt_lab.training.models import GPTConfig, build_model  # noqa: E402


def _block(n_embd=96, n_head=6):
    return build_model(GPTConfig(block_size=32, n_layer=1, n_head=n_head, n_embd=n_embd)).blocks()[0]


def test_the_six_matmuls_in_the_order_they_run():
    fig = plots.block_matmuls(_block(), batch=3, seq=32)
    assert fig.matmuls == ["Q, K, V projection", "Q Kᵀ", "· V", "output projection",
                           "up projection", "down projection"]
    boxes = [p for p in fig.axes[0].patches if isinstance(p, FancyBboxPatch)]
    matmul = [b for b in boxes if to_rgba(b.get_edgecolor())[:3]
              == to_rgba(diagrams.MATMUL_COLOR)[:3]]
    assert len(matmul) == 6 and len(boxes) > 6                   # the element-wise steps too
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "(BT × F)(F × H)" in texts and "(T × H/n_h)(H/n_h × T)" in texts


def test_the_sizes_come_from_the_module_not_from_the_caller():
    block = _block(n_embd=96, n_head=6)
    assert plots.block_sizes(block) == {"H": 96, "n_h": 6, "F": 384}
    title = plots.block_matmuls(block, batch=3, seq=32).axes[0].get_title()
    assert "B = 3, T = 32, H = 96, n_h = 6, F = 384" in title
    assert "tab:orange" not in (diagrams.MATMUL_COLOR, diagrams.ELEMENTWISE_COLOR)  # recompute's
