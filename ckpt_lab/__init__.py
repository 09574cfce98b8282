"""ckpt-lab: activation checkpointing, built from scratch and measured.

The names lessons and outside users call live here; each comes from a small module named for
what it does: `memory` measures, `checkpoint` (with `selective`, `recursive`, `offload`)
changes what autograd keeps, `models`/`data`/`train` give something real to train,
`formulas` predicts, `planner` decides. Modules such as `ckpt_lab.planner` and
`ckpt_lab.formulas` are meant to be used by their full name. `ckpt_lab.checkpoint` is the
module that builds checkpointing from scratch, and calling it calls its function:
`ckpt_lab.checkpoint(fn, x)` is `ckpt_lab.checkpoint.checkpoint(fn, x)`.
"""
from .memory import (LayerProfile, MemoryLog, SimulatedOutOfMemoryError, phase, profile_layers,
                     track_memory)
from . import checkpoint  # the module; calling it calls checkpoint.checkpoint
from .checkpoint import CheckpointError, checkpoint_sequential
from .selective import Decision
from .recursive import checkpoint_recursive
from .modules import CheckpointedModules, checkpoint_modules
from .offload import OffloadStats, offload_activations
from .models import CheckpointPolicy, build_model, get_config
from .data import TextBatches, load_corpus
from .train import load_run_state, save_run_state, train

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
    "get_config",
    "load_corpus",
    "load_run_state",
    "offload_activations",
    "phase",
    "profile_layers",
    "save_run_state",
    "track_memory",
    "train",
]
