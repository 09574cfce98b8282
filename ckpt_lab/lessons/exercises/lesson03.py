"""Exercises of lesson 3. Predictions: the best segment count, where a segmented step peaks, and
how the best peak grows with depth, each measured on a chain of MLP blocks (512 tokens, width
64), parameter gradients allocated beforehand: with PyTorch's checkpoint_sequential, and for the
peak's moment with ckpt_lab's, whose `boundaries` make a first segment longer than the last
(uniform segments never do). Build task: the learner's checkpoint_sequential, run against
PyTorch's (output and gradients bit for bit, FLOPs) and the step peak formula, and the learner's
sweep of the step peak over S."""
from __future__ import annotations

import functools

import torch
from torch import nn

from ckpt_lab import formulas

from .base import Exercise, _number, near, one_of
from .threads import one_thread

MOMENTS = ("end of forward", "start of backward", "a recompute tooth")


def chain_logs(layers: int, segments, width: int = 64, tokens: int = 512) -> dict:
    """Measured: {S: MemoryLog} of one step of `layers` MLP blocks for each segment count S."""
    from torch.utils.checkpoint import checkpoint_sequential
    from ckpt_lab.lessons.recompute_label import label_recompute
    from ckpt_lab.measure.memory import track_memory
    from ckpt_lab.training.models import MLPBlock
    torch.manual_seed(0)
    blocks = nn.Sequential(*[MLPBlock(width) for _ in range(layers)])
    x = torch.randn(tokens, width, requires_grad=True)
    for p in blocks.parameters():
        p.grad = torch.zeros_like(p)                 # model state, made before measuring
    logs = {}
    for k in segments:
        with track_memory() as logs[k], label_recompute(blocks):
            checkpoint_sequential(blocks, k, x, use_reentrant=False).sum().backward()
    return logs


def units(logs: dict, layers: int, width: int = 64, tokens: int = 512) -> dict:
    """Each peak in units of one block's activations, less the backward's fixed A + G (the
    plain run's peak minus its `layers` kept units)."""
    unit = tokens * width * 4
    extra = logs[1].peak_bytes - layers * unit
    return {k: (log.peak_bytes - extra) / unit for k, log in logs.items()}


def chain_peak_units(layers: int, segments: int) -> float:
    """Measured: the peak of `layers` blocks in `segments`, in units, less A + G."""
    return units(chain_logs(layers, (1, segments)), layers)[segments]


@functools.lru_cache(maxsize=1)
def best_segments() -> int:
    """Measured: the segment count with the least peak for 16 blocks (ties: fewer)."""
    logs = chain_logs(16, range(1, 17))
    return min(logs, key=lambda k: (logs[k].peak_bytes, k))


def moment_of(log) -> str:
    """Where a step's peak falls: before the first recompute, in backward, or in forward."""
    from ckpt_lab.lessons.plots import phase_spans
    top = max(log.timeline, key=lambda p: p.live_bytes)
    if top.phase == "forward":
        return "end of forward"
    spans = phase_spans(log, "recompute")
    return "start of backward" if not spans or top.step < spans[0][0] else "a recompute tooth"


UNEVEN = [0, 12]    # segment starts: a 12-block first segment, checkpointed, and a 4-block last one


def uneven_log(layers: int = 16, boundaries=tuple(UNEVEN), width: int = 64, tokens: int = 512):
    """Measured: the MemoryLog of one step of `layers` MLP blocks under ckpt_lab's
    checkpoint_sequential with segments starting at `boundaries` (its recompute is labelled)."""
    from ckpt_lab import checkpoint_sequential
    from ckpt_lab.measure.memory import track_memory
    from ckpt_lab.training.models import MLPBlock
    torch.manual_seed(0)
    blocks = nn.Sequential(*[MLPBlock(width) for _ in range(layers)])
    x = torch.randn(tokens, width, requires_grad=True)
    for p in blocks.parameters():
        p.grad = torch.zeros_like(p)                 # model state, made before measuring
    with track_memory() as log:
        checkpoint_sequential(blocks, x, boundaries=list(boundaries)).sum().backward()
    return log


@functools.lru_cache(maxsize=1)
def peak_moment() -> str:
    """Measured: where the step of 16 blocks in segments starting at UNEVEN peaks."""
    return moment_of(uneven_log())


