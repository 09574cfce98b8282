"""What every exercise shares: the `Exercise` record, and judges built from a declaration:
a number within a tolerance (`near`), one of a few choices (`one_of`), a set of names
(`name_set`). Each judge measures the right answer when it judges, never before, and turns a
wrong answer into a hint for its side or its kind of mistake.

A judge's messages are format strings: ``{expected}`` is the measured answer, ``{value}`` the
learner's number, and ``facts`` (a function returning a dict) adds other measured numbers.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Callable

from ckpt_lab.lessons.units import GIB  # noqa: F401  (lesson08, lesson09)

Judge = Callable[[Any], tuple[bool, str]]


@dataclass(frozen=True)
class Exercise:
    """A question, the function that judges an answer (judge(answer) -> (ok, message)) and,
    for a prediction, the function that measures the right answer (`expected`), which the
    test run uses to make sure no output above the question already shows it."""

    key: str
    question: str
    judge: Judge
    expected: Callable[[], Any] | None = None


def _number(answer) -> float:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or answer != answer:
        raise TypeError(f"expected a number, got {answer!r} ({type(answer).__name__})")
    return float(answer)


def near(expected: Callable[[], float], tolerance: float, *, low: str, high: str | None = None,
         right: str = "{value:,.6g} is right.", relative: bool = False, strict: bool = False,
         facts: Callable[[], dict] | None = None) -> Judge:
    """A judge of a number: ``right`` within ``tolerance`` of ``expected()`` (absolute, or
    relative with ``relative``; ``strict``: closer than it), else the hint for the side it
    misses on, ``low`` below and ``high`` above (``low`` for both when ``high`` is None).
    A tolerance of 0 asks for the number itself."""
    def judge(answer):
        value = _number(answer)
        want = expected()
        if relative:
            ok = math.isclose(value, want, rel_tol=tolerance, abs_tol=1e-12)
        else:
            ok = abs(value - want) < tolerance if strict else abs(value - want) <= tolerance
        message = right if ok else low if value < want or high is None else high
        return ok, message.format(expected=want, value=value, **(facts() if facts else {}))
    return judge


def one_of(choices: tuple, expected: Callable[[], Any], right: str, wrong: str,
           hints: dict | None = None, *, normalise: Callable[[str], str] | None = None,
           facts: Callable[[], dict] | None = None) -> Judge:
    """A judge of one of ``choices`` (an answer of another type, or outside them, is asked
    again; ``normalise``, e.g. ``str.lower``, is applied first): right when it is
    ``expected()``, else ``hints[answer]`` where the answer has its own hint, else ``wrong``."""
    def judge(answer):
        if not isinstance(answer, type(choices[0])):
            return False, f"Answer one of {choices}."
        given = normalise(answer) if normalise else answer
        if given not in choices:
            return False, f"Answer one of {choices}."
        want = expected()
        fields = dict(expected=want, **(facts() if facts else {}))
        if given == want:
            return True, right.format(**fields)
        return False, (hints or {}).get(given, wrong).format(**fields)
    judge.choices = choices          # the options, for the answer-on-screen rule (tools/lesson_shape)
    return judge


def _name_set(answer, valid, what: str = "names", convert: Callable = str,
              normalise: Callable | None = None):
    """(set of names, None) from one name or a collection of them, or (None, why not).

    Each element is ``convert``-ed (str; int for numbers), then ``normalise``-d (case, aliases).
    """
    if isinstance(answer, type(next(iter(valid)))):
        answer = {answer}
    try:
        given = {convert(a) for a in answer}
    except (TypeError, ValueError):
        example = "{" + ", ".join(repr(v) for v in list(valid)[:2]) + "}"
        return None, f"Give a set of {what}, e.g. {example}."
    if normalise:
        given = {normalise(g) for g in given}
    unknown = given - set(valid)
    if unknown:
        return None, f"Unknown {what} {sorted(unknown)}; choose from {list(valid)}."
    return given, None


def name_set(valid, expected: Callable[[], Iterable], right: str | Callable[[set], str],
             wrong: Callable[[set, set], str], *, what: str = "names", convert: Callable = str,
             normalise: Callable | None = None) -> Judge:
    """A judge of a set of names out of ``valid`` (a single name counts as a set of one): right
    when it is ``expected()``; else ``wrong(given, expected)`` says what is missing or extra.
    ``right`` is a message, or a function of the expected set that writes one."""
    def judge(answer):
        given, why = _name_set(answer, valid, what, convert, normalise)
        if why:
            return False, why
        want = set(expected())
        if given == want:
            return True, right(want) if callable(right) else right
        return False, wrong(given, want)
    return judge


def not_quite(hints: list[str]) -> str:
    """One message from a wrong answer's hints: "Not quite: a; b."."""
    return "Not quite: " + "; ".join(hints) + "."
