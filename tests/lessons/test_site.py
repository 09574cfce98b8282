"""The course site: executed notebooks in, a Sphinx (myst-nb, sphinx-book-theme) site out.

The real site is built by `make test` from the notebooks nbval executed in that run; this
builds it once from small executed notebooks made here (test_notebooks.py checks that the nbval
run saves them, widget state included) and reads the HTML: pages in course order, the sidebar,
previous/next, search, launch links, takeaways, reference pages, links, static widgets, and
nothing fetched from the network. The glossary's anchors are checked without building."""
import base64
import io
import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import build_site  # noqa: E402
import course_map  # noqa: E402

course = course_map.course
VIEW, STATE = build_site.WIDGET_VIEW, build_site.WIDGET_STATE
md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell

# Every anchor the glossary promises (lessons link them); renaming a heading breaks this list.
GLOSSARY_ANCHORS = [
    "activation", "saved-tensor", "model-state", "tensor-bytes", "allocator-bytes",
    "reserved-bytes", "step-peak", "total-peak", "kept-bytes", "activation-model", "step-model", "budget", "gb-and-gib", "checkpoint",
    "recompute", "layer", "block", "chain", "segment", "segments-of-k-blocks", "every-k-th-block",
    "full-recomputation", "selective-recomputation", "selective-activation-checkpointing",
    "early-stop", "reentrant", "non-reentrant", "saved-tensor-hooks", "pareto-front", "offload",
    "flops", "micro-batch", "gradient-accumulation", "global-batch", "mixed-precision",
    "autocast", "attention-core", "fused-attention", "logits", "chunked-cross-entropy", "gqa", "swiglu", "rmsnorm", "rank", "ddp",
    "fsdp", "zero", "all-reduce", "reduce-scatter", "all-gather", "pipeline-stage", "bubble",
    "gpipe", "1f1b", "tensor-parallelism", "sequence-parallelism",
    "torchcompile", "dynamo", "guard", "graph-break", "aotautograd", "partitioner",
    "decomposition", "inductor", "kernel-fusion", "activation-memory-budget"]


def _png() -> str:
    fig = Figure(figsize=(1, 1))
    fig.add_subplot().plot([0, 1], [1, 0])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode()


def hidden_claim_cell():
    """Lesson 1's first hidden claim check (source and metadata as committed), with the one
    result line it prints when it runs."""
    lesson = nbformat.read(ROOT / "notebooks" / "01_where_memory_goes.ipynb", as_version=4)
    cell = next(c for c in lesson.cells if c.cell_type == "code"
                and "hide-input" in c.metadata.get("tags", []) and "course.claims(" in c.source)
    assert cell.metadata["jupyter"]["source_hidden"] is True      # JupyterLab folds it too
    return code(cell.source, metadata=cell.metadata, execution_count=5, outputs=[
        nbformat.v4.new_output("stream", name="stdout", text=f"{HIDDEN_RESULT}\n")])


HIDDEN_RESULT = "✓ 8 claims hold (model state per parameter) · measured/predicted 1.000"


