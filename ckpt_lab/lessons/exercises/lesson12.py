"""Exercises of lesson 12: with N GPUs, which memory shrinks, and does checkpointing still pay?

Three committed predictions. The bands that halve come from `parallel_formulas` and
`formulas` (what the lesson measures them against); the DDP configurations that fail are
run, on one rank of a tiny model (`distributed.launch`, world_size=1: DDP's reducer raises
the same errors on one rank as on two); the micro-batches a stage holds come from walking the
schedule `scale_out.pipeline_step` runs.
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
        hints.append("each rank runs B/N of the rows, so its activations are those of half "
                     "the batch")
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
    right="weights, gradients and Adam's moments are sharded (16 B/param / 2 per rank), and each "
          "rank runs half the rows, so its activations halve too. DDP halves only the "
          "activations.")


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
        return True, (f"{expected}: stage r holds at most p - r micro-batches: stage 0 runs "
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


EXERCISES = [
    Exercise("12.fsdp_halves", "FSDP on 2 ranks against one process with the whole batch: "
             "which bands of a GPU's memory halve? Choose from weights, gradients, buckets, "
             "Adam, gathered weights, activations.", _bands, fsdp_halving_bands),
    Exercise("12.ddp_failures", "Which of the five DDP configurations in the table fail "
             "within two steps? Give their numbers.", _ddp_failures, failing_ddp_configurations),
    Exercise("12.stage_in_flight", "4 pipeline stages, 8 micro-batches, 1F1B: how many "
             "micro-batches does stage 0 hold at most, and stage 3? Give (stage 0, stage 3).",
             _stage_in_flight, first_and_last_stage),
]
