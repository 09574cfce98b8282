"""ckpt-lab: activation checkpointing, built from scratch and measured.

Two rooms, one direction. ``ckpt_lab`` (this package) is the library an engineer imports into
their own training code, one folder per layer, each importing only from the layers below it:
`measure` (what memory a step uses), `checkpoint` (what autograd keeps), `plan` (what to
checkpoint), `training` (something to train). ``ckpt_lab.lessons`` is the course's scaffolding;
it imports the library, the library never imports it. docs/architecture.md draws the folders
and says what each holds.

The names lessons and outside users call are re-exported here, with the submodules they use by
name (`planner`, `formulas`, `capacity`, `parallel_formulas`, `distributed`).
``ckpt_lab.checkpoint`` is the package that builds checkpointing from scratch, and calling it
calls its function: ``ckpt_lab.checkpoint(fn, x)`` is ``ckpt_lab.checkpoint.checkpoint(fn, x)``.
"""
from ._requirements import check_torch

check_torch()

from .measure.memory import (MemoryLog, SimulatedOutOfMemoryError, kept_after_forward,  # noqa: E402
                             phase, track_memory)
from . import checkpoint  # noqa: E402  (the package; calling it calls checkpoint.checkpoint)
from .checkpoint import CheckpointError, checkpoint_sequential  # noqa: E402
from .checkpoint.selective import Decision  # noqa: E402
from .checkpoint.recursive import checkpoint_recursive  # noqa: E402
from .checkpoint.wrap import CheckpointedModules, checkpoint_modules  # noqa: E402
from .checkpoint.offload import OffloadStats, offload_activations  # noqa: E402
from .plan import capacity, formulas, parallel_formulas, planner  # noqa: E402,F401
from .plan.profile import LayerProfile, profile_layers  # noqa: E402
from .plan.module_planner import plan_modules, profile_modules  # noqa: E402
from .training import distributed  # noqa: E402,F401
from .training.models import (CheckpointPolicy, CheckpointScheme, build_model,  # noqa: E402
                              get_config)
from .training.data import TextBatches, load_corpus  # noqa: E402
from .training.loop import load_run_state, save_run_state, train  # noqa: E402
from .training.losses import chunked_cross_entropy  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "CheckpointPolicy",
    "CheckpointScheme",
    "CheckpointedModules",
    "Decision",
    "LayerProfile",
    "MemoryLog",
    "OffloadStats",
    "SimulatedOutOfMemoryError",
    "TextBatches",
    "build_model",
    "checkpoint",
    "checkpoint_modules",
    "checkpoint_recursive",
    "checkpoint_sequential",
    "chunked_cross_entropy",
    "get_config",
    "kept_after_forward",
    "load_corpus",
    "load_run_state",
    "offload_activations",
    "phase",
    "plan_modules",
    "profile_layers",
    "profile_modules",
    "save_run_state",
    "track_memory",
    "train",
]
