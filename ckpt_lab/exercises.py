"""Exercises of the lessons and the functions that check a learner's answer.

``check("03.optimal_segments", answer)`` prints ✓ when the answer is right, a hint when it is
not, "not answered yet" for ``None``, and returns a bool; it never raises on a wrong answer,
so a notebook left unanswered still runs top to bottom. ``question(key)`` gives the text.

Expected answers are never typed in: each is computed when checked, from
`ckpt_lab.formulas` or by measuring a small run with `track_memory` and PyTorch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from . import formulas
from .checkpoint import checkpoint
from .course import kept_after_forward

GIB = 2 ** 30


@dataclass(frozen=True)
class Exercise:
    """A question and the function that judges an answer: judge(answer) -> (ok, message)."""

    key: str
    question: str
    judge: Callable[[Any], tuple[bool, str]]


def _number(answer) -> float:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or answer != answer:
        raise TypeError(f"expected a number, got {answer!r} ({type(answer).__name__})")
    return float(answer)


def _close(answer, expected: float, rel: float, hint_low: str, hint_high: str):
    """Judge a number within a relative tolerance; the hint depends on the side it misses."""
    value = _number(answer)
    if math.isclose(value, expected, rel_tol=rel, abs_tol=1e-12):
        return True, f"{value:,.6g} is right."
    return False, hint_low if value < expected else hint_high


# ------------------------------------------------------------------------------ lesson 1
def _adam_mixed(answer):
    expected = formulas.model_state_per_param("mixed", "adam").total
    return _close(answer, expected, 1e-9,
                  "Too few: besides the 16-bit weights and gradients, Adam keeps an fp32 "
                  "master copy of the weights and two fp32 moments (momentum and variance).",
                  "Too many: with ZeRO's accounting the gradients stay 16-bit (2 bytes) and "
                  "there is one fp32 master copy (4) plus two fp32 moments (4 + 4).")


def _block_bytes(answer):
    from .memory import profile_layers
    from .models import MLPBlock
    tokens, width = 8 * 64, 512
    torch.manual_seed(0)
    chain = nn.Sequential(*[MLPBlock(width) for _ in range(3)])
    prof = profile_layers(chain, torch.randn(tokens, width), repeats=1)
    expected = prof[1].act_bytes
    return _close(answer, expected, 1e-3,
                  "Too few: count one (tokens x width) fp32 tensor the block must keep; "
                  "tokens = batch x positions.",
                  "Too many: the Linear's input is the previous block's ReLU output, already "
                  "kept, and the pre-activation is freed once ReLU saved its own output.")


def _adam_fp32_7b(answer):
    expected = formulas.model_state_bytes(7_000_000_000, "fp32", "adam") / GIB
    return _close(answer, expected, 0.02,
                  "Too few: fp32 Adam keeps weights, gradients and two moments: 4 numbers of "
                  "4 bytes per parameter. Convert bytes to GiB by dividing by 2**30.",
                  "Too many: 16 bytes per parameter; 1 GiB is 2**30 bytes (not 10**9).")


# ------------------------------------------------------------------------------ lesson 2
def _dropout_chain(width: int = 16, depth: int = 4):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.3)]
    return nn.Sequential(*layers)


def _grads(chain, run, x, seed: int = 1):
    chain.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    torch.manual_seed(seed)
    run(chain, x).square().sum().backward()
    return [p.grad.clone() for p in chain.parameters()] + [x.grad.clone()]


def _my_checkpoint(answer):
    if not callable(answer):
        return False, ("Pass your function itself, e.g. check('02.my_checkpoint', "
                       "hooks_checkpoint), taking (fn, x) and returning fn(x).")
    chain = _dropout_chain()
    x = torch.randn(64, 16)
    plain = _grads(chain, lambda f, t: f(t), x)
    try:
        yours = _grads(chain, answer, x)
    except Exception as e:  # the learner's code: report, do not raise
        return False, f"Your function raised {type(e).__name__}: {e}"
    if not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, yours)):
        return False, ("Gradients differ from a plain run. The chain has Dropout: save "
                       "torch.get_rng_state() in forward and restore it around the recompute.")
    xs = x.detach().requires_grad_(True)
    kept_plain = kept_after_forward(chain, xs)
    kept = kept_after_forward(lambda t: answer(chain, t), xs)
    if kept >= kept_plain:
        return False, (f"Gradients are right, but your forward keeps {kept:,} bytes, no less "
                       f"than a plain run ({kept_plain:,}). Run the function under "
                       "torch.no_grad() (reentrant) or pack saved tensors into handles (hooks).")
    return True, f"Gradients match a plain run and the forward keeps {kept:,} of {kept_plain:,} bytes."


class _ResBlock(nn.Module):
    """x + relu(bn(conv(x))), with the whole branch checkpointed when asked."""

    def __init__(self, channels: int, whole_branch: bool):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.whole_branch = whole_branch

    def branch(self, x):
        return self.relu(self.bn(self.conv(x)))

    def forward(self, x):
        if self.whole_branch:
            return x + checkpoint(self.branch, x)
        return x + self.branch(x)


def _branch_saving(answer):
    torch.manual_seed(0)
    x = torch.randn(4, 8, 16, 16, requires_grad=True)
    plain = kept_after_forward(_ResBlock(8, False), x)
    ckpt = kept_after_forward(_ResBlock(8, True), x)
    expected = plain - ckpt
    return _close(answer, expected, 0.01,
                  "Too few: with the whole branch checkpointed, both the BatchNorm's input "
                  "(the conv output) and the ReLU's output are dropped, each as large as x.",
                  "Too many: x itself is kept (it is the checkpoint's input and the residual "
                  "needs it) and the block's output is alive either way.")


RNG_LAYERS = {"Linear": lambda: nn.Linear(16, 16), "ReLU": nn.ReLU,
              "Dropout": lambda: nn.Dropout(0.5), "BatchNorm1d": lambda: nn.BatchNorm1d(16)}


def layers_needing_rng() -> set[str]:
    """Measured: the layer types whose gradients change when the RNG state is not restored."""
    out = set()
    for name, make in RNG_LAYERS.items():
        torch.manual_seed(0)
        layer = nn.Sequential(nn.Linear(16, 16), make())
        x = torch.randn(32, 16)
        grads = []
        for preserve in (True, False):
            layer.zero_grad(set_to_none=True)
            torch.manual_seed(1)
            checkpoint(layer, x.requires_grad_(True), preserve_rng_state=preserve).sum().backward()
            grads.append(layer[0].weight.grad.clone())
        if not torch.equal(*grads):
            out.add(name)
    return out


def _rng_layers(answer):
    if isinstance(answer, str):
        answer = {answer}
    try:
        given = {str(a) for a in answer}
    except TypeError:
        return False, "Give a set of layer names, e.g. {'Linear', 'ReLU'}."
    unknown = given - set(RNG_LAYERS)
    if unknown:
        return False, f"Unknown names {sorted(unknown)}; choose from {sorted(RNG_LAYERS)}."
    expected = layers_needing_rng()
    if given == expected:
        return True, f"{sorted(given)}: only these draw random numbers in forward."
    if given - expected:
        return False, (f"{sorted(given - expected)} compute the same thing every time they "
                       "run; a layer needs the RNG replayed only if it draws random numbers.")
    return False, "Something that draws random numbers in forward is missing from your set."


# ------------------------------------------------------------------------------ lesson 3
def _optimal_segments(answer):
    expected = formulas.optimal_segment_count(16, 1, 1)
    value = _number(answer)
    if value == expected:
        return True, f"{expected} segments: peak (S - 1) + 16 / S layers is least there."
    return False, ("Write the peak as (S - 1) kept inputs + 16 / S layers of the last segment "
                   "and try S = 2, 3, 4, 5, 8 (the last segment takes the remainder).")


def _peak_in_layers(answer):
    expected = formulas.uniform_peak_bytes(36, 6, 1, 1)
    return _close(answer, expected, 1e-9,
                  "Too few: count the kept inputs of every segment before the last one too.",
                  "Too many: only the last segment's 36 / 6 layers are alive at once, plus "
                  "one kept input per earlier segment.")


def _sqrt_growth(answer):
    def best(n):
        s = formulas.optimal_segment_count(n, 1, 1)
        return formulas.uniform_peak_bytes(n, s, 1, 1)
    expected = best(64) / best(16)
    return _close(answer, expected, 0.05,
                  "Too small: the optimal peak is about 2 sqrt(L) layers, so compute "
                  "best(64) / best(16) with best(L) = min over S of (S - 1) + L / S.",
                  "Too large: 4x more layers without checkpoints is 4x the memory, but with "
                  "the best segmentation the peak grows like sqrt(L).")


# ------------------------------------------------------------------------------ lesson 4
def _full_recompute_ratio(answer):
    expected = (formulas.dense_training_flops(10 ** 6, 10 ** 3, 1.0)
                / formulas.dense_training_flops(10 ** 6, 10 ** 3, 0.0))
    return _close(answer, expected, 0.01,
                  "Too small: recomputation adds one whole forward (2NT) to a step of "
                  "forward 2NT + backward 4NT.",
                  "Too large: backward costs twice the forward, so one extra forward is a "
                  "third of a step, not a half.")


def _recomputed_layers(answer):
    expected = formulas.recompute_layers(formulas.uniform_boundaries(12, 4), 12)
    return _close(answer, expected, 1e-9,
                  "Too few: every segment but the last is re-run in backward; 3 segments of "
                  "12 // 4 layers.",
                  "Too many: the last segment is not checkpointed, so it is not re-run.")


# ------------------------------------------------------------------------------ lesson 5
def _megatron_gib(answer):
    expected = formulas.megatron_layer_bytes(2048, 1, 12288, 96) / GIB
    return _close(answer, expected, 0.02,
                  "Too few: sbh(34 + 5as/h) bytes with s = 2048, b = 1, h = 12288, a = 96; "
                  "the 5as/h term is 80 here, more than the 34.",
                  "Too many: divide bytes by 2**30 for GiB; the formula already counts "
                  "16-bit activations (2 bytes each).")


def _crossover(answer):
    h, a = 768, 12
    expected = 34 * h / (5 * a)
    return _close(answer, expected, 0.03,
                  "Too short: set 5as/h = 34 and solve for s with h = 768, a = 12.",
                  "Too long: set 5as/h = 34 and solve for s with h = 768, a = 12.")


def _selective_fraction(answer):
    s, b, h, a = 2048, 1, 768, 12
    full = formulas.megatron_layer_bytes(s, b, h, a)
    expected = 1 - formulas.megatron_layer_bytes(s, b, h, a, selective=True) / full
    return _close(answer, expected, 0.02,
                  "Too small: selective recomputation drops the whole 5as/h part; compute "
                  "(5as/h) / (34 + 5as/h).",
                  "Too large: the 34 sbh of the projections and the MLP stay; give the "
                  "fraction (between 0 and 1) that is removed.")


EXERCISES = {e.key: e for e in [
    Exercise("01.adam_mixed_bytes", "Mixed-precision training with Adam, ZeRO's accounting "
             "(16-bit weights and gradients): how many bytes per parameter?", _adam_mixed),
    Exercise("01.block_activation_bytes", "One MLPBlock (Linear -> ReLU, width 512, fp32, no "
             "dropout) in the middle of a chain, batch of 8 rows x 64 positions: how many bytes "
             "does it keep for backward?", _block_bytes),
    Exercise("01.adam_fp32_7b", "A 7-billion-parameter model trained in fp32 with Adam: how "
             "many GiB do weights, gradients and optimizer states take?", _adam_fp32_7b),
    Exercise("02.my_checkpoint", "Pass your checkpoint function (fn, x) -> fn(x): it must give "
             "the gradients of a plain run through Dropout and keep fewer bytes.",
             _my_checkpoint),
    Exercise("02.branch_saving", "x of shape (4, 8, 16, 16) fp32, block x + relu(bn(conv(x))): "
             "how many bytes does checkpointing the whole branch save after the forward?",
             _branch_saving),
    Exercise("02.rng_layers", "Which of Linear, ReLU, Dropout, BatchNorm1d need the RNG state "
             "restored for the recompute? Give a set of names.", _rng_layers),
    Exercise("03.optimal_segments", "16 identical layers, a kept input as large as one layer's "
             "activations: which segment count gives checkpoint_sequential the least peak?",
             _optimal_segments),
    Exercise("03.peak_in_layers", "36 identical layers in 6 uniform segments: the peak, in "
             "units of one layer's activations (a kept input is one unit)?", _peak_in_layers),
    Exercise("03.sqrt_growth", "With the best segment count each time, by what factor does the "
             "peak grow from 16 to 64 layers?", _sqrt_growth),
    Exercise("04.full_recompute_ratio", "Dense model, forward 2NT FLOPs, backward 4NT: FLOPs of "
             "a step with full recomputation divided by FLOPs without?", _full_recompute_ratio),
    Exercise("04.recomputed_layers", "checkpoint_sequential on 12 layers with segments=4: how "
             "many layer forwards does backward re-run?", _recomputed_layers),
    Exercise("05.megatron_gib", "GPT-3 (s=2048, b=1, h=12288, a=96), 16-bit: GiB of "
             "activations per layer by Megatron's sbh(34 + 5as/h)?", _megatron_gib),
    Exercise("05.crossover_seq", "GPT-2 small (h=768, a=12): at what sequence length does the "
             "attention term 5as/h equal the 34?", _crossover),
    Exercise("05.selective_fraction", "GPT-2 small at s=2048: what fraction of a layer's "
             "activation bytes does selective recomputation remove?", _selective_fraction),
]}


def _get(key: str) -> Exercise:
    if key not in EXERCISES:
        raise ValueError(f"unknown exercise {key!r}; valid: {', '.join(EXERCISES)}")
    return EXERCISES[key]


def question(key: str) -> str:
    """The text of an exercise."""
    return _get(key).question


def keys(lesson: int | None = None) -> list[str]:
    """Exercise keys, all or one lesson's (e.g. keys(3))."""
    return [k for k in EXERCISES if lesson is None or k.startswith(f"{lesson:02d}.")]


