"""Every lesson reads as a lesson (tools/lesson_reading.py): checks out of sight, code that fits,
a build task with a solution and a test, one sitting; and the notebooks stay formatted."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools import lesson_reading

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NOTEBOOKS = LESSONS + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))


def _notebook(*cells) -> dict:
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _code(src: str, hidden: bool = False) -> dict:
    meta = {"tags": ["hide-input"], "jupyter": {"source_hidden": True}} if hidden else {}
    return {"cell_type": "code", "source": src, "metadata": meta, "outputs": []}


def _write(tmp_path, name, nb) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(nb))
    return path


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_the_lesson_reads_as_a_lesson(path):
    problems = lesson_reading.problems(lesson_reading.read(path))
    assert not problems, f"{path.name}: " + "; ".join(problems)


def test_a_visible_claims_block_counts_as_verification_and_a_hidden_one_does_not(tmp_path):
    block = 'with course.claims("x") as c:\n    c.ratio("a", 1, 1, 0.9, 1.1)\nplot(x)\n'
    visible = lesson_reading.read(_write(tmp_path, "01_a.ipynb", _notebook(_code(block))))
    assert (visible.code_lines, visible.claim_lines) == (3, 2)
    assert any("verification" in p for p in lesson_reading.problems(visible))
    hidden = lesson_reading.read(_write(tmp_path, "01_b.ipynb", _notebook(_code(block, True))))
    assert (hidden.code_lines, hidden.claim_lines) == (0, 0)


def test_a_long_visible_line_and_a_missing_build_task_are_reported(tmp_path):
    nb = _notebook(_code("x = " + "1 + " * 30 + "1\n"))
    problems = lesson_reading.problems(lesson_reading.read(_write(tmp_path, "05_x.ipynb", nb)))
    assert any("over 100" in p for p in problems) and any("build task" in p for p in problems)
    tour = lesson_reading.read(_write(tmp_path, "00_x.ipynb", _notebook(_code("x = 1\n"))))
    assert not lesson_reading.problems(tour)          # lesson 0 needs no build task


@pytest.mark.parametrize("path", [p for p in LESSONS if not p.name.startswith("00_")],
                         ids=lambda p: p.stem)
def test_every_build_task_has_a_worked_solution_and_a_test(path):
    visible = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                      if c["cell_type"] == "code" and not lesson_reading.hidden(c))
    keys = re.findall(r"""exercises\.check\(\s*["']([^"']+)["']""", visible)
    assert keys, f"{path.name} has no build task"
    solutions = (ROOT / "notebooks" / "solutions" / f"{path.stem}_solutions.ipynb").read_text()
    tests = (ROOT / "tests" / "lessons" / f"test_exercises_{path.name[:2]}.py").read_text()
    for key in keys:
        assert key in solutions, f"{key}: no worked solution in {path.stem}_solutions.ipynb"
        assert f'"{key}"' in tests, f"{key}: no test in test_exercises_{path.name[:2]}.py"


def test_every_notebook_is_formatted():
    """ruff formats notebooks (line length 100, pyproject.toml): run `ruff format notebooks`."""
    result = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", "--quiet",
                             *map(str, NOTEBOOKS)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
