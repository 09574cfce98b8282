"""Exercises of lesson 8 (will it fit?): three committed predictions, each judged against a
planner computation or a measurement made when it is judged."""
from __future__ import annotations

from functools import lru_cache

import torch

from .base import GIB, Exercise, name_set, one_of

MODELS = ("7B", "13B", "70B")
GPU = "141GB"
# the lesson's CPU sizes (course.sizes' first values), so a judge measures what the lesson did
CPU_SIZES = dict(batch=4, seq=64, n_layer=4, n_embd=128, n_head=4)
STRATEGIES = {"none": "none", "selective": "selective", "segments of 1": "every",
              "segments of 2": "every:2"}


def models_that_fit(gpu: str = GPU) -> frozenset:
    """Llama 2 sizes for which some plan of `capacity.strategy_rows` fits one GPU of `gpu`."""
    from ckpt_lab import capacity
    device = capacity.parse_bytes(gpu)
    return frozenset(m for m in MODELS if capacity.cheapest(capacity.strategy_rows(
        capacity.TransformerConfig.named(f"llama2-{m.lower()}", micro_batch=8), device)))


def _state_and_budget(gpu: str = GPU) -> tuple[dict, float]:
    """GiB of mixed-precision Adam state per model, and the GiB under 85% of `gpu`."""
    from ckpt_lab import capacity, formulas
    state = {m: formulas.model_state_bytes(
        capacity.TransformerConfig.named(f"llama2-{m.lower()}").num_params) / GIB for m in MODELS}
    return state, capacity.DEFAULT_HEADROOM * capacity.parse_bytes(gpu) / GIB


def _fits_right(right: set) -> str:
    state, budget = _state_and_budget()
    return (f"only {', '.join(sorted(right))}: its state ("
            + ", ".join(f"{state[m]:.0f} GiB" for m in sorted(right))
            + f") leaves room under the {budget:.1f} GiB budget; the others' state alone does "
            "not fit.")


def _fits_hints(given: set, right: set) -> str:
    state, budget = _state_and_budget()
    hints = []
    if given - right:
        hints.append("Size the state first: " + ", ".join(
            f"the {m}'s is {state[m]:,.0f} GiB" for m in sorted(given - right))
            + f", over the {budget:.1f} GiB budget before any activation.")
    if right - given:
        hints.append(", ".join(f"The {m}'s state ({state[m]:.0f} GiB)" for m in sorted(right - given))
                     + f" is under the {budget:.1f} GiB budget, and checkpointing with "
                     "accumulation brings the activations down to a few GiB.")
    return " ".join(hints)


_fits = name_set(MODELS, models_that_fit, _fits_right, _fits_hints, what="model sizes")


def course_gpt():
    """The course's GPT config at the lesson's CPU sizes, and one batch (inputs, targets)."""
    from ckpt_lab.training.models import get_config
    s = CPU_SIZES
    cfg = get_config("gpt-cpu", block_size=s["seq"], n_layer=s["n_layer"], n_embd=s["n_embd"],
                     n_head=s["n_head"], dropout=0.0)
    torch.manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (s["batch"], s["seq"] + 1))
    return cfg, x[:, :-1].contiguous(), x[:, 1:].contiguous()


@lru_cache(maxsize=1)
def planner_ratios() -> dict:
    """measured / planned activation peak of each strategy at the lesson's CPU sizes, one step."""
    from ckpt_lab import capacity, track_memory
    from ckpt_lab.training.models import build_model
    cfg, x, y = course_gpt()
    small = capacity.TransformerConfig(cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.block_size,
                                       vocab=cfg.vocab_size, micro_batch=x.shape[0],
                                       precision="fp32", dropout=False)
    planned = {r.strategy: r.activation_bytes for r in capacity.strategy_rows(small, 2 ** 40)
               if r.accumulation_steps == 1}
    ratios = {}
    for name, policy in STRATEGIES.items():
        model = build_model(cfg, policy=policy)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        with track_memory() as mem:
            model(x, y).backward()
        key = {"segments of 1": "segments of 1 block", "segments of 2": "segments of 2 blocks"}.get(name, name)
        ratios[name] = mem.peak_bytes / planned[key]
    return ratios


