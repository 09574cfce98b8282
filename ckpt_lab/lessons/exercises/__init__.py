"""Exercises of the lessons and the functions that check a learner's answer.

A prediction is committed before the cells that reveal it::

    guess = exercises.predict("03.peak_at_six", None)   # your answer instead of None
    ...                                                 # the lesson measures, draws
    guess.reveal()                                      # ✓ or ✗, and why

``predict`` records the answer and says nothing of it; ``reveal`` judges it after the
measurement. ``check("03.peak_at_six", answer)`` judges at once and prints ✓ when the answer is right, a hint when it is
not, "not answered yet" for ``None``, and returns a bool; it never raises on a wrong answer,
so a notebook left unanswered still runs top to bottom. ``question(key)`` gives the text.

Expected answers are never typed in: each is computed when checked, from
`ckpt_lab.plan.formulas` or by measuring a small run with `track_memory` and PyTorch.
"""
from __future__ import annotations

from . import (lesson00, lesson01, lesson02, lesson03, lesson04, lesson05, lesson06, lesson07, lesson08,
               lesson09, lesson10, lesson11, lesson12)
from . import lesson13, lesson14
from dataclasses import dataclass
from typing import Any

from .base import Exercise

_LESSONS = (lesson00, lesson01, lesson02, lesson03, lesson04, lesson05, lesson06, lesson07, lesson08,
            lesson09, lesson10, lesson11, lesson12) + (lesson13, lesson14)
EXERCISES: dict[str, Exercise] = {e.key: e for m in _LESSONS for e in m.EXERCISES}


def _get(key: str) -> Exercise:
    if key not in EXERCISES:
        raise ValueError(f"unknown exercise {key!r}; valid: {', '.join(EXERCISES)}")
    return EXERCISES[key]


def question(key: str) -> str:
    """The text of an exercise."""
    return _get(key).question


def keys(lesson: int | None = None) -> list[str]:
    """Exercise keys, all or one lesson's (e.g. keys(3))."""
    return [k for k in EXERCISES if lesson is None or k.startswith(f"{lesson:02d}.")]


def check(key: str, answer) -> bool:
    """Print ✓ or a hint for ``answer`` ("not answered yet" for None); True when right."""
    exercise = _get(key)
    if answer is None:
        print(f"{key}: not answered yet. {exercise.question}")
        return False
    ok, message = _judge(exercise, answer)
    print(f"{key}: {'✓' if ok else '✗'} {message}")
    return ok


def _judge(exercise: Exercise, answer) -> tuple[bool, str]:
    try:
        return exercise.judge(answer)
    except TypeError as e:
        return False, str(e)


@dataclass(frozen=True)
class Prediction:
    """An answer committed before the measurement; `reveal` judges it afterwards."""

    key: str
    answer: Any

    def reveal(self) -> bool:
        """Print ✓ or ✗ with the reason (the measurement is on screen by now); True when right."""
        exercise = _get(self.key)
        if self.answer is None:
            print(f"{self.key}: no prediction was made; the cells above measured the answer. "
                  "Commit one next time before running on: that is the exercise.")
            return False
        ok, message = _judge(exercise, self.answer)
        print(f"{self.key}: your prediction {self.answer!r}: {'✓' if ok else '✗'} {message}")
        return ok


def predict(key: str, answer) -> Prediction:
    """Record a prediction without judging it; call ``.reveal()`` after the measurement."""
    exercise = _get(key)
    if answer is None:
        print(f"{key}: {exercise.question}\n  Write your prediction in place of None, then run on.")
    else:
        print(f"{key}: prediction recorded ({answer!r}). The next cells measure it.")
    return Prediction(key, answer)
