"""ckpt-lab: activation checkpointing, built from scratch and measured.

The names lessons and outside users call live here; each comes from a small module named for
what it does (`memory`, `checkpoint`, ...).
"""
from .checkpoint import CheckpointError, checkpoint, checkpoint_sequential
from .offload import OffloadStats, offload_activations
from .recursive import checkpoint_recursive
from .selective import Decision
from .memory import LayerProfile, MemoryLog, SimulatedOutOfMemoryError, phase, profile_layers, track_memory

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "Decision",
    "LayerProfile",
    "MemoryLog",
    "OffloadStats",
    "SimulatedOutOfMemoryError",
    "checkpoint",
    "checkpoint_recursive",
    "checkpoint_sequential",
    "offload_activations",
    "phase",
    "profile_layers",
    "track_memory",
]
