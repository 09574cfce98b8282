"""What every exercise shares: the `Exercise` record and the judges of numbers and name sets."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

GIB = 2 ** 30


@dataclass(frozen=True)
class Exercise:
    """A question, the function that judges an answer (judge(answer) -> (ok, message)) and,
    for a prediction, the function that measures the right answer (`expected`), which the
    test run uses to make sure no output above the question already shows it."""

    key: str
    question: str
    judge: Callable[[Any], tuple[bool, str]]
    expected: Callable[[], Any] | None = None


def _number(answer) -> float:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or answer != answer:
        raise TypeError(f"expected a number, got {answer!r} ({type(answer).__name__})")
    return float(answer)


def _close(answer, expected: float, rel: float, hint_low: str, hint_high: str):
    """Judge a number within a relative tolerance; the hint depends on the side it misses."""
    value = _number(answer)
    if math.isclose(value, expected, rel_tol=rel, abs_tol=1e-12):
        return True, f"{value:,.6g} is right."
    return False, hint_low if value < expected else hint_high


def _name_set(answer, valid, what: str):
    """(set of names, None) from a name or a collection of names, or (None, why not)."""
    if isinstance(answer, str):
        answer = {answer}
    try:
        given = {str(a) for a in answer}
    except TypeError:
        return None, f"Give a set of {what}, e.g. {{'Linear', 'ReLU'}}."
    unknown = given - set(valid)
    if unknown:
        return None, f"Unknown names {sorted(unknown)}; choose from {sorted(valid)}."
    return given, None
