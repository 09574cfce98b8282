"""The budget scatter figure (`plots.budget_scatter`). Lesson 7's predictions are tested in
test_exercises_07.py, lesson 8's in test_exercises_08.py."""
import matplotlib

matplotlib.use("Agg")

import pytest

from ckpt_lab.lessons import plots


def test_budget_scatter_fills_fitting_points_and_draws_the_budget():
    fig = plots.budget_scatter(["a", "b"], [2 * 2 ** 20, 5 * 2 ** 20], [0.0, 1.0], 3 * 2 ** 20)
    ax = fig.axes[0]
    faces = [c.get_facecolors() for c in ax.collections]
    assert faces[0].shape[0] == 1 and faces[0][0][3] > 0          # a fits: filled
    assert faces[1].shape[0] == 0 or faces[1][0][3] == 0          # b does not: hollow
    assert any(abs(line.get_ydata()[0] - 3.0) < 1e-9 for line in ax.lines)
    with pytest.raises(ValueError):
        plots.budget_scatter(["a"], [1, 2], [0.0], 3)
