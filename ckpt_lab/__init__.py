"""ckpt-lab: activation checkpointing, built from scratch and measured.

Two rooms, one direction (docs/architecture.md draws them):

* ``ckpt_lab`` (this package) is the library an engineer imports into their own training code.
  Foundations: `memory` and `allocator` measure (tensor bytes; what the allocator saw),
  `checkpoint` (with `selective`, `recursive`, `offload`) changes what autograd keeps.
  `checkpoint` holds the two designs at their smallest and the API; the machinery under it is
  one module per job: `checkpoint_hooks` and `checkpoint_reentrant` (each design in full),
  `guards` (metadata and version checks), `fingerprint` (the bitwise check), `replay`
  (generators and autocast), `module_state` (the modules' parameters and buffers), `reach`
  (the modules and parameters a function reaches), `arguments` (nested arguments and
  outputs), `holders` (what autograd keeps in place of a saved tensor), `early_stop` (ending a
  recompute early) and `errors` (`CheckpointError`).
  Predictions and something to train: `formulas`, `parallel_formulas`, `profile`, `models`,
  `data`, `timing`; `losses` (cross-entropy in checkpointed chunks). Decide and apply:
  `planner`, `modules` (with `module_step`), `capacity`, `fallback`, `train`, `throughput`,
  `distributed`, `snapshot`. Plumbing: `__main__` (the ``ckpt-lab`` command) and
  `_requirements` (the torch version check at import).
* ``ckpt_lab.lessons`` is the course's scaffolding: what the notebooks lay out (course links and
  sizes, widgets, plots, exercises, lesson demos). It imports the library; the library never
  imports it. Import it only to follow the course.

The names lessons and outside users call are re-exported here. ``ckpt_lab.checkpoint`` is the
module that builds checkpointing from scratch, and calling it calls its function:
``ckpt_lab.checkpoint(fn, x)`` is ``ckpt_lab.checkpoint.checkpoint(fn, x)``.
"""
from ._requirements import check_torch

check_torch()

from .memory import MemoryLog, SimulatedOutOfMemoryError, kept_after_forward, phase, track_memory  # noqa: E402
from .profile import LayerProfile, profile_layers  # noqa: E402
from . import checkpoint  # noqa: E402  (the module; calling it calls checkpoint.checkpoint)
from .checkpoint import CheckpointError, checkpoint_sequential  # noqa: E402
from .selective import Decision  # noqa: E402
from .recursive import checkpoint_recursive  # noqa: E402
from .modules import CheckpointedModules, checkpoint_modules  # noqa: E402
from .offload import OffloadStats, offload_activations  # noqa: E402
from .models import CheckpointPolicy, build_model, get_config  # noqa: E402
from .data import TextBatches, load_corpus  # noqa: E402
from .train import load_run_state, save_run_state, train  # noqa: E402
from .losses import chunked_cross_entropy  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "CheckpointPolicy",
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
    "profile_layers",
    "save_run_state",
    "track_memory",
    "train",
]
