"""What a learner reads in a lesson, from the notebook itself (no run needed), and its bounds.

The lesson form asks that a learner read technique, not verification, in code that fits the
screen, with something to build, in one sitting. This counts, per lesson:

* visible code lines, and those that are claim checks (`course.claims` blocks and `c.ratio` /
  `c.equal` / `c.true` lines); a cell is out of sight when its metadata hides its input
  (`jupyter.source_hidden`, or a tag `hide-input` / `remove-input` / `remove-cell`);
* visible code lines over 100 characters;
* build tasks: `exercises.check(` calls in visible code cells;
* cells, and words of prose in Markdown cells.

Bounds (`problems`): verification at most 10% of visible code lines, no visible line over 100
characters, at least one build task in lessons 1-12, at most 32 cells, at most 1,600 words.

``python tools/lesson_reading.py notebooks/[0-9][0-9]_*.ipynb`` prints a line per lesson and
exits 1 when one is out of bounds; tests/lessons/test_lesson_reading.py holds every lesson to it.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

MAX_VERIFICATION_SHARE = 0.10
MAX_LINE = 100
MAX_CELLS = 32
MAX_WORDS = 1600
BUILD_TASK_LESSONS = range(1, 13)

_CLAIM = re.compile(
    r"^\s*(with\s+course\.claims\(|with\s+claims\(|c\.(ratio|equal|true)\(|course\.claims\()"
)
_HIDE_TAGS = {"hide-input", "remove-input", "remove-cell"}
_MARKUP = re.compile(r"<[^>]+>|\]\([^)]*\)|[#*`|>-]")


@dataclass(frozen=True)
class Reading:
    """What a learner reads in one lesson."""

    lesson: int
    cells: int
    code_lines: int
    claim_lines: int
    long_lines: int
    build_tasks: int
    words: int

    @property
    def verification_share(self) -> float:
        """Claim-check lines as a share of the visible code lines."""
        return self.claim_lines / self.code_lines if self.code_lines else 0.0


def hidden(cell: dict) -> bool:
    """True when the cell's input is out of sight (JupyterLab folds it, the site hides it)."""
    meta = cell.get("metadata", {})
    tags = set(meta.get("tags", []))
    return bool(meta.get("jupyter", {}).get("source_hidden")) or bool(_HIDE_TAGS & tags)


def read(path: str | Path) -> Reading:
    """Count what a learner reads in the notebook at ``path`` (named NN_title.ipynb)."""
    nb = json.loads(Path(path).read_text())
    code = claims = long = builds = words = 0
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            words += len(_MARKUP.sub(" ", src).split())
            continue
        if cell["cell_type"] != "code" or hidden(cell):
            continue
        in_claims = None
        for line in src.splitlines():
            if not line.strip() or line.strip().startswith("#"):
                continue
            code += 1
            indent = len(line) - len(line.lstrip())
            if in_claims is not None and indent <= in_claims:
                in_claims = None
            if _CLAIM.match(line):
                claims += 1
                if line.lstrip().startswith("with"):
                    in_claims = indent
            elif in_claims is not None:
                claims += 1
            long += len(line) > MAX_LINE
        builds += len(re.findall(r"exercises\.check\(", src))
    lesson = int(re.match(r"(\d\d)_", Path(path).name).group(1))
    return Reading(lesson, len(nb["cells"]), code, claims, long, builds, words)


def problems(r: Reading) -> list[str]:
    """What is out of bounds in one lesson's reading (empty when it reads as a lesson)."""
    out = []
    if r.verification_share > MAX_VERIFICATION_SHARE:
        out.append(f"verification is {r.verification_share:.0%} of visible code "
                   f"(at most {MAX_VERIFICATION_SHARE:.0%}): move claim checks into hidden cells")
    if r.long_lines:
        out.append(f"{r.long_lines} visible code line(s) over {MAX_LINE} characters: "
                   "`ruff format` the notebook, shorten long strings by hand")
    if r.lesson in BUILD_TASK_LESSONS and not r.build_tasks:
        out.append("no build task (a visible `exercises.check(...)` cell)")
    if r.cells > MAX_CELLS:
        out.append(f"{r.cells} cells (at most {MAX_CELLS})")
    if r.words > MAX_WORDS:
        out.append(f"{r.words} words of prose (at most {MAX_WORDS})")
    return out


def main(paths: list[str]) -> int:
    """Print one line per lesson; 1 when any is out of bounds."""
    bad = 0
    for path in paths:
        r = read(path)
        issues = problems(r)
        bad += bool(issues)
        print(f"{'BAD' if issues else 'OK '} {Path(path).name:42} verification {r.claim_lines:3}/"
              f"{r.code_lines:3} ({r.verification_share:4.0%})  long lines {r.long_lines:2}  "
              f"build tasks {r.build_tasks}  cells {r.cells:2}  words {r.words:5}"
              + "".join(f"\n    {i}" for i in issues))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
