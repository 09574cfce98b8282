"""Conventions every course notebook keeps, checked statically (nbval runs them; the budget
hook in notebooks/conftest.py times them), plus one run proving the budget hook can fail."""
import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest

from ckpt_lab.lessons import course, exercises

ROOT = Path(__file__).resolve().parents[2]
NB_DIR = ROOT / "notebooks"
LESSONS = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))
SOLUTIONS = sorted((NB_DIR / "solutions").glob("[0-9][0-9]_*_solutions.ipynb"))
ALL = LESSONS + SOLUTIONS


def _name(path: Path) -> str:
    return path.relative_to(NB_DIR).with_suffix("").as_posix()


def _read(path):
    return nbformat.read(path, as_version=4)


def _code(nb):
    return [c.source for c in nb.cells if c.cell_type == "code"]


COURSE = [p for p in LESSONS if p.stem in course.LESSONS]


def test_course_map_matches_the_files():
    assert [p.stem for p in COURSE] == list(course.LESSONS)


@pytest.mark.parametrize("path", ALL, ids=_name)
def test_badges_point_at_own_notebook(path):
    first = _read(path).cells[0]
    assert first.cell_type == "markdown"
    name = _name(path)
    assert course.colab_url(name) in first.source
    assert course.binder_url(name) in first.source
    urls = re.findall(r"https://(?:colab\.research\.google\.com/github|mybinder\.org/v2)/[^)\s]+",
                      first.source)
    assert urls and all(name + ".ipynb" in u for u in urls), urls
    assert course.REPO_SLUG in course.colab_url(name) and course.BRANCH in course.binder_url(name)


@pytest.mark.parametrize("path", COURSE, ids=_name)
def test_lesson_says_what_the_learner_will_be_able_to_do(path):
    assert "you will be able to" in _read(path).cells[0].source


@pytest.mark.parametrize("path", ALL, ids=_name)
def test_outputs_stripped_and_kernelspec(path):
    nb = _read(path)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


PYPROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
COLAB_SHIPS = ("torch", "ipywidgets", "numpy", "matplotlib")


@pytest.mark.parametrize("path", ALL, ids=_name)
def test_first_code_cell_installs_only_when_missing(path):
    first = _code(_read(path))[0]
    assert re.search(r"try:\s*\n\s*import ckpt_lab\s*\nexcept ImportError:", first), first
    pip_lines = [line for line in first.splitlines() if "pip install" in line]
    assert pip_lines and all(line.startswith("    ") for line in pip_lines)   # inside except
    assert any("--no-deps" in line and course.REPO_SLUG in line for line in pip_lines)
    # nothing Colab ships is installed, upgraded or pinned
    assert all("--no-deps" in line for line in pip_lines)
    assert not any(re.search(rf"\b{name}\b", line) for line in pip_lines for name in COLAB_SHIPS)
    assert "course.setup()" in first                          # prints the device it will use


@pytest.mark.parametrize("path", ALL, ids=_name)
def test_install_cell_pins_this_release(path):
    """The tag a notebook installs is the package's version, so a release bump cannot forget it."""
    first = _code(_read(path))[0]
    tags = re.findall(r"git\+https://github\.com/([\w.-]+/[\w.-]+)@v([\w.]+)\"", first)
    assert tags == [(course.REPO_SLUG, PYPROJECT_VERSION)], tags
    assert course.install_spec() in first
    import ckpt_lab
    assert ckpt_lab.__version__ == PYPROJECT_VERSION


@pytest.mark.parametrize("path", COURSE, ids=_name)
def test_opening_says_how_to_get_a_gpu_on_colab(path):
    opening = _read(path).cells[0].source
    assert "Runtime > Change runtime type" in opening and "GPU" in opening
    assert course.GPU_HINT.startswith("on Colab, Runtime > Change runtime type")


