"""The figures of lessons 11 and 12 draw what they are handed: bars side by side (never
stacked by accident), bands stacked in the course's phase colours, and pipeline schedules in
a time that respects each stage's dependencies."""
import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from ckpt_lab.lessons import plots  # noqa: E402
from ckpt_lab.lessons.scale_out import schedule  # noqa: E402


def test_grouped_bars_stand_side_by_side_with_predicted_ticks():
    fig = plots.grouped_bars({"a": {"x": 2 * plots.MIB, "y": plots.MIB},
                              "b": {"x": 3 * plots.MIB, "y": 4 * plots.MIB}},
                             predicted={("a", "y"): plots.MIB})
    ax = fig.axes[0]
    bars = ax.patches
    assert sorted(b.get_height() for b in bars) == [1, 2, 3, 4]
    assert all(b.get_y() == 0 for b in bars)                       # none stacked on another
    lefts = sorted(round(b.get_x(), 6) for b in bars)
    assert len(set(lefts)) == 4                                    # none drawn over another
    phase = {to_rgba(c) for c in plots.PHASE_COLORS.values()}
    assert not {to_rgba(b.get_facecolor()) for b in bars} & phase
    assert "predicted" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_stacked_bands_stack_in_order_with_shared_colours_and_hatches():
    fig = plots.stacked_bands({"run": {"weights": plots.MIB, "gathered weights": 2 * plots.MIB}},
                              plots.STATE_BANDS, plots.STATE_HATCHES)
    lower, upper = fig.axes[0].patches
    assert (lower.get_y(), lower.get_height(), upper.get_y(), upper.get_height()) == (0, 1, 1, 2)
    assert to_rgba(lower.get_facecolor()) == to_rgba(upper.get_facecolor())
    assert upper.get_hatch() == "//" and not lower.get_hatch()
    assert plots.STATE_BANDS["Adam"] == plots.PHASE_COLORS["optimizer"]
    assert plots.STATE_BANDS["activations & buffers"] == plots.PHASE_COLORS["forward"]


@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
def test_pipeline_times_respect_the_dependencies(kind):
    stages, m = 4, 8
    times = plots.pipeline_times({r: schedule(kind, stages, r, m) for r in range(stages)})
    end = {(r, op, i): e for r, ops in times.items() for op, i, s, e in ops}
    start = {(r, op, i): s for r, ops in times.items() for op, i, s, e in ops}
    for r, ops in times.items():
        assert len(ops) == 2 * m
        assert all(a[3] <= b[2] for a, b in zip(ops, ops[1:]))   # one operation at a time
        for op, i, s, e in ops:
            assert e - s == (1 if op == "F" else 2)
            if op == "F" and r > 0:
                assert s >= end[r - 1, "F", i]
            if op == "B" and r < stages - 1:
                assert s >= end[r + 1, "B", i]
    assert start[0, "F", 0] == 0


def test_pipeline_times_refuse_schedules_that_wait_on_each_other():
    with pytest.raises(ValueError, match="wait on each other"):
        plots.pipeline_times({0: [("B", 0), ("F", 0)], 1: [("F", 0), ("B", 0)]})


def test_pipeline_grid_labels_what_each_stage_holds():
    fig = plots.pipeline_grid({r: schedule("1f1b", 4, r, 8) for r in range(4)})
    texts = [t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("holds")]
    assert texts == ["holds ≤ 4", "holds ≤ 3", "holds ≤ 2", "holds ≤ 1"]


def test_tradeoff_points_share_a_point_when_settings_coincide():
    fig = plots.tradeoff_points({"a": (1.0, 2.0), "b": (1.0, 2.0), "c": (1.5, 0.5)}, "x", "y")
    assert sorted(t.get_text() for t in fig.axes[0].texts) == ["a = b", "c"]


def test_segment_plans_and_live_per_op_draw_what_they_are_given():
    fig = plots.segment_plans({"requested": [(1, 3)], "ran": [(1, 2), (2, 3)]}, 4, boundaries=[2])
    bars = [p for p in fig.axes[0].patches if p.get_width() > 0.5]
    assert sorted(p.get_width() for p in bars) == [1, 1, 2]
    # neighbouring segments stay apart: every other one hatched, each labelled with its layers
    assert [bool(p.get_hatch()) for p in bars] == [False, False, True]
    assert [t.get_text() for t in fig.axes[0].texts] == ["1–2", "1", "2"]
    fig = plots.live_per_op({"A": [plots.MIB, 3 * plots.MIB]}, predicted={"A": 4 * plots.MIB})
    ax = fig.axes[0]
    assert list(ax.get_lines()[0].get_ydata()) == [1, 3] and ax.get_lines()[1].get_ydata()[0] == 4


def test_allocation_timeline_colours_each_phase():
    fig = plots.allocation_timeline([plots.MIB, 2 * plots.MIB, plots.MIB],
                                    ["forward", "recompute", "backward"])
    colours = [to_rgba(c.get_facecolor()[0]) for c in fig.axes[0].collections]
    assert colours == [to_rgba(plots.PHASE_COLORS[p]) for p in ("forward", "recompute", "backward")]
