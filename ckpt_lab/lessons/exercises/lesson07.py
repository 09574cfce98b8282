"""Exercises of lesson 7 (combining checkpointing, accumulation, bf16 and offload): three
committed predictions and one build task, a search for the largest micro-batch a budget allows.

Each right answer is measured when it is needed, on the lesson's GPT at its CPU sizes (the
gpt-cpu shape: 4 blocks, H = 128, 4 heads, T = 64, dropout off): step peaks (activations) with
`track_memory`, the parameter gradients allocated beforehand; FLOPs with `FlopCounterMode`. The
build task's judge runs the learner's search against those step peaks, a budget that holds the
model state too (the total peak), and ckpt_lab's own search (`throughput.largest_micro_batch`).
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils.flop_counter import FlopCounterMode

from ckpt_lab import build_model, formulas, get_config, track_memory
from ckpt_lab.training.throughput import largest_micro_batch, micro_batch_sizes, step_peak_bytes

from .base import Exercise, near, one_of

BATCH, SEQ, LAYERS, HIDDEN, HEADS = 4, 64, 4, 128, 4
ORDER = ("below", "equal", "above")


@functools.lru_cache(maxsize=None)
def _batch(rows: int = BATCH):
    from ckpt_lab import TextBatches, load_corpus
    return TextBatches(load_corpus(), rows, SEQ).get(0)


def _model(policy: str = "none"):
    cfg = get_config("gpt-cpu", block_size=SEQ, n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS,
                     dropout=0.0)
    return build_model(cfg, policy=policy, impl="torch")


def _steps(model, micro_batches: int, precision: str):
    x, y = _batch()
    for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        with torch.autocast("cpu", torch.bfloat16) if precision == "bf16" \
                else contextlib.nullcontext():
            loss = model(xm, ym) / micro_batches
        loss.backward()


def step_peak(policy: str = "none", micro_batches: int = 1, precision: str = "fp32") -> int:
    """Measured step peak (activations) of a step of the lesson's CPU GPT, gradients allocated."""
    model = _model(policy)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with track_memory() as mem:
        _steps(model, micro_batches, precision)
    return mem.peak_bytes


def autocast_ratio() -> float:
    """Measured: a bf16-autocast step's peak over the fp32 step's."""
    return step_peak(precision="bf16") / step_peak()


_autocast = near(
    autocast_ratio, 0.07,
    right="x{expected:.2f}: not x0.5. Autocast keeps the weights in fp32 and makes a bf16 copy "
          "of each for its matmuls, which autograd keeps; the layer norms, softmax and loss "
          "still work in fp32.",
    low="Measured x{expected:.2f}. Only some tensors become bf16: autocast runs matmuls in bf16 "
        "but layer norms, softmax and the loss in fp32, and keeps a bf16 copy of every weight it "
        "multiplies by.",
    high="Measured x{expected:.2f}: the matmul outputs, most of the activations, are stored in 2 "
         "bytes instead of 4.")


def accumulation_flops_ratio(micro_batches: int = 4) -> float:
    """Measured: FLOPs of a step split into `micro_batches` over FLOPs of the whole batch."""
    model = _model()
    counts = []
    for k in (1, micro_batches):
        with FlopCounterMode(display=False) as counter:
            _steps(model, k, "fp32")
        counts.append(counter.get_total_flops())
    return counts[1] / counts[0]


_accumulation_flops = near(
    accumulation_flops_ratio, 0.01,
    right="x{expected:g}: accumulation re-runs nothing; every row goes through one forward and "
          "one backward, in four smaller pieces.",
    low="Every row of the batch still goes through the whole forward and backward once: the "
        "arithmetic is the same.",
    high="Accumulation recomputes nothing: it runs the same rows in four smaller pieces (smaller "
         "matmuls, the same FLOPs).")


def bf16_small_batch_ratio() -> float:
    """Measured: with every block checkpointed and micro-batches of one row (4 of them), the
    bf16-autocast step's peak over the fp32 step's."""
    return (step_peak("every", BATCH, "bf16") / step_peak("every", BATCH, "fp32"))


def bf16_small_batch() -> str:
    """The side of 1 the ratio above lies on: "below", "equal" (within 2%) or "above"."""
    r = bf16_small_batch_ratio()
    return "equal" if abs(r - 1) <= 0.02 else ("above" if r > 1 else "below")


_bf16_small = one_of(
    ORDER, bf16_small_batch, normalise=lambda s: s.strip().lower(),
    facts=lambda: {"r": bf16_small_batch_ratio()},
    right="{expected} (x{r:.2f}): the bf16 copies of the weights autocast keeps do not shrink "
          "with the micro-batch, while the activations they save on do; with every block "
          "checkpointed there is little activation left to halve.",
    wrong="Measured x{r:.2f}. With every block checkpointed and one row per micro-batch the "
          "activations are small, but autocast still keeps a bf16 copy of every weight it "
          "multiplies by: a cost per model, not per row.")


# ----------------------------------------------- the build task: the largest micro-batch that fits
GLOBAL_BATCH = 16              # rows of one optimizer step, as in the lesson's last section


@functools.lru_cache(maxsize=1)
def _search_model():
    return _model()


def model_state() -> int:
    """Model state of the lesson's GPT trained with AdamW in fp32: weights, gradients and the two
    moments, 16 bytes a parameter (`formulas.model_state_bytes`; lesson 7 measures it)."""
    params = sum(p.numel() for p in _search_model().parameters())
    return formulas.model_state_bytes(params, "fp32", "adam")


