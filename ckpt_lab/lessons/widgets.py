"""Interactive explorers for the lessons: sliders that re-measure and redraw one figure.

Each explorer is an ``ipywidgets.VBox`` holding real ``IntSlider``s (``continuous_update=False``,
so a measurement runs when the slider is released), an HTML line with the numbers and an
``Image`` widget with the figure as PNG bytes, re-rendered from one matplotlib Figure whose
artists are redrawn in place. No ipympl or browser is needed: tests set
``explorer.sliders["segments"].value`` and read ``explorer.result``.

* `segments_explorer`: peak memory against segment count (the U curve), measured and
  predicted, and the memory timeline ("sawtooth") of the chosen setting (lesson 3).
* `seq_explorer`: a GPT block's activation bytes against sequence length, with the linear and
  quadratic (attention) terms of the formula (lesson 5).
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field

import ipywidgets as W
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import nn

from ckpt_lab import formulas
from ckpt_lab.checkpoint import checkpoint_sequential
from ckpt_lab.lessons.course import dropout_mask_bytes, fmt_bytes, pick_device
from ckpt_lab.lessons.plots import PHASE_COLORS
from ckpt_lab.lessons.units import MIB
from ckpt_lab.measure.memory import MemoryLog, kept_after_forward, track_memory
from ckpt_lab.training.models import Block, GPTConfig, MLPBlock


def _slider(name: str, value: int, lo: int, hi: int, step: int = 1) -> W.IntSlider:
    if not lo <= value <= hi:
        raise ValueError(f"{name}={value} must lie between {lo} and {hi}")
    return W.IntSlider(value=value, min=lo, max=hi, step=step, description=name,
                       continuous_update=False, readout=True,
                       style={"description_width": "initial"})


def _label(ax, **text):
    """Title and axis labels (``text``), the y axis from 0, and the legend."""
    ax.set(**text)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)


class Explorer(W.VBox):
    """Sliders, a line of numbers and a figure that `update` redraws whenever a slider moves."""

    def __init__(self, sliders: dict[str, W.IntSlider], figsize=(10, 3.6)):
        self.sliders = sliders
        self.text = W.HTML()
        self.image = W.Image(format="png")
        self.figure = Figure(figsize=figsize)
        FigureCanvasAgg(self.figure)
        self.result = None
        self._busy = False
        super().__init__([W.HBox(list(sliders.values())), self.text, self.image])
        for s in sliders.values():
            s.observe(self._changed, names="value")

    def values(self) -> dict[str, int]:
        """Current slider values by name."""
        return {k: s.value for k, s in self.sliders.items()}

    def _changed(self, _change):
        if not self._busy:
            self.refresh()

    def refresh(self):
        """Re-measure at the current slider values and redraw the figure."""
        self._busy = True
        try:
            self.result = self.update(**self.values())
        finally:
            self._busy = False
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=80)
        self.image.value = buf.getvalue()

    def update(self, **values):
        raise NotImplementedError


# --------------------------------------------------------------------------- segments (lesson 3)
@dataclass
class SegmentsResult:
    """What the segments explorer measured at one slider setting (bytes)."""

    layers: int
    segments: int
    batch: int
    width: int
    peak_bytes: int
    predicted_bytes: int
    unit_bytes: int
    measured_curve: list[int]
    predicted_curve: list[int]
    best_segments: int
    predicted_best: int
    log: MemoryLog = field(repr=False)

    @property
    def ratio(self) -> float:
        """measured / predicted peak at the chosen segment count."""
        return self.peak_bytes / self.predicted_bytes


def measure_chain_peak(blocks: nn.Sequential, x: torch.Tensor, segments: int) -> MemoryLog:
    """One forward + backward of checkpoint_sequential(blocks, x, segments), tracked.

    Parameter gradients are allocated beforehand (zeroed, not freed), so the log shows
    activations and the gradients flowing between blocks, not model state.
    """
    for p in blocks.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        else:
            p.grad.zero_()
    with track_memory() as log:
        checkpoint_sequential(blocks, x, segments=segments).sum().backward()
    return log


class SegmentsExplorer(Explorer):
    """Peak memory of an MLP chain against segment count, measured and predicted."""

    def __init__(self, layers=16, segments=4, batch=16, width=64, positions=64,
                 max_layers=32, max_batch=64, max_width=256, device=None):
        self.device = pick_device(device)
        self.positions = positions
        self._models: dict[tuple[int, int], nn.Sequential] = {}
        sliders = {"segments": _slider("segments", segments, 1, layers),
                   "layers": _slider("layers", layers, 2, max_layers),
                   "batch": _slider("batch", batch, 1, max_batch),
                   "width": _slider("width", width, 16, max_width, 16)}
        super().__init__(sliders)
        self.ax_curve, self.ax_time = self.figure.subplots(1, 2)
        self.refresh()

    def _blocks(self, layers: int, width: int) -> nn.Sequential:
        key = (layers, width)
        if key not in self._models:
            torch.manual_seed(0)
            self._models = {key: nn.Sequential(*[MLPBlock(width) for _ in range(layers)])
                            .to(self.device)}
        return self._models[key]

    def update(self, segments, layers, batch, width):
        seg_slider = self.sliders["segments"]
        if seg_slider.max != layers:
            seg_slider.max = layers          # clamps the value too
            segments = seg_slider.value
        blocks = self._blocks(layers, width)
        torch.manual_seed(1)
        x = torch.randn(batch * self.positions, width, device=self.device, requires_grad=True)
        unit = x.numel() * x.element_size()
        logs = {s: measure_chain_peak(blocks, x, s) for s in range(1, layers + 1)}
        measured = [logs[s].peak_bytes for s in range(1, layers + 1)]
        wgrad = (width * width + width) * x.element_size()
        predicted = [formulas.chain_step_peak_bytes(layers, s, unit, wgrad) for s in range(1, layers + 1)]
        best = min(range(1, layers + 1), key=lambda s: (measured[s - 1], s))
        result = SegmentsResult(layers, segments, batch, width, measured[segments - 1],
                                predicted[segments - 1], unit, measured, predicted, best,
                                formulas.optimal_segment_count(layers, unit, unit),
                                logs[segments])
        self._draw(result)
        self.text.value = (
            f"<b>{layers} blocks, {segments} segments</b>: step peak (activations) measured "
            f"{fmt_bytes(result.peak_bytes)}, predicted {fmt_bytes(result.predicted_bytes)} "
            f"(ratio {result.ratio:.3f}); least measured peak at {best} segments, formula's "
            f"optimum {result.predicted_best} (sqrt(L) = {layers ** 0.5:.1f}).")
        return result

    def _draw(self, r: SegmentsResult):
        ax = self.ax_curve
        ax.clear()
        xs = list(range(1, r.layers + 1))
        ax.plot(xs, [p / MIB for p in r.predicted_curve], "-", color="tab:gray", label="predicted")
        ax.plot(xs, [m / MIB for m in r.measured_curve], "o", color="black", ms=4, label="measured")
        ax.axvline(r.segments, color="gray", ls=":", label=f"chosen: {r.segments}")
        _label(ax, title=f"Step peak (activations) vs segments ({r.layers} blocks)",
               xlabel="segments", ylabel="step peak (MiB)")
        ax = self.ax_time
        ax.clear()
        for phase, color in PHASE_COLORS.items():                 # recompute orange, as everywhere
            pts = [(p.step, p.live_bytes / MIB) for p in r.log.timeline if p.phase == phase]
            if pts:
                ax.plot(*zip(*pts), ".", ms=3, color=color, label=phase)
        _label(ax, title=f"Timeline at {r.segments} segments (measured)", xlabel="operation",
               ylabel="live memory (MiB)")
        self.figure.tight_layout()


def segments_explorer(**kwargs) -> SegmentsExplorer:
    """Sliders for segments, layers, batch and width driving the U curve and the sawtooth."""
    return SegmentsExplorer(**kwargs)


# ------------------------------------------------------------------------ sequence (lesson 5)
@dataclass
class SeqResult:
    """A GPT block's kept bytes at one sequence length, measured and predicted."""

    seq: int
    measured_bytes: int
    predicted_bytes: int
    linear_bytes: int        # the T B H terms at our dtypes
    quadratic_bytes: int     # the n_h T^2 B (attention core) terms at our dtypes
    megatron_bytes: int      # Megatron's T B H (34 + 5 n_h T / H), 16-bit activations

    @property
    def ratio(self) -> float:
        """measured / predicted."""
        return self.measured_bytes / self.predicted_bytes


