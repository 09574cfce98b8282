"""tools/lesson_shape: the rules every lesson keeps, on small synthetic executed notebooks."""
import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from tools import lesson_shape


def lesson(prose_words=20, lines=3, figure=True, closing=True, answer_above=None):
    cells = [new_markdown_cell("# A question\n" + "word " * prose_words)]
    outputs = [new_output("stream", name="stdout", text="line\n" * lines)]
    if answer_above is not None:
        outputs.append(new_output("stream", name="stdout", text=f"kept {answer_above:,} bytes\n"))
    if figure:
        outputs.append(new_output("display_data", data={"image/png": "iVBO", "text/plain": "<Figure>"}))
    cells.append(new_code_cell("measure()", outputs=outputs))
    cells.append(new_code_cell('guess = exercises.predict("02.kept", None)'))
    if closing:
        cells += [new_markdown_cell("## What you now know\n- a"), new_markdown_cell("## In your code\n```\n```")]
    return new_notebook(cells=cells)


def test_a_lesson_in_shape_has_no_problems():
    assert lesson_shape.problems(lesson(), lambda key: 65536) == []


def test_each_rule_is_reported():
    broken = lesson_shape.problems(lesson(prose_words=200, lines=50, figure=False, closing=False))
    assert any("no figure" in b for b in broken)
    assert any("over 180 words" in b for b in broken)
    assert any("lines of text output" in b for b in broken)
    assert any("What you now know" in b for b in broken) and any("In your code" in b for b in broken)


def test_an_answer_printed_above_its_question_is_caught():
    nb = lesson(answer_above=65536)
    assert lesson_shape.problems(nb, lambda key: 65536) == [
        "02.kept: its answer '65,536' is printed above the question"]
    assert lesson_shape.problems(nb, lambda key: 65537) == []         # another number is fine
    assert lesson_shape.problems(nb, lambda key: None) == []          # no expected: not searched


def test_short_answers_are_not_searched_for():
    assert lesson_shape.renderings(4) == [] and "65,536" in lesson_shape.renderings(65536)


def test_every_lesson_and_only_a_lesson_is_held_to_the_form():
    from ckpt_lab.lessons import course
    assert course.LESSONS and all(lesson_shape.held_to_form(f"{name}.ipynb")
                                  for name in course.LESSONS)
    assert not lesson_shape.held_to_form("solutions/03_how_many_segments_solutions.ipynb")
    assert not lesson_shape.held_to_form("zz_budget_probe.ipynb")


def test_the_command_line_reports_each_lesson(tmp_path, capsys):
    path = tmp_path / "00_x.ipynb"
    nbformat.write(lesson(figure=False), path)
    assert lesson_shape.main([str(path)]) == 1
    assert "BAD 00_x.ipynb" in capsys.readouterr().out


def _with_prose(markdown):
    nb = lesson()
    nb.cells.insert(1, new_markdown_cell(markdown))
    return nb


def test_an_answer_stated_in_a_heading_or_sentence_above_is_caught():
    nb = _with_prose("## Why it keeps 65,536 bytes\nSome text.")
    broken = lesson_shape.problems(nb, lambda key: 65536)
    assert len(broken) == 1 and "stated above the question, in cell [1]" in broken[0]
    nb = _with_prose("The block keeps 65536 bytes. Then more.")
    assert lesson_shape.problems(nb, lambda key: 65536)
    assert lesson_shape.problems(nb, lambda key: 12345) == []


def test_a_choice_is_caught_when_named_alone_not_when_offered_beside_another():
    choices = ("the first stage", "the last stage")
    gives = _with_prose("### The first stage holds the most")
    asks = _with_prose("Does the first stage or the last stage hold the most?")
    answer = lambda key: "the first stage"
    assert lesson_shape.problems(gives, answer, lambda key: choices)
    assert lesson_shape.problems(asks, answer, lambda key: choices) == []
    assert lesson_shape.problems(_with_prose("It is the same."), lambda key: "same",
                                 lambda key: ("same", "other")) == []   # one short word: not searched


def test_links_and_tags_are_not_prose():
    units = lesson_shape.prose_units("See [the first stage](glossary.md#the-first-stage) <b>x</b>.\n"
                                     "- a bullet\n| a | row |\nOne. Two?")
    assert "glossary.md" not in units[0] and "<b>" not in units[0]
    assert units[1:] == ["- a bullet", "| a | row |", "One.", "Two?"]


def test_a_list_of_lesson_links_is_navigation_not_prose():
    nav = "## The course\n\n- 01: [Where does the memory of a training step go?](01_x.ipynb)\n"
    assert lesson_shape.prose_words(nav) == 3
    assert lesson_shape.prose_words("- a [link](x.ipynb) inside a sentence") == 6