def executed_notebook(title="Lesson", widget_state=True, takeaways=True, up="", hidden=False):
    """A small notebook as nbval saves it: outputs, a plot, an explorer and its widget state
    (and, with `hidden`, a lesson's hidden claim check).

    `up` is "../" for a notebook in notebooks/solutions/, whose links start one folder lower."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        md(f"# {title}\n\n"
           f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
           f"(https://colab.research.google.com/x.ipynb)\n\n"
           f"Next: [lesson 1]({up}01_where_memory_goes.ipynb), "
           f"[a part]({up}02_checkpointing_from_scratch.ipynb#intro), "
           f"[the step peak]({up}../docs/glossary.md#step-peak), "
           f"[the planner]({up}../ckpt_lab/plan/planner.py), "
           "[Colab](https://colab.research.google.com/x.ipynb). Math: $a + b$."),
        code("print('peak 123 MiB')", execution_count=1, outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="peak 123 MiB\n")]),
        code("plot()", execution_count=2, outputs=[
            nbformat.v4.new_output("display_data", data={"image/png": _png(),
                                                         "text/plain": "<Figure>"})]),
        code("explorer", execution_count=3, outputs=[
            nbformat.v4.new_output("display_data", data={
                VIEW: {"model_id": "box", "version_major": 2, "version_minor": 0},
                "text/plain": "Explorer()"})]),
    ]
    if hidden:
        nb.cells.append(hidden_claim_cell())
    if takeaways:
        nb.cells.append(md("## What you now know\n\n- a takeaway of "
                           f"{title.split()[-1]}, see [segments]({up}../docs/glossary.md#segment)\n"
                           "- another one\n\n## In your code\n\n- `not_a_takeaway()`"))
    if widget_state:
        w = {"model_module": "@jupyter-widgets/controls", "model_module_version": "2.0.0"}
        nb.metadata["widgets"] = {STATE: {"version_major": 2, "version_minor": 0, "state": {
            "box": {**w, "model_name": "VBoxModel", "state": {
                "children": ["IPY_MODEL_slider", "IPY_MODEL_text", "IPY_MODEL_image"]}},
            "slider": {**w, "model_name": "IntSliderModel",
                       "state": {"description": "segments", "value": 5, "max": 16}},
            "text": {**w, "model_name": "HTMLModel", "state": {"value": "<b>peak 42 MiB</b>"}},
            "image": {**w, "model_name": "ImageModel", "state": {"format": "png"},
                      "buffers": [{"encoding": "base64", "path": ["value"], "data": _png()}]}}}}
    return nb


BUILT = ["00_tour", "01_where_memory_goes", "03_how_many_segments",
         "solutions/03_how_many_segments_solutions"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """One site built through the command line from four executed notebooks (and one stray)."""
    tmp = tmp_path_factory.mktemp("site")
    executed = tmp / "executed"
    (executed / "solutions").mkdir(parents=True)
    for page in BUILT:
        nbformat.write(executed_notebook(f"Page {page.split('/')[-1]}",
                                         takeaways=page != "01_where_memory_goes",
                                         hidden=page == "01_where_memory_goes",
                                         up="../" if "/" in page else ""),
                       executed / f"{page}.ipynb")
    nbformat.write(executed_notebook(), executed / "zz_not_in_the_course.ipynb")
    (tmp / "notebook_budgets.json").write_text(json.dumps({"00_tour.ipynb": {"seconds": 4.4}}))
    out = tmp / "site"
    assert build_site.main([str(executed), str(out), "--require", "00_tour"]) == 0
    return out


def read(site, page) -> str:
    return (site / page).read_text(encoding="utf-8")


def test_every_executed_course_notebook_is_a_page(site):
    for page in BUILT:
        assert (site / "notebooks" / f"{page}.html").exists(), page
    assert not list(site.rglob("zz_not_in_the_course*.html"))
    assert not (site.parent / "jupyter_execute").exists()     # nothing written beside the site
    for page in ("index.html", "search.html", "searchindex.js", ".nojekyll"):
        assert (site / page).exists(), page
    for doc in build_site.reference_pages():
        assert (site / doc).with_suffix(".html").exists(), doc


def test_sidebar_follows_the_course_order_with_solutions_under_their_lesson(site):
    page = read(site, "notebooks/01_where_memory_goes.html")
    nav = page[page.index("bd-docs-nav"):]
    nav = nav[:nav.index("</nav>")]
    links = [h for h in re.findall(r'href="([^"]+)"', nav) if h.endswith(".html")]
    assert links == ["../index.html", "00_tour.html", "03_how_many_segments.html",
                     "solutions/03_how_many_segments_solutions.html",
                     *[f"../{d[:-3]}.html" for d in build_site.reference_pages()]]
    assert '<p aria-level="2" class="caption" role="heading"><span class="caption-text">Lessons' \
        in nav


@pytest.mark.parametrize("page, prev, next_", [
    ("notebooks/00_tour.html", "../index.html", "01_where_memory_goes.html"),
    ("notebooks/01_where_memory_goes.html", "00_tour.html", "03_how_many_segments.html"),
    ("notebooks/03_how_many_segments.html", "01_where_memory_goes.html",
     "solutions/03_how_many_segments_solutions.html"),
    ("notebooks/solutions/03_how_many_segments_solutions.html",
     "../03_how_many_segments.html", "../../docs/glossary.html")])
def test_previous_and_next_links_walk_the_course(site, page, prev, next_):
    html = read(site, page)
    assert re.search(rf'<a class="left-prev"\s+href="{re.escape(prev)}"', html)
    assert re.search(rf'<a class="right-next"\s+href="{re.escape(next_)}"', html)


def test_search_index_holds_the_lessons_words(site):
    index = read(site, "searchindex.js")
    assert "notebooks/00_tour" in index and "takeaway" in index
    assert 'id="search-input"' in read(site, "search.html") or "search" in read(site, "search.html")


def test_launch_buttons_are_the_courses_own_colab_and_binder_links(site):
    for page in BUILT:
        html = read(site, f"notebooks/{page}.html")
        header = html[html.index("dropdown-launch-buttons"):]
        header = header[:header.index("</ul>")]
        assert f'href="{course.colab_url(page)}"' in header, page
        assert f'href="{course.binder_url(page)}"' in header, page
    index = read(site, "index.html")
    for name in course_map.LESSONS:          # the landing page: every lesson, built or not
        assert f'href="{course.colab_url(name)}"' in index
        assert f'href="{course.binder_url(name)}"' in index


def test_landing_page_has_the_course_map_and_each_lessons_takeaways(site):
    index = read(site, "index.html")
    index = index[index.index('<article class="bd-article">'):]          # not the sidebar
    assert "Before you start" in index and "Paths through the course" in index
    positions = [index.index(t) for t in course_map.LESSONS.values()]
    assert positions == sorted(positions)                       # course order
    assert "a takeaway of 00_tour" in index and "a takeaway of 03_how_many_segments" in index
    assert "not_a_takeaway" not in index
    # the takeaway's glossary link, written from notebooks/, rebased to the landing page
    assert 'href="docs/glossary.html#segment"' in index
    assert index.count("(not in this build)") == len(course_map.LESSONS) - 3
    rows = course_map.lessons(folders=(course_map.NOTEBOOKS,))
    assert f"<td><p>{course_map.fmt_minutes(rows[2].study_minutes)}</p></td>" in index
    assert "<td><p>4 s</p></td>" in index and "not measured" in index   # run times, measured


def test_links_become_page_links_or_github_links(site):
    html = read(site, "notebooks/00_tour.html")
    assert 'href="01_where_memory_goes.html"' in html                # a page of the site
    github = f"https://github.com/{course.REPO_SLUG}/blob/{course.BRANCH}"
    assert f'href="{github}/notebooks/02_checkpointing_from_scratch.ipynb#intro"' in html
    assert f'href="{github}/ckpt_lab/plan/planner.py"' in html             # not a page: GitHub
    assert 'href="../docs/glossary.html#step-peak"' in html
    assert 'href="https://colab.research.google.com/x.ipynb"' in html
    assert "colab-badge.svg" not in html                              # badges become links
    assert not re.search(r'href="(?!https?:|\.\./_sources/)[^"]*\.ipynb', html)


def test_outputs_plots_and_widgets_are_static(site):
    html = read(site, "notebooks/00_tour.html")
    assert "peak 123 MiB" in html and "../_images/" in html
    assert "<b>segments</b> 5" in html and "<b>peak 42 MiB</b>" in html
    assert 'src="data:image/png;base64,' + _png()[:40] in html       # the explorer's figure
    assert STATE not in html and "embed-amd" not in html and "require.min.js" not in html


def test_a_hidden_claim_check_shows_its_result_line_and_folds_its_code(site):
    """A lesson's claim check tagged hide-input: myst-nb folds its source into a closed
    <details> ("Show code cell source") and shows its output, the one result line, below it."""
    html = read(site, "notebooks/01_where_memory_goes.html")
    assert '<div class="cell tag_hide-input' in html, "the hide-input tag did not reach the page"
    start = html.index('<div class="cell tag_hide-input')
    ends = [i for i in (html.find('<div class="cell ', start + 1), html.find("</section>", start))
            if i > 0]
    cell = html[start:min(ends)]
    folded, after = cell.split("</details>", 1)
    assert re.search(r'<details class="[^"]*\bhide above-input"\s*>', folded)   # closed: no open
    assert "Show code cell source" in folded and 'class="cell_input' in folded
    assert '<span class="n">claims</span>' in folded                        # the check is there
    assert 'class="cell_output' in after and HIDDEN_RESULT in after
    assert HIDDEN_RESULT not in folded


def test_nothing_is_fetched_from_the_network(site):
    for path in site.rglob("*.html"):
        html = path.read_text(encoding="utf-8")
        assert not re.search(r'<script[^>]+src="(https?:)?//', html), path
        assert not re.search(r'<link[^>]+href="(https?:)?//', html), path
        assert not re.search(r'<img[^>]+src="(https?:)?//', html), path
    assert (site / "_static" / "mathjax" / "tex-chtml.js").exists()
    assert 'src="../_static/mathjax/tex-chtml.js"' in read(site, "notebooks/00_tour.html")
    assert list((site / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))


def test_reference_pages_include_the_recipe_card_only_when_it_exists(tmp_path):
    (tmp_path / "docs").mkdir()
    for doc in ("glossary.md", "notation.md", "decision_guide.md", "architecture.md"):
        (tmp_path / "docs" / doc).write_text("# x\n")
    assert build_site.reference_pages(tmp_path) == ["docs/glossary.md", "docs/notation.md",
                                                    "docs/decision_guide.md", "docs/architecture.md"]
    (tmp_path / "docs" / "recipes.md").write_text("# Recipes\n")
    assert build_site.reference_pages(tmp_path)[-1] == "docs/recipes.md"
    (tmp_path / "docs" / "glossary.md").unlink()
    with pytest.raises(ValueError, match="glossary.md"):
        build_site.reference_pages(tmp_path)


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
    with pytest.raises(SystemExit) as exit_:
        build_site.main([str(tmp_path), str(tmp_path / "site"), "--require-all"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "01_where_memory_goes" in err and "solutions/03_how_many_segments_solutions" in err


def test_a_broken_link_fails_the_build(tmp_path):
    nb = executed_notebook()
    nb.cells[0].source += "\n\n[gone](no_such_lesson.ipynb), [term](../docs/glossary.md#no-such-term)"
    nbformat.write(nb, tmp_path / "00_tour.ipynb")
    with pytest.raises(ValueError) as err:
        build_site.build(tmp_path, tmp_path / "site")
    assert "no_such_lesson" in str(err.value) and "no-such-term" in str(err.value)


def test_a_folder_that_is_not_a_site_is_never_emptied(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    nbformat.write(executed_notebook(), tmp_path / "00_tour.ipynb")
    with pytest.raises(ValueError, match="not a site"):
        build_site.build(tmp_path, tmp_path / "out")
    assert (tmp_path / "out" / "precious.txt").exists()


# ------------------------------------------------------------------------------- glossary
def _slugs(markdown: str) -> list[str]:
    """GitHub's heading anchors (what the site's myst_heading_anchors makes too)."""
    from myst_parser.slugs import github_slugify
    return [github_slugify(h.strip()) for h in re.findall(r"^#{1,6} (.+)$", markdown, re.M)]


def test_glossary_keeps_its_documented_anchors(site):
    glossary = (ROOT / "docs" / "glossary.md").read_text()
    slugs = _slugs(glossary)
    assert len(slugs) == len(set(slugs)), "two glossary headings share an anchor"
    missing = [a for a in GLOSSARY_ANCHORS if a not in slugs]
    assert not missing, f"glossary anchors gone (lessons link them): {missing}"
    html = read(site, "docs/glossary.html")
    assert all(f'id="{a}"' in html for a in GLOSSARY_ANCHORS)


def test_every_link_to_the_glossary_names_an_anchor_it_has():
    slugs = set(_slugs((ROOT / "docs" / "glossary.md").read_text()))
    sources = {p: p.read_text(encoding="utf-8") for p in
               [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                *sorted((ROOT / "notebooks").rglob("*.ipynb"))]}
    sources["tools/course_map.py"] = course_map.readme_section(course_map.lessons())
    bad = [(str(p), a) for p, text in sources.items()
           for a in re.findall(r"glossary\.md#([\w-]+)", text) if a not in slugs]
    assert not bad, f"links to glossary anchors that do not exist: {bad}"
    assert (ROOT / "docs" / "glossary.md").read_text().count("\n### ") >= len(GLOSSARY_ANCHORS)


def test_the_site_renders_in_a_browser_with_no_network(site, tmp_path):
    """MathJax typesets from the site's own copy, the explorer shows its figure, and the page
    asks no other host for anything (Chromium, as in test_browser.py: skipped without it
    locally, a failure under CI)."""
    import browser_helpers as bh
    from test_browser import require_chromium
    chromium = require_chromium()
    from playwright.sync_api import sync_playwright

    asked = []

    def offline(route):
        if route.request.url.startswith(("file:", "data:")):
            return route.continue_()
        asked.append(route.request.url)
        return route.abort()

    with sync_playwright() as playwright:
        context = bh.launch_browser(playwright, chromium, tmp_path / "profile")
        try:
            page = context.new_page()
            page.route("**/*", offline)
            page.goto((site / "notebooks" / "00_tour.html").as_uri())
            page.wait_for_selector("mjx-container", timeout=60_000)     # $a + b$, typeset
            assert page.locator(".ckpt-widget img").count() == 1
            assert page.locator(".ckpt-widget img").evaluate("i => i.naturalWidth") > 0
        finally:
            context.close()
    assert asked == []