class _TorchCheckpointCalls(ast.NodeVisitor):
    """Calls of torch.utils.checkpoint's functions in source order, however they were
    imported (``torch.utils.checkpoint.checkpoint``, ``tuc.checkpoint``, ``from
    torch.utils.checkpoint import checkpoint``), and the ones that open a ``with``."""

    def __init__(self):
        self.names, self.calls, self.with_calls = {}, [], set()

    def visit_Import(self, node):
        for a in node.names:
            self.names[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                a.name.split(".")[0]

    def visit_ImportFrom(self, node):
        for a in node.names:
            self.names[a.asname or a.name] = f"{node.module}.{a.name}"

    def dotted(self, expr):
        if isinstance(expr, ast.Name):
            return self.names.get(expr.id, expr.id)
        if isinstance(expr, ast.Attribute):
            base = self.dotted(expr.value)
            return base and f"{base}.{expr.attr}"
        return None

    def visit_With(self, node):
        self.with_calls |= {id(item.context_expr) for item in node.items}
        self.generic_visit(node)

    def visit_Call(self, node):
        name = self.dotted(node.func) or ""
        if name.startswith("torch.utils.checkpoint."):
            self.calls.append((name.rpartition(".")[2], node))
        self.generic_visit(node)


def torch_checkpoint_calls(path):
    """(function name, call node, source of the call, whether it opens a ``with``) for every
    call of a torch.utils.checkpoint function in a notebook's code."""
    lines, magic = [], False
    for src in _code(_read(path)):
        for line in src.splitlines():    # IPython's %magics and !shell lines are no Python
            magic = magic or line.lstrip().startswith(("%", "!"))
            if not magic:
                lines.append(line)
            magic = magic and line.rstrip().endswith("\\")
    code = "\n".join(lines)
    visitor = _TorchCheckpointCalls()
    visitor.visit(ast.parse(code))
    return [(name, node, ast.get_source_segment(code, node), id(node) in visitor.with_calls)
            for name, node in visitor.calls]


CHECKPOINTS = {"checkpoint", "checkpoint_sequential"}
CALLS = {p: torch_checkpoint_calls(p) for p in ALL}
CHECKPOINTING = [p for p in ALL if any(name in CHECKPOINTS for name, *_ in CALLS[p])]
EARLY_STOP = [p for p in ALL if any(name == "set_checkpoint_early_stop" for name, *_ in CALLS[p])]


def test_the_checks_of_torch_calls_see_them():
    """The two tests below run on every notebook that makes the call (found by its imports)."""
    assert len(CHECKPOINTING) >= 8 and NB_DIR / "00_tour.ipynb" in CHECKPOINTING
    assert NB_DIR / "02_checkpointing_from_scratch.ipynb" in EARLY_STOP


@pytest.mark.parametrize("path", CHECKPOINTING, ids=_name)
def test_use_reentrant_always_explicit(path):
    for name, node, src, _ in CALLS[path]:
        if name in CHECKPOINTS:
            assert any(k.arg == "use_reentrant" for k in node.keywords), src


@pytest.mark.parametrize("path", EARLY_STOP, ids=_name)
def test_early_stop_is_shown_as_a_context_manager(path):
    for name, _, src, opens_with in CALLS[path]:
        if name == "set_checkpoint_early_stop":
            assert opens_with, src


@pytest.mark.parametrize("path", ALL, ids=_name)
def test_no_downloads_at_run_time(path):
    for src in _code(_read(path))[1:]:
        assert not re.search(r"urlretrieve|requests\.|wget|curl |https?://|download=True", src), src


@pytest.mark.parametrize("path", COURSE[1:], ids=_name)
def test_exercises_and_solutions(path):
    lesson = int(path.name[:2])
    keys = exercises.keys(lesson)
    assert 2 <= len(keys) <= 4          # 2-3 predictions, and at most one build task
    lesson_code = "\n".join(_code(_read(path)))
    solution = NB_DIR / "solutions" / f"{path.stem}_solutions.ipynb"
    assert solution.exists(), f"missing {solution}"
    solution_code = "\n".join(_code(_read(solution)))
    for key in keys:
        assert (f'exercises.check("{key}", ' in lesson_code
                or f'exercises.predict("{key}", ' in lesson_code), key
        assert f'exercises.check("{key}", ' in solution_code, key
    # unanswered in the lesson: every answer starts as None, or a build task's function as a
    # stub whose body is `...` or `raise NotImplementedError`
    for src in _code(_read(path)):
        if "exercises.check(" in src or "exercises.predict(" in src:
            assert re.search(r"=\s*None|,\s*None\)|^\s+(\.\.\.|raise NotImplementedError\b)",
                             src, re.M), src


def test_tour_links_every_lesson():
    tour = "\n".join(c.source for c in _read(NB_DIR / "00_tour.ipynb").cells if c.cell_type == "markdown")
    for name in course.LESSONS:
        if name != "00_tour":
            assert f"({name}.ipynb)" in tour


def test_budget_hook_fails_a_notebook_over_budget_and_saves_the_run(tmp_path):
    """Run one tiny notebook under nbval with a zero-second budget: the hook must fail it and
    still write its measurements, and save the notebook as executed, widget state included
    (what the site is built from)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("x = [0] * 1000"), nbformat.v4.new_code_cell("print(len(x))"),
                nbformat.v4.new_markdown_cell("text"),
                nbformat.v4.new_code_cell("import ipywidgets\ns = ipywidgets.IntSlider(value=3)\ns"),
                nbformat.v4.new_code_cell("s.value = 7"),
                nbformat.v4.new_code_cell("len(x);  # a final semicolon hides the value")]
    target = NB_DIR / "zz_budget_probe.ipynb"   # beside the conftest that holds the hook
    out = tmp_path / "budgets.json"
    nbformat.write(nb, target)
    try:
        env = dict(os.environ, CKPT_LAB_NB_BUDGET_SECONDS="0", CKPT_LAB_NB_BUDGET_JSON=str(out),
                   CKPT_LAB_EXECUTED_DIR=str(tmp_path / "executed"), CKPT_LAB_LESSON_FORM="all")
        proc = subprocess.run([sys.executable, "-m", "pytest", str(target), "-p", "no:cacheprovider",
                               "-q"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        target.unlink()
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "over its budget" in proc.stdout
    assert "out of the lesson form" in proc.stdout and "no closing 'What you now know'" in proc.stdout
    record = json.loads(out.read_text())["zz_budget_probe.ipynb"]
    assert record["seconds"] > 0 and record["peak_rss_mib"] > 10

    ran = _read(tmp_path / "executed" / "zz_budget_probe.ipynb")
    code = [c for c in ran.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == [1, 2, 3, 4, 5]
    assert code[4].outputs == []                                 # as Jupyter shows it
    assert code[1].outputs[0].text == "1000\n" and ran.cells[2].source == "text"
    view = code[2].outputs[0].data["application/vnd.jupyter.widget-view+json"]
    state = ran.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    assert state[view["model_id"]]["state"]["value"] == 7      # the state after the last cell
    assert not list(NB_DIR.glob("zz_budget_probe*")) and not (NB_DIR / "executed").exists()


# ---------------------------------------------------- every lesson keeps the lesson form
from tools import lesson_shape  # noqa: E402


def _closing(nb, heading: str) -> str:
    cells = [c.source for c in nb.cells if c.cell_type == "markdown"]
    found = [s for s in cells if s.lstrip().lower().startswith(f"## {heading}")]
    assert found, f"no '## {heading}' section"
    return found[-1]


@pytest.mark.parametrize("path", COURSE, ids=_name)
def test_lesson_prose_cells_are_short(path):
    words = [lesson_shape.prose_words(c.source) for c in _read(path).cells if c.cell_type == "markdown"]
    long = [w for w in words if w > lesson_shape.MAX_PROSE_WORDS]
    assert not long, f"prose cells over {lesson_shape.MAX_PROSE_WORDS} words: {long}"


@pytest.mark.parametrize("path", COURSE, ids=_name)
def test_lesson_closes_with_takeaways_and_plain_code(path):
    nb = _read(path)
    know = _closing(nb, "what you now know")
    bullets = [l for l in know.splitlines() if l.lstrip().startswith(("- ", "* "))]
    assert 3 <= len(bullets) <= 5, f"'What you now know' has {len(bullets)} bullets (3-5)"
    code = re.search(r"```python\n(.*?)```", _closing(nb, "in your code"), re.S)
    assert code, "'In your code' shows its lines in a ```python block"
    lines = [l for l in code.group(1).splitlines() if l.strip()]
    assert len(lines) <= 12 and "ckpt_lab" not in code.group(1), \
        "'In your code' is at most 12 lines of plain PyTorch / Hugging Face, no ckpt_lab"


@pytest.mark.parametrize("path", COURSE, ids=_name)
def test_lesson_exercises_are_committed_predictions(path):
    """Two or three predictions, each revealed later; every one a registered exercise."""
    source = "\n".join(_code(_read(path)))
    keys = re.findall(r"(\w+)\s*=\s*exercises\.predict\(\s*[\"'](\d\d\.\w+)[\"']", source)
    assert 2 <= len(keys) <= 3, f"{len(keys)} predictions (2-3 per lesson)"
    for var, key in keys:
        assert key in exercises.EXERCISES and key.startswith(path.stem[:2] + ".")
        assert re.search(rf"\b{var}\.reveal\(\)", source), f"{key} is never revealed"
        assert exercises.EXERCISES[key].expected is not None, \
            f"{key} declares no expected(): the answer-on-screen rule cannot check it"


def test_the_tour_lists_every_lesson_by_its_current_title():
    """The tour's course list is course.lesson_links_markdown(), so a retitled lesson cannot
    leave the tour naming it by an old title."""
    cells = [c.source for c in _read(NB_DIR / "00_tour.ipynb").cells if c.cell_type == "markdown"]
    core, rest = range(0, 6), range(6, len(course.LESSONS))
    assert any(course.lesson_links_markdown(core) in s for s in cells)
    assert any(course.lesson_links_markdown(rest) in s for s in cells)


def test_the_tour_groups_the_lessons_as_the_course_map_paths_do():
    """The tour names the core, the practitioner's lessons and the optional ones by number;
    the README's course map (tools/course_map.PATHS) is where those paths are defined."""
    sys.path.insert(0, str(NB_DIR.parent / "tools"))
    import course_map
    text = next(c.source for c in _read(NB_DIR / "00_tour.ipynb").cells
                if c.source.startswith("Then the practitioner's lessons"))
    paths = {name: [int(n[:2]) for n in lessons] for name, lessons, _ in course_map.PATHS}
    assert paths["The core"] == list(range(0, 6))
    optional = sorted(n for name, ns in paths.items() if name.startswith("Optional") for n in ns)
    named = ", ".join(map(str, paths["The practitioner's lessons"]))
    assert f"practitioner's lessons ({named})" in text
    assert f"optional ones ({', '.join(map(str, optional))})" in text