def check(key: str, answer) -> bool:
    """Print ✓ or a hint for ``answer`` ("not answered yet" for None); True when right."""
    exercise = _get(key)
    if answer is None:
        print(f"{key}: not answered yet. {exercise.question}")
        return False
    try:
        ok, message = exercise.judge(answer)
    except TypeError as e:
        ok, message = False, str(e)
    print(f"{key}: {'✓' if ok else '✗'} {message}")
    return ok


# ------------------------------------------------------------------------------ lesson 9
def _true_saving_100_10(answer):
    expected = 1 - formulas.corrected_mem_ckpt(100, 8, 512, 1024) / \
        formulas.article_mem_no_ckpt(100, 8, 512, 1024)
    return _close(answer, expected, 0.01,
                  "Too small: count only the 9 kept segment inputs and the 10 layers of the "
                  "segment being rebuilt, in units of one layer, against 100 units.",
                  "Too large: backward rebuilds a whole 10-layer segment while 9 kept inputs "
                  "wait; the boundaries alone (the article's 90%) are not the peak.")


def _best_segments_transformer(answer):
    expected = formulas.optimal_segment_count(48, 18, 1)
    value = _number(answer)
    if value == expected:
        return True, (f"{expected} segments: with a = 18 b the optimum moves far beyond "
                      "sqrt(48) ~ 7, towards sqrt(L a / b).")
    return False, ("Compute (S - 1) * 1 + (layers in the last segment) * 18 for each S "
                   "(formulas.uniform_peak_bytes(48, S, 18, 1)) and take the least; "
                   "about sqrt(L a / b).")


