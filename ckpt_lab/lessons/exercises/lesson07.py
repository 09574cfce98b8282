"""Exercises of lesson 7 (combining checkpointing, accumulation, bf16 and offload): three
committed predictions and one build task, a search for the largest micro-batch a budget allows
that measures as few micro-batch sizes as it can.

Each prediction's right answer is measured when it is first needed (then kept), on the lesson's
GPT at its CPU sizes (the gpt-cpu shape: 4 blocks, H = 128, 4 heads, T = 64, dropout off), on
one thread: step peaks (activations) with `track_memory`, the parameter gradients allocated
beforehand. The build task's judge runs the learner's search on a smaller GPT (gpt-tiny's
shape, dropout off) against its measured step peaks, budgets that hold the model state too
(total peaks), and ckpt_lab's own search (`throughput.largest_micro_batch`), and counts the
sizes the search measured.
"""
from __future__ import annotations

import contextlib
import functools
import math

import torch

from ckpt_lab import build_model, formulas, get_config
from ckpt_lab.lessons import combining
from ckpt_lab.training.throughput import largest_micro_batch, micro_batch_sizes, step_peak_bytes

from .base import Exercise, near, one_of
from .threads import one_thread

BATCH, SEQ, LAYERS, HIDDEN, HEADS = 4, 64, 4, 128, 4
ORDER = ("below", "equal", "above")
CUTS = ("more", "the same", "less")


@functools.cache
def _batch(rows: int = BATCH, seq: int = SEQ):
    from ckpt_lab import TextBatches, load_corpus
    return TextBatches(load_corpus(), rows, seq).get(0)


def _model(policy: str = "none"):
    cfg = get_config("gpt-cpu", block_size=SEQ, n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS,
                     dropout=0.0)
    return build_model(cfg, policy=policy, impl="torch")


def _steps(model, x, y, micro_batches: int, precision: str):
    for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        with torch.autocast("cpu", torch.bfloat16) if precision == "bf16" \
                else contextlib.nullcontext():
            loss = model(xm, ym) / micro_batches
        loss.backward()


@functools.cache
def step_peak(policy: str = "none", micro_batches: int = 1, precision: str = "fp32") -> int:
    """Measured step peak (activations) of a step of the lesson's CPU GPT, gradients allocated
    (`combining.step_peak`), on one thread; measured once per setting."""
    model, (x, y) = _model(policy), _batch()      # the batch made before the tracker starts
    with one_thread():
        return combining.step_peak(model, lambda: _steps(model, x, y, micro_batches, precision))


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


def accumulation_cut(policy: str, micro_batches: int = BATCH) -> float:
    """Measured: the step peak with ``micro_batches`` micro-batches over the step peak of the
    whole batch, under ``policy``."""
    return step_peak(policy, micro_batches) / step_peak(policy)


def accumulation_with_checkpointing() -> str:
    """Measured answer of 07.accumulation_with_ckpt: does accumulation over 4 micro-batches cut
    the step peak by "more", "the same" (within 5%) or "less" with every block checkpointed
    than without?"""
    ratio = accumulation_cut("every") / accumulation_cut("none")
    return "the same" if abs(ratio - 1) <= 0.05 else ("less" if ratio > 1 else "more")


def _cut_facts() -> dict:
    return {"none": accumulation_cut("none"), "every": accumulation_cut("every")}


_accumulation_with_ckpt = one_of(
    CUTS, accumulation_with_checkpointing, normalise=lambda s: " ".join(s.lower().split()),
    facts=_cut_facts,
    right="{expected}: x{every:.2f} with every block checkpointed, x{none:.2f} without. What "
          "does not shrink with the micro-batch (the causal mask, each Linear's weight gradient "
          "as backward makes it, the output layer's V x H one) is a larger share of a step "
          "that checkpointing has already emptied.",
    wrong="Measured: {expected}, x{every:.2f} with every block checkpointed against x{none:.2f} "
          "without. Checkpointing removes activations that shrink with the micro-batch; what "
          "is left (weight gradients as backward makes them, the causal mask) does not shrink.",
    hints={"more": "Measured: less, x{every:.2f} with every block checkpointed against "
                   "x{none:.2f} without. Accumulation divides what grows with the rows; "
                   "checkpointing has already removed most of that, so the bytes that do not "
                   "shrink weigh more."})


