"""The course's figures draw what they are handed, with legends a reader can tell apart: timelines,
bars side by side (never stacked by accident), bands stacked in the course's phase colours,
pipeline schedules in a time that respects each stage's dependencies, the budget scatter."""
import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from torch import nn  # noqa: E402

from ckpt_lab import checkpoint_sequential, track_memory
from ckpt_lab.lessons import plots  # noqa: E402
from ckpt_lab.lessons.scale_out import schedule  # noqa: E402


def _two_runs():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(6)])
    logs = {}
    for k in (1, 3):
        with track_memory() as mem:
            checkpoint_sequential(model, torch.randn(8, 16), segments=k).sum().backward()
        logs[f"{k} segments"] = mem
    return logs


def test_timeline_gives_each_run_a_panel_and_each_phase_one_colour_and_one_legend_entry():
    logs = _two_runs()
    fig = plots.timeline(logs, levels={"a level": 1000})
    axes = fig.axes
    assert len(axes) == 2 and [a.get_title().split(" (peak")[0] for a in axes] == list(logs)
    phase = {to_rgba(c): name for name, c in plots.PHASE_COLORS.items()}
    for a, log in zip(axes, logs.values()):
        drawn = [l for l in a.get_lines() if l.get_label() in plots.PHASE_COLORS]
        assert all(phase[to_rgba(l.get_color())] == l.get_label() for l in drawn)
        peak = [l for l in a.get_lines() if l.get_label() == "peak"]
        assert len(peak) == 1 and peak[0].get_ydata()[0] * plots.MIB == log.peak_bytes
        assert len(a.patches) == len(plots.phase_spans(log))   # one shaded band per recompute
    labels = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert len(labels) == len(set(labels))                    # one entry per series
    assert labels[:3] == ["forward", "recompute", "backward"] and "a level" in labels
    assert axes[1].get_legend() is None
    spans = plots.phase_spans(logs["3 segments"])
    assert len(spans) == 2 and plots.phase_spans(logs["1 segments"]) == []
    for first, last in spans:                                  # each band is a tooth: memory climbs in it
        live = {p.step: p.live_bytes for p in logs["3 segments"].timeline}
        assert max(live[s] for s in range(first, last + 1)) > live[first - 1]


def test_timeline_shows_a_later_higher_run_whole():
    """The panels share their y axis: a run drawn after a lower one is not clipped at its top."""
    logs = dict(reversed(list(_two_runs().items())))           # the lower, checkpointed run first
    fig = plots.timeline(logs)
    top = max(log.peak_bytes for log in logs.values()) / plots.MIB
    assert all(a.get_ylim()[0] == 0 and a.get_ylim()[1] >= top for a in fig.axes)


def test_timeline_draws_into_one_axes_per_run_and_refuses_a_mismatch():
    import matplotlib.pyplot as plt
    logs = _two_runs()
    fig, axes = plt.subplots(1, 2)
    assert plots.timeline(logs, ax=list(axes)) is fig
    with pytest.raises(ValueError, match="one run per Axes"):
        plots.timeline(logs, ax=axes[0])


def test_no_figure_of_lessons_0_to_3_uses_a_phase_colour_for_anything_else():
    orange = to_rgba(plots.PHASE_COLORS["recompute"])
    fig = plots.measured_vs_predicted([1, 2], [plots.MIB, 2 * plots.MIB], [plots.MIB, 2 * plots.MIB], "x", "t")
    assert orange not in {to_rgba(l.get_color()) for l in fig.axes[0].get_lines()}
    fig = plots.stacked({"a": {"parameters": 1, "gradients": 2, "optimizer states": 3,
                               "activations": 4, "master copy": 5, "something else": 6}})
    colours = {to_rgba(p.get_facecolor()) for p in fig.axes[0].patches}
    assert orange not in colours
    assert to_rgba(plots.PHASE_COLORS["backward"]) == to_rgba(plots.PART_COLORS["gradients"])
    fig = plots.grouped_bars({"peak": {"run": 0.7}, "FLOPs": {"run": 1.2}, "time": {"H200": 1.3}},
                             "ratio", "t", scale=1, reference=1.0, values=True)
    assert orange not in {to_rgba(p.get_facecolor()) for p in fig.axes[0].patches}


