"""The README's library example runs as written, and its course map is the one the course gives now."""
import re
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import course_map  # noqa: E402

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_library_example_runs():
    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    torch.manual_seed(0)
    layers = [m for _ in range(8) for m in (nn.Linear(256, 256), nn.GELU())]
    x = torch.randn(512, 256, requires_grad=True)
    namespace = {"model_layers": layers, "x": x}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["plan"].boundaries[0] == 0
    assert namespace["mem"].peak_bytes > 0


def test_course_map_lists_every_lesson_with_a_measured_time():
    rows = [l for l in README.splitlines() if l.startswith("| ") and ".ipynb" in l]
    names = [re.search(r"\(notebooks/([\w]+)\.ipynb\)", r).group(1) for r in rows]
    assert names == list(course_map.LESSONS)
    assert all(re.search(r"\| \d+ s \|$", r) for r in rows)


def test_course_map_section_matches_what_the_study_time_rule_gives_now():
    """Regenerate with `python tools/course_map.py --write` when this fails."""
    problems = course_map.readme_drift(README, course_map.lessons())
    assert not problems, ("README's course map is stale; run `python tools/course_map.py "
                          "--write` (after `make test` for fresh run times):\n" + "\n".join(problems))
