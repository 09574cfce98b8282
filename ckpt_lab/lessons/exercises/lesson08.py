"""Exercises of lesson 8 (will it fit?): three committed predictions, each judged against a
planner computation or a measurement made when it is judged, and a build task: the model-state
bytes of LoRA fine-tuning, run against a peft measurement and `formulas.lora_state_bytes`."""
from __future__ import annotations

from functools import lru_cache

import torch

from .base import GIB, Exercise, name_set, one_of

MODELS = ("7B", "13B", "70B")
GPU = "141GB"
# the lesson's CPU sizes (course.sizes' first values), so a judge measures what the lesson did
CPU_SIZES = dict(batch=4, seq=64, n_layer=4, n_embd=128, n_head=4)
# the lesson's plans: (the model's policy, k blocks per segment under checkpoint_sequential)
STRATEGIES = {"none": ("none", 0), "selective": ("selective", 0), "segments of 1": ("none", 1),
              "segments of 2": ("none", 2)}


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
        hints.append(", ".join(f"The {m}'s state ({state[m]:.0f} GiB)"
                               for m in sorted(right - given))
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


def gpt_step(model, x, y, k: int):
    """The loss of one forward, the blocks in segments of k blocks under torch's
    checkpoint_sequential (every segment but the last checkpointed; 0: none), as the planner
    prices "segments of k blocks"."""
    from torch.utils.checkpoint import checkpoint_sequential
    embed, *blocks, head = model.layers()
    h, chain = embed(x), torch.nn.Sequential(*blocks)
    h = checkpoint_sequential(chain, len(blocks) // k, h, use_reentrant=False) if k else chain(h)
    return model.loss(head(h), y)


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
    for name, (policy, k) in STRATEGIES.items():
        model = build_model(cfg, policy=policy)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        with track_memory() as mem:
            gpt_step(model, x, y, k).backward()
        planner_name = f"{name} block{'s' if k > 1 else ''}" if k else name
        ratios[name] = mem.peak_bytes / planned[planner_name]
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


def _ladder_configs():
    """The lesson's course GPT at CPU sizes, and the configurations two orders of the ladder
    end at under a budget of 30% of the plain step's peak: (accumulate first, densify first)."""
    import logging

    from ckpt_lab.training import fallback
    from ckpt_lab.training.models import build_model
    logging.getLogger("ckpt_lab.training.fallback").setLevel(logging.ERROR)   # the rungs, unprinted
    cfg, x, y = course_gpt()
    model = build_model(cfg)
    plain = fallback.StepConfig(0, 1, x.shape[0])
    limit = int(0.30 * fallback.chain_step(model, x, y)(plain).peak_bytes)
    step = fallback.chain_step(model, x, y, limit_bytes=limit)
    ends = [fallback.run_with_fallback(step, plain, order=order, max_every=cfg.n_layer).config
            for order in (("accumulate", "densify", "shrink"), ("densify", "accumulate", "shrink"))]
    return model, x, y, plain, ends


@lru_cache(maxsize=1)
def ladder_flop_ratios() -> tuple[float, float]:
    """FLOPs of the configurations the two ladders end at, each over the plain step's."""
    from ckpt_lab.training import fallback
    model, x, y, plain, ends = _ladder_configs()
    base = fallback.config_flops(model, x, y, plain)
    return tuple(fallback.config_flops(model, x, y, c) / base for c in ends)


def ladder_flops() -> str:
    """Measured: which ladder's end runs more FLOPs per step (or 'same')."""
    accumulate, densify = ladder_flop_ratios()
    if abs(accumulate - densify) < 0.01:
        return "same"
    return "densify first" if densify > accumulate else "accumulate first"


_ladder_flops = one_of(
    ("accumulate first", "densify first", "same"), ladder_flops, normalise=str.lower,
    right="{expected} costs more: a checkpoint re-runs its segment's forward in backward "
          "(x{densify:.2f} FLOPs here), while accumulation splits the same arithmetic into "
          "micro-batches (x{accumulate:.2f}).",
    hints={"same": "Both fit, but only one adds arithmetic: which one runs a forward twice?",
           "accumulate first": "Accumulation splits the batch into micro-batches that together "
                               "do the arithmetic of one step; a checkpoint re-runs forwards "
                               "(x{densify:.2f} FLOPs here against x{accumulate:.2f})."},
    wrong="It is {expected}.",
    facts=lambda: dict(zip(("accumulate", "densify"), ladder_flop_ratios())))


# ------------------------------------------------------------------------------ build task
LORA_OPTIMIZERS = ("adamw", "adamw8bit")


def _llama2_7b_cases():
    """(args, library bytes) for Llama 2 7B at r = 16: 16-, 8- and 4-bit bases, two optimizers."""
    from ckpt_lab import capacity
    cases = []
    for bits in (16, 8, 4):
        for optimizer in LORA_OPTIMIZERS:
            cfg = capacity.TransformerConfig.named("llama2-7b", lora_rank=16, base_bits=bits,
                                                   optimizer=optimizer)
            shapes = list(cfg.linear_shapes().values()) * cfg.layers
            other = cfg.num_params - sum(o * i for o, i in shapes)
            cases.append(((shapes, other, 16, bits, optimizer), cfg.finetune_state()))
    return cases


def _lora_state(answer):
    if not callable(answer):
        return False, ("Pass your function itself: exercises.check('08.lora_state', "
                       "lora_state_bytes).")
    from ckpt_lab.lessons import finetune
    shapes, other = finetune.tiny_shapes()
    measured = finetune.measured_state(16, 16, "adamw")
    cases = [((shapes, other, 16, 16, "adamw"), measured)] + _llama2_7b_cases()
    for (shapes, other, r, bits, optimizer), want in cases:
        parts = None if isinstance(want, int) else want
        want = want if isinstance(want, int) else want.total
        try:
            got = answer(shapes, other, r, base_bits=bits, optimizer=optimizer)
        except Exception as e:         # the learner's code: any error is a hint, not a crash
            return False, f"Your function raised {type(e).__name__}: {e}"
        if got is None:
            return False, ("not answered yet: lora_state_bytes returns None. Write its body and "
                           "return the bytes.")
        if isinstance(got, bool) or not isinstance(got, (int, float)) or got != got:
            return False, f"Return a number of bytes, got {got!r}."
        if abs(got / want - 1) > 0.01:
            what = ("the tiny Llama measured with peft, bf16 base, AdamW" if parts is None else
                    f"Llama 2 7B, {bits}-bit base, {optimizer}")
            split = ("" if parts is None else
                     f" (base {parts.base / GIB:.2f} GiB, adapters {parts.adapters / GIB:.3f}, "
                     f"their gradients {parts.adapter_grads / GIB:.3f}, optimizer "
                     f"{parts.optimizer / GIB:.3f})")
            return False, (f"{what}: yours {got:,.0f} bytes, expected {want:,.0f}{split}. "
                           "Only the adapters train: fp32 weights, fp32 "
                           "gradients and the optimizer's state (8 bytes, or about 2 for 8-bit "
                           "Adam) per adapter value; the base is frozen (no gradient, no "
                           "state), 4.127 bits a weight when 4-bit.")
    return True, (f"Within 1% of the peft measurement ({measured:,} bytes) and of "
                  "formulas.lora_state_bytes for Llama 2 7B on 16-, 8- and 4-bit bases.")


EXERCISES = [
    Exercise("08.fits_141gb", "Llama 2 7B, 13B and 70B, mixed-precision Adam, sequence 4096: "
             "which can train on ONE 141 GB GPU (total peak, model state included, under 85%) "
             "with some checkpointing plan? "
             "Answer a set such as {'7B', '13B'}.", _fits, expected=models_that_fit),
    Exercise("08.planner_error", "The planner counts what each layer keeps (Megatron's "
             "terms). Against a measured step of the course's GPT, does it read 'high' or "
             "'low', and where most: 'none', 'selective', 'segments of 1' or 'segments of 2'? "
             "Answer a pair like ('high', 'none').", _planner_error, expected=planner_error),
    Exercise("08.ladder_flops", "Under the same simulated GPU, one ladder accumulates first "
             "(halves the micro-batch, same global batch), another densifies first (checkpoints "
             "more). Both end at a configuration that fits. Which end runs more FLOPs per step: "
             "'accumulate first', 'densify first' or 'same'?", _ladder_flops,
             expected=ladder_flops),
    Exercise("08.lora_state", "Build task: write lora_state_bytes(shapes, other_params, r, "
             "base_bits=16, optimizer='adamw'), the model-state bytes of LoRA fine-tuning, and "
             "pass the function.", _lora_state),
]
