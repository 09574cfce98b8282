"""Exercises of lesson 6 (where checkpoints go when the layers are not alike).

Each prediction's right answer is measured when it is needed, on the lesson's chain at its CPU
sizes (`conv_net`): a 13-layer convolutional net that works at four scales, each half the image
and twice the channels of the one before, profiled with `profile_layers`; the planner prices
re-running a layer by its forward FLOPs (`forward_flops`, passed as ``fwd_cost``). The build
task (`06.bisected`) runs the learner's recursive bisection, written with
`torch.utils.checkpoint`, against `checkpoint_recursive` on chains of `MLPBlock`s.
"""
from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .base import Exercise, near, one_of
from .threads import one_thread

# Exercise 06.read_low: two plans for the CPU-sized net, read by the activation model.
READ_PLANS = {"no checkpoint": [0], "segments of 2": [0, 2, 4, 6, 8, 10]}
BISECT_WIDTH, BISECT_TOKENS, BISECT_DEPTHS = 64, 256, (8, 16, 32)


def conv(c_in: int, c_out: int, stride: int = 1) -> nn.Module:
    """Conv 3x3 (no bias), BatchNorm, ReLU."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(c_out), nn.ReLU())


def _conv_net(channels: int, per_scale: int, batch: int, image: int, device):
    torch.manual_seed(0)
    layers = [conv(3, channels)] + [conv(channels, channels) for _ in range(per_scale - 1)]
    for scale in range(1, 4):
        c = channels * 2 ** scale
        layers += [conv(c // 2, c, stride=2)] + [conv(c, c) for _ in range(per_scale - 1)]
    layers += [nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * channels, 10))]
    layers = [layer.to(device) for layer in layers]
    return layers, torch.randn(batch, 3, image, image, device=device)


def forward_flops(layers, x) -> list[int]:
    """Each layer's forward FLOPs, counted by PyTorch."""
    flops, h = [], x
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        for layer in layers:
            before = counter.get_total_flops()
            h = layer(h)
            flops.append(counter.get_total_flops() - before)
    return flops


@functools.lru_cache(maxsize=4)
def conv_net(channels: int = 8, per_scale: int = 3, batch: int = 8, image: int = 32,
             device: str = "cpu"):
    """The lesson's chain, its input and its profile: `per_scale` conv layers at each of four
    scales (each halves the image and doubles the channels), then a pooled linear head,
    profiled by `profile_layers`. The lesson prices re-running a layer by its forward FLOPs
    (`forward_flops`, given to the planner as ``fwd_cost``), not by the profile's measured
    `forward_seconds`: timings of layers this small jitter on a shared CPU. Built once per
    size: the lesson and the checks of its exercises share it (`widgets.measure_plan_peak`
    leaves it as it found it)."""
    from ckpt_lab.plan.profile import profile_layers
    layers, x = _conv_net(channels, per_scale, batch, image, torch.device(device))
    return layers, x, profile_layers(layers, x, repeats=1)


@functools.lru_cache(maxsize=4)
def conv_flops(channels: int = 8, per_scale: int = 3, batch: int = 8, image: int = 32,
               device: str = "cpu") -> tuple:
    """Each layer's forward FLOPs of `conv_net` at these sizes: the planner's ``fwd_cost``."""
    layers, x, _ = conv_net(channels, per_scale, batch, image, device)
    return tuple(forward_flops(layers, x))


@functools.lru_cache(maxsize=1)
def _last_segments() -> tuple:
    return tuple(last_segments())


def last_segments() -> list[tuple[int, int]]:
    """On the CPU-sized net, for uniform segments S = 2..8: (layers in the uniform plan's last
    segment, layers in the last segment of the planner's cheapest plan within the uniform
    plan's step peak), both on the step model, recompute priced in forward FLOPs."""
    from ckpt_lab import planner
    layers, x, profile = conv_net()
    flops, n, out = list(conv_flops()), len(layers), []
    for segments in range(2, 9):
        uniform = planner.evaluate_plan(planner.uniform_plan(n, segments), profile,
                                        fwd_cost=flops)
        best = planner.optimal_segments(profile, fwd_cost=flops, budget_bytes=uniform.peak_bytes)
        out.append((n - uniform.boundaries[-1], n - best.boundaries[-1]))
    return out


def last_segment() -> str:
    """Measured answer of 06.last_segment: the planner's last segment against the uniform
    plan's, at every S ("longer", "equal", "shorter"; "mixed" when it varies)."""
    words = {("longer" if b > u else "equal" if b == u else "shorter") for u, b in _last_segments()}
    return words.pop() if len(words) == 1 else "mixed"


def _last_facts() -> dict:
    pairs = _last_segments()
    return {"pairs": ", ".join(f"{u} -> {b}" for u, b in pairs)}