def _accumulation_bound(answer):
    state = formulas.model_state_bytes(7_000_000_000, "mixed", "adam")
    expected = (state + 60 * GIB) / state
    return _close(answer, expected, 0.02,
                  "Too small: divide the whole peak (model state + activations) by the part "
                  "no activation technique removes, the model state.",
                  "Too large: model state does not shrink: mixed-precision Adam keeps 16 bytes "
                  "per parameter (formulas.model_state_bytes(7e9, 'mixed', 'adam')).")


EXERCISES.update({e.key: e for e in [
    Exercise("09.true_saving_100_10", "Article B's model (one B x S x H tensor per layer), 100 "
             "layers, checkpoint_sequential with 10 segments: what fraction of activation "
             "memory is really saved at the peak (a number between 0 and 1)?",
             _true_saving_100_10),
    Exercise("09.best_segments_transformer", "48 layers that each keep a = 18 units and pass on "
             "b = 1 unit (a transformer block): which uniform segment count gives the least "
             "peak?", _best_segments_transformer),
    Exercise("09.accumulation_bound", "A 7B model trained with mixed-precision Adam (16 bytes "
             "per parameter) whose activations take 60 GiB without checkpointing: by at most "
             "what factor can checkpointing plus accumulation lower the peak?",
             _accumulation_bound),
]})