@functools.lru_cache(maxsize=1)
def sqrt_growth() -> float:
    """Measured: best peak of 64 blocks over best peak of 16, in units, less A + G."""
    best = {n: formulas.optimal_segment_count(n, 1, 1) for n in (16, 64)}
    return chain_peak_units(64, best[64]) / chain_peak_units(16, best[16])


def _best(answer):
    expected = best_segments()
    value = _number(answer)
    if value == expected:
        last = 16 - (expected - 1) * (16 // expected)
        return True, (f"{expected}: {expected - 1} kept inputs and a last segment of {last} "
                      f"blocks, {expected - 1 + last} units; fewer segments leave a longer last "
                      "segment, more leave more kept inputs.")
    if value <= 2:
        return False, (f"Measured best: {expected}. With few segments the last one is long, "
                       "and backward holds all of it at once.")
    if value > 8:
        return False, (f"Measured best: {expected}. Past L/2 = 8 every segment but the last is "
                       "one block, whose kept input the plain run keeps anyway: nothing is saved.")
    return False, (f"Measured best: {expected}, about sqrt(16). Count kept inputs (S - 1) plus "
                   "the last segment's blocks (16 - (S - 1) x (16 // S)) for your S.")


_moment = one_of(
    MOMENTS, peak_moment,
    right="{expected}: rebuilding the 12-block first segment holds 12 blocks' activations at "
          "once, more than the start of backward holds (1 kept input and the 4-block last "
          "segment). Uniform segments never give a tooth that wins: none is longer than the last.",
    hints={"end of forward": "Measured: {expected}. Backward adds gradients before it frees "
                             "anything, so the peak is always after the forward ends.",
           "start of backward": "Measured: {expected}. Count both moments in blocks: the start "
                                "of backward holds 1 kept input and the 4-block last segment; "
                                "the recompute of the first segment rebuilds 12 blocks."},
    wrong="Measured: {expected}. Count the blocks alive at each moment.")

_growth = near(
    sqrt_growth, 0.02, relative=True,
    low="Too small: 2 sqrt(64) / 2 sqrt(16) = 2 is the continuous estimate; whole segments give "
        "2 sqrt(L) - 1 units at S = sqrt(L), so (16 - 1) / (8 - 1).",
    high="Too large: 4x the layers is 4x the memory only without checkpoints; with the best "
         "segments the peak grows like sqrt(L).")


# --------------------------------------------------------------------------- the build task
# The learner writes checkpoint_sequential from checkpoint, and a sweep of the step peak. The
# judge runs both on a chain of its own: 8 blocks, so S = 3, 5, 6 and 7 leave a remainder, and
# tiny tensors on one thread, so a judgement takes about a second. PyTorch's side of each
# comparison is measured once per process (`_reference`, `_torch_flops`) and reused.
BUILD_LAYERS, BUILD_WIDTH, BUILD_TOKENS = 8, 32, 64
NOT_ANSWERED = ("not answered yet (your function raises NotImplementedError or returns None): "
                "write its body, then run the cell again.")


def build_chain(dropout: float = 0.0, layers: int = BUILD_LAYERS, width: int = BUILD_WIDTH,
                tokens: int = BUILD_TOKENS):
    """(blocks, x): `layers` MLP blocks with their parameter gradients allocated, and an input."""
    from ckpt_lab.training.models import MLPBlock
    torch.manual_seed(0)
    blocks = nn.Sequential(*[MLPBlock(width, dropout) for _ in range(layers)])
    x = torch.randn(tokens, width, requires_grad=True)
    for p in blocks.parameters():
        p.grad = torch.zeros_like(p)                 # model state, made before measuring
    return blocks, x


def torch_checkpoint_sequential(blocks, S: int, x):
    """PyTorch's checkpoint_sequential with the build task's signature (blocks, S, x)."""
    from torch.utils.checkpoint import checkpoint_sequential
    return checkpoint_sequential(blocks, S, x, use_reentrant=False)


def formula_peaks(layers: int = BUILD_LAYERS, width: int = BUILD_WIDTH,
                  tokens: int = BUILD_TOKENS) -> dict:
    """{S: the lesson's step peak formula} for the build task's chain (A = X = one unit)."""
    unit, weight_grad = tokens * width * 4, (width * width + width) * 4
    return {S: formulas.chain_step_peak_bytes(layers, S, unit, weight_grad)
            for S in range(1, layers + 1)}


def _segment_sizes(layers: int, S: int) -> str:
    """"2, 2 and 3": the blocks per segment of checkpoint_sequential's plan."""
    k = layers // S
    sizes = [k] * (S - 1) + [layers - (S - 1) * k]
    return ", ".join(map(str, sizes[:-1])) + f" and {sizes[-1]}"


def _step(run, blocks, S, x, seed: int = 0):
    """Output, input gradient and parameter gradients of one step of run(blocks, S, x)."""
    for p in blocks.parameters():
        p.grad.zero_()
    x.grad = None
    torch.manual_seed(seed)
    out = run(blocks, S, x)
    if out is None:
        raise NotImplementedError
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"it returned a {type(out).__name__}, not the chain's output tensor")
    out.sum().backward()
    return [out.detach(), x.grad] + [p.grad.clone() for p in blocks.parameters()]


