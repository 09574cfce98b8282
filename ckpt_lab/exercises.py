"""Exercises of the lessons and the functions that check a learner's answer.

``check("03.peak_at_six", answer)`` prints ✓ when the answer is right, a hint when it is
not, "not answered yet" for ``None``, and returns a bool; it never raises on a wrong answer,
so a notebook left unanswered still runs top to bottom. ``question(key)`` gives the text.

Expected answers are never typed in: each is computed when checked, from
`ckpt_lab.formulas` or by measuring a small run with `track_memory` and PyTorch.
"""
from __future__ import annotations

import dataclasses
import functools
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
FROZEN_ADAMW_CONFIG = dict(block_size=16, width=64, depth=3)


def frozen_adamw_step_bytes() -> int:
    """Measured: the bytes the first AdamW step adds to the 01.1 model (embedding frozen)."""
    from .memory import track_memory
    from .models import MLPConfig, build_model
    model = build_model(MLPConfig(**FROZEN_ADAMW_CONFIG))
    model.chain[0].requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (4, FROZEN_ADAMW_CONFIG["block_size"]))
    model(x, x).backward()
    with track_memory() as mem:
        optimizer.step()
    return mem.current_bytes


def _frozen_adamw(answer):
    expected = frozen_adamw_step_bytes()
    return _close(answer, expected, 1e-3,
                  "Too few: AdamW keeps two fp32 tensors (exp_avg and exp_avg_sq) the size of "
                  "every parameter it updates, 8 bytes per parameter: count the biases and the "
                  "head's weight too, not only the blocks' weights.",
                  "Too many: a frozen parameter gets no gradient, and AdamW skips a parameter "
                  "whose .grad is None, so the embedding gets no state. Count only the blocks "
                  "and the head, 8 bytes per parameter (the step counters add 4 bytes per "
                  "tensor, within the tolerance).")


def _block_bytes(answer):
    from .memory import profile_layers
    from .models import MLPBlock
    tokens, width = 8 * 64, 512
    torch.manual_seed(0)
    chain = nn.Sequential(*[MLPBlock(width) for _ in range(3)])
    prof = profile_layers(chain, torch.randn(tokens, width), repeats=1)
    expected = prof[1].act_bytes
    return _close(answer, expected, 1e-3,
                  "Too few: ReLU's backward needs its output, so the block keeps one "
                  "(tokens x width) fp32 tensor; tokens = batch x positions = 8 x 64.",
                  "Too many: do not count the block's input: it is the previous block's ReLU "
                  "output, already kept by that block (the Linear reuses it). And the Linear's "
                  "output is freed once ReLU has made and saved its own output.")


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


RNG_LAYERS = {"Linear": lambda: nn.Linear(16, 16), "ReLU": nn.ReLU, "GELU": nn.GELU,
              "LayerNorm": lambda: nn.LayerNorm(16), "BatchNorm1d": lambda: nn.BatchNorm1d(16),
              "Dropout": lambda: nn.Dropout(0.5), "AlphaDropout": lambda: nn.AlphaDropout(0.5),
              "RReLU": nn.RReLU}


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


def _name_set(answer, valid, what: str):
    """(set of names, None) from a name or a collection of names, or (None, why not)."""
    if isinstance(answer, str):
        answer = {answer}
    try:
        given = {str(a) for a in answer}
    except TypeError:
        return None, f"Give a set of {what}, e.g. {{'Linear', 'ReLU'}}."
    unknown = given - set(valid)
    if unknown:
        return None, f"Unknown names {sorted(unknown)}; choose from {sorted(valid)}."
    return given, None


def _rng_layers(answer):
    given, why = _name_set(answer, RNG_LAYERS, "layer names")
    if why:
        return False, why
    expected = layers_needing_rng()
    if given == expected:
        return True, (f"{sorted(given)}: only these draw random numbers in forward (RReLU "
                      "draws a slope for every negative input while training).")
    if given - expected:
        return False, (f"{sorted(given - expected)} compute the same thing every time they "
                       "run; a layer needs the RNG replayed only if it draws random numbers.")
    return False, ("A layer that draws random numbers in forward is missing from your set; run "
                   "the commented measurement for every layer before you check again.")


