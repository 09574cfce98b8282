"""The oldest torch ckpt_lab runs on, checked before anything else is imported.

Tested: torch 2.13.0 (CI, pinned in requirements.txt) and 2.14.1 (the unit tests, by hand,
2026-12-01). Older releases fail in ways a learner cannot read: with 2.6.0 and 2.9.1 the unit
tests of per-op selective checkpointing crash the interpreter (a segmentation fault inside
PyTorch while dispatch modes and saved-tensor hooks are nested), and below 2.5
``import ckpt_lab`` would stop at a missing ``torch.OutOfMemoryError``. So `check_torch`
refuses them with what to do. No lesson needs more than the floor.
"""
from __future__ import annotations

import torch

MIN_TORCH = (2, 13)


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
            f"ckpt_lab needs torch>={need}; this environment has torch "
            f"{version or torch.__version__}. With torch 2.6 and 2.9 its selective checkpointing "
            f"crashed the interpreter in its tests. Upgrade: pip install -U 'torch>={need}' (on "
            "Colab, then Runtime > Restart session), or `make lab` for the tested versions.")
