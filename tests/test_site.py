"""The site builder: executed notebooks in, one page each and a course-map index out.

The real site is built by `make test` from the notebooks nbval executed in that run; this
tests the builder on small executed notebooks made here (test_notebooks.py checks that the
nbval run saves them, widget state included)."""
import base64
import importlib.util
import io
from pathlib import Path

import nbformat
import pytest
from matplotlib.figure import Figure

from ckpt_lab.lessons import course

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("build_site", ROOT / "tools" / "build_site.py")
build_site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_site)

VIEW, STATE = build_site.WIDGET_VIEW, build_site.WIDGET_STATE


def _png() -> str:
    fig = Figure(figsize=(1, 1))
    fig.add_subplot().plot([0, 1], [1, 0])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode()


def executed_notebook(widget_state=True):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("Next: [lesson 1](01_where_memory_goes.ipynb), "
                                      "[a part](02_checkpointing_from_scratch.ipynb#intro), "
                                      "[Colab](https://colab.research.google.com/x.ipynb)"),
        nbformat.v4.new_code_cell("print('peak 123 MiB')", execution_count=1, outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="peak 123 MiB\n")]),
        nbformat.v4.new_code_cell("plot()", execution_count=2, outputs=[
            nbformat.v4.new_output("display_data", data={"image/png": _png(),
                                                         "text/plain": "<Figure>"})]),
        nbformat.v4.new_code_cell("explorer", execution_count=3, outputs=[
            nbformat.v4.new_output("display_data", data={
                VIEW: {"model_id": "abc", "version_major": 2, "version_minor": 0},
                "text/plain": "VBox()"})]),
    ]
    if widget_state:
        nb.metadata["widgets"] = {STATE: {"version_major": 2, "version_minor": 0, "state": {
            "abc": {"model_name": "IntSliderModel", "model_module": "@jupyter-widgets/controls",
                    "model_module_version": "2.0.0", "state": {"value": 5}}}}}
    return nb


def test_site_has_a_page_per_executed_notebook_and_an_index_in_course_order(tmp_path):
    executed = tmp_path / "executed"
    (executed / "solutions").mkdir(parents=True)
    nbformat.write(executed_notebook(), executed / "00_tour.ipynb")
    nbformat.write(executed_notebook(), executed / "03_segments_and_sqrt_l.ipynb")
    nbformat.write(executed_notebook(),
                   executed / "solutions" / "03_segments_and_sqrt_l_solutions.ipynb")
    nbformat.write(executed_notebook(), executed / "zz_not_in_the_course.ipynb")
    written = build_site.build(executed, tmp_path / "site", require=["00_tour"])
    assert [p.relative_to(tmp_path / "site").as_posix() for p in written] == [
        "00_tour.html", "03_segments_and_sqrt_l.html",
        "solutions/03_segments_and_sqrt_l_solutions.html"]

    page = (tmp_path / "site" / "00_tour.html").read_text()
    assert "peak 123 MiB" in page                              # outputs
    assert "data:image/png;base64," + _png()[:40] in page      # plots, inline
    assert STATE in page and '"value": 5' in page              # the widget's static snapshot
    assert 'href="01_where_memory_goes.html"' in page
    assert 'href="02_checkpointing_from_scratch.html#intro"' in page
    assert "https://colab.research.google.com/x.ipynb" in page

    index = (tmp_path / "site" / "index.html").read_text()
    positions = [index.index(title) for title in course.LESSONS.values()]
    assert positions == sorted(positions)                      # the course map's order
    assert 'href="00_tour.html"' in index and 'href="solutions/03_segments' in index
    assert "(not built)" in index and "zz_not_in_the_course" not in index
    assert f"github.com/{course.REPO_SLUG}/blob/{course.BRANCH}/docs/recipes.md" in index
    assert (tmp_path / "site" / ".nojekyll").exists()


@pytest.mark.parametrize("breakage, message", [
    ("unexecuted", "no executed cell"), ("no_state", "state was not saved"),
    ("state_error", "could not be read")])
def test_a_notebook_that_was_not_properly_executed_is_refused(tmp_path, breakage, message):
    nb = executed_notebook(widget_state=breakage != "no_state")
    if breakage == "unexecuted":
        for cell in nb.cells[1:]:
            cell.execution_count = None
    if breakage == "state_error":
        nb.metadata["ckpt_lab_widget_state_error"] = "RuntimeError('boom')"
    nbformat.write(nb, tmp_path / "00_tour.ipynb")
    with pytest.raises(ValueError, match=message):
        build_site.build(tmp_path, tmp_path / "site")


def test_command_line_fails_when_a_required_lesson_was_not_run(tmp_path, capsys):
    nbformat.write(executed_notebook(), tmp_path / "00_tour.ipynb")
    assert build_site.main([str(tmp_path), str(tmp_path / "site"), "--require", "00_tour"]) == 0
    with pytest.raises(SystemExit) as exit_:
        build_site.main([str(tmp_path), str(tmp_path / "site"), "--require-all"])
    assert exit_.value.code == 1
    assert "01_where_memory_goes" in capsys.readouterr().err