# ------------------------------------------------------------------------------ lesson 3
def chain_peak_units(layers: int, segments: int, width: int = 64, tokens: int = 512) -> float:
    """Measured: the step peak of `layers` MLP blocks in `segments`, in units of one block's
    activations, less the backward's fixed extra (the gradient in flight and one weight
    gradient, measured as the plain run's peak minus its `layers` kept units)."""
    from .memory import track_memory
    from .checkpoint import checkpoint_sequential
    from .models import MLPBlock
    torch.manual_seed(0)
    blocks = nn.Sequential(*[MLPBlock(width) for _ in range(layers)])
    x = torch.randn(tokens, width, requires_grad=True)
    unit = x.numel() * x.element_size()
    for p in blocks.parameters():
        p.grad = torch.zeros_like(p)
    peaks = []
    for k in (1, segments):
        with track_memory() as log:
            checkpoint_sequential(blocks, x, segments=k).sum().backward()
        peaks.append(log.peak_bytes)
    extra = peaks[0] - layers * unit
    return (peaks[1] - extra) / unit


def _peak_at_six(answer):
    expected = chain_peak_units(16, 6)
    five = chain_peak_units(16, 5)
    value = _number(answer)
    if math.isclose(value, expected, rel_tol=0.02):
        return True, (f"measured {expected:.1f} units at 6 segments, more than {five:.1f} at 5: "
                      "16 // 6 = 2 layers per segment leaves the last one 6 layers.")
    if value < expected:
        return False, ("Too few: checkpoint_sequential makes segments of 16 // 6 = 2 layers "
                       "and the last takes the remainder, 16 - 5 x 2 layers; add the 5 kept "
                       "inputs of the earlier segments.")
    return False, ("Too many: only the last segment is alive in full (16 - 5 x 2 layers), "
                   "plus one kept input for each of the 5 earlier segments.")


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
    return _close(answer, expected, 0.02,
                  "Too small: 2 sqrt(64) / 2 sqrt(16) = 2 is the continuous estimate; count "
                  "exactly, best(L) = min over whole S of (S - 1) + (layers in the last "
                  "segment): at S = sqrt(L) that is 2 sqrt(L) - 1, not 2 sqrt(L).",
                  "Too large: 4x more layers without checkpoints is 4x the memory, but with "
                  "the best segmentation the peak grows like sqrt(L): (2 sqrt(64) - 1) / "
                  "(2 sqrt(16) - 1).")


# ------------------------------------------------------------------------------ lesson 4
CANDIDATE_MODULES = {
    "Linear": lambda: nn.Linear(16, 16), "ReLU": nn.ReLU, "GELU": nn.GELU,
    "Dropout": lambda: nn.Dropout(0.5),
    "Linear->ReLU": lambda: nn.Sequential(nn.Linear(16, 16), nn.ReLU()),
    "ReLU->Linear": lambda: nn.Sequential(nn.ReLU(), nn.Linear(16, 16)),
    "Linear->ReLU->Linear": lambda: nn.Sequential(nn.Linear(16, 16), nn.ReLU(),
                                                  nn.Linear(16, 16)),
}


def checkpoint_saving_bytes() -> dict[str, int]:
    """Measured: bytes `checkpoint` saves after the forward of each candidate, x of (64, 16)."""
    torch.manual_seed(0)
    x = torch.randn(64, 16, requires_grad=True)
    out = {}
    for name, make in CANDIDATE_MODULES.items():
        m = make()
        out[name] = kept_after_forward(m, x) - kept_after_forward(lambda t: checkpoint(m, t), x)
    return out


def _no_saving_modules(answer):
    given, why = _name_set(answer, CANDIDATE_MODULES, "names")
    if why:
        return False, why
    saving = checkpoint_saving_bytes()
    expected = {n for n, b in saving.items() if b <= 0}
    if given == expected:
        return True, (f"{sorted(given)}: each keeps only a tensor that is alive anyway (its "
                      "input, which the checkpoint keeps, or its output). Measured savings: "
                      + ", ".join(f"{n} {b} B" for n, b in saving.items()))
    wrong = sorted(given - expected)
    if wrong:
        return False, (f"{wrong} keep something besides their input and output (a ReLU output "
                       "inside, a dropout mask): checkpointing drops it. Measure each with "
                       "kept_after_forward(m, x) against kept_after_forward(lambda t: "
                       "checkpoint(m, t), x).")
    return False, ("Something that saves nothing is missing: a module whose only saved tensor "
                   "is its input (kept by the checkpoint anyway) or its own output.")


def _mlp_for_policy():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))


def policy_cost(policy) -> dict[str, int]:
    """Measured for the (Linear 16->64, GELU, Linear 64->16) MLP on x of (64, 16): bytes kept
    after the forward and FLOPs of a step, plain, fully checkpointed and with ``policy``."""
    from torch.utils.flop_counter import FlopCounterMode
    mlp = _mlp_for_policy()
    x = torch.randn(64, 16, requires_grad=True)
    runs = {"plain": lambda t: mlp(t), "full": lambda t: checkpoint(mlp, t),
            "policy": lambda t: checkpoint(mlp, t, policy=policy)}
    out = {}
    for name, run in runs.items():
        out[f"{name}_bytes"] = kept_after_forward(run, x)
        with FlopCounterMode(display=False) as counter:
            run(x).sum().backward()
        out[f"{name}_flops"] = counter.get_total_flops()
    return out


