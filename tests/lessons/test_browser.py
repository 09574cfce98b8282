"""End to end in a real browser: each lesson with widgets, run in JupyterLab through the UI.

nbval checks that the code runs; this checks what a learner sees. For every notebook under
notebooks/ whose code uses widgets, and for the tour under Notebook 7, it runs all cells in
Chromium, then requires: no error output, no widget shown as text or as an error box, no widget
manager error in the console, every slider drawn as a slider whose drag changes its readout and
an output (and, per lesson, at least one redrawn plot). Screenshots go to artifacts/browser/.

Needs Debian's Chromium (`apt-get install -y chromium`); skips without it, except under CI.
"""

import os
import re
import shutil
from pathlib import Path

import pytest

import browser_helpers as bh

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
TOUR = NOTEBOOKS / "00_tour.ipynb"
ARTIFACTS = REPO / "artifacts" / "browser"
RUN_TIMEOUT_S = 240  # one lesson's "Run All"; the whole suite's budget is 5 minutes on 2 cores

# A one-slider lesson in miniature: the harness must pass it...
GOOD = [
    "import ipywidgets as widgets\nimport matplotlib.pyplot as plt\n"
    "from IPython.display import display",
    "slider = widgets.IntSlider(value=3, min=1, max=8, description='bars')\nout = widgets.Output()\n\n"
    "def draw(change=None):\n    with out:\n        out.clear_output(wait=True)\n"
    "        fig, ax = plt.subplots(figsize=(4, 2.5))\n"
    "        ax.bar(range(slider.value), range(1, slider.value + 1))\n        plt.show()\n\n"
    "slider.observe(draw, names='value')\ndraw()\ndisplay(widgets.VBox([slider, out]))",
    ("raise MemoryError('shown on purpose')", ("raises-exception",)),  # a lesson may do this
]
# ...and catch each way this one goes wrong.
BROKEN = GOOD[:1] + [
    "print(widgets.IntSlider(value=4))  # a widget that reaches the page as text",
    "lonely = widgets.IntSlider(value=2, max=5)  # moves, but redraws nothing\n"
    "plot = widgets.Output()\n"
    "with plot:\n    plt.plot([1, 2])\n    plt.show()\ndisplay(lonely, plot)",
    "display({'application/vnd.jupyter.widget-view+json': {'model_id': 'f00d', 'version_major': 2,\n"
    "         'version_minor': 0}, 'text/plain': 'Lost()'}, raw=True)  # a model the page never gets",
    "1 / 0",
]


