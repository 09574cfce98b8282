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
* `fsdp`: `fsdp_step`, FSDP2 (`fully_shard`) with no checkpointing, ckpt_lab's checkpoint or
  PyTorch's `checkpoint_wrapper`, applied before or after sharding; per-rank bytes by kind.
* `pipeline`: `pipeline_step`, one pipeline stage per rank, plain send/recv, a GPipe or 1F1B
  schedule.
"""
from .ddp import PITFALLS, ddp_pitfalls, ddp_step
from .fsdp import ORDERS, apply_checkpointing, fsdp_step, shard
from .pipeline import cut_segments, pipeline_step, schedule, stage_layers
from .ranks import check_batch, device, several, whoami
from .reference import BANDS, bands, one_process, single_step