def _selective_policy(answer):
    if not callable(answer):
        return False, ("Pass your policy itself: a function policy(op, *args, **kwargs) -> bool, "
                       "True to keep the op's output.")
    try:
        c = policy_cost(answer)
    except Exception as e:  # the learner's code: report, do not raise
        return False, f"Your policy raised {type(e).__name__}: {e}"
    summary = (f"kept {c['policy_bytes']:,} B (plain {c['plain_bytes']:,}, full checkpoint "
               f"{c['full_bytes']:,}); step FLOPs {c['policy_flops']:,} (plain "
               f"{c['plain_flops']:,})")
    if c["policy_flops"] > c["plain_flops"]:
        return False, (f"A matmul is re-run: {summary}. Return True for the matmul ops "
                       "(op.overloadpacket in ckpt_lab.selective.MATMUL_OPS: aten.addmm, aten.mm).")
    if c["policy_bytes"] >= c["plain_bytes"]:
        return False, (f"Nothing is dropped: {summary}. Return False for the GELU so its "
                       "output is recomputed.")
    return True, f"{summary}: the GELU output is dropped and no matmul is re-run."


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
    Exercise("01.frozen_adamw_bytes", "Predict, then measure: build_model(MLPConfig("
             "block_size=16, width=64, depth=3)) with its embedding frozen "
             "(model.chain[0].requires_grad_(False)), all parameters given to AdamW, after one "
             "forward + backward: how many bytes does the first optimizer.step() add? Work it "
             "out from the shapes first (vocabulary 256), then measure it with track_memory.",
             _frozen_adamw),
    Exercise("01.block_activation_bytes", "One MLPBlock (Linear -> ReLU, width 512, fp32, no "
             "dropout) in the middle of a chain, batch of 8 rows x 64 positions: how many bytes "
             "does this block add to what the chain keeps for backward? Count the tensors the "
             "block creates and keeps; its input is the previous block's output, kept by that "
             "block, so it does not count here.", _block_bytes),
    Exercise("01.adam_fp32_7b", "A 7-billion-parameter model trained in fp32 with Adam: how "
             "many GiB do weights, gradients and optimizer states take?", _adam_fp32_7b),
    Exercise("02.my_checkpoint", "Pass your checkpoint function (fn, x) -> fn(x): it must give "
             "the gradients of a plain run through Dropout and keep fewer bytes.",
             _my_checkpoint),
    Exercise("02.branch_saving", "x of shape (4, 8, 16, 16) fp32, block x + relu(bn(conv(x))): "
             "how many bytes does checkpointing the whole branch save after the forward?",
             _branch_saving),
    Exercise("02.rng_layers", "Predict, then measure: which of Linear, ReLU, GELU, LayerNorm, "
             "BatchNorm1d, Dropout, AlphaDropout, RReLU give other gradients when the recompute "
             "does not replay the random generator (preserve_rng_state=False)? Give a set of "
             "names.", _rng_layers),
    Exercise("03.peak_at_six", "The chain of 16 MLP blocks with checkpoint_sequential(segments=6): "
             "predict its peak in units of one block's activations, counting the kept inputs "
             "and the last segment's layers (leave out the backward's a + w); the check "
             "measures it.", _peak_at_six),
    Exercise("03.peak_in_layers", "36 identical layers in 6 uniform segments: the peak, in "
             "units of one layer's activations (a kept input is one unit)?", _peak_in_layers),
    Exercise("03.sqrt_growth", "With the best segment count each time, by what factor does the "
             "peak grow from 16 to 64 layers?", _sqrt_growth),
    Exercise("04.no_saving_modules", "Of Linear, ReLU, GELU, Dropout, Linear->ReLU, "
             "ReLU->Linear and Linear->ReLU->Linear (width 16): for which does checkpoint(m, x) "
             "keep no fewer bytes after the forward than m(x)? Give a set of names.",
             _no_saving_modules),
    Exercise("04.selective_policy", "Pass a policy(op, *args, **kwargs) -> bool for "
             "checkpoint(mlp, x, policy=...) on Linear(16, 64) -> GELU -> Linear(64, 16): it "
             "must keep fewer bytes than a plain run and re-run no matmul.", _selective_policy),
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


