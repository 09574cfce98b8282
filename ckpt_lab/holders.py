"""What a checkpoint leaves autograd in place of each saved tensor, and what it notes about it.

Under saved-tensor hooks autograd stores whatever the pack hook returns. A checkpoint returns a
`Holder`: empty until the recompute fills it with the tensor that was saved, emptied again once
backward has used it, so the activation lives only between the two. Beside it the forward notes
a `Saved` record (the holder, by weak reference; the tensor's metadata, version and fingerprint;
whether it is a parameter) that the checks of `guards` and `fingerprint` compare the recompute
against. The reentrant design keeps records only, for their version probes.
"""
from __future__ import annotations

import weakref

import torch

from .guards import meta_of, probe


class Holder:
    """What autograd stores in place of a saved tensor: filled by a recompute."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self):
        self.tensor = None


class Saved:
    """What the forward recorded about one saved tensor: its holder, metadata and version (and,
    in the hooks design, its fingerprint, and which leaf it is if it is a parameter)."""

    __slots__ = ("holder", "meta", "requires_grad", "probe", "version", "digest", "leaf")

    def __init__(self, holder: Holder, t: torch.Tensor, digest=None, leaf=None):
        self.holder = weakref.ref(holder)         # dead once autograd no longer needs it
        self.meta, self.requires_grad = meta_of(t), t.requires_grad
        self.probe, self.version = probe(t), t._version
        self.digest, self.leaf = digest, leaf

    def edited(self) -> bool:
        """Modified in place since it was saved, while autograd still needs it."""
        return (self.probe is not None and self.probe._version != self.version
                and self.holder() is not None)