def _peak(run, blocks, S, x) -> int:
    from ckpt_lab.measure.memory import track_memory
    with track_memory() as log:
        run(blocks, S, x).sum().backward()
    return log.peak_bytes


def _flops(run, blocks, S, x) -> int:
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        run(blocks, S, x).sum().backward()
    return counter.get_total_flops()


@functools.lru_cache(maxsize=None)
def _reference(S: int) -> list:
    """PyTorch's output and gradients for S segments on the dropout chain (measured once)."""
    blocks, x = build_chain(dropout=0.1)
    with one_thread():
        return _step(torch_checkpoint_sequential, blocks, S, x)


@functools.lru_cache(maxsize=None)
def _torch_flops(S: int) -> int:
    """FLOPs PyTorch's checkpoint_sequential counts for S segments (measured once)."""
    blocks, x = build_chain()
    with one_thread():
        return _flops(torch_checkpoint_sequential, blocks, S, x)


def _calls(function, *args):
    """(result, None), or (None, the message) when calling it fails or it is not written yet."""
    try:
        result = function(*args)
    except NotImplementedError:
        return None, NOT_ANSWERED
    except Exception as e:                            # the learner's code: say what it raised
        return None, f"your function raised {type(e).__name__}: {e}"
    return result, None


def _judge_build(answer):
    """The build task: (my_checkpoint_sequential, peak_sweep), each judged in turn."""
    if not (isinstance(answer, tuple) and len(answer) == 2 and all(map(callable, answer))):
        return False, ("Pass both functions themselves: "
                       "check(key, (my_checkpoint_sequential, peak_sweep)).")
    with one_thread():
        ok, message = _judge_checkpoint_sequential(answer[0])
        if not ok:
            return False, f"my_checkpoint_sequential: {message}"
        ok, sweep_message = _judge_peak_sweep(answer[1])
    if not ok:
        return False, f"my_checkpoint_sequential ✓; peak_sweep: {sweep_message}"
    return True, f"{message} {sweep_message}"


