"""The course map (tools/course_map.py): the study-time rule, takeaways, paths, the README check."""
import sys
from pathlib import Path

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import course_map  # noqa: E402

md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell


def notebook(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def test_prose_words_count_what_a_learner_reads():
    nb = notebook(md("# Title here\n\n[![Open In Colab](https://x/badge.svg)](https://colab/x)\n\n"
                     "Read [the glossary](../docs/glossary.md#step-peak) <b>now</b>, $a + b$.\n"
                     "| a | b |\n|---|---|\n<!-- a comment of many words -->"),
                  code("print('code is not prose')"))
    # Title here / Read the glossary now, $a / + is no word / b$. / a / b
    assert course_map.prose_words(nb) == 2 + 4 + 2 + 2


def test_study_minutes_follow_the_documented_rule():
    words = " ".join(["word"] * 240)                       # 2 minutes at 120 words a minute
    hidden = code("with course.claims('x') as c:\n    c.true('y', True)")
    hidden.metadata = {"tags": ["hide-input"], "jupyter": {"source_hidden": True}}
    nb = notebook(md(words), code("x = 1\n# a comment\n\ny = 2"), hidden,   # 2 visible lines
                  md("**1.** Predict"), code('guess = exercises.predict("03.a", None)'),
                  md("**2.** Build"), code('def f():\n    ...\nexercises.check("03.b", f)'),
                  code('exercises.check("03.b", 5)'))     # the same exercise again
    assert course_map.exercise_keys(nb) == ["03.a", "03.b"]
    assert course_map.visible_code_lines(nb) == 2 + 1 + 3 + 1
    minutes = (240 / course_map.WORDS_PER_MINUTE + 7 * course_map.SECONDS_PER_CODE_LINE / 60
               + course_map.MINUTES_PER_PREDICTION + course_map.MINUTES_PER_BUILD_TASK)
    assert course_map.study_minutes(nb) == 35 == round(minutes / 5) * 5     # 2 + 1.5 + 10 + 20
    assert course_map.study_minutes(notebook(md("one word"))) == course_map.ROUND_TO
    assert "120" in course_map.STUDY_RULE and "20 min per build task" in course_map.STUDY_RULE


def test_every_lesson_gets_a_study_time_and_the_course_lists_them_in_order():
    rows = course_map.lessons(budgets=Path("/nonexistent.json"))
    assert [r.name for r in rows] == list(course_map.LESSONS)
    assert all(15 <= r.study_minutes <= 180 and r.run_seconds is None for r in rows)
    assert course_map.fmt_minutes(45) == "45 min" and course_map.fmt_minutes(80) == "1 h 20 min"
    assert course_map.fmt_minutes(120) == "2 h"


def test_run_times_come_from_the_test_runs_measurements(tmp_path):
    budgets = tmp_path / "budgets.json"
    budgets.write_text('{"00_tour.ipynb": {"seconds": 4.4}, '
                       '"solutions/03_how_many_segments_solutions.ipynb": {"seconds": 1.2}}')
    assert course_map.run_seconds(budgets) == {
        "00_tour": 4.4, "solutions/03_how_many_segments_solutions": 1.2}
    rows = course_map.lessons(budgets=budgets)
    assert rows[0].run_seconds == 4.4 and rows[1].run_seconds is None


def executed_lesson_with_takeaways():
    """A small executed lesson as the lessons will end: takeaways, then 'In your code'."""
    nb = notebook(
        md("# Lesson 3\n\n**After this notebook you will be able to:**\n\n- not a takeaway"),
        code("print(1)"),
        md("## What you now know\n\n- the peak is lowest near sqrt(L)\n"
           "  [segments](../docs/glossary.md#segment), measured\n"
           "* the last segment is never checkpointed\n\n"
           "Some closing prose that is no bullet.\n\n## In your code\n\n- `checkpoint_sequential(...)`"),
        md("## Further reading\n\n- a paper"))
    nb.cells[1].execution_count = 1
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    return nb


def test_takeaways_are_the_bullets_of_what_you_now_know(tmp_path):
    path = tmp_path / "03_how_many_segments.ipynb"
    nbformat.write(executed_lesson_with_takeaways(), path)
    assert course_map.takeaways(course_map.read_notebook(path)) == [
        "the peak is lowest near sqrt(L) [segments](../docs/glossary.md#segment), measured",
        "the last segment is never checkpointed"]
    assert course_map.section_bullets(course_map.read_notebook(path), "In your code") == [
        "`checkpoint_sequential(...)`"]
    assert course_map.takeaways(notebook(md("## Exercises\n\n- one"))) == []


def test_links_are_rebased_from_a_lessons_folder_to_the_root():
    text = ("[a](../docs/glossary.md#step-peak), [b](solutions/x.ipynb), [c](https://x.org/y), "
            "[d](#local), ![e](img.png)")
    assert course_map.rebase_links(text, "notebooks") == (
        "[a](docs/glossary.md#step-peak), [b](notebooks/solutions/x.ipynb), [c](https://x.org/y), "
        "[d](#local), ![e](notebooks/img.png)")


def test_every_lesson_is_on_exactly_one_path_and_has_an_outcome():
    on_paths = [name for _, members, _ in course_map.PATHS for name in members]
    assert sorted(on_paths) == sorted(course_map.LESSONS)
    assert set(course_map.OUTCOMES) == set(course_map.LESSONS)
    assert any("scale-out" in name.lower() for name, _, _ in course_map.PATHS)
    for _, links in course_map.PREREQUISITES:
        assert links and all(url.startswith("https://") for _, url in links)


def test_the_readme_check_tolerates_small_edits_and_catches_stale_tables():
    rows = course_map.lessons()
    readme = course_map.readme_section(rows)
    assert course_map.readme_drift(readme, rows) == []
    # one more code cell in a lesson moves it by a rounding step at most: still fine
    nudged = [r if r.number != 3 else course_map.Lesson(3, r.name, r.title, r.study_minutes + 5,
                                                        r.run_seconds) for r in rows]
    assert course_map.readme_drift(readme, nudged) == []
    # a lesson that doubled since the table was written: stale
    doubled = [r if r.number != 9 else course_map.Lesson(9, r.name, r.title, 2 * r.study_minutes,
                                                         r.run_seconds) for r in rows]
    problems = course_map.readme_drift(readme, doubled)
    assert problems and "study time" in problems[0]
    # a lesson renamed, or a path changed: the text differs
    renamed = readme.replace(rows[2].title, "Something else")
    assert "text differs" in course_map.readme_drift(renamed, rows)[0]
    assert course_map.readme_drift("no section", rows)


@pytest.mark.parametrize("argv", [["--readme"], []])
def test_command_line_prints_the_section_or_the_table(argv, capsys, tmp_path):
    assert course_map.main(argv + ["--budgets", str(tmp_path / "none.json")]) == 0
    out = capsys.readouterr()
    assert "00_tour" in out.out and "kept the README's" in out.err
    assert (course_map.START in out.out) == bool(argv)