class SeqExplorer(Explorer):
    """Activation bytes of one GPT block against sequence length T: the T^2 term takes over."""

    def __init__(self, seq=64, batch=4, n_embd=128, n_head=4, max_seq=256, step=16,
                 device=None, measure_at=()):
        """``measure_at``: lengths measured up front, so the first figure (the one a static
        page keeps) already shows points across T."""
        self.device = pick_device(device)
        self.batch, self.n_embd, self.n_head, self.max_seq = batch, n_embd, n_head, max_seq
        self.mask_bytes = dropout_mask_bytes(self.device)
        config = GPTConfig(block_size=max_seq, n_head=n_head, n_embd=n_embd, dropout=0.1)
        torch.manual_seed(0)
        self.block = Block(config).to(self.device)
        self.measured: dict[int, int] = {}
        for length in measure_at:
            _slider("measure_at", length, 1, max_seq)          # the same bounds as the slider's
            self.measure(length)
        super().__init__({"seq_len": _slider("seq_len", seq, step, max_seq, step)},
                         figsize=(7, 3.6))
        self.ax = self.figure.subplots()
        self.refresh()

    def terms(self, seq: int) -> tuple[int, int]:
        """(linear, quadratic) bytes of the formula at this sequence length."""
        t = formulas.megatron_layer_terms(seq, self.batch, self.n_embd, self.n_head, 4,
                                          self.mask_bytes)
        quad = sum(v for k, v in t.items() if k in formulas.ATTENTION_CORE_TERMS)
        return sum(t.values()) - quad, quad

    def measure(self, seq: int) -> int:
        """Bytes one block keeps after its forward at this sequence length (cached)."""
        if seq not in self.measured:
            torch.manual_seed(1)
            x = torch.randn(self.batch, seq, self.n_embd, device=self.device,
                            requires_grad=True)
            self.measured[seq] = kept_after_forward(self.block, x)
        return self.measured[seq]

    def update(self, seq_len):
        measured = self.measure(seq_len)
        lin, quad = self.terms(seq_len)
        predicted = formulas.gpt_block_bytes(self.batch, seq_len, self.n_embd, self.n_head, 4,
                                             mask_bytes=self.mask_bytes)
        result = SeqResult(seq_len, measured, predicted, lin, quad,
                           formulas.megatron_layer_bytes(seq_len, self.batch, self.n_embd,
                                                         self.n_head))
        self._draw(result)
        share = quad / (lin + quad)
        self.text.value = (
            f"<b>seq_len {seq_len}</b>: one block keeps {fmt_bytes(measured)} measured, "
            f"{fmt_bytes(predicted)} predicted (ratio {result.ratio:.3f}); the attention "
            f"core's T&sup2; terms are {share:.0%} of it.")
        return result

    def _draw(self, r: SeqResult):
        ax = self.ax
        ax.clear()
        grid = list(range(self.sliders["seq_len"].step, self.max_seq + 1,
                          self.sliders["seq_len"].step))
        lin = [self.terms(s)[0] / MIB for s in grid]
        quad = [self.terms(s)[1] / MIB for s in grid]
        # the course's palette: the kept T B H terms blue, the T^2 terms selective
        # recomputation drops in recompute orange (plots.PHASE_COLORS)
        ax.plot(grid, lin, "-", color="tab:blue", label="predicted: linear (T B H) terms")
        ax.plot(grid, quad, "-", color="tab:orange", label="predicted: attention (n_h T² B) terms")
        ax.plot(grid, [a + b for a, b in zip(lin, quad)], "-", color="k", lw=1,
                label="predicted: total")
        pts = sorted(self.measured.items())
        ax.plot([s for s, _ in pts], [b / MIB for _, b in pts], "o", color="k",
                label="measured (one block)")
        ax.axvline(r.seq, color="gray", ls=":")
        _label(ax, title="Activation memory of one GPT block vs sequence length",
               xlabel="sequence length T (tokens)", ylabel="MiB")
        self.figure.tight_layout()


