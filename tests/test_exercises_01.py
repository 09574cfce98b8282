"""Lesson 1's predictions and build task: judged against measurements, with a diagnosis for each
wrong answer."""
import pytest

from ckpt_lab import formulas
from ckpt_lab.lessons import exercises
from ckpt_lab.lessons.exercises import lesson01

from exercise_checks import right_then_wrong


def test_the_measured_answers():
    assert lesson01.parts_that_grow() == {"activations"}
    assert lesson01.mixed_adam_bytes_per_param() == pytest.approx(
        formulas.model_state_per_param("mixed", "adam").total, rel=1e-3)
    parts = lesson01.mixed_adam_parts(dict(block_size=16, width=64, depth=2))
    assert parts["master copy"] == 2 * parts["parameters"] == 2 * parts["gradients"]


@pytest.mark.parametrize("key, right, wrong, hint", [
    ("01.grows_with_batch", {"activations"}, {"activations", "gradients"}, "shape of its parameter"),
    ("01.grows_with_batch", "activations", {"optimizer states", "activations"}, "per parameter"),
    ("01.grows_with_batch", ["activations"], {"parameters"}, "every token"),
    ("01.mixed_adam_bytes", 16, 8, "master copy"),
    ("01.mixed_adam_bytes", 16.0, 18, "fp32 (18 bytes)"),
])
def test_right_and_wrong(key, right, wrong, hint, capsys):
    right_then_wrong(key, right, wrong, hint, capsys)


def test_malformed_answers_never_raise(capsys):
    assert exercises.check("01.grows_with_batch", {"weights"}) is False
    assert exercises.check("01.mixed_adam_bytes", "sixteen") is False
    assert "Unknown names" in capsys.readouterr().out
    assert exercises.keys(1) == ["01.grows_with_batch", "01.mixed_adam_bytes", "01.predict_parts"]


def predict_parts(config, B, optimizer):
    """The worked solution of the build task (as in the solutions notebook)."""
    L, H, T, V = config.depth, config.width, config.block_size, config.vocab_size
    P = V * H + L * (H * H + H) + H * V + V
    N = B * T
    state = {"adamw": 8, "sgd momentum": 4, "sgd": 0}[optimizer]
    return {"parameters": 4 * P, "gradients": 4 * P, "optimizer states": state * P,
            "activations": (L + 1) * N * H * 4 + N * V * 4}


def _with(part, bytes_of):
    """The solution with one part replaced by a plausible mistake."""
    def wrong(config, B, optimizer):
        return {**predict_parts(config, B, optimizer), part: bytes_of(config, B, optimizer)}
    return wrong


@pytest.mark.parametrize("wrong, hint", [
    # activations without the loss's N x V log-softmax
    (_with("activations", lambda c, B, o: (c.depth + 1) * B * c.block_size * c.width * 4),
     "log-softmax over V"),
    # one Adam moment instead of two
    (_with("optimizer states", lambda c, B, o: predict_parts(c, B, o)["parameters"]),
     "two fp32 moments"),
    # gradients that grow with the batch
    (_with("gradients", lambda c, B, o: B * predict_parts(c, B, o)["parameters"]),
     "whatever B is"),
])
def test_the_build_task_runs_the_function_against_track_memory(wrong, hint, capsys):
    right_then_wrong("01.predict_parts", predict_parts, wrong, hint, capsys)


def test_the_build_task_measures_each_step_it_judges():
    """The judge's expected bytes are measured (track_memory), one optimizer at a time."""
    parts = lesson01.step_parts(2, dict(block_size=8, width=16, depth=1), optimizer="sgd")
    assert parts["optimizer states"] == 0
    momentum = lesson01.step_parts(2, dict(block_size=8, width=16, depth=1),
                                   optimizer="sgd momentum")
    assert momentum["optimizer states"] == momentum["parameters"]
    assert {o for _, _, o in lesson01.TASK_STEPS} == set(lesson01.OPTIMIZERS)


def test_an_unwritten_or_broken_function_is_not_answered_and_never_raises(capsys):
    def stub(config, B, optimizer):
        ...

    def unfinished(config, B, optimizer):
        raise NotImplementedError

    def broken(config, B, optimizer):
        return {"parameters": 1}

    assert exercises.check("01.predict_parts", stub) is False
    assert exercises.check("01.predict_parts", unfinished) is False
    assert capsys.readouterr().out.count("not answered yet") == 2
    assert exercises.check("01.predict_parts", broken) is False
    assert exercises.check("01.predict_parts", 16) is False
    assert "exactly the keys" in capsys.readouterr().out


def test_each_prediction_sits_under_a_question():
    from exercise_checks import headings_ask
    headings_ask("01_where_memory_goes")