def _judge_checkpoint_sequential(fn):
    L = BUILD_LAYERS
    blocks, x = build_chain(dropout=0.1)             # dropout: the recompute must redraw its masks
    for S in range(1, L + 1):
        mine, why = _calls(_step, fn, blocks, S, x)
        if why:
            return False, why if why == NOT_ANSWERED else f"S = {S}: {why}"
        theirs = _reference(S)
        if not torch.equal(mine[0], theirs[0]):
            return False, (f"S = {S}: the output differs from PyTorch's. Run every block once, "
                           "in order: segment j is blocks[j * k:(j + 1) * k] with k = L // S, "
                           "and the last segment runs the rest.")
        if not all(torch.equal(a, b) for a, b in zip(mine[1:], theirs[1:])):
            return False, (f"S = {S}: the output matches but the gradients differ from "
                           "PyTorch's. The recompute must replay the dropout masks "
                           "(checkpoint's preserve_rng_state=True, the default) and the input "
                           "must keep its graph: do not detach it.")
    blocks, x = build_chain()
    want = formula_peaks()
    unit = BUILD_TOKENS * BUILD_WIDTH * 4
    peaks = {S: _peak(fn, blocks, S, x) for S in range(1, L + 1)}
    off = {S: (peaks[S] - want[S]) / unit for S in peaks if abs(peaks[S] / want[S] - 1) > 1e-3}
    if off:
        S, units = next(iter(off.items()))
        if units > 0:
            return False, (f"Step peaks differ from the formula at S = {sorted(off)}: at S = {S} "
                           f"{units:+.0f} units. Your chain keeps more than it should: wrap "
                           "every segment but the last in checkpoint(segment, x, "
                           "use_reentrant=False).")
        return False, (f"Step peaks differ from the formula at S = {sorted(off)}: at S = {S} "
                       f"{units:+.0f} units. Segments hold L // S blocks each and the last one "
                       f"the rest: with {L} blocks, S = 3 is {_segment_sizes(L, 3)} blocks.")
    for S in range(1, L + 1):
        mine, theirs = _flops(fn, blocks, S, x), _torch_flops(S)
        if mine != theirs:
            more = "more" if mine > theirs else "less"
            return False, (f"S = {S}: your step counts {mine:,} FLOPs, PyTorch's {theirs:,}: it "
                           f"re-runs {more} than PyTorch's. Checkpoint every segment but the "
                           "last: backward starts with the last segment, so re-running it frees "
                           "nothing and costs its forward again.")
    return True, (f"For S = 1 ... {L}: output and gradients equal PyTorch's bit for bit, the "
                  "same FLOPs, and every step peak on the formula. checkpoint_sequential is "
                  "this loop.")


def _judge_peak_sweep(sweep):
    blocks, x = build_chain()
    got, why = _calls(sweep, torch_checkpoint_sequential, blocks, x)
    if why:
        return False, why
    if got is None:
        return False, NOT_ANSWERED
    L, want = BUILD_LAYERS, formula_peaks()
    if not isinstance(got, dict) or set(got) != set(want):
        keys = sorted(got) if isinstance(got, dict) else type(got).__name__
        return False, (f"Return a dict {{S: step peak in bytes}} for every S from 1 to L = "
                       f"len(blocks) = {L}; got {keys}.")
    off = sorted(S for S in want if not isinstance(got[S], (int, float))
                 or abs(got[S] / want[S] - 1) > 1e-3)
    if not off:
        return True, (f"Your sweep: {L} step peaks, each on the formula (S - 1) X + the last "
                      "segment's blocks x A + A + G.")
    S = off[0]
    if isinstance(got[S], (int, float)) and got[S] < want[S]:
        return False, (f"S = {S}: {got[S]:,} bytes, below the formula's {want[S]:,}. The step "
                       "peak comes in backward: run run(blocks, S, x).sum().backward() inside "
                       "`with track_memory() as log:` and read log.peak_bytes.")
    return False, (f"S = {S}: {got[S]!r}, the formula says {want[S]:,} bytes. Measure one step "
                   "per S, each in its own track_memory block, and read log.peak_bytes.")


EXERCISES = [
    Exercise("03.best_segments", "16 blocks Linear -> ReLU with checkpoint_sequential: which "
             "segment count S (1 to 16) gives the least peak?", _best, expected=best_segments),
    Exercise("03.peak_moment", "The 16 blocks with ckpt_lab.checkpoint_sequential(blocks, x, "
             "boundaries=[0, 12]): a 12-block first segment, checkpointed, and a 4-block last one. "
             "Where in the step is the peak? One of 'end of forward', 'start of backward', "
             "'a recompute tooth'.", _moment,
             expected=peak_moment),
    Exercise("03.sqrt_growth", "With the best segment count each time, by what factor does the "
             "peak (in units of one block's activations, without the backward's A + G) grow "
             "from 16 to 64 blocks?", _growth, expected=sqrt_growth),
    Exercise("03.checkpoint_sequential", "Build task: write my_checkpoint_sequential(blocks, S, "
             "x), which runs an nn.Sequential in S segments of L // S blocks (the last takes the "
             "rest) and wraps every segment but the last in torch.utils.checkpoint.checkpoint("
             "segment, x, use_reentrant=False), and peak_sweep(run, blocks, x), which returns "
             "{S: step peak in bytes} of run(blocks, S, x).sum().backward() for every S from 1 to "
             "len(blocks), each measured with track_memory. Pass both functions: "
             "(my_checkpoint_sequential, peak_sweep).", _judge_build),
]