def budget_chain():
    """Lesson 6, exercise 2: eight Linear -> GELU layers of unequal width, their input, and a
    budget for one step's peak (bytes, as track_memory counts them)."""
    torch.manual_seed(0)
    widths = [64, 512, 64, 384, 32, 512, 64, 256, 16]
    layers = [nn.Sequential(nn.Linear(a, b), nn.GELU()) for a, b in zip(widths, widths[1:])]
    x = torch.randn(128, 64)
    return layers, x, int(0.55 * _step_peak(layers, x, [0]))


def _step_peak(layers, x, starts) -> int:
    """Measured peak of checkpoint_sequential + .float().sum().backward(), grads allocated."""
    from .checkpoint import checkpoint_sequential
    from .memory import track_memory
    for layer in layers:
        for p in layer.parameters():
            p.grad = torch.zeros_like(p)
    with track_memory() as mem:
        checkpoint_sequential(layers, x, boundaries=starts).float().sum().backward()
    return mem.peak_bytes


def _plan_for_budget(answer):
    from .checkpoint import segment_starts
    from .memory import profile_layers
    from .planner import optimal_segments
    layers, x, budget = budget_chain()
    if not isinstance(answer, (list, tuple)) or not all(
            isinstance(b, int) and not isinstance(b, bool) for b in answer):
        return False, "Answer a list of segment starts (layer indices), e.g. [0, 2, 5]."
    try:
        starts = segment_starts(len(layers), boundaries=list(answer))
    except ValueError as e:
        return False, str(e)
    measured = _step_peak(layers, x, starts)
    profile = [dataclasses.replace(p, forward_seconds=1.0)
               for p in profile_layers(layers, x, repeats=1)]
    best = optimal_segments(profile, budget)
    if measured > budget:
        return False, (f"{starts} measures {measured:,} bytes, over the budget of {budget:,}. "
                       "Predict before you run: planner.step_peak_bytes(starts, profile) tells "
                       "you which segment peaks; cut the wide layers finer or start the last "
                       "segment later.")
    if starts[-1] > best.boundaries[-1]:
        return False, (f"{starts} fits ({measured:,} of {budget:,} bytes) but recomputes "
                       f"{starts[-1]} layers; a plan that fits recomputes fewer. The last "
                       "segment is never recomputed: start it as early as the budget allows.")
    return True, (f"{starts} measures {measured:,} of {budget:,} bytes and recomputes "
                  f"{starts[-1]} layers, the fewest any plan that fits can.")


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
    Exercise("06.plan_for_budget", "The chain of exercises.budget_chain() (eight Linear -> "
             "GELU layers of unequal width, its input and a budget): choose segment starts so "
             "that one step (checkpoint_sequential + .float().sum().backward()) measures within "
             "the budget while recomputing as few layers as possible. Predict with "
             "planner.step_peak_bytes first; the check measures.", _plan_for_budget),
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
FUSED_BLOCK = dict(batch=8, seq=64, n_embd=128, n_head=4)


def fused_block_saved_bytes() -> int:
    """Measured bytes one `models.Block` with attn_impl="sdpa" keeps for backward (fp32, no
    dropout, FUSED_BLOCK's sizes), its input included: what exercise 08.1 predicts."""
    from .course import kept_after_forward
    from .models import GPTConfig, build_model
    b, t, c, h = (FUSED_BLOCK[k] for k in ("batch", "seq", "n_embd", "n_head"))
    model = build_model(GPTConfig(block_size=t, n_layer=1, n_head=h, n_embd=c, dropout=0.0,
                                  attn_impl="sdpa"))
    x = torch.randn(b, t, c, requires_grad=True)
    # allocated and alive after forward: everything saved but the input, plus the output,
    # which is as large as the input, so this is what the block keeps, its input included
    return kept_after_forward(model.blocks()[0], x)


def _fused_block(answer):
    expected = fused_block_saved_bytes()
    return _close(answer, expected, 0.02,
                  "Too few: count the block's input (kept by the first LayerNorm), the qkv "
                  "input, Q, K and V (the fused kernel keeps them), the output projection's "
                  "input, the second LayerNorm's input, the MLP's input and its two 4C-wide "
                  "tensors (GELU's input and output), all in fp32.",
                  "Too many: a fused kernel keeps no T x T scores (no softmax output, no "
                  "masks), and its output is the output projection's input, one tensor.")


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
    Exercise("08.fused_block_bytes", "The course's GPT block with fused attention "
             "(attn_impl='sdpa'): batch 8, T 64, C 128, 4 heads, fp32, dropout off. Predict the "
             "bytes it keeps for backward, its input included and its output not, with "
             "formulas.transformer_layer_terms or by hand; the next cell measures it.",
             _fused_block),
    Exercise("08.usable_gib", "An '80 GB' GPU and the keep-peak-under-85% rule: how many GiB may "
             "the planned peak use?", _usable_gib),
    Exercise("08.fallback_rungs", "Article order (densify, accumulate, shrink), start with no "
             "checkpointing, accumulation 1, batch 8, max_every=4; the step fits only at "
             "micro-batch <= 2: how many configurations does run_with_fallback try?",
             _fallback_rungs),
]})