@functools.lru_cache(maxsize=None)
def measured_step_peak(policy: str, rows: int) -> int:
    """Step peak (activations) of one micro-batch of ``rows`` rows under ``policy``, parameter
    gradients allocated first (`throughput.step_peak_bytes`, one thread: tiny tensors)."""
    x, y = _batch(GLOBAL_BATCH)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return step_peak_bytes(_search_model(), x[:rows], y[:rows], policy, rows)
    finally:
        torch.set_num_threads(threads)


def search_cases() -> list[tuple[str, int]]:
    """(policy, budget) pairs the search is judged on; each budget is a total peak (model state
    included), set from measured step peaks: 4 rows of no checkpoint fit; 5 to 7 rows fit, which
    do not divide 16; one row fits; not even one row fits."""
    state, peak = model_state(), measured_step_peak
    four, between, one = peak("none", 4), (peak("none", 4) + peak("none", 8)) // 2, peak("none", 1)
    return [("none", state + four), ("every", state + four), ("none", state + between),
            ("selective", state + between), ("every", state + one), ("none", state + one - 1)]


def expected_micro_batch(policy: str, budget: int) -> int:
    """ckpt_lab's answer: `throughput.largest_micro_batch` for the room the model state leaves;
    0 where not even one row fits."""
    x, y = _batch(GLOBAL_BATCH)
    room = budget - model_state()
    if room < 0:
        return 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return largest_micro_batch(_search_model(), x, y, policy, room) or 0
    finally:
        torch.set_num_threads(threads)


def _one_search(answer, policy: str, budget: int) -> tuple[str | None, int]:
    """(None, sizes measured) where the learner's search finds ckpt_lab's answer, else (why, 0)."""
    state, divisors, measured = model_state(), micro_batch_sizes(GLOBAL_BATCH), set()

    def step_peak(rows):
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= GLOBAL_BATCH:
            raise ValueError(f"step_peak takes a whole number of rows from 1 to {GLOBAL_BATCH}, "
                             f"got {rows!r}")
        measured.add(rows)
        return measured_step_peak(policy, rows)

    where = f"With '{policy}' checkpointing and a budget of {budget:,} bytes"
    try:
        got = answer(step_peak, state, GLOBAL_BATCH, budget)
    except Exception as e:  # the learner's code: report, do not raise
        return f"{where}, your function raised {type(e).__name__}: {e}", 0
    if got is None:
        return ("not answered yet: largest_micro_batch returns None. Write its body (the hint "
                "above the cell) and return a number of rows, 0 when not even one row fits."), 0
    if isinstance(got, bool) or not isinstance(got, int):
        return f"{where}, it returned {got!r}: return a whole number of rows (0: none fits).", 0
    want = expected_micro_batch(policy, budget)
    if got == want:
        return None, len(measured)
    if got < 0 or got > GLOBAL_BATCH:
        return f"{where}, it returned {got}: a micro-batch has 0 to {GLOBAL_BATCH} rows.", 0
    if got and GLOBAL_BATCH % got:
        return (f"{where}, it returned {got} rows, which do not divide the global batch of "
                f"{GLOBAL_BATCH}: the step would not split into whole micro-batches. Search the "
                f"divisors {divisors} only."), 0
    if got > want:
        total = state + measured_step_peak(policy, got)
        if measured_step_peak(policy, got) <= budget:
            return (f"{where}, {got} rows: their step peak fits the budget, but their total peak "
                    f"(model state included) is {total:,} bytes, over it. The budget holds the "
                    "model state too: compare state + step_peak(B) with it."), 0
        return (f"{where}, {got} rows: their total peak is {total:,} bytes, over the budget; "
                f"the largest that fits is {want or 'none (0)'}."), 0
    rows = f"{got} row fits" if got == 1 else f"{got} rows fit"
    return (f"{where}, {rows}, but so do {want}: the total peak grows with the micro-batch, so "
            "search from the largest divisor down (or bisect)."), 0


def _micro_batch_search(answer):
    if not callable(answer):
        return False, ("Pass your function itself: exercises.check('07.micro_batch_search', "
                       "largest_micro_batch), a function (step_peak, state, global_batch, "
                       "budget) -> rows.")
    cases, most = search_cases(), 0
    for policy, budget in cases:
        why, sizes = _one_search(answer, policy, budget)
        if why:
            return False, why
        most = max(most, sizes)
    policies = len({p for p, _ in cases})
    return True, (f"On {len(cases)} budgets under {policies} checkpoint policies your search "
                  "agrees with ckpt_lab's throughput.largest_micro_batch, down to 0 where "
                  f"nothing fits. It measured at most {most} micro-batch sizes in one search; a "
                  f"bisection over the {len(micro_batch_sizes(GLOBAL_BATCH))} divisors measures "
                  "at most 3.")


EXERCISES = [
    Exercise("07.autocast_ratio", "The lesson's GPT (gpt-cpu shape, B = 4, T = 64, fp32 "
             "weights): with bf16 autocast, the step peak (activations) is what multiple of the "
             "fp32 step's?",
             _autocast, expected=autocast_ratio),
    Exercise("07.accumulation_flops", "Splitting a step's batch into 4 micro-batches "
             "(accumulation): FLOPs of the step with accumulation divided by FLOPs without?",
             _accumulation_flops, expected=accumulation_flops_ratio),
    Exercise("07.bf16_small_batch", "The lesson's GPT with every block checkpointed and 4 "
             "micro-batches of one row: is the bf16-autocast step peak (activations) below, "
             "equal to or above the fp32 step's?", _bf16_small, expected=bf16_small_batch),
    Exercise("07.micro_batch_search", "Build task: pass your function largest_micro_batch("
             "step_peak, state, global_batch, budget), which returns the largest micro-batch B "
             "(a divisor of global_batch, in rows) whose total peak, state + step_peak(B), is "
             "within budget, and 0 when not even one row fits. It runs on the lesson's GPT "
             "under three checkpoint policies and six budgets.", _micro_batch_search),
]