def seq_explorer(**kwargs) -> SeqExplorer:
    """A sequence-length slider showing the quadratic attention term take over."""
    return SeqExplorer(**kwargs)


# ------------------------------------------------------------------ plans under a budget (6, 10)
@dataclass
class PlanResult:
    """The planner's plan at one budget, applied and measured (bytes; cost in the explorer's
    basis: profiled forward seconds, or the per-layer cost it was given, e.g. FLOPs)."""

    budget_bytes: int
    boundaries: list
    predicted_bytes: int       # the planner's step peak (planner.step_peak_bytes)
    peak_bytes: int            # measured step peak with the plan applied
    recompute_cost: float      # cost of the layers the plan recomputes
    forward_cost: float        # cost of the whole chain's forward

    @property
    def ratio(self) -> float:
        """measured / predicted peak."""
        return self.peak_bytes / self.predicted_bytes


def measure_plan(layers, x: torch.Tensor, boundaries, allocator: bool = False):
    """The `track_memory` log of one step of checkpoint_sequential(layers, x, boundaries=...),
    followed by ``.float().sum().backward()``, parameter gradients allocated beforehand (as in
    lessons); with ``allocator=True`` the allocator's own events too
    (``log.allocator_peak_bytes``: what `planner.plan_chain(..., allocator=True)` predicts).

    The model is left as it was: parameter gradients (and ``x.grad``), BatchNorm statistics
    and the random generators are restored afterwards.
    """
    from ckpt_lab.plan.profile import _Untouched
    layers, x_grad = list(layers), x.grad
    try:
        with _Untouched(layers, x.device), track_memory(allocator=allocator) as log:
            checkpoint_sequential(layers, x, boundaries=list(boundaries)).float().sum().backward()
    finally:
        x.grad = x_grad
    return log