_last_segment = one_of(
    ("longer", "equal", "shorter"), last_segment,
    right="Longer at every S (layers in the last segment, uniform -> planner: {pairs}). The "
          "last segment is never re-run, so a plan re-runs every forward before it; the small "
          "last scales keep little, so the planner lets one long last segment hold them and "
          "spends its checkpoints in the big first scale.",
    wrong="Not quite: longer at every S (uniform -> planner: {pairs}).",
    hints={"equal": "Measured: longer at every S (uniform -> planner: {pairs}). The planner is "
                    "free to move the last boundary: every layer before it is re-run, so it "
                    "moves it as early as the budget allows.",
           "shorter": "Measured: longer at every S (uniform -> planner: {pairs}). A shorter last "
                      "segment would re-run more: every forward before the last segment's start "
                      "runs twice. The last scales keep little, so a long last segment fits."},
    normalise=lambda a: a.strip().lower(), facts=_last_facts)


@functools.lru_cache(maxsize=1)
def read_gaps() -> dict:
    """Measured step peak over the activation model's (`formulas.segmented_peak_bytes`, what
    `planner.evaluate_plan` gives from act and out bytes) for each plan of 06.read_low."""
    from ckpt_lab import planner
    from ckpt_lab.lessons.widgets import measure_plan_peak
    layers, x, profile = conv_net()
    act, out = [p.act_bytes for p in profile], [p.out_bytes for p in profile]
    flops = list(conv_flops())
    with one_thread():
        return {name: measure_plan_peak(layers, x, plan)
                / planner.evaluate_plan(plan, act, out, flops).peak_bytes
                for name, plan in READ_PLANS.items()}


def read_low() -> str:
    """Measured answer of 06.read_low: the plan the activation model reads lower, relative to
    its measured step peak ("the same" within 5%)."""
    g = read_gaps()
    ratio = g["segments of 2"] / g["no checkpoint"]
    return "the same" if abs(ratio - 1) <= 0.05 else (
        "segments of 2" if ratio > 1 else "no checkpoint")


def _gap_facts() -> dict:
    g = read_gaps()
    return {"none": g["no checkpoint"], "two": g["segments of 2"]}


_read_low = one_of(
    tuple(READ_PLANS) + ("the same",), read_low, normalise=lambda a: " ".join(a.lower().split()),
    facts=_gap_facts,
    right="{expected}: measured x{two:.2f} the activation model's peak, against x{none:.2f} with "
          "no checkpoint. What the model leaves out (a segment's own input, backward's working "
          "memory) sits in the one segment in backward. With many short segments the model "
          "counts little else, so the omission is a large share; with no checkpoint it counts "
          "every layer's activations.",
    wrong="Measured: {expected}, x{two:.2f} for segments of 2 against x{none:.2f} with no "
          "checkpoint. The activation model counts less and less as checkpoints multiply, while "
          "what it leaves out belongs to the one segment in backward.",
    hints={"no checkpoint": "Measured: segments of 2 (x{two:.2f} against x{none:.2f}). With no "
                            "checkpoint the model counts every layer's activations, so what it "
                            "leaves out is a small share of its count; with short segments it "
                            "counts little besides, and the same pieces weigh more."})


@functools.lru_cache(maxsize=1)
def bisection_growth() -> float:
    """Measured: how many units (one block's activation) the recursive-bisection step peak
    grows when a chain of identical MLPBlocks doubles from 16 to 32 blocks."""
    from ckpt_lab import checkpoint_recursive
    from ckpt_lab.lessons.widgets import measure_plan_peak
    from ckpt_lab.training.models import MLPBlock

    class Bisected(nn.Module):
        def __init__(self, chain):
            super().__init__()
            self.chain = chain

        def forward(self, t):
            return checkpoint_recursive(self.chain, t)

    x = torch.randn(BISECT_TOKENS, BISECT_WIDTH, requires_grad=True)
    unit = x.numel() * x.element_size()
    peaks = []
    for depth in BISECT_DEPTHS[-2:]:
        torch.manual_seed(0)
        chain = nn.Sequential(*[MLPBlock(BISECT_WIDTH) for _ in range(depth)])
        with one_thread():
            peaks.append(measure_plan_peak([Bisected(chain)], x, [0]))
    return (peaks[1] - peaks[0]) / unit


_bisection_growth = near(
    bisection_growth, 0.25,
    right="{expected:g} unit: one more level of recursion, so one more kept input; memory grows "
          "as log2(L).",
    low="Measured {expected:g}: a deeper recursion keeps one more input while its deepest level "
        "runs.",
    high="Measured {expected:g}. Segments grow like sqrt(L) and no checkpoint like L; bisection "
         "keeps one input per level of recursion, and doubling adds one level.")


class _Run(nn.Module):
    """A chain run by a function of (layers, x): the learner's bisection, or the library's."""

    def __init__(self, chain, run):
        super().__init__()
        self.chain, self.run = chain, run

    def forward(self, t):
        return self.run(list(self.chain), t)


