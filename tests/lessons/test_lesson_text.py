"""The text of lessons 0-3, checked statically.

The measured claims are asserted in the notebooks themselves (course.claims); these hold the
words: a term is linked or defined before it is used, the faults are a table, the optimum's
calculus is shown, the peak claims stay, the claim checks are out of sight. (That early stop
is shown as the context manager it is holds for every notebook: test_notebooks.py.)
"""
import re
from pathlib import Path

import nbformat
import pytest

NB = Path(__file__).resolve().parents[2] / "notebooks"
LESSONS = ["00_tour", "01_where_memory_goes", "02_checkpointing_from_scratch", "03_how_many_segments"]
ALL = [NB / f"{n}.ipynb" for n in LESSONS] + sorted((NB / "solutions").glob("0[0-3]_*.ipynb"))


def _cells(name, kind):
    return [c.source for c in nbformat.read(NB / f"{name}.ipynb", as_version=4).cells
            if c.cell_type == kind]


# Terms whose glossary entry gives the answer of a prediction: linked at their first use after its
# reveal, never above it (the second and third reviews: a link above a question must not answer it).
# 00.same_losses: "gradients unchanged", "changes no result"; 01.mixed_adam_bytes: 16 bytes per
# parameter; 02.kept_tensors: kept bytes count the forward's output.
AFTER_REVEAL = {"00_tour": ("guess2.reveal()", {"checkpointing": "checkpoint", "recompute": "recompute"}),
                "01_where_memory_goes": ("guess2.reveal()", {"mixed precision": "mixed-precision",
                                                             "model state": "model-state"}),
                "02_checkpointing_from_scratch": ("guess.reveal()", {"kept bytes": "kept-bytes"})}
LINKED = [("00_tour", "activation", "activation"), ("00_tour", "segments", "segment"),
          ("01_where_memory_goes", "autocast", "autocast"), ("01_where_memory_goes", "activation", "activation")]


@pytest.mark.parametrize("name, term, anchor", LINKED + [(n, term, a) for n, (_, terms) in AFTER_REVEAL.items()
                                                         for term, a in terms.items()])
def test_a_term_is_linked_where_it_first_appears(name, term, anchor):
    """A term is linked where it first appears; one whose glossary entry states a prediction's
    answer where it first appears after that reveal, and not before it."""
    cells = nbformat.read(NB / f"{name}.ipynb", as_version=4).cells[1:]
    reveal, terms = AFTER_REVEAL.get(name, (None, {}))
    if term in terms:
        at = next(i for i, c in enumerate(cells) if reveal in c.source)
        assert not any(f"glossary.md#{anchor}" in c.source for c in cells[:at]), f"'{term}' linked above the reveal"
        cells = cells[at:]
    first = next(c.source for c in cells if c.cell_type == "markdown" and term in c.source.lower())
    assert f"glossary.md#{anchor}" in first, f"'{term}' is used before it is linked"


def test_the_activation_entry_leaves_01_grows_with_batch_open():
    """Lessons 0, 1 and 5 link the entry above a prediction: it names no scaling (lesson 1 measures it)."""
    glossary = (NB.parent / "docs" / "glossary.md").read_text()
    entry = glossary.split("### Activation\n", 1)[1].split("\n### ", 1)[0]
    assert "grow" not in entry and "model state" not in entry.lower(), entry


def test_lesson_1_defines_the_master_copy_and_leaves_out_what_it_does_not_need():
    prose = _cells("01_where_memory_goes", "markdown")
    first = next(s for s in prose if "master copy" in s.lower())
    assert "*master copy*" in first and "optimizer" in first
    body = "\n".join(prose[:-1])                                     # all but further reading
    assert "Megatron" not in body and "ZeRO" not in body


def test_lesson_2_gives_the_guards_as_a_table_not_a_paragraph():
    section = next(s for s in _cells("02_checkpointing_from_scratch", "markdown") if "| guard |" in s)
    rows = [l for l in section.splitlines() if l.startswith("| ") and "---" not in l][1:]
    assert len(rows) >= 6
    assert max(len(s.split()) for s in _cells("02_checkpointing_from_scratch", "markdown")) <= 180


def test_lesson_3_shows_the_calculus_of_the_optimum():
    details = [s for s in _cells("03_how_many_segments", "markdown") if "<details>" in s and "calculus" in s]
    assert details and "p'(S)" in details[0] and "S^*" in details[0]


@pytest.mark.parametrize("name", ["00_tour", "01_where_memory_goes"])
def test_the_peak_at_the_loss_stays_asserted(name):
    code = "\n".join(_cells(name, "code"))
    assert re.search(r"c\.true\([^\n]*_log_softmax_backward", code)


def test_lesson_3_asserts_where_the_peak_falls_and_when_the_tail_is_flat():
    code = "\n".join(_cells("03_how_many_segments", "code"))
    assert "top.step < spans[0][0]" in code and "max(teeth) < logs[S].peak_bytes" in code
    assert "boundaries=uneven" in code and "top.step >= spans[0][0]" in code   # a first segment longer than the last
    assert "one-block segments keep what plain keeps" in code and "wide blocks" in code


@pytest.mark.parametrize("name", LESSONS[:3])
def test_claim_checks_are_out_of_sight(name):
    """Lessons 0-2 (issue 27): a claim check sits in a cell whose input is hidden, tagged
    hide-input for the site and source_hidden for JupyterLab; at most one short check stays in
    sight."""
    cells = [c for c in nbformat.read(NB / f"{name}.ipynb", as_version=4).cells
             if c.cell_type == "code"]
    hidden = [c for c in cells if "hide-input" in c.metadata.get("tags", [])]
    assert hidden and all(c.metadata.get("jupyter", {}).get("source_hidden") for c in hidden)
    in_sight = [c.source for c in cells if c not in hidden and "course.claims(" in c.source]
    assert len(in_sight) <= 1 and all(s.count("\n    c.") <= 2 for s in in_sight), in_sight


def test_the_tour_derives_the_recomputed_blocks_from_the_chain():
    """00[18]: the count of re-run blocks comes from L blocks (L + 2 layers) and S, not a typed
    number; L counts blocks only, as in docs/notation.md."""
    code = "\n".join(_cells("00_tour", "code"))
    assert "L, N, H = size.depth," in code and "per_segment = (L + 2) // segments" in code
    assert "recomputed = (segments - 1) * per_segment - 1" in code
    assert "recompute_matmuls == recomputed" in code          # and is checked against the run
