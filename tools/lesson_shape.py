"""The shape a learner meets in an executed lesson, and the rules every lesson keeps.

``python tools/lesson_shape.py artifacts/executed/[0-9]*.ipynb`` prints one line per lesson.
notebooks/conftest.py applies `problems` to every lesson of the course (`held_to_form`: each one
in `ckpt_lab.lessons.course.LESSONS`; solutions are exempt) after nbval ran it, so the test run
fails when a lesson grows a wall of output, loses its figure or its closing sections, or shows
an exercise's answer above the question.

The rules (the lesson-form issue): at least one figure; no prose cell over 180 words; at most
45 lines of text output; the lesson closes with "What you now know" and "In your code"; nothing
above a prediction or check gives the answer it asks for: no output prints it, and no heading,
header bullet or sentence of prose above it states it (`answers_on_screen`).

``--answers`` also looks up each exercise's measured answer (slow: it measures) and applies the
answer rule, as the test run does.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

MAX_PROSE_WORDS = 180
MAX_TEXT_LINES = 45
FIGURE_MIMES = ("image/png", "image/svg+xml", "application/vnd.jupyter.widget-view+json")
_QUESTION = re.compile(r"exercises\.(?:predict|check)\(\s*[\"'](\d\d\.\w+)[\"']")


@dataclass
class Shape:
    """What one executed lesson shows a learner."""

    figures: int
    longest_prose: int
    prose_over_limit: int
    text_lines: int
    what_you_know: bool
    in_your_code: bool


def held_to_form(name: str) -> bool:
    """Whether a notebook (its path under notebooks/, e.g. "03_how_many_segments.ipynb")
    keeps the lesson form: every lesson of the course does; solutions and others do not."""
    from ckpt_lab.lessons.course import LESSONS
    return Path(name).with_suffix("").as_posix() in LESSONS


def _text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    data = output.get("data", {})
    text = data.get("text/plain", "")
    if "text/html" in data and not text:
        text = re.sub(r"<[^>]+>", "", data["text/html"])
    if output.get("output_type") == "error":
        text = "\n".join(output.get("traceback", []))
    return text


_NAV_LINE = re.compile(r"^\s*[-*] (\d\d: )?\[[^\]]*\]\([^)\s]*\)\s*$")


def prose_words(markdown: str) -> int:
    """Words of prose in a Markdown cell; a list item that is only a link (the tour's list of
    lessons) is navigation, not prose to read, and counts none."""
    return sum(len(line.split()) for line in markdown.splitlines() if not _NAV_LINE.match(line))


def shape(nb) -> Shape:
    """Count figures, prose words, text lines and the closing sections of an executed notebook."""
    words = [prose_words(c.source) for c in nb.cells if c.cell_type == "markdown"]
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    figures = sum(any(m in o.get("data", {}) for m in FIGURE_MIMES) for o in outputs)
    lines = sum(len(_text(o).splitlines()) for o in outputs)
    tail = " ".join(c.source for c in nb.cells[-4:] if c.cell_type == "markdown").lower()
    return Shape(figures, max(words or [0]), sum(w > MAX_PROSE_WORDS for w in words), lines,
                 "what you now know" in tail, "in your code" in tail)


def renderings(value) -> list[str]:
    """The ways a lesson might print an answer (numbers only; short ones are too common)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return []
    from ckpt_lab.lessons.units import fmt_bytes
    forms = {f"{value:,.0f}", f"{value:.0f}", f"{value:.2f}", f"{value:.3g}", f"{value:,.2f}"}
    if abs(value) >= 1024:
        forms.add(fmt_bytes(value))
    return sorted(f for f in forms if len(f.replace(",", "").replace(".", "").strip("0")) >= 3)


# A one-word choice shorter than this is too common a word ("same", "above") to search prose for.
MIN_CHOICE_LETTERS = 8


def prose_units(markdown: str) -> list[str]:
    """The statements of a markdown cell: each heading, bullet and table row, and each sentence
    of its paragraphs, with link targets and HTML tags taken out (they name files, not answers)."""
    text = re.sub(r"\]\([^)]*\)", "]", markdown)
    text = re.sub(r"<[^>]+>", " ", text)
    units, paragraph = [], []
    for line in text.splitlines() + [""]:
        stripped = line.strip()
        if not stripped or re.match(r"(#{1,6} |[-*] |\d+\. |\|)", stripped):
            units += re.split(r"(?<=[.?!])\s+", " ".join(paragraph))
            paragraph = []
            if stripped:
                units.append(stripped)
        else:
            paragraph.append(stripped)
    return [u for u in units if u.strip()]