# ----------------------------------------------------------------------------- lesson 11
def _kv_cache_mib(answer):
    from types import SimpleNamespace

    from .hf import kv_cache_bytes
    config = SimpleNamespace(num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                             hidden_size=512)
    expected = kv_cache_bytes(config, batch=4, seq=1024, dtype_bytes=2) / 2 ** 20
    return _close(answer, expected, 0.01,
                  "Too few: the cache holds keys AND values, for every layer, for the KV heads "
                  "(2 here, not 8), each head_dim = hidden / heads wide.",
                  "Too many: grouped-query attention caches only the 2 KV heads, not all 8 "
                  "query heads; bf16 is 2 bytes; 1 MiB is 2**20 bytes.")


@functools.lru_cache(maxsize=None)
def trap_adapters_with_grad(layers: int = 6, every: int = 3) -> int:
    """Measured: adapter tensors that get a gradient when a tiny Llama with LoRA on q_proj and
    v_proj (everything else frozen) is checkpointed reentrantly on every `every`-th layer,
    without enable_input_require_grads."""
    from . import hf
    model = hf.tiny_model("llama", layers=layers)
    hf.add_lora(model)
    hf.enable_checkpointing(model, use_reentrant=True, every_n_layers=every)
    model.disable_input_require_grads()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.train_step(model, hf.token_batch(2, 16, 256))
    return hf.trainable_with_grad(model)


def _trap_adapters(answer):
    expected = trap_adapters_with_grad()
    return _close(answer, expected, 1e-9,
                  "Too few: a reentrant checkpoint loses gradients only when none of its inputs "
                  "requires grad. Which checkpointed layers get an input computed by trainable "
                  "adapters in an earlier layer?",
                  "Too many: layer 0 is checkpointed and its input, the frozen embedding's "
                  "output, does not require grad: its adapters (A and B of q_proj and v_proj) "
                  "get nothing.")


@functools.lru_cache(maxsize=None)
def compiled_kept_mib(depth: int = 8, rows: int = 512, width: int = 256) -> float:
    """Measured: MiB the compiled forward of a Linear+GELU chain keeps for backward at
    activation_memory_budget=1.0 (same partitioner as inductor, eager execution)."""
    from .compiled import budget_sweep

    def make():
        torch.manual_seed(0)
        return nn.Sequential(*[m for _ in range(depth)
                               for m in (nn.Linear(width, width), nn.GELU())])
    row = budget_sweep(make, torch.randn(rows, width), budgets=(1.0,),
                       backend="aot_eager_decomp_partition", repeats=1)[0]
    return row.kept_bytes / 2 ** 20


def _compiled_kept(answer):
    expected = compiled_kept_mib()
    return _close(answer, expected, 0.02,
                  "Too few: each block keeps two (rows x width) fp32 tensors for backward: the "
                  "Linear's output (GELU's backward reads it) and the GELU's output (the next "
                  "Linear's weight gradient, or the loss, reads it).",
                  "Too many: the chain's input x existed before the step (it is not allocated "
                  "by the forward), and nothing else survives to the backward at budget 1.0.")


EXERCISES.update({e.key: e for e in [
    Exercise("11.kv_cache_mib", "A Llama-style model, 8 layers, hidden 512, 8 query heads and 2 "
             "key/value heads, trained in bf16 with use_cache=True on batch 4 x 1024 tokens "
             "with every layer checkpointed: how many MiB does the key/value cache pin?",
             _kv_cache_mib),
    Exercise("11.trap_adapters", "A 6-layer tiny Llama, LoRA (A and B) on q_proj and v_proj of "
             "every layer, everything else frozen, checkpointed with use_reentrant=True and "
             "every_n_layers=3, input grads NOT enabled: how many of the 24 adapter tensors "
             "get a gradient?", _trap_adapters),
    Exercise("11.compiled_kept_mib", "8 blocks of Linear(256, 256) -> GELU on a (512, 256) fp32 "
             "batch, compiled with activation_memory_budget=1.0: how many MiB does the "
             "forward keep for the backward?", _compiled_kept),
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
