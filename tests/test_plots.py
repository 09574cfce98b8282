"""The course's figures draw what they are handed, with legends a reader can tell apart."""
import matplotlib

matplotlib.use("Agg")

import torch  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from torch import nn  # noqa: E402

from ckpt_lab import checkpoint_sequential, track_memory
from ckpt_lab.lessons import plots  # noqa: E402


def test_timeline_run_lines_never_share_a_phase_colour():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(6)])
    logs = {}
    for k in (1, 3):
        with track_memory() as mem:
            checkpoint_sequential(model, torch.randn(8, 16), segments=k).sum().backward()
        logs[f"{k} segments"] = mem
    ax = plots.timeline(logs).axes[0]
    phase = {to_rgba(c) for c in plots.PHASE_COLORS.values()}
    lines = [l for l in ax.get_lines() if "segments" in l.get_label()]
    assert len(lines) == 2 and not {to_rgba(l.get_color()) for l in lines} & phase
    assert [max(l.get_ydata()) * plots.MIB for l in lines] == [m.peak_bytes for m in logs.values()]
    assert "recompute ops (shaded)" in [t.get_text() for t in ax.get_legend().get_texts()]
    spans = plots.phase_spans(logs["3 segments"])
    assert len(spans) == 2 and plots.phase_spans(logs["1 segments"]) == []
    assert len(ax.patches) == 2                      # one shaded band per recomputed segment
    for first, last in spans:                        # each band is a tooth: memory climbs in it
        live = {p.step: p.live_bytes for p in logs["3 segments"].timeline}
        assert max(live[s] for s in range(first, last + 1)) > live[first - 1]


def test_measured_vs_predicted_series_can_be_told_apart():
    fig = plots.measured_vs_predicted([1, 2], [1 * plots.MIB, 2 * plots.MIB], [1, 2], "x", "t",
                                      label_measured="A measured", label_predicted="A", color="C2")
    plots.measured_vs_predicted([1, 2], [3 * plots.MIB, 4 * plots.MIB], [3, 4], "x", "t",
                                ax=fig.axes[0], label_measured="B measured", label_predicted="B",
                                color="C3")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["A", "A measured", "B", "B measured"]
    assert list(fig.axes[0].get_lines()[1].get_ydata()) == [1.0, 2.0]
