"""The oldest torch ckpt_lab runs on, checked before anything else is imported.

The library subclasses ``torch.OutOfMemoryError`` (new in torch 2.5) at import time, so an
older torch would fail with a bare AttributeError; `check_torch` says what to do instead.
Lessons that need more say so themselves (`ckpt_lab.lessons.course.LESSON_TORCH`).
"""
from __future__ import annotations

import torch

MIN_TORCH = (2, 5)


def torch_version(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of a torch version string such as '2.13.0+cpu' (default: the installed one)."""
    major, minor = (version or torch.__version__).split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def check_torch(version: str | None = None) -> None:
    """Raise ImportError with the fix when the installed torch is older than `MIN_TORCH`."""
    have = torch_version(version)
    if have < MIN_TORCH:
        need = ".".join(map(str, MIN_TORCH))
        raise ImportError(
            f"ckpt_lab needs torch>={need}; this environment has torch {version or torch.__version__}. "
            f"Upgrade it (pip install 'torch>={need}'), or use the tested versions: "
            "`make lab` installs them from requirements.txt.")