def _bisection_run(chain, run, x):
    """(step peak, layer forwards, gradients) of one step of `run` over `chain` on `x`."""
    from ckpt_lab.lessons.widgets import measure_plan_peak
    calls = []
    hooks = [m.register_forward_pre_hook(lambda *_: calls.append(1)) for m in chain]
    try:
        peak = measure_plan_peak([_Run(chain, run)], x, [0])
    finally:
        for h in hooks:
            h.remove()
    chain.zero_grad(set_to_none=True)
    xs = x.detach().requires_grad_(True)
    run(list(chain), xs).float().sum().backward()
    return peak, len(calls), [p.grad for p in chain.parameters()] + [xs.grad]


BISECT_CHECK_DEPTHS = (4, 7, 16)


def _bisected(answer):
    with one_thread():
        return _judge_bisected(answer)


def _judge_bisected(answer):
    from ckpt_lab import checkpoint_recursive
    from ckpt_lab.training.models import MLPBlock
    if not callable(answer):
        return False, ("Pass your function itself: exercises.check('06.bisected', bisected), "
                       "taking (layers, x) and returning the chain's output.")
    x = torch.randn(64, 32)
    for depth in BISECT_CHECK_DEPTHS:
        torch.manual_seed(0)
        chain = nn.Sequential(*[MLPBlock(32) for _ in range(depth)])
        library = _bisection_run(chain, lambda layers, t: checkpoint_recursive(
            nn.Sequential(*layers), t), x)
        try:
            out = answer(list(chain), x.detach().requires_grad_(True))
            if out is None:
                return False, ("not answered yet: your bisected returns None. Write its body: "
                               "one layer runs plainly; otherwise checkpoint the bisected first "
                               "half, then bisect the second.")
            yours = _bisection_run(chain, answer, x)
        except Exception as e:  # the learner's code: report, do not raise
            return False, f"bisected on {depth} layers raised {type(e).__name__}: {e}"
        plain = _bisection_run(chain, lambda layers, t: nn.Sequential(*layers)(t), x)
        if not all(a is not None and torch.equal(a, b) for a, b in zip(yours[2], plain[2])):
            return False, (f"{depth} layers: the gradients differ from a plain run's. Return "
                           "the last layer's output, and run every layer once in the forward.")
        (peak, forwards, _), (want_peak, want_forwards, _) = yours, library
        if peak >= plain[0]:
            return False, (f"{depth} layers: the step peak is a plain run's ({peak:,} bytes): "
                           "no checkpoint took effect. Run the first half inside "
                           "torch.utils.checkpoint.checkpoint(..., use_reentrant=False).")
        if forwards != want_forwards:
            return False, (f"{depth} layers: {forwards} layer forwards where bisection runs "
                           f"{want_forwards} ({depth} + formulas.bisection_cost's re-runs). "
                           "Each half is bisected once: the first len(layers) // 2 layers "
                           f"({depth // 2} here) inside its checkpoint, the other "
                           f"{depth - depth // 2} after it, and a single layer runs plainly.")
        if peak != want_peak:
            return False, (f"{depth} layers: step peak {peak:,} bytes where checkpoint_recursive "
                           f"measures {want_peak:,}. Split where it does, the first "
                           f"len(layers) // 2 layers ({depth // 2} here) checkpointed, and "
                           "bisect that first half inside its checkpoint too.")
    return True, (f"gradients bit for bit, and the step peak and layer forwards of "
                  f"checkpoint_recursive at {', '.join(map(str, BISECT_CHECK_DEPTHS))} layers.")


EXERCISES = [
    Exercise("06.last_segment", "The lesson's 13-layer net at its CPU sizes: within the step "
             "peak of uniform segments (S = 2..8), is the last segment (never re-run) of the "
             "planner's cheapest plan 'longer', 'equal' or 'shorter' than the uniform plan's?",
             _last_segment, expected=last_segment),
    Exercise("06.read_low", "The 13-layer net at its CPU sizes: the activation model (kept "
             "inputs + last segment, without backward's A + G: formulas.segmented_peak_bytes) "
             "reads every plan below its measured step peak. Relative to the measured peak, "
             "which plan does it read lower: 'no checkpoint', 'segments of 2' (starts "
             f"{READ_PLANS['segments of 2']}) or 'the same'?", _read_low, expected=read_low),
    Exercise("06.bisection_growth", "Recursive bisection of identical MLPBlocks: doubling the "
             "depth from 16 to 32 blocks raises the step peak by how many units (one block's "
             "activation)?", _bisection_growth, expected=bisection_growth),
    Exercise("06.bisected", "Build task: write bisected(layers, x), recursive bisection with "
             "torch.utils.checkpoint: the first len(layers) // 2 layers checkpointed (and "
             "bisected inside), then the rest bisected; one layer runs plainly. The check compares "
             "gradients with a plain run and the step peak and layer forwards with "
             "checkpoint_recursive.", _bisected),
]
