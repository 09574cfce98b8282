"""The torch floor: below it, `import ckpt_lab` says what to do instead of failing on a
missing attribute; pyproject states the same floor."""
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ckpt_lab._requirements import MIN_TORCH, check_torch, torch_version

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("version, expected", [("2.13.0", (2, 13)), ("2.5.1+cu124", (2, 5)),
                                               ("2.6.0a0+git1234", (2, 6)), ("3.0.0", (3, 0))])
def test_torch_version_parses_release_and_local_builds(version, expected):
    assert torch_version(version) == expected


def test_below_the_floor_the_error_names_the_fix():
    with pytest.raises(ImportError, match=r"needs torch>=2\.13.*torch 2\.9\.1.*pip install"):
        check_torch("2.9.1")
    check_torch("2.13.0")                      # the floor itself passes
    check_torch()                              # and the installed torch


def test_import_ckpt_lab_under_an_old_torch_raises_the_clear_error():
    """A fresh interpreter whose torch claims 2.9: ImportError with the fix, not a crash later."""
    code = "import torch; torch.__version__ = '2.9.1'; import ckpt_lab"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0
    assert "ImportError: ckpt_lab needs torch>=2.13" in out.stderr, out.stderr[-1500:]


def test_pyproject_states_the_same_floor():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = ".".join(map(str, MIN_TORCH))
    assert f"torch>={floor}" in deps, deps