def bf16_small_batch_ratio() -> float:
    """Measured: with every block checkpointed and micro-batches of one row (4 of them), the
    bf16-autocast step's peak over the fp32 step's."""
    return step_peak("every", BATCH, "bf16") / step_peak("every", BATCH, "fp32")


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


# ------------------------------- the build task: the largest micro-batch that fits, measured few
GLOBAL_BATCHES = (16, 12)      # rows of one optimizer step: 16 as in the lesson's last section


@functools.lru_cache(maxsize=1)
def _search_model():
    """The judge's GPT: gpt-tiny's shape (2 blocks, H = 32, T = 16), dropout off."""
    return build_model(get_config("gpt-tiny", dropout=0.0), impl="torch")


def model_state() -> int:
    """Model state of the judge's GPT trained with AdamW in fp32: weights, gradients and the
    two moments, 16 bytes a parameter (`formulas.model_state_bytes`; lesson 7 measures it)."""
    params = sum(p.numel() for p in _search_model().parameters())
    return formulas.model_state_bytes(params, "fp32", "adam")


def _rows(global_batch: int):
    return _batch(global_batch, _search_model().config.block_size)


@functools.cache
def measured_step_peak(policy: str, rows: int) -> int:
    """Step peak (activations) of one micro-batch of ``rows`` rows under ``policy``, parameter
    gradients allocated first (`throughput.step_peak_bytes`), on one thread; measured once."""
    x, y = _rows(max(GLOBAL_BATCHES))
    with one_thread():
        return step_peak_bytes(_search_model(), x[:rows], y[:rows], policy, rows)


def most_measurements(global_batch: int) -> int:
    """Sizes a search may measure: as many as a bisection over the divisors of the global batch
    needs at worst, ceil(log2(divisors + 1))."""
    return math.ceil(math.log2(len(micro_batch_sizes(global_batch)) + 1))


def search_cases() -> list[tuple[str, int, int]]:
    """(policy, global batch, budget) triples the search is judged on; each budget is a total
    peak (model state included), set from measured step peaks of no checkpoint: 4 rows fit; 6
    rows fit, so rows that do not divide 16 fit; one row fits; not even one row fits."""
    state, peak = model_state(), measured_step_peak
    four, six, one = peak("none", 4), peak("none", 6), peak("none", 1)
    return [("none", 16, state + four), ("every", 16, state + four),
            ("none", 16, state + six), ("none", 12, state + six), ("every", 12, state + six),
            ("selective", 16, state + six), ("every", 16, state + one),
            ("none", 16, state + one - 1)]


@functools.cache
def expected_micro_batch(policy: str, global_batch: int, budget: int) -> int:
    """ckpt_lab's answer: `throughput.largest_micro_batch` for the room the model state leaves;
    0 where not even one row fits."""
    x, y = _rows(global_batch)
    room = budget - model_state()
    if room < 0:
        return 0
    with one_thread():
        return largest_micro_batch(_search_model(), x, y, policy, room) or 0