# ------------------------------------------------------------------------------ lesson 6
SHRINKING_ACT = [4, 4, 4, 4, 2, 2, 2, 2, 1, 1, 1, 1]    # units: a net whose resolution halves
SHRINKING_OUT = [2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1]


def _plan_recompute(answer):
    from .planner import optimal_segments
    plan = optimal_segments(SHRINKING_ACT, SHRINKING_OUT, [1] * len(SHRINKING_ACT), 14)
    value = _number(answer)
    if value == plan.recompute_cost:
        return True, (f"{plan.recompute_cost:g} layers: plan {plan.boundaries} (peak "
                      f"{plan.peak_bytes} units) re-runs everything before its last segment.")
    return False, ("Too many: the last segment is not re-run, so make it as long as the budget "
                   "allows (the small layers at the end are cheap to keep)."
                   if value > plan.recompute_cost else
                   "Too few: with the last segment that long, some earlier segment no longer "
                   "fits; try planner.optimal_segments(act, out, [1] * 12, 14).")


def _bisection_forwards(answer):
    expected = 32 + formulas.bisection_cost(32, 1, 1).recompute_layers
    return _close(answer, expected, 1e-9,
                  "Too few: besides the 32 forwards, each layer is re-run once per level at "
                  "which it lies in a first half: (L/2) log2 L recomputed layers.",
                  "Too many: the second half of each split is not checkpointed at that level; "
                  "(L/2) log2 L layers are recomputed, on top of the 32 forwards.")


