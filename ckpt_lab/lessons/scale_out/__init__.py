"""The rank functions of lesson 12: what each process runs under `distributed.launch`.

They live in this package, not in the notebook, because every rank is a fresh Python
interpreter that imports the function it runs by module and name (see `ckpt_lab.training.distributed`).
Each one builds the same seeded GPT on every rank, takes its share of a global batch the caller
passes in, runs one measured training step and returns plain numbers (and tensors) to the
caller. One module per kind of run, every name re-exported here (``scale_out.ddp_step``):

* `ranks`: what every rank function shares; `whoami` (each rank says who it is, after an
  all-reduce) and `several` (a list of these in one launch: one process start-up for a whole
  experiment).
* `reference`: `single_step`, the one-process reference run in the caller, `one_process` its
  bytes by kind, and `bands`, which sorts a run's bytes into the bands of lesson 12's figure.
* `ddp`: `ddp_step` (`DistributedDataParallel`, with or without checkpointing, loss and
  gradients) and `ddp_pitfalls` (reentrant checkpointing under DDP, the failures and fixes).
* `fsdp`: `fsdp_step`, one FSDP2 step over a model that an importable `prepare(model)`
  checkpoints and shards (`shard_layers`, `checkpoint_then_shard`, `shard_then_checkpoint`,
  `ckpt_lab_then_shard`, `one_unit`, or the lesson's own); per-rank bytes by kind.
* `pipeline`: `pipeline_step`, one pipeline stage per rank: `run_stage`, the send/recv loop of
  one stage, in a GPipe or 1F1B `schedule` (or orders of the caller's), measured between
  operations.
"""
from .ddp import PITFALLS, ddp_pitfalls, ddp_step
from .fsdp import (apply_checkpointing, checkpoint_then_shard, ckpt_lab_then_shard, fsdp_step,
                   one_unit, shard_layers, shard_then_checkpoint, unit_bytes)
from .pipeline import (check_order, cut_segments, pipeline_step, run_stage, schedule,
                       stage_layers)
from .ranks import check_batch, device, several, whoami
from .reference import BANDS, bands, one_process, single_step