def _words(text: str) -> re.Pattern:
    """Text's words in prose, in any case, apart by spaces or hyphens ("bit-identical")."""
    words = re.findall(r"[^\W_]+", text.lower())
    return re.compile(r"\b" + r"[\s-]+".join(map(re.escape, words)) + r"\b", re.I)


def _choice_pattern(choice) -> re.Pattern | None:
    """A pattern for a choice's words in prose, or None when the choice is no distinctive
    string (a number, a bool, one short common word)."""
    if not isinstance(choice, str):
        return None
    words = re.findall(r"[^\W_]+", choice)
    if not words or (len(words) == 1 and len(words[0]) < MIN_CHOICE_LETTERS):
        return None
    return _words(choice)


def _number_shown(value, text: str) -> list[str]:
    return [r for r in renderings(value) if re.search(rf"(?<![\d.]){re.escape(r)}(?![\d])", text)]


def stated_in_prose(units: list[str], value, choices=()) -> list[str]:
    """The prose units that state `value`: a distinctive number in any of its renderings, or a
    distinctive choice named without another choice beside it (a unit that lists two or more
    choices asks; one that names only the answer gives it)."""
    pattern = _choice_pattern(value)
    if pattern is not None:
        others = [_words(str(c)) for c in choices if str(c).lower() != value.lower()]
        return [u for u in units if pattern.search(u) and not any(o.search(u) for o in others)]
    return [u for u in units if _number_shown(value, u)]


def answers_on_screen(nb, expected_of, choices_of=lambda key: ()) -> list[str]:
    """Questions whose measured answer already shows above them: printed in an output, or
    stated in the markdown (a heading, a header bullet, a sentence of prose).

    `expected_of(key)` returns the right answer of an exercise, or None when it has no
    `expected` function; `choices_of(key)` the options of a one-of exercise (empty otherwise).
    Only answers with a distinctive rendering are searched for: numbers with three or more
    significant digits, and choices of two or more words or one long word.
    """
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for key in _QUESTION.findall(cell.source):
            value = expected_of(key)
            if value is None:
                continue
            above = "\n".join(_text(o) for c in nb.cells[:index] for o in c.get("outputs", []))
            shown = _number_shown(value, above)
            if shown:
                found.append(f"{key}: its answer {shown[0]!r} is printed above the question")
            for at, md in enumerate(nb.cells[:index]):
                if md.cell_type != "markdown":
                    continue
                for unit in stated_in_prose(prose_units(md.source), value, choices_of(key)):
                    found.append(f"{key}: its answer {value!r} is stated above the question, "
                                 f"in cell [{at}]: {unit[:90]!r}")
    return found


def exercise_answers():
    """(expected_of, choices_of) from the course's exercises: the measured answer of each one
    that declares one, and the options of each one-of exercise."""
    from ckpt_lab.lessons import exercises

    def expected_of(key):
        exercise = exercises.EXERCISES.get(key)
        return exercise.expected() if exercise is not None and exercise.expected else None

    def choices_of(key):
        exercise = exercises.EXERCISES.get(key)
        return getattr(exercise.judge, "choices", ()) if exercise is not None else ()

    return expected_of, choices_of


def problems(nb, expected_of=lambda key: None, choices_of=lambda key: ()) -> list[str]:
    """Every rule of the lesson form this executed notebook breaks."""
    s = shape(nb)
    out = []
    if s.figures < 1:
        out.append("no figure")
    if s.prose_over_limit:
        out.append(f"{s.prose_over_limit} prose cell(s) over {MAX_PROSE_WORDS} words "
                   f"(longest {s.longest_prose})")
    if s.text_lines > MAX_TEXT_LINES:
        out.append(f"{s.text_lines} lines of text output (at most {MAX_TEXT_LINES})")
    if not s.what_you_know:
        out.append("no closing 'What you now know'")
    if not s.in_your_code:
        out.append("no closing 'In your code'")
    return out + answers_on_screen(nb, expected_of, choices_of)


def main(paths: list[str]) -> int:
    """Print one line per lesson; exit 1 when any breaks a rule (``--answers``: the answer rule
    too, each exercise's answer measured)."""
    answers = exercise_answers() if "--answers" in paths else (lambda key: None, lambda key: ())
    paths = [p for p in paths if p != "--answers"]
    bad = 0
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        s, broken = shape(nb), problems(nb, *answers)
        bad += bool(broken)
        print(f"{'BAD' if broken else 'OK '} {path.split('/')[-1]:42s} figures {s.figures:2d}  "
              f"longest prose {s.longest_prose:3d}  text lines {s.text_lines:3d}  "
              f"closing {'yes' if s.what_you_know and s.in_your_code else 'no'}"
              + (f"  ({'; '.join(broken)})" if broken else ""))
    print(f"{len(paths) - bad}/{len(paths)} lessons in shape")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