def _bisection_peak(answer):
    expected = formulas.bisection_cost(64, 1, 1).peak_bytes
    return _close(answer, expected, 1e-9,
                  "Too few: every level of the recursion keeps one input while the one "
                  "layer at the bottom keeps its activations: M(n) = max(1 + M(n - n//2), M(n//2)).",
                  "Too many: recursive bisection keeps one input per level, log2(64) levels, "
                  "plus one layer: far less than sqrt segments' 15.")


EXERCISES.update({e.key: e for e in [
    Exercise("06.plan_recompute", "A chain of 12 layers keeping [4, 4, 4, 4, 2, 2, 2, 2, 1, 1, "
             "1, 1] units with outputs [2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1] units, each costing 1 "
             "to run: under a budget of 14 units, how many layer forwards does the cheapest plan "
             "recompute?",
             _plan_recompute),
    Exercise("06.bisection_forwards", "checkpoint_recursive on 32 identical layers: how many "
             "layer forwards does one step run in all (forward plus recompute)?",
             _bisection_forwards),
    Exercise("06.bisection_peak", "64 identical layers, each keeping 1 unit, a kept input 1 "
             "unit: the peak of recursive bisection, in units (formulas.bisection_cost's model)?",
             _bisection_peak),
]})


# ----------------------------------------------------------------------------- lesson 10
def _minimum_budget(answer):
    from .planner import BudgetTooSmallError, optimal_segments
    try:
        optimal_segments(SHRINKING_ACT, SHRINKING_OUT, [1] * len(SHRINKING_ACT), 0)
    except BudgetTooSmallError as e:
        expected = e.minimum_bytes
    return _close(answer, expected, 1e-9,
                  "Too small: no plan fits that. Every segment's activations plus the inputs "
                  "kept before it must fit; catch BudgetTooSmallError and read .minimum_bytes.",
                  "Too large: a finer plan fits a smaller budget; ask the planner with budget 0 "
                  "and read BudgetTooSmallError.minimum_bytes.")