def _one_search(answer, policy: str, global_batch: int, budget: int) -> tuple[str | None, str]:
    """(why the learner's search is wrong, or None; why it measured too many sizes, or "")."""
    state, divisors, measured = model_state(), micro_batch_sizes(global_batch), set()

    def step_peak(rows):
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= global_batch:
            raise ValueError(f"step_peak takes a whole number of rows from 1 to {global_batch}, "
                             f"got {rows!r}")
        measured.add(rows)
        return measured_step_peak(policy, rows)

    where = (f"With '{policy}' checkpointing, a global batch of {global_batch} rows and a "
             f"budget of {budget:,} bytes")
    try:
        got = answer(step_peak, state, global_batch, budget)
    except Exception as e:  # the learner's code: report, do not raise
        return f"{where}, your function raised {type(e).__name__}: {e}", ""
    if got is None:
        return ("not answered yet: largest_micro_batch returns None. Write its body and return "
                "a number of rows, 0 when not even one row fits."), ""
    if isinstance(got, bool) or not isinstance(got, int):
        return f"{where}, it returned {got!r}: return a whole number of rows (0: none fits).", ""
    want = expected_micro_batch(policy, global_batch, budget)
    if got < 0 or got > global_batch:
        return f"{where}, it returned {got}: a micro-batch has 0 to {global_batch} rows.", ""
    if got and global_batch % got:
        return (f"{where}, it returned {got} rows, which do not divide the global batch: the "
                f"step would not split into whole micro-batches. Only {divisors} do."), ""
    if got > want:
        total = state + measured_step_peak(policy, got)
        if measured_step_peak(policy, got) <= budget:
            return (f"{where}, {got} rows: their step peak fits the budget, but their total peak "
                    f"(model state included) is {total:,} bytes, over it. The budget holds the "
                    "model state too."), ""
        return (f"{where}, {got} rows: their total peak is {total:,} bytes, over the budget; "
                f"the largest that fits is {want or 'none (0)'}."), ""
    if got < want:
        rows = f"{got} row fits" if got == 1 else f"{got} rows fit"
        return f"{where}, {rows}, but so do {want}.", ""
    most = most_measurements(global_batch)
    if len(measured) <= most:
        return None, ""
    return None, (f"{where}, {got} rows is right, but your search measured {len(measured)} "
                  f"sizes ({sorted(measured)}). Each is a training step, and on a GPU one over "
                  f"the budget crashes: {most} are enough for the {len(divisors)} divisors of "
                  f"{global_batch}. The step peak grows with the rows: what does one "
                  "measurement tell you about the sizes above and below it?")


def _micro_batch_search(answer):
    if not callable(answer):
        return False, ("Pass your function itself: exercises.check('07.micro_batch_search', "
                       "largest_micro_batch), a function (step_peak, state, global_batch, "
                       "budget) -> rows.")
    cases = search_cases()
    judged = [_one_search(answer, *case) for case in cases]   # every case, then the cost
    for why, costly in judged:
        if why:
            return False, why
    for why, costly in judged:
        if costly:
            return False, costly
    policies = len({p for p, _, _ in cases})
    return True, (f"On {len(cases)} budgets, {policies} checkpoint policies and global batches "
                  f"of {' and '.join(map(str, GLOBAL_BATCHES))} rows your search agrees with "
                  "ckpt_lab's throughput.largest_micro_batch, down to 0 where nothing fits, "
                  f"measuring at most {max(map(most_measurements, GLOBAL_BATCHES))} sizes a "
                  "search: what a bisection over the divisors needs.")


EXERCISES = [
    Exercise("07.autocast_ratio", "The lesson's GPT (gpt-cpu shape, B = 4, T = 64, fp32 "
             "weights): with bf16 autocast, the step peak (activations) is what multiple of the "
             "fp32 step's?",
             _autocast, expected=autocast_ratio),
    Exercise("07.accumulation_with_ckpt", "The lesson's GPT: accumulation over 4 micro-batches "
             "cuts the step peak (activations). With every block checkpointed, does it cut it "
             "by 'more', 'the same' or 'less' than without checkpointing?",
             _accumulation_with_ckpt, expected=accumulation_with_checkpointing),
    Exercise("07.bf16_small_batch", "The lesson's GPT with every block checkpointed and 4 "
             "micro-batches of one row: is the bf16-autocast step peak (activations) below, "
             "equal to or above the fp32 step's?", _bf16_small, expected=bf16_small_batch),
    Exercise("07.micro_batch_search", "Build task: pass your function largest_micro_batch("
             "step_peak, state, global_batch, budget), which returns the largest micro-batch B "
             "(a divisor of global_batch, in rows) whose total peak, state + step_peak(B), is "
             "within budget, and 0 when not even one row fits, measuring few sizes (each "
             "step_peak call is a training step). It runs on a small GPT under three checkpoint "
             "policies, eight budgets and two global batches.", _micro_batch_search),
]
