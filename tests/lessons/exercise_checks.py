"""What the tests of each lesson's exercises share: judging an answer quietly, a right answer
met with ✓ and a wrong one with ✗ and its hint, and an unanswered or malformed answer met with
a message instead of an exception."""
from ckpt_lab.lessons import exercises


def judge(key: str, answer) -> bool:
    """Whether exercise `key` judges `answer` right (nothing printed)."""
    return exercises.EXERCISES[key].judge(answer)[0]


def right_then_wrong(key: str, right, wrong, hint: str, capsys) -> None:
    """`right` prints ✓; `wrong` prints ✗ and a hint containing `hint`."""
    assert exercises.check(key, right) is True
    assert "✓" in capsys.readouterr().out
    assert exercises.check(key, wrong) is False
    out = capsys.readouterr().out
    assert "✗" in out and hint in out


def unanswered_and_malformed(keys, malformed, capsys) -> None:
    """Neither None nor `malformed` raises or counts as right; None says "not answered yet"."""
    for key in keys:
        assert exercises.check(key, None) is False
        assert exercises.check(key, malformed) is False
    assert "not answered yet" in capsys.readouterr().out


def in_your_code(name: str) -> str:
    """The python block of a lesson's closing "In your code" section (e.g. "08_capacity_and_oom")."""
    import re
    from pathlib import Path

    import nbformat
    nb = nbformat.read(Path(__file__).resolve().parents[2] / "notebooks" / f"{name}.ipynb",
                       as_version=4)
    cell = next(c.source for c in nb.cells if c.source.startswith("## In your code"))
    return re.search(r"```python\n(.*?)```", cell, re.S).group(1)


def prediction_headings(name: str) -> dict[str, str]:
    """{exercise key: the heading of the section that asks it} for a lesson (e.g. "00_tour");
    a prediction asked before the first section heading belongs to the lesson's title."""
    import re
    from pathlib import Path

    import nbformat
    nb = nbformat.read(Path(__file__).resolve().parents[2] / "notebooks" / f"{name}.ipynb",
                       as_version=4)
    found, heading = {}, None
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            lines = [l for l in cell.source.splitlines() if re.match(r"#{1,3} ", l)]
            heading = lines[-1] if lines else heading
        for key in re.findall(r"exercises\.predict\(\s*[\"'](\d\d\.\w+)[\"']", cell.source):
            found[key] = heading
    return found


def headings_ask(name: str) -> None:
    """Each section that holds a prediction is headed by a question, not by its answer: the
    claim is stated after the reveal (the review of 2026-12-01, "answers on screen")."""
    for key, heading in prediction_headings(name).items():
        assert heading and heading.rstrip().endswith("?"), f"{key} sits under {heading!r}"