def test_verdict_grid_takes_any_number_of_cases_and_outlines_guesses():
    table = {f"case {i}": {"plain": "right", "torch": ["right", "WRONG, silently",
                                                         "refuses (RuntimeError)"][i % 3]}
             for i in range(9)}
    fig = plots.verdict_grid(table, guesses={"case 0": "right", "case 1": "right"},
                             guess_column="torch")
    ax = fig.axes[0]
    filled = [p for p in ax.patches if p.get_fill()]
    outlined = [p for p in ax.patches if not p.get_fill()]
    assert len(filled) == 18 and len(outlined) == 2
    assert [p.get_linestyle() for p in outlined] == ["-", "--"]   # a hit, then a miss
    assert [t.get_text() for t in ax.get_yticklabels()] == list(table)
    assert to_rgba(filled[3].get_facecolor()) == to_rgba(plots.VERDICT_COLORS["WRONG, silently"])
    with pytest.raises(ValueError, match="starts with one of"):
        plots.verdict_of("maybe")


def test_bars_draw_measured_bars_predicted_ticks_and_a_guess():
    fig = plots.bars(["a", "b"], [3.0, 1.0], "x input", "t", predicted=[3.0, 1.0], guess={"a": 2.0})
    ax = fig.axes[0]
    assert [p.get_height() for p in ax.patches] == [3.0, 1.0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["predicted", "your guess", "measured"]


def test_measured_vs_predicted_series_can_be_told_apart():
    fig = plots.measured_vs_predicted([1, 2], [1 * plots.MIB, 2 * plots.MIB], [1, 2], "x", "t",
                                      label_measured="A measured", label_predicted="A", color="C2")
    plots.measured_vs_predicted([1, 2], [3 * plots.MIB, 4 * plots.MIB], [3, 4], "x", "t",
                                ax=fig.axes[0], label_measured="B measured", label_predicted="B",
                                color="C3")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["A", "A measured", "B", "B measured"]
    assert list(fig.axes[0].get_lines()[1].get_ydata()) == [1.0, 2.0]


# ------------------------------------------------------ lesson 1: tensor vs allocator bytes
def test_allocator_timeline_draws_tensor_and_allocator_bytes_and_marks_both_peaks():
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    with track_memory(allocator=True) as mem:
        c = torch.empty(1000)
        c.resize_(3000)             # holds the old and the new storage for a moment: 4,000 B
        (torch.randn(8, 64) @ w).relu().sum().backward()
    with track_memory() as plain:
        torch.ones(10)
    fig = plots.allocator_timeline({"step": mem})
    (a,) = fig.axes
    phase = {to_rgba(col): name for name, col in plots.PHASE_COLORS.items()}
    drawn = [l for l in a.get_lines() if l.get_label().startswith("tensor bytes, ")]
    assert {l.get_label() for l in drawn} == {"tensor bytes, forward", "tensor bytes, backward"}
    assert all(l.get_label().endswith(phase[to_rgba(l.get_color())]) for l in drawn)
    marks = {l.get_label(): l.get_ydata()[0] * 1024 for l in a.get_lines()
             if l.get_label() in ("tensor peak", "allocator peak")}      # KiB below 1 MiB
    at = mem.allocator_peak_point()
    assert marks == {"tensor peak": mem.peak_bytes,
                     "allocator peak": at.allocator_bytes + at.transient_bytes}
    (spikes,) = a.collections                     # one grey spike per op that held bytes
    held = [p for p in mem.timeline if p.transient_bytes]
    assert len(spikes.get_segments()) == len(held) >= 1
    assert max(p.transient_bytes for p in held) == 4000
    labels = [t.get_text() for t in a.get_legend().get_texts()]
    assert len(labels) == len(set(labels)) and "held only while the op ran" in labels
    with pytest.raises(ValueError, match="allocator=True"):
        plots.allocator_timeline({"no allocator": plain})


def test_loss_share_draws_measured_points_on_the_predicted_line():
    fig = plots.loss_share([256, 1024], [0.1, 0.4], [256, 1024, 4096], [0.1, 0.4, 0.7])
    (share,) = fig.axes
    line, points = share.get_lines()
    assert list(line.get_xdata()) == [256, 1024, 4096] and list(points.get_xdata()) == [256, 1024]
    assert list(points.get_ydata()) == [10, 40] and points.get_linestyle() == "None"
    assert "70% (predicted)" in [t.get_text() for t in share.texts]   # past the measured sizes


def test_chunk_peaks_draw_measured_points_on_the_formula_and_the_floor():
    fig = plots.chunk_peaks([1, 2, 4], [30 * plots.MIB, 20 * plots.MIB, 15 * plots.MIB],
                            [30 * plots.MIB, 20 * plots.MIB, 15 * plots.MIB],
                            floor_bytes=15 * plots.MIB)
    (chunks,) = fig.axes
    formula, measured, floor = chunks.get_lines()
    assert to_rgba(measured.get_color()) == to_rgba(plots.PHASE_COLORS["recompute"])
    assert list(measured.get_ydata()) == [30, 20, 15] and list(floor.get_ydata()) == [15, 15]


def test_throughput_panels_mark_what_does_not_fit_and_colour_by_policy():
    def row(policy, micro_batch, peak, speed):
        return dict(policy=policy, micro_batch=micro_batch, accumulation=8 // micro_batch,
                    peak_bytes=peak * plots.MIB, tokens_per_s=speed)
    rows = [row("none", 2, 10, 9000), row("every", 4, 8, 7000), row("none", 4, 20, 9500)]
    fig = plots.throughput_panels({"CPU, roomy": (12 * plots.MIB, rows), "GPU": (12 * plots.MIB,
                                                                              rows[:2])})
    a, b = fig.axes
    points = [l for l in a.get_lines() if l.get_marker() == "o"]
    assert [p.get_xdata()[0] for p in points] == [10, 8, 20]
    assert [p.get_markerfacecolor() == "none" for p in points] == [False, False, True]
    assert to_rgba(points[1].get_color()) == to_rgba(plots.PHASE_COLORS["recompute"])
    assert [t.get_text() for t in a.texts] == ["2 x4", "4 x2", "4 x2"]
    assert len([l for l in b.get_lines() if l.get_marker() == "o"]) == 2


def test_throughput_panels_lay_machines_out_in_rows():
    rows = [dict(policy="none", micro_batch=2, accumulation=4, peak_bytes=plots.MIB,
                 tokens_per_s=1000)]
    fig = plots.throughput_panels({name: (2 * plots.MIB, rows) for name in "abc"}, ncols=2)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(fig.axes) == 4 and [ax.get_title() for ax in shown] == ["a", "b", "c"]
    assert "step peak (activations)" in shown[0].get_xlabel()


def test_technique_bars_stack_the_step_peak_on_the_model_state():
    measured = {"plain": 10 * plots.MIB, "4 micro-batches": 3 * plots.MIB}
    fig = plots.technique_bars(measured, {"plain": 9 * plots.MIB}, state_bytes=10 * plots.MIB)
    ax = fig.axes[0]
    state, step = ax.containers
    assert [b.get_height() for b in state] == [10, 10]
    assert [(b.get_y(), b.get_height()) for b in step] == [(10, 10), (10, 3)]
    assert [l.get_ydata()[0] for l in ax.get_lines()] == [19]    # the formula, on the state
    assert [t.get_text() for t in ax.texts] == ["step x1.00\ntotal x1.00",
                                                "step x0.30\ntotal x0.65"]
    plain = plots.technique_bars(measured)                       # no state: the step peak alone
    assert len(plain.axes[0].containers) == 1 and plain.axes[0].texts[1].get_text() == "step x0.30"


def test_combination_grid_draws_total_peaks_against_a_total_budget():
    rows = [dict(policy="none", M=1, precision="fp32", peak=8 * plots.MIB, recompute_share=0),
            dict(policy="every", M=1, precision="fp32", peak=2 * plots.MIB,
                 recompute_share=0.2),
            dict(policy="every", M=1, precision="bf16", peak=2 * plots.MIB,
                 recompute_share=0.2)]
    fig = plots.combination_grid(rows, 14 * plots.MIB, state_bytes=10 * plots.MIB)
    ax = fig.axes[0]
    points = [l for l in ax.get_lines() if l.get_marker() in ("o", "s")]
    assert [p.get_ydata()[0] for p in points] == [18, 12, 12]
    assert [p.get_markerfacecolor() == "none" for p in points] == [True, False, False]
    xs = [p.get_xdata()[0] for p in points]                      # fp32 and bf16 side by side
    assert len(set(xs)) == 3 and xs[1] < 1 < xs[2]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["none\n+0%", "every\n+20%"]
    assert "total peak" in ax.get_ylabel() and ax.get_title() == "M = 1 micro-batch"


def test_every_figure_module_is_reachable_as_plots_dot_name():
    """The figures live in one module per kind; notebooks call each as ``plots.name``."""
    import importlib
    import pkgutil
    for info in pkgutil.iter_modules(plots.__path__):
        module = importlib.import_module(f"{plots.__name__}.{info.name}")
        public = [n for n, v in vars(module).items() if not n.startswith("_")
                  and getattr(v, "__module__", module.__name__) == module.__name__
                  and not isinstance(v, type(module)) and n != "annotations"]
        assert public, info.name
        for name in public:
            assert getattr(plots, name) is getattr(module, name), f"plots.{name} ({info.name})"


# ------------------------------------------------ bars, bands and schedules (lessons 11, 12)
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
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "hatched only to tell them apart" in legend[1] and legend[2] == "stage boundary"
    fig = plots.live_per_op({"A": [plots.MIB, 3 * plots.MIB]}, predicted={"A": 4 * plots.MIB})
    ax = fig.axes[0]
    assert list(ax.get_lines()[0].get_ydata()) == [1, 3] and ax.get_lines()[1].get_ydata()[0] == 4


def test_allocation_timeline_colours_each_phase():
    fig = plots.allocation_timeline([plots.MIB, 2 * plots.MIB, plots.MIB],
                                    ["forward", "recompute", "backward"])
    colours = [to_rgba(c.get_facecolor()[0]) for c in fig.axes[0].collections]
    assert colours == [to_rgba(plots.PHASE_COLORS[p]) for p in ("forward", "recompute", "backward")]


# ----------------------------------------------------------- the budget scatter (lesson 7)
def test_budget_scatter_fills_fitting_points_and_draws_the_budget():
    fig = plots.budget_scatter(["a", "b"], [2 * 2 ** 20, 5 * 2 ** 20], [0.0, 1.0], 3 * 2 ** 20)
    ax = fig.axes[0]
    faces = [c.get_facecolors() for c in ax.collections]
    assert faces[0].shape[0] == 1 and faces[0][0][3] > 0          # a fits: filled
    assert faces[1].shape[0] == 0 or faces[1][0][3] == 0          # b does not: hollow
    assert any(abs(line.get_ydata()[0] - 3.0) < 1e-9 for line in ax.lines)
    with pytest.raises(ValueError):
        plots.budget_scatter(["a"], [1, 2], [0.0], 3)