def rng_matters_for_dropout() -> bool:
    """Measured: do a Dropout chain's gradients change when the checkpoint skips the RNG replay?"""
    chain = _dropout_chain()
    x = torch.randn(64, 16)
    plain = _grads(chain, lambda f, t: f(t), x)
    loose = _grads(chain, lambda f, t: checkpoint(f, t, preserve_rng_state=False), x)
    return not all(torch.equal(a, b) for a, b in zip(plain, loose))


def _rng_replay(answer):
    if not isinstance(answer, bool):
        return False, "Answer True or False."
    expected = rng_matters_for_dropout()
    if answer == expected:
        return True, ("Right: without the replay the recompute draws a new dropout mask, so "
                      "backward differentiates a different function than the forward ran.")
    return False, ("Try it: checkpoint(..., preserve_rng_state=False) on a model with Dropout, "
                   "then compare gradients with torch.equal against a plain run.")


EXERCISES.update({e.key: e for e in [
    Exercise("10.minimum_budget", "The chain of exercise 06.plan_recompute ([4, 4, 4, 4, 2, 2, "
             "2, 2, 1, 1, 1, 1] units kept, outputs [2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1]): what is "
             "the least budget, in units, that the planner accepts?", _minimum_budget),
    Exercise("10.rng_replay", "A model with Dropout, checkpointed with preserve_rng_state=False: "
             "do its gradients differ from a plain run's? Answer True or False.", _rng_replay),
]})


# ------------------------------------------------------------------------------ lesson 7
def _accumulation_peak(answer):
    def peak(batch):
        layers = formulas.gpt_layers(batch, 64, 4, 128, 4, 256, 4, True)
        spans = [(0, len(layers), False)]
        return formulas.chain_peak_bytes(layers, spans, batch * 64, 256, 4)
    expected = peak(2)
    return _close(answer, expected, 0.01,
                  "Too few: accumulation runs micro-batches of 8 // 4 = 2 rows one after the "
                  "other; the peak is that of one micro-batch of 2, not less.",
                  f"Too many: only one micro-batch's activations are alive at a time; compute "
                  f"formulas.chain_peak_bytes for batch 2 (the full batch of 8 peaks at "
                  f"{peak(8):,} bytes).")


def _offload_seconds(answer):
    from .offload import PCIE4_X16_BYTES_PER_S, OffloadStats
    moved = 6 * GIB
    expected = OffloadStats(0, PCIE4_X16_BYTES_PER_S, bytes_offloaded=moved,
                            bytes_restored=moved).transfer_seconds
    return _close(answer, expected, 0.02,
                  "Too short: the bytes cross PCIe twice, to the host in forward and back in "
                  "backward; 6 GiB is 6 * 2**30 bytes.",
                  "Too long: 25 GB/s is 25e9 bytes per second; count each direction once.")


