"""Exercises of lesson 12: with more GPUs, which memory shrinks, and does checkpointing still pay?

Three committed predictions and a build task. The bands that halve come from
`parallel_formulas` and `formulas` (what the lesson measures them against); the DDP
configurations that fail are run, on one rank of a tiny model (`distributed.launch`,
world_size=1: DDP's reducer raises the same errors on one rank as on two); the micro-batches a
stage holds come from walking the schedule `scale_out.pipeline_step` runs. The build task, the
1F1B order of a stage, is walked through the pipeline's dependencies for several sizes, then
run on two real stages, whose measured micro-batches in flight and gradients are compared with
1F1B's and one process's.
"""
from __future__ import annotations

import functools

from .base import Exercise, name_set, not_quite

BANDS = ("weights", "gradients", "buckets", "Adam", "gathered weights", "activations")
# Band names as a learner may write them: any case, or as lesson 12's bars name the last one.
_BAND_NAMES = {b.lower(): b for b in BANDS} | {"activations & buffers": "activations"}


@functools.lru_cache(maxsize=None)
def fsdp_halving_bands(world: int = 2, rows: int = 8) -> frozenset:
    """Bands of a rank's memory that FSDP on `world` ranks holds at half (within 10%) of one
    process's, by the formulas lesson 12 checks its measurements against."""
    from ckpt_lab import formulas, parallel_formulas as pf
    from ckpt_lab.training.models import build_model, get_config
    cfg = get_config("gpt-cpu", block_size=64, n_layer=4, n_embd=128, n_head=4, dropout=0.0)
    numels = [p.numel() for p in build_model(cfg).parameters()]

    def activations(batch):
        layers = formulas.gpt_layers(batch, cfg.block_size, cfg.n_layer, cfg.n_embd,
                                     cfg.n_head, cfg.vocab_size, 4, False)
        return formulas.chain_peak_bytes(layers, build_model(cfg).segments(),
                                         batch * cfg.block_size, cfg.vocab_size)

    per_state = pf.fsdp_state_bytes(numels, world) / pf.fsdp_state_bytes(numels, 1)
    ratios = {"weights": per_state, "gradients": per_state, "Adam": per_state,
              "activations": activations(rows // world) / activations(rows),
              "buckets": 0.0,                 # neither FSDP nor one process keeps any
              "gathered weights": float("inf")}   # FSDP only: one unit at a time
    return frozenset(b for b, r in ratios.items() if abs(r - 1 / world) <= 0.1 / world)


def _bands_hints(given: set, expected: set) -> str:
    hints = []
    if "activations" not in given:
        hints.append("at a fixed global batch each rank runs 1/D of the rows, so its "
                     "activations are those of half the batch")
    if not {"weights", "gradients", "Adam"} <= given:
        hints.append("FSDP shards the weights, their gradients and Adam's moments alike")
    if "buckets" in given:
        hints.append("FSDP keeps no buckets: it reduce-scatters each unit's gradients")
    if "gathered weights" in given:
        hints.append("gathered weights do not halve: they appear, one unit at a time")
    return not_quite(hints)


_bands = name_set(
    BANDS, fsdp_halving_bands, wrong=_bands_hints, what="bands",
    normalise=lambda name: _BAND_NAMES.get(name.strip().lower(), name),
    right="weights, gradients and Adam's moments are sharded (16 B/param / 2 per rank), and at a "
          "fixed global batch each rank runs half the rows, so its activations halve too. DDP "
          "halves only the activations.")


@functools.lru_cache(maxsize=None)
def failing_ddp_configurations() -> frozenset:
    """Measured: the numbers (1-5, the first five of `scale_out.PITFALLS`, PyTorch's checkpoint;
    6 to 8 are ckpt_lab's designs, no part of the question) of the DDP configurations whose
    two steps raise, run on one rank of a tiny GPT."""
    from ckpt_lab import distributed
    from ckpt_lab.training.data import TextBatches, load_corpus
    from ckpt_lab.lessons import scale_out
    from ckpt_lab.training.models import get_config
    cfg = get_config("gpt-cpu", block_size=16, n_layer=2, n_embd=32, n_head=2, dropout=0.0)
    x, y = TextBatches(load_corpus(), 2, cfg.block_size).get(0)
    rows = distributed.launch(scale_out.ddp_pitfalls, cfg, x, y, world_size=1,
                              backend="gloo", timeout=120)[0]
    return frozenset(i + 1 for i, r in enumerate(rows[:5]) if r["outcome"] == "error")


def _ddp_hints(given: set, expected: set) -> str:
    hints = []
    if 1 in expected - given:
        hints.append("1: find_unused_parameters walks the graph after the forward, and a "
                     "reentrant checkpoint ran its parameters under no_grad")
    if 4 in expected - given:
        hints.append("4: a reentrant checkpoint whose input needs no grad gives its "
                     "parameters no gradient, so DDP's reduction never finishes")
    if given - expected:
        hints.append(f"{sorted(given - expected)} ran both steps: static_graph, the "
                     "non-reentrant design and the default options all work")
    return not_quite(hints)


_ddp_failures = name_set(
    (1, 2, 3, 4, 5), failing_ddp_configurations, wrong=_ddp_hints, convert=int,
    what="configuration numbers",
    right="1 and 4: with find_unused_parameters DDP marks the reentrant checkpoint's parameters "
          "ready twice; with a frozen embedding they get no gradient and step 2 refuses to start.")


@functools.lru_cache(maxsize=None)
def held_by_stage(stages: int = 4, micro_batches: int = 8) -> tuple[int, ...]:
    """Computed: the most micro-batches each stage holds under 1F1B, by walking the schedule
    `scale_out.pipeline_step` runs."""
    from ckpt_lab.lessons.scale_out import schedule
    held = []
    for rank in range(stages):
        now = most = 0
        for op, _ in schedule("1f1b", stages, rank, micro_batches):
            now += 1 if op == "F" else -1
            most = max(most, now)
        held.append(most)
    return tuple(held)


def first_and_last_stage() -> tuple[int, int]:
    """The right answer: what stage 0 and stage 3 hold at most (4 stages, 8 micro-batches)."""
    held = held_by_stage()
    return held[0], held[-1]


def _stage_in_flight(answer):
    try:
        first, last = (int(a) for a in answer)
    except (TypeError, ValueError):
        return False, "Give two numbers: (held on stage 0, held on stage 3)."
    expected = first_and_last_stage()
    if (first, last) == expected:
        return True, (f"{expected}: stage i holds at most pp - i micro-batches: stage 0 runs "
                      "forwards until micro-batch 0 has come back through all 4 stages; the "
                      "last stage runs each backward right after its forward. 8 or 80 "
                      "micro-batches: the same.")
    if first == 8:
        return False, ("8 is GPipe's answer (every forward, then every backward). Under 1F1B "
                       "stage 0 starts its first backward once micro-batch 0 has gone through "
                       "all 4 stages and back: how many forwards has it run by then?")
    return False, ("Count the forwards stage 0 runs before micro-batch 0's gradient comes back "
                   "from stage 3, and what stage 3, which turns each forward straight into "
                   "a backward, ever holds.")


# ---------------------------------------------------------------- build task: the 1F1B order
# (pp, M) the learner's order is walked for: more and fewer micro-batches than stages, one
# stage, one micro-batch.
ORDER_CASES = ((2, 4), (4, 8), (4, 2), (3, 5), (1, 3), (5, 1))


def _held(order) -> int:
    now = most = 0
    for op, _ in order:
        now += 1 if op == "F" else -1
        most = max(most, now)
    return most


def _walk(fn, pp: int, M: int):
    """(orders by stage, None) for the learner's `fn` at (pp, M), or (None, what is wrong):
    each order checked, then walked through the pipeline's dependencies."""
    from ckpt_lab.lessons import plots, scale_out
    try:
        orders = {i: fn(pp, i, M) for i in range(pp)}
    except Exception as e:  # noqa: BLE001 -- the learner's code: report, do not raise
        return None, f"one_f_one_b({pp}, i, {M}) raised {type(e).__name__}: {e}"
    if any(o is None for o in orders.values()):
        return None, None
    try:
        orders = {i: scale_out.check_order(o, M) for i, o in orders.items()}
    except Exception as e:  # noqa: BLE001 -- a wrong shape of answer: say what
        return None, f"pp={pp}, M={M}: {e}"
    for i in range(1, pp):
        if [j for op, j in orders[i] if op == "F"] != [j for op, j in orders[i - 1] if op == "F"] \
                or [j for op, j in orders[i] if op == "B"] != \
                [j for op, j in orders[i - 1] if op == "B"]:
            return None, (f"pp={pp}, M={M}: stages {i - 1} and {i} run their micro-batches in "
                          "different orders. Messages between two stages pair up in the order "
                          "they are sent: every stage runs its forwards, and its backwards, in "
                          "the same order of j")
    try:
        plots.pipeline_times(orders)
    except ValueError:
        return None, (f"pp={pp}, M={M}: the stages wait on each other for ever. A stage's F(j) "
                      "waits for F(j) on the stage before, its B(j) for B(j) on the stage after: "
                      "some stage runs a backward whose gradient needs a forward that comes "
                      "after it")
    return orders, None


def _step_time(orders) -> float:
    from ckpt_lab.lessons import plots
    return max(ops[-1][3] for ops in plots.pipeline_times(orders).values() if ops)


@functools.lru_cache(maxsize=1)
def _tiny_pipeline():
    """A 2-stage GPT small enough to run at check time, its batch and one process's gradients."""
    from ckpt_lab.training.data import TextBatches, load_corpus
    from ckpt_lab.lessons import scale_out
    from ckpt_lab.training.models import get_config
    cfg = get_config("gpt-cpu", block_size=16, n_layer=2, n_embd=32, n_head=2, dropout=0.0)
    x, y = TextBatches(load_corpus(), 4, cfg.block_size).get(0)
    return cfg, x, y, scale_out.single_step(cfg, x, y)[1]


def _run_on_two_stages(fn, M: int = 4):
    """The learner's orders run on 2 real stages (gloo): per stage, the most micro-batches it
    held (measured) and whether its gradients are one process's."""
    import torch

    from ckpt_lab import distributed
    from ckpt_lab.lessons import scale_out
    cfg, x, y, grads = _tiny_pipeline()
    orders = [scale_out.check_order(fn(2, i, M), M) for i in range(2)]
    stages = distributed.launch(scale_out.pipeline_step, cfg, x, y, M, "1f1b", (), orders,
                                world_size=2, backend="gloo", timeout=120)
    mine = lambda st, name: st["layers"][0] <= int(name.split(".")[1]) < st["layers"][1]  # noqa: E731
    same = all(torch.allclose(st["grads"][n], g, rtol=1e-5, atol=1e-6) for st in stages
               for n, g in grads.items() if mine(st, n))
    return [st["in_flight"] for st in stages], same


def _one_f_one_b(answer):
    from ckpt_lab import parallel_formulas as pf
    from ckpt_lab.lessons import scale_out
    if not callable(answer):
        return False, ("Pass your function itself: exercises.check('12.one_f_one_b', "
                       "one_f_one_b), where one_f_one_b(pp, i, M) returns a list of "
                       "('F', j) and ('B', j).")
    for pp, M in ORDER_CASES:
        orders, wrong = _walk(answer, pp, M)
        if orders is None and wrong is None:
            return False, ("not answered yet: your one_f_one_b returns None. Return the list "
                           "of ('F', j) and ('B', j) that stage i runs, in order.")
        if wrong:
            return False, wrong + "."
        held = [_held(orders[i]) for i in range(pp)]
        most = [pf.in_flight("1f1b", pp, i, M) for i in range(pp)]
        if any(h > m for h, m in zip(held, most)):
            i = next(i for i in range(pp) if held[i] > most[i])
            gpipe = " That is GPipe's order: every forward, then every backward." \
                if held == [M] * pp else ""
            return False, (f"pp={pp}, M={M}: stage {i} holds {held[i]} micro-batches; 1F1B holds "
                           f"at most min(pp - i, M) = {most[i]}.{gpipe} Stage i needs only as "
                           "many forwards as fit before micro-batch 0's gradient comes back, "
                           "then one backward per forward.")
        ours = {i: scale_out.schedule("1f1b", pp, i, M) for i in range(pp)}
        theirs, best = _step_time(orders), _step_time(ours)
        if theirs > best:
            return False, (f"pp={pp}, M={M}: your stages hold little, but the step takes "
                           f"{theirs:g} time units (a forward 1, a backward 2) against 1F1B's "
                           f"{best:g}: a stage waits for a gradient when it could run a forward. "
                           "Warm up with pp - i - 1 forwards before the first backward.")
    measured, same = _run_on_two_stages(answer)
    want = [pf.in_flight("1f1b", 2, i, 4) for i in range(2)]
    if measured != want or not same:
        return False, (f"On 2 real stages with 4 micro-batches your orders held {measured} "
                       f"micro-batches (1F1B: {want}) and {'gave' if same else 'did not give'} "
                       "one process's gradients.")
    return True, (f"Every stage holds at most min(pp - i, M) micro-batches, in 1F1B's time, for "
                  f"{len(ORDER_CASES)} sizes; on 2 real stages (4 micro-batches) yours held "
                  f"{measured} micro-batches, measured, with one process's gradients.")


EXERCISES = [
    Exercise("12.fsdp_halves", "FSDP on 2 ranks against one process with the whole batch: "
             "which bands of a GPU's memory halve? Choose from weights, gradients, buckets, "
             "Adam, gathered weights, activations.", _bands, fsdp_halving_bands),
    Exercise("12.ddp_failures", "Which of the five DDP configurations in the table fail "
             "within two steps? Give their numbers.", _ddp_failures, failing_ddp_configurations),
    Exercise("12.stage_in_flight", "4 pipeline stages, 8 micro-batches, 1F1B: how many "
             "micro-batches does stage 0 hold at most, and stage 3? Give (stage 0, stage 3).",
             _stage_in_flight, first_and_last_stage),
    Exercise("12.one_f_one_b", "Build task: pass your function one_f_one_b(pp, i, M), the list "
             "of ('F', j) and ('B', j) stage i of pp runs under 1F1B for M micro-batches. It is "
             "walked through the pipeline for several sizes, then run on 2 real stages.",
             _one_f_one_b),
]
