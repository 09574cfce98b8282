"""Lesson 3's exercises: the predictions, judged against measurements of PyTorch's
checkpoint_sequential, and the build task (the learner's checkpoint_sequential and peak sweep),
whose judges accept a right function and reject plausible wrong ones with a hint."""
import pytest

from ckpt_lab import formulas
from ckpt_lab.lessons import exercises
from ckpt_lab.lessons.exercises import lesson03

from exercise_checks import in_your_code, right_then_wrong


@pytest.fixture(autouse=True)
def _one(one_thread):
    yield


def _best_units(layers: int) -> int:
    """Least uniform checkpoint_sequential peak, in units, by brute force."""
    return min((s - 1) + (layers - (s - 1) * (layers // s)) for s in range(1, layers + 1))


def test_the_measured_answers_and_the_shape_of_the_curve():
    assert lesson03.best_segments() == 4
    assert lesson03.peak_moment() == "a recompute tooth"       # a first segment longer than the last
    logs = lesson03.chain_logs(16, (1, 4, 5, 6, 9))
    assert lesson03.moment_of(logs[4]) == "start of backward"   # uniform segments: no tooth wins
    assert lesson03.sqrt_growth() == pytest.approx(_best_units(64) / _best_units(16))
    units = lesson03.units(logs, 16)
    assert units[6] > units[5]                                 # a step up
    assert units[9] == 16                                      # S > L / 2: no saving at all here
    assert formulas.optimal_segment_count(16, 1, 1) == lesson03.best_segments()


@pytest.mark.parametrize("key, right, wrong, hint", [
    ("03.best_segments", 4, 1, "last one is long"),
    ("03.best_segments", 4, 12, "L/2"),
    ("03.best_segments", 4, 6, "kept inputs"),
    ("03.peak_moment", "a recompute tooth", "start of backward", "rebuilds 12 blocks"),
    ("03.peak_moment", "a recompute tooth", "end of forward", "after the forward"),
    ("03.sqrt_growth", _best_units(64) / _best_units(16), 2.0, "continuous estimate"),
    ("03.sqrt_growth", 15 / 7, 4.0, "sqrt(L)"),
])
def test_right_and_wrong(key, right, wrong, hint, capsys):
    right_then_wrong(key, right, wrong, hint, capsys)


def test_malformed_answers_never_raise(capsys):
    assert exercises.check("03.best_segments", "four") is False
    assert exercises.check("03.peak_moment", "backward") is False
    assert "one of" in capsys.readouterr().out
    assert exercises.keys(3) == ["03.best_segments", "03.peak_moment", "03.sqrt_growth",
                                 "03.checkpoint_sequential"]


def test_each_prediction_sits_under_a_question():
    from exercise_checks import headings_ask
    headings_ask("03_how_many_segments")


def _lesson(name):
    import nbformat
    from pathlib import Path
    return nbformat.read(Path(__file__).resolve().parents[2] / "notebooks" / f"{name}.ipynb",
                         as_version=4)


def test_in_your_code_searches_the_segments_for_any_a_and_b():
    """The closing's rule is right beyond a = b (a transformer block keeps far more than it
    passes on, lesson 9): its peak function, run for many chains, picks the segment count of
    formulas.optimal_segment_count, which lesson 3 holds to measurement for a = b and a = 5 b."""
    import re
    from ckpt_lab import formulas
    code = in_your_code("03_how_many_segments")
    assert "isqrt(len(blocks))" not in code.replace("isqrt(L) segments", "")
    scope = {}
    exec(re.search(r"^def peak.*?\n(?:    .*\n)+", code, re.M).group(0), scope)
    for L in (4, 12, 16, 48, 64):
        for a, b in ((1, 1), (5, 1), (18, 1)):
            best = min(range(1, L + 1), key=lambda S: (scope["peak"](S, L, a, b), S))
            assert best == formulas.optimal_segment_count(L, a, b), (L, a, b)


def test_the_best_count_is_not_given_away_before_it_is_asked():
    """03.best_segments: neither lesson 3's title and header nor the tour says sqrt(L)."""
    import re
    from ckpt_lab.lessons import course
    assert "sqrt" not in course.LESSONS["03_how_many_segments"].lower()
    header = _lesson("03_how_many_segments").cells[0].source
    tour = "\n".join(c.source for c in _lesson("00_tour").cells if c.cell_type == "markdown")
    for text in (header, tour):
        words = re.sub(r"\([^()\s]*\)", "", text)             # link targets name the file
        assert "√" not in words and "sqrt" not in words.lower()


# ------------------------------------------------------------------------------ the build task
def _segments(blocks, S, checkpoint_fn, starts=None, last_plain=True):
    """Run blocks in segments (uniform L // S unless `starts`), each through checkpoint_fn."""
    k = len(blocks) // S
    starts = starts or [i * k for i in range(S)]
    ends = starts[1:] + [len(blocks)]

    def run(x):
        for j, (a, b) in enumerate(zip(starts, ends)):
            segment = blocks[a:b]
            x = segment(x) if (last_plain and j == len(starts) - 1) else checkpoint_fn(segment, x)
        return x
    return run


def torch_ckpt(segment, x, **kw):
    from torch.utils.checkpoint import checkpoint
    return checkpoint(segment, x, use_reentrant=False, **kw)


def right(blocks, S, x):
    return _segments(blocks, S, torch_ckpt)(x)


def right_on_ckpt_lab(blocks, S, x):                    # the hooks design of lesson 2
    import ckpt_lab
    return _segments(blocks, S, ckpt_lab.checkpoint)(x)


def ceil_segments(blocks, S, x):                         # ceil(L / S) blocks per segment
    k = -(-len(blocks) // S)
    return _segments(blocks, S, torch_ckpt, starts=list(range(0, len(blocks), k)))(x)


def last_checkpointed_too(blocks, S, x):
    return _segments(blocks, S, torch_ckpt, last_plain=False)(x)


def no_rng_replay(blocks, S, x):
    return _segments(blocks, S, lambda s, t: torch_ckpt(s, t, preserve_rng_state=False))(x)


def no_checkpoint(blocks, S, x):
    return blocks(x)


def skips_a_block(blocks, S, x):
    return right(blocks[:-1], min(S, len(blocks) - 1), x)


def unsolved(blocks, S, x):
    raise NotImplementedError


def _sweep(run, blocks, x, backward=True):
    from ckpt_lab import track_memory
    peaks = {}
    for S in range(1, len(blocks) + 1):
        with track_memory() as log:
            out = run(blocks, S, x).sum()
            if backward:
                out.backward()
        peaks[S] = log.peak_bytes
    return peaks


def test_the_build_task_accepts_checkpoint_sequential_on_either_checkpoint(capsys):
    assert exercises.check("03.checkpoint_sequential", (right, _sweep))
    assert exercises.check("03.checkpoint_sequential", (right_on_ckpt_lab, _sweep))
    out = capsys.readouterr().out
    assert "bit for bit" in out and "each on the formula" in out


@pytest.mark.parametrize("wrong, hint", [
    (ceil_segments, "L // S blocks each"),
    (last_checkpointed_too, "Checkpoint every segment but the last"),
    (no_rng_replay, "preserve_rng_state"),
    (no_checkpoint, "keeps more than it should"),
    (skips_a_block, "output differs"),
    (unsolved, "not answered yet"),
])
def test_the_build_task_rejects_a_plausible_mistake_with_its_hint(wrong, hint, capsys):
    assert exercises.check("03.checkpoint_sequential", (wrong, _sweep)) is False
    out = capsys.readouterr().out
    assert "✗ my_checkpoint_sequential:" in out and hint in out, out


@pytest.mark.parametrize("sweep, hint", [
    (lambda r, b, x: _sweep(r, b, x, backward=False), "comes in backward"),
    (lambda r, b, x: {1: 0}, "for every S from 1 to L"),
    (lambda r, b, x: None, "not answered yet"),
    (lambda r, b, x: exec("raise NotImplementedError"), "not answered yet"),
])
def test_the_build_task_runs_the_sweep_with_pytorchs_function(sweep, hint, capsys):
    assert exercises.check("03.checkpoint_sequential", (right, sweep)) is False
    out = capsys.readouterr().out
    assert "my_checkpoint_sequential ✓; peak_sweep:" in out and hint in out, out


def test_the_build_task_wants_both_functions(capsys):
    for answer in (right, (right,), "code", (right, "sweep")):
        assert exercises.check("03.checkpoint_sequential", answer) is False
    assert "Pass both functions" in capsys.readouterr().out


def test_the_formula_the_judges_hold_to_is_pytorchs_measured_peak():
    """The build task's formula is no typed-in number: PyTorch's own run measures it."""
    blocks, x = lesson03.build_chain()
    measured = _sweep(lesson03.torch_checkpoint_sequential, blocks, x)
    want = lesson03.formula_peaks()
    assert all(abs(measured[S] / want[S] - 1) < 1e-3 for S in want)
    assert len(set(want.values())) >= 3                        # the peaks differ with S