def accumulation_flops_ratio(micro_batches: int = 4) -> float:
    """Measured: FLOPs of a step split into `micro_batches` over FLOPs of the whole batch."""
    from torch.utils.flop_counter import FlopCounterMode
    from .models import GPTConfig, build_model
    model = build_model(GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (8, 16), generator=g)
    y = torch.randint(0, 256, (8, 16), generator=g)
    counts = []
    for k in (1, micro_batches):
        with FlopCounterMode(display=False) as fc:
            for xm, ym in zip(x.chunk(k), y.chunk(k)):
                (model(xm, ym) / k).backward()
        counts.append(fc.get_total_flops())
    return counts[1] / counts[0]


def _accumulation_flops(answer):
    expected = accumulation_flops_ratio(4)
    return _close(answer, expected, 0.01,
                  "Too small: every row of the batch still goes through the whole forward and "
                  "backward once.",
                  "Too large: accumulation recomputes nothing; it runs the same rows in four "
                  "smaller pieces.")


# ------------------------------------------------------------------------------ lesson 8
def _llama7b_state(answer):
    from .capacity import TransformerConfig
    cfg = TransformerConfig(32, 4096, 32, 4096, vocab=32000)
    expected = formulas.model_state_bytes(cfg.num_params, "mixed", "adam") / GIB
    return _close(answer, expected, 0.02,
                  "Too few: mixed-precision Adam keeps 16 bytes per parameter; take "
                  "num_params from capacity.TransformerConfig(32, 4096, 32, 4096, vocab=32000).",
                  "Too many: divide bytes by 2**30 for GiB, and use the config's num_params "
                  "(about 6.6e9 for this GPT-style count), not a rounded 7e9.")


def _usable_gib(answer):
    from .capacity import DEFAULT_HEADROOM, parse_bytes
    expected = DEFAULT_HEADROOM * parse_bytes("80GB") / GIB
    return _close(answer, expected, 0.01,
                  "Too few: 80 GB is 80e9 bytes (a GB is 10**9); take 85% of it, then divide "
                  "by 2**30.",
                  "Too many: a GB is 10**9 bytes, a GiB 2**30: 80 GB is about 74.5 GiB before "
                  "the 85% rule.")


def fallback_rungs(order, fits_micro_batch: int = 2, batch_size: int = 8,
                   max_every: int = 4) -> int:
    """Rungs `run_with_fallback` tries when a step fits only at micro-batch <= fits_micro_batch."""
    from .fallback import StepConfig, run_with_fallback

    def step(config):
        if config.micro_batch > fits_micro_batch:
            raise torch.OutOfMemoryError(f"micro-batch {config.micro_batch} does not fit")
        return config
    import logging
    logger = logging.getLogger("ckpt_lab.fallback")
    level = logger.level
    logger.setLevel(logging.ERROR)      # the ladder's warnings would drown the check's answer
    try:
        return len(run_with_fallback(step, StepConfig(0, 1, batch_size), order=order,
                                     max_every=max_every).rungs)
    finally:
        logger.setLevel(level)


def _fallback_rungs(answer):
    expected = fallback_rungs(("densify", "accumulate", "shrink"))
    value = _number(answer)
    if value == expected:
        return True, (f"{expected} rungs: densifying (off, every 4, 2, 1) cannot help a step "
                      "that only fits at micro-batch 2, so all four fail before accumulation.")
    return False, ("Walk the ladder: densify until every block is checkpointed (each fails), "
                   "then double accumulation until micro-batch 2; count the configurations, "
                   "the one that fits included.")