def measure_plan_peak(layers, x: torch.Tensor, boundaries) -> int:
    """Step peak of checkpoint_sequential(layers, x, boundaries=...): activations and the
    gradients between layers (parameter gradients are allocated beforehand, as in lessons).
    The model is left as it was (see `measure_plan`).
    """
    return measure_plan(layers, x, boundaries).peak_bytes


class PlanExplorer(Explorer):
    """A budget slider over any chain: the planner's plan, its predicted and measured step peak,
    and the Pareto front of step peak against recomputed forward time (the step model), or
    against `cost` (one number per layer, e.g. FLOPs, named by `basis`) when given."""

    def __init__(self, layers, x: torch.Tensor, budget_fraction: float = 0.5, profile=None,
                 cost=None, basis: str | None = None):
        from ckpt_lab.plan.profile import profile_layers
        from ckpt_lab.plan.planner import minimum_peak, pareto_front, step_peak_bytes
        self.layers, self.x = list(layers), x
        self.profile = profile if profile is not None else profile_layers(self.layers, x)
        self.out = [p.out_bytes for p in self.profile]
        self.cost = [p.forward_seconds for p in self.profile] if cost is None else list(cost)
        self.basis = basis
        self.of = f" of the forward's {basis}" if basis else " of the forward"
        self.none_bytes = step_peak_bytes([0], self.profile)
        self.min_bytes = minimum_peak(self.profile)
        self.front = pareto_front(self.profile, fwd_cost=self.cost)
        self.measured: dict[tuple, int] = {}
        lo = self.min_bytes / self.none_bytes
        slider = W.FloatSlider(value=min(max(budget_fraction, lo), 1.0), min=round(lo + 0.005, 2),
                               max=1.0, step=0.01, description="budget (x no-checkpoint)",
                               continuous_update=False, readout=True, readout_format=".2f",
                               style={"description_width": "initial"})
        super().__init__({"budget": slider}, figsize=(7, 3.6))
        self.ax = self.figure.subplots()
        self.refresh()

    def plan(self, budget_bytes: int):
        """The planner's cheapest plan whose predicted step peak is within budget_bytes."""
        from ckpt_lab.plan.planner import optimal_segments
        return optimal_segments(self.profile, budget_bytes, fwd_cost=self.cost)

    def update(self, budget):
        budget_bytes = max(int(budget * self.none_bytes), self.min_bytes)
        plan = self.plan(budget_bytes)
        key = tuple(plan.boundaries)
        if key not in self.measured:
            self.measured[key] = measure_plan_peak(self.layers, self.x, key)
        result = PlanResult(budget_bytes, list(plan.boundaries), plan.peak_bytes,
                            self.measured[key], plan.recompute_cost, sum(self.cost))
        self._draw(result)
        self.text.value = (
            f"<b>budget {fmt_bytes(budget_bytes)}</b>: plan {result.boundaries} recomputes "
            f"{result.recompute_cost / result.forward_cost:.0%}{self.of}; step peak "
            f"measured {fmt_bytes(result.peak_bytes)}, predicted {fmt_bytes(result.predicted_bytes)} "
            f"(ratio {result.ratio:.3f})")
        return result

    def _draw(self, r: PlanResult):
        ax = self.ax
        ax.clear()
        total = sum(self.cost)
        xs = [p.peak_bytes / MIB for p in self.front]
        ys = [100 * p.recompute_cost / total for p in self.front]
        ax.step(xs, ys, where="post", color="C1", label="Pareto front (predicted step peak)")
        pts = [(self.measured[k] / MIB, 100 * self.plan_cost(k) / total) for k in self.measured]
        ax.plot(*zip(*pts), "o", color="C0", label="plans applied (measured step peak)")
        ax.axvline(r.budget_bytes / MIB, color="gray", ls=":", label="budget")
        _label(ax, title="Step peak against recomputation", xlabel="step peak (MiB)",
               ylabel=f"forward recomputed (%{', ' + self.basis if self.basis else ''})")
        self.figure.tight_layout()

    def plan_cost(self, boundaries) -> float:
        """Cost (profiled forward seconds, or `cost`) of the layers a plan recomputes (all before the last start)."""
        return sum(self.cost[:list(boundaries)[-1]])


def plan_explorer(layers, x, **kwargs) -> PlanExplorer:
    """A budget slider that plans (ckpt_lab.plan.planner), applies and measures on any chain."""
    return PlanExplorer(layers, x, **kwargs)

