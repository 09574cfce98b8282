"""Exercises of lesson 10 (your own model): three committed predictions about the lesson's default
model, each answer measured when judged (profile_layers, the planner on that profile, PyTorch's
checkpoint); and one build task, a function that checkpoints any model's blocks to fit a
budget, judged by running it on two models and measuring the step (its peak, its gradients,
the blocks it recomputes)."""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from ckpt_lab.checkpoint import checkpoint

from .base import Exercise, _number, one_of
from .lesson02 import _dropout_chain, _grads
from .threads import one_thread

WIDTH, BATCH = 128, 512        # the default model's CPU sizes (course.sizes' first values)


def default_model(width: int = WIDTH) -> nn.Sequential:
    """The lesson's default model, as its BRING YOUR MODEL cell builds it (seed 0)."""
    torch.manual_seed(0)

    def block(n_in, n_out, p=0.1):
        return nn.Sequential(nn.Linear(n_in, n_out), nn.GELU(), nn.Dropout(p))
    w = width
    return nn.Sequential(block(64, 4 * w), block(4 * w, 4 * w), block(4 * w, w // 2),
                         block(w // 2, 8 * w), block(8 * w, w), block(w, w), nn.Linear(w, 10))


@lru_cache(maxsize=1)
def default_profile():
    """profile_layers of the default model on a batch of BATCH (memory fields are exact)."""
    from ckpt_lab.plan.profile import profile_layers
    model = default_model().train()
    return tuple(profile_layers(list(model), torch.randn(BATCH, 64), repeats=1))


def largest_layer() -> int:
    """Index of the default model's layer that keeps the most bytes for backward."""
    profile = default_profile()
    return max(range(len(profile)), key=lambda i: profile[i].act_bytes)


def _largest_layer(answer):
    value, right = _number(answer), largest_layer()
    profile = default_profile()
    if value == right:
        return True, (f"layer {right}: it keeps GELU's input and dropout's mask at the width of "
                      "its output, the widest in the model; its own narrow input costs little.")
    if not (value == int(value) and 0 <= value < len(profile)):
        return False, f"Give a layer index from 0 to {len(profile) - 1}."
    i = int(value)
    return False, (f"Layer {i} keeps {profile[i].act_bytes / profile[right].act_bytes:.0%} of "
                   f"what layer {right} keeps: a Linear keeps its input, GELU its input, Dropout "
                   "a mask as wide as its output; the widest output wins, not the widest input.")


def finest_and_around() -> tuple[list[int], list[int]]:
    """Two plans of the default model: a checkpoint before every layer, and checkpoints only
    before and after the layer that keeps the most."""
    n, big = len(default_profile()), largest_layer()
    return list(range(n)), sorted({0, big, big + 1} - {n})


def finest_plan() -> str:
    """Which of `finest_and_around`'s plans has the lower predicted step peak (or "same")."""
    from ckpt_lab import planner
    profile = list(default_profile())
    every, around = (planner.step_peak_bytes(p, profile) for p in finest_and_around())
    return "same" if every == around else "around the largest" if around < every else "every layer"


def _finest_facts() -> dict:
    from ckpt_lab import planner
    profile = list(default_profile())
    every, around = finest_and_around()
    none = planner.step_peak_bytes([0], profile)
    return dict(every=planner.step_peak_bytes(every, profile) / none,
                around=planner.step_peak_bytes(around, profile) / none, plan=around,
                big=largest_layer())


_finest_plan = one_of(
    ("every layer", "around the largest", "same"), finest_plan, normalise=str.lower,
    right="Around the largest: {plan} peaks at {around:.0%} of the plain step, every layer at "
          "{every:.0%}. A checkpoint keeps its segment's input until backward gets there, so with "
          "one before every layer all the earlier layers' outputs are alive while layer {big} is "
          "rebuilt; {plan} keeps only layer {big}'s own input.",
    hints={"every layer": "More checkpoints keep more inputs alive. While backward rebuilds layer "
                          "{big} (it cannot be split), the output every earlier checkpoint kept "
                          "is still held: {every:.0%} of the plain step against {around:.0%} "
                          "for {plan}.",
           "same": "Count what is alive while layer {big} is rebuilt: with a checkpoint before "
                   "every layer, every earlier layer's output waits too ({every:.0%} of the "
                   "plain step against {around:.0%})."},
    wrong="It is {expected}.", facts=_finest_facts)


def rng_matters_for_dropout() -> bool:
    """Measured: do a Dropout chain's gradients change when the checkpoint skips the RNG replay?"""
    chain = _dropout_chain()
    x = torch.randn(64, 16)
    plain = _grads(chain, lambda f, t: f(t), x)
    loose = _grads(chain, lambda f, t: checkpoint(f, t, preserve_rng_state=False), x)
    return not all(torch.equal(a, b) for a, b in zip(plain, loose))


_rng_replay = one_of(
    (True, False), rng_matters_for_dropout,
    right="Right: without the replay the recompute draws a new dropout mask, so backward "
          "differentiates a different function than the forward ran.",
    wrong="Measured: with preserve_rng_state=False the recompute draws a new dropout mask, and "
          "the gradients differ from a plain run's.")


# ------------------------------------------------------------------- the build task: fit(...)
class TokenEncoder(nn.Module):
    """Token ids -> embedding -> torch's nn.TransformerEncoder (causal, dropout) -> logits ->
    the loss: a model whose blocks are not ckpt_lab's `Block`."""

    def __init__(self, vocab: int = 256, width: int = 32, layers: int = 4, seq: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, 2, 4 * width, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)
        mask = nn.Transformer.generate_square_subsequent_mask(seq)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, idx, targets):
        h = self.encoder(self.embed(idx), mask=self.mask, is_causal=True)
        return F.cross_entropy(self.head(h).flatten(0, 1), targets.flatten())


def fit_cases():
    """(name, model, step, block class) of the models the build task runs on, each fresh
    (seed 0): a ckpt_lab GPT and a TokenEncoder, both with dropout, 4 blocks, 32 tokens x 4."""
    from ckpt_lab.training.models import Block, build_model, get_config
    torch.manual_seed(0)
    gpt = build_model(get_config("gpt-cpu", block_size=32, n_embd=32, n_layer=4, dropout=0.1))
    torch.manual_seed(0)
    encoder = TokenEncoder()
    idx = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    tgt = torch.roll(idx, -1, dims=1)
    return [("the lesson's GPT", gpt.train(), lambda: gpt(idx, tgt), Block),
            ("a model on nn.TransformerEncoder", encoder.train(), lambda: encoder(idx, tgt),
             nn.TransformerEncoderLayer)]


def _step_grads(model, step, seed: int = 7):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    step().backward()
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def _step_peak(model, step) -> int:
    from ckpt_lab import track_memory
    model.zero_grad(set_to_none=True)            # the step allocates the gradients: they count
    with track_memory() as mem:
        step().backward()
    model.zero_grad(set_to_none=True)
    return mem.peak_bytes


@lru_cache(maxsize=None)
def blocks_needed(case: int, budget: int) -> int:
    """How many blocks the planner checkpoints to fit `budget` on `fit_cases()[case]` (the
    exact step model of two recorded steps; measured once per process)."""
    from ckpt_lab.plan.module_planner import plan_modules
    _, model, step, block = fit_cases()[case]
    model.zero_grad(set_to_none=True)
    return len(plan_modules(model, block, step, budget).names)


def _fit_one(answer, case: int):
    """None where `answer` fits model `case` of `fit_cases()`, else why not."""
    from ckpt_lab import CheckpointedModules, checkpoint_modules
    name, model, step, block = fit_cases()[case]
    plain = _step_grads(model, step)
    with checkpoint_modules(model, block):
        everything = _step_peak(model, step)
    budget = (everything + _step_peak(model, step)) // 2     # some blocks must be checkpointed
    try:
        handle = answer(model, step, budget)
    except Exception as e:  # the learner's code: report, do not raise
        return f"On {name}, fit raised {type(e).__name__}: {e}"
    if handle is None:
        return ("not answered yet: fit returns None. Write its body (the hint above the cell) and "
                "return the handle checkpoint_modules gives.")
    if not isinstance(handle, CheckpointedModules):
        return (f"fit returned a {type(handle).__name__}; apply the plan with "
                "checkpoint_modules(model, plan.select) and return the handle it gives.")
    try:
        peak, grads, names = _step_peak(model, step), _step_grads(model, step), list(handle.names)
    finally:
        handle.remove()
    if any("forward" in vars(m) for m in model.modules()):
        return (f"On {name}, a module is still wrapped after handle.remove(): apply the plan "
                "with checkpoint_modules.")
    if peak > budget:
        return (f"On {name}, the step peaks at {peak:,} bytes, over the budget of {budget:,}, "
                f"with {len(names)} block(s) checkpointed. Let plan_modules choose them.")
    if not all(a is None and b is None or a is not None and b is not None and torch.equal(a, b)
               for a, b in zip(grads, plain)):
        return (f"On {name}, the gradients differ from a plain step's. Keep checkpoint_modules' "
                "defaults: its checkpoint replays the random generator, so dropout draws the "
                "forward's masks again.")
    needed = blocks_needed(case, budget)
    if len(names) > needed:
        return (f"On {name}, you checkpoint {len(names)} blocks where {needed} fit the budget: "
                "every extra block is a forward recomputed for nothing. Plan for the budget.")
    return None


def _fit_budget(answer):
    if not callable(answer):
        return False, ("Pass your function itself: exercises.check('10.fit_budget', fit), a "
                       "function (model, step, budget_bytes) -> the handle of checkpoint_modules.")
    with one_thread():
        for case in range(len(fit_cases())):
            why = _fit_one(answer, case)
            if why:
                return False, why
    return True, ("On both models the step fits its budget, every gradient equals a plain "
                  "step's bit for bit (dropout included), and no block is recomputed that the "
                  "budget did not need.")


EXERCISES = [
    Exercise("10.largest_layer", "The lesson's default model (blocks Linear -> GELU -> Dropout, "
             "widths 64 -> 4W -> 4W -> W/2 -> 8W -> W -> W -> 10): which layer index keeps the "
             "most bytes for backward?", _largest_layer, expected=largest_layer),
    Exercise("10.finest_plan", "On the default model: a checkpoint before every layer, or "
             "checkpoints only before and after the layer that keeps the most: which plan has "
             "the lower step peak? Answer 'every layer', 'around the largest' or 'same'.",
             _finest_plan, expected=finest_plan),
    Exercise("10.rng_replay", "A model with Dropout, checkpointed with preserve_rng_state=False: "
             "do its gradients differ from a plain run's? Answer True or False.", _rng_replay,
             expected=rng_matters_for_dropout),
    Exercise("10.fit_budget", "Build task: pass your function fit(model, step, budget_bytes), "
             "which checkpoints the blocks of any model (found from the model) so that step() "
             "and its backward peak within budget_bytes, and returns checkpoint_modules' "
             "handle. It runs on a GPT and on torch's nn.TransformerEncoder.", _fit_budget),
]
