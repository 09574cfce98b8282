"""`CheckpointError`: what a checkpoint raises instead of computing a wrong gradient.

Every guard of `ckpt_lab.checkpoint` (`replay`, `guards`, `fingerprint` and both designs)
refuses with it, naming the cause and the fix; it lives alone here so that all of them can raise
it without importing one another. ``ckpt_lab.CheckpointError`` and
``ckpt_lab.checkpoint.CheckpointError`` are this class.
"""


class CheckpointError(RuntimeError):
    """The recomputation would not reproduce the forward, so gradients would be wrong."""