EXERCISES.update({e.key: e for e in [
    Exercise("07.accumulation_peak", "The gpt-cpu model (4 blocks, C=128, 4 heads, T=64, vocab "
             "256, dropout on, fp32), batch 8, no checkpointing, micro_batches=4: by the "
             "formula, how many bytes does the step peak at?", _accumulation_peak),
    Exercise("07.offload_seconds", "A step offloads 6 GiB of activations to the host and brings "
             "them back for backward: how many seconds of transfer at 25 GB/s (PCIe 4.0 x16)?",
             _offload_seconds),
    Exercise("07.accumulation_flops", "Splitting a step's batch into 4 micro-batches "
             "(accumulation): FLOPs of the step with accumulation divided by FLOPs without?",
             _accumulation_flops),
    Exercise("08.llama7b_state_gib", "A 7B LLaMA-like config (32 layers, hidden 4096, 32 heads, "
             "seq 4096, vocab 32000) trained with mixed-precision Adam: GiB of model state, "
             "with the planner's parameter count?", _llama7b_state),
    Exercise("08.usable_gib", "An '80 GB' GPU and the keep-peak-under-85% rule: how many GiB may "
             "the planned peak use?", _usable_gib),
    Exercise("08.fallback_rungs", "Article order (densify, accumulate, shrink), start with no "
             "checkpointing, accumulation 1, batch 8, max_every=4; the step fits only at "
             "micro-batch <= 2: how many configurations does run_with_fallback try?",
             _fallback_rungs),
]})


# ------------------------------------------------------------------------------ lesson 12
def _fsdp_state_gib(answer):
    from .parallel_formulas import fsdp_state_bytes
    expected = fsdp_state_bytes([1_300_000_000], 8) / GIB
    return _close(answer, expected, 0.02,
                  "Too few: FSDP shards the fp32 weights, their gradients and Adam's two "
                  "moments, 16 bytes per parameter in all; divide by the 8 ranks, then by 2**30.",
                  "Too many: every part of the state is sharded, so each rank keeps 16/8 = 2 "
                  "bytes per parameter (DDP's buckets are gone: FSDP reduce-scatters instead).")


def _stage_in_flight(answer):
    from .scale_out import schedule
    held, expected = 0, 0               # walk the schedule `pipeline_step` runs
    for op, _ in schedule("1f1b", 4, 1, 8):
        held += 1 if op == "F" else -1
        expected = max(expected, held)
    value = _number(answer)
    if value == expected:
        return True, (f"{expected}: stage 1 runs {4 - 1 - 1} warm-up forwards, then one more "
                      "before its first backward; the micro-batch count does not matter.")
    return False, ("Under 1F1B stage r runs stages - r - 1 forwards before it starts to "
                   "alternate, and one more forward before each backward: count what it holds "
                   "when its first backward begins (GPipe would hold all 8).")


def _sp_over_tp(answer):
    from .parallel_formulas import megatron_tp_layer_bytes
    s, h, a, t = 2048, 12288, 96, 8
    expected = megatron_tp_layer_bytes(s, 1, h, a, t, True) / megatron_tp_layer_bytes(s, 1, h, a, t)
    return _close(answer, expected, 0.01,
                  "Too small: sequence parallelism divides only the 10 sbh that tensor "
                  "parallelism leaves whole; the 24 sbh and 5as^2b were split by t already.",
                  "Too large: with sequence parallelism the layer norms' inputs and the dropout "
                  "masks are split by t too: (34 + 5as/h)/t against 10 + 24/t + 5as/(ht).")


EXERCISES.update({e.key: e for e in [
    Exercise("12.fsdp_state_gib", "A 1.3B-parameter model with fp32 weights and Adam, trained "
             "on 8 ranks with FSDP (ZeRO-3): GiB of model state (weights, gradients, Adam's "
             "moments) per rank?", _fsdp_state_gib),
    Exercise("12.stage_in_flight", "4 pipeline stages, 8 micro-batches, 1F1B schedule: for how "
             "many micro-batches does stage 1 (the second stage) hold activations at its peak?",
             _stage_in_flight),
    Exercise("12.sp_over_tp", "One Megatron layer, s=2048, b=1, h=12288, a=96, t=8: per-GPU "
             "activation bytes with tensor + sequence parallelism divided by those with tensor "
             "parallelism alone?", _sp_over_tp),
]})