def in_ci() -> bool:
    """Whether the CI environment variable is set (to anything but false/0)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_chromium() -> str:
    """Path of Chromium; skip when it or Playwright is missing, but fail when CI is set."""
    path = bh.find_chromium()
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        path, missing = None, "Playwright for Python (pip install -r requirements.txt)"
    else:
        missing = f"Chromium: {bh.CHROMIUM_INSTALL_HINT}"
    if path is None:
        message = f"browser tests need {missing}"
        if in_ci():
            pytest.fail(f"{message} (CI is set, so this is a failure, not a skip)")
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def chromium() -> str:
    """Path of Chromium, or a skip (a failure under CI)."""
    return require_chromium()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A throwaway copy of notebooks/ plus the fixture notebooks; the repo is never written."""
    root = tmp_path_factory.mktemp("browser-root")
    if NOTEBOOKS.is_dir():
        shutil.copytree(NOTEBOOKS, root / "notebooks",
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    (root / "fixtures").mkdir()
    bh.write_notebook(root / "fixtures" / "one_slider.ipynb", GOOD)
    bh.write_notebook(root / "fixtures" / "broken_widgets.ipynb", BROKEN)
    return root


@pytest.fixture(scope="module")
def browser(chromium, tmp_path_factory):
    """One headless Chromium, fresh profile, shared by every test in this module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = bh.launch_browser(playwright, chromium, tmp_path_factory.mktemp("chromium-profile"))
        yield context
        context.close()


def _server(app, workdir, tmp_path_factory):
    server = bh.start_jupyter(app, workdir, tmp_path_factory.mktemp(f"jupyter-{app}"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def lab(chromium, workdir, tmp_path_factory):
    """`jupyter lab` serving the throwaway copy."""
    yield from _server("lab", workdir, tmp_path_factory)


@pytest.fixture(scope="module")
def notebook7(chromium, workdir, tmp_path_factory):
    """`jupyter notebook` (Notebook 7) serving the throwaway copy."""
    yield from _server("notebook", workdir, tmp_path_factory)


def assert_learner_sees_working_widgets(report: bh.LessonReport) -> None:
    """The checks a lesson with widgets must pass, with the whole report in the message."""
    summary = (f"{report.app} {report.notebook}: {report.widgets} widgets, {report.sliders} sliders, "
               f"moves {report.moves}, seconds {report.seconds}, screenshot {report.screenshot}")
    assert report.problems == [], f"{summary}\nproblems:\n" + "\n".join(report.problems)
    assert report.widgets > 0, f"no widget rendered at all. {summary}"
    if report.sliders:
        assert report.images_redrawn > 0, f"dragging the sliders redrew no plot. {summary}"
    assert report.screenshot.is_file()


@pytest.mark.parametrize("ci, outcome", [("", pytest.skip.Exception), ("true", pytest.fail.Exception)],
                         ids=["local", "ci"])
def test_missing_chromium_skips_locally_and_fails_in_ci(monkeypatch, ci, outcome):
    monkeypatch.setattr(bh, "find_chromium", lambda: None)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="apt-get install -y chromium"):
        require_chromium()


def test_widget_lessons_are_found_by_their_imports(tmp_path):
    cells = {"magic_only": ['%pip install --quiet "ipywidgets>=8,<9"'],
             "ours": ["from ckpt_lab.lessons import plots, widgets\nwidgets.segments_explorer()"],
             "plain": ["import ipywidgets as W\nW.IntSlider()"],
             "interact": ["from ipywidgets import interact\ninteract(print, x=3)"],
             "none": ["print('no widgets here')"]}
    for name, sources in cells.items():
        bh.write_notebook(tmp_path / f"{name}.ipynb", sources)
    assert [p.stem for p in bh.widget_notebooks(tmp_path)] == ["interact", "ours", "plain"]


def test_harness_passes_a_one_slider_notebook(browser, lab, workdir):
    report = bh.check_notebook(browser, lab, workdir / "fixtures" / "one_slider.ipynb", ARTIFACTS,
                               RUN_TIMEOUT_S)
    assert_learner_sees_working_widgets(report)
    assert report.sliders == 1 and report.images_redrawn == 1
    assert re.fullmatch(r"widget 0, first slider: 3 -> [12], image redrawn", report.moves[0])


def test_harness_catches_broken_widgets(browser, lab, workdir):
    report = bh.check_notebook(browser, lab, workdir / "fixtures" / "broken_widgets.ipynb",
                               ARTIFACTS, RUN_TIMEOUT_S)
    problems = "\n".join(report.problems)
    assert "ZeroDivisionError" in problems
    assert "widget rendered as text: 'IntSlider(value=4)'" in problems
    assert "widget failed to render: 'Error displaying widget: model not found'" in problems
    assert "first slider: moving the slider from 2 changed no output" in problems
    assert "browser console: error: Error: widget model not found" in problems


def _lesson_params():
    lessons = bh.widget_notebooks(NOTEBOOKS) if NOTEBOOKS.is_dir() else []
    if not lessons:
        return [pytest.param(None, marks=pytest.mark.skip(reason="no notebook under notebooks/ "
                                                                  "uses widgets yet"))]
    return [pytest.param(p.name, id=p.stem) for p in lessons]


@pytest.mark.parametrize("name", _lesson_params())
def test_lesson_widgets_work_in_jupyterlab(browser, lab, workdir, name):
    report = bh.check_notebook(browser, lab, workdir / "notebooks" / name, ARTIFACTS, RUN_TIMEOUT_S)
    assert_learner_sees_working_widgets(report)


def test_tour_works_in_notebook7(browser, notebook7, workdir):
    """The tour under Notebook 7; before the tour exists, the one-slider fixture stands in."""
    if TOUR.is_file():
        target = workdir / "notebooks" / TOUR.name
    else:
        target = workdir / "fixtures" / "one_slider_nb7.ipynb"
        bh.write_notebook(target, GOOD)
    report = bh.check_notebook(browser, notebook7, target, ARTIFACTS, RUN_TIMEOUT_S)
    if bh.uses_widgets(target):
        assert_learner_sees_working_widgets(report)
    else:
        assert report.problems == [], "\n".join(report.problems)