def planner_error() -> tuple[str, str]:
    """Measured: does the planner read high or low, and at which strategy most?"""
    ratios = planner_ratios()
    worst = max(ratios, key=lambda n: abs(ratios[n] - 1))
    return ("low" if ratios[worst] > 1 else "high"), worst


def _planner_error(answer):
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2
            and all(isinstance(a, str) for a in answer)):
        return False, ("Answer a pair like ('high', 'none'): 'high' or 'low', then one of "
                       f"{sorted(STRATEGIES)} (or 'densest').")
    direction, where = answer[0].lower(), answer[1].lower().replace("densest", "segments of 1")
    right_dir, right_where = planner_error()
    ratios = planner_ratios()
    spread = f"measured/planned {min(ratios.values()):.2f}-{max(ratios.values()):.2f}"
    if direction not in ("high", "low") or where not in STRATEGIES:
        return False, f"Use 'high' or 'low', and one of {sorted(STRATEGIES)}."
    if direction != right_dir:
        return False, (f"It reads {right_dir} ({spread}): the planner counts what the layers "
                       "keep, not the norms' statistics, the causal mask, the logits' gradient "
                       "or backward's working memory, which the measurement sees.")
    if where != right_where:
        return False, (f"{right_dir.capitalize()}, yes, but most at {right_where} ({spread}): "
                       "checkpointing shrinks the kept activations, not backward's working "
                       "memory, so the share the planner misses grows as the plan gets denser.")
    return True, (f"{right_dir}, most at {right_where} ({spread}): what the planner leaves out "
                  "(backward's working memory) is a larger share of a denser plan.")


@lru_cache(maxsize=1)
def accumulation_time_ratio(repeats: int = 9) -> float:
    """CPU time of the batch in 4 accumulated micro-batches over one plain step (same FLOPs),
    measured once per process: the judge and the solutions' printout read the same timing."""
    from ckpt_lab.training import fallback
    from ckpt_lab.training.models import build_model
    cfg, x, y = course_gpt()
    model = build_model(cfg)
    plain = fallback.StepConfig(0, 1, x.shape[0])
    accumulated = fallback.StepConfig(0, 4, x.shape[0])
    one, four = fallback.median_seconds(model, x, y, [plain, accumulated], repeats=repeats)
    return four / one


def accumulation_time() -> str:
    """Measured on this CPU: is accumulating 4 micro-batches 'slower', 'same' or 'faster'?"""
    r = accumulation_time_ratio()
    return "slower" if r > 1.1 else "faster" if r < 0.9 else "same"


_accumulation_time = one_of(
    ("slower", "same", "faster"), accumulation_time, normalise=str.lower,
    right="{expected}: every micro-batch repeats every operation, and at these sizes a step's "
          "time is mostly per-operation overhead, not arithmetic (the measured factor is on "
          "screen above).",
    hints={"same": "FLOPs are the same, but the CPU time is not: each of the 4 micro-batches "
                   "runs every operation, and small operations cost their overhead whatever "
                   "their size."},
    wrong="It ran {expected} on this CPU: the arithmetic is the same, the number of operations "
          "is 4 times larger.")


EXERCISES = [
    Exercise("08.fits_141gb", "Llama 2 7B, 13B and 70B, mixed-precision Adam, sequence 4096: "
             "which can train on ONE 141 GB GPU (peak under 85%) with some checkpointing plan? "
             "Answer a set such as {'7B', '13B'}.", _fits, expected=models_that_fit),
    Exercise("08.planner_error", "The planner counts what each layer keeps (Megatron's "
             "terms). Against a measured step of the course's GPT, does it read 'high' or "
             "'low', and where most: 'none', 'selective', 'segments of 1' or 'segments of 2'? "
             "Answer a pair like ('high', 'none').", _planner_error, expected=planner_error),
    Exercise("08.accumulation_time", "Accumulating a batch in 4 micro-batches runs the same "
             "FLOPs as one step. On a CPU, at this lesson's sizes, is it 'slower', 'same' or "
             "'faster'?", _accumulation_time, expected=accumulation_time),
]
