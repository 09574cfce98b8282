"""Sphinx configuration of the course site (used by tools/build_site.py; not run by hand).

The source folder is one tools/build_site.py lays out from the executed notebooks, mirroring
the repository (``index.md``, ``notebooks/``, ``notebooks/solutions/``, ``docs/``), so every
relative link a lesson or page writes resolves as it does on GitHub. myst-nb renders the
notebooks with the outputs they already have (execution off); sphinx-book-theme gives the
sidebar, previous/next, search and the Colab and Binder buttons. Nothing is fetched at build
or reading time: MathJax is served from the site itself and widgets arrive as static HTML.
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import course_map  # noqa: E402

course = course_map.course
GITHUB = f"https://github.com/{course.REPO_SLUG}"

project = "ckpt-lab"
author = "the ckpt-lab authors"
copyright = "ckpt-lab authors, MIT licence"
html_title = "ckpt-lab: gradient checkpointing, measured"

extensions = ["myst_nb", "sphinx.ext.githubpages"]   # githubpages: .nojekyll
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3                 # GitHub-style slugs: glossary.md#step-peak
nb_execution_mode = "off"                # the tests already ran every notebook
nb_ipywidgets_js = {}                    # widgets are static HTML (tools/build_site.py)
nb_merge_streams = True
suppress_warnings = ["myst.header"]      # lessons may skip a heading level
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

html_theme = "sphinx_book_theme"
html_theme_options = {
    "repository_url": GITHUB,
    "repository_branch": course.BRANCH,
    "path_to_docs": "",                  # the source mirrors the repository root
    "use_repository_button": True,
    "use_download_button": True,
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "launch_buttons": {"colab_url": "https://colab.research.google.com",
                       "binderhub_url": "https://mybinder.org",
                       "notebook_interface": "jupyterlab"},
}
html_static_path = [str(Path(__file__).resolve().parent / "static")]
html_css_files = ["ckpt_lab.css"]
html_last_updated_fmt = None
html_show_sphinx = False

# MathJax 3 from the installed sphinx-mathjax-offline package, copied into the site: the
# combined TeX->CHTML script, its fonts and the TeX extensions it may load on demand.
MATHJAX = Path(importlib.util.find_spec("sphinx-mathjax-offline").origin).parent / "static" / "mathjax"
MATHJAX_FILES = ["tex-chtml.js", "output/chtml/fonts/woff-v2", "input/tex/extensions", "ui", "a11y"]
mathjax_path = "mathjax/tex-chtml.js"


def _copy_mathjax(app, exc):
    if exc is not None:
        return
    out = Path(app.outdir) / "_static" / "mathjax"
    for rel in MATHJAX_FILES:
        src, dst = MATHJAX / rel, out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dst)


def setup(app):
    app.connect("build-finished", _copy_mathjax)
