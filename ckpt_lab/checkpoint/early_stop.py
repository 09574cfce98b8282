"""Early stop: end a recompute as soon as it has produced the last tensor backward needs.
(Design note 11, in NOTES.md.)

A hooks-design recompute fills the holders in the order the forward saved; the operations after
the last save only build outputs nobody uses, so they are skipped (``early_stop=True``, the
default; lesson 4 measures the difference). Where to stop is the subtle part, at an op boundary:
`StopRecompute` ends the run from the pack hook when the last saved tensors all require grad,
and otherwise `StopAtOp`, a dispatch mode started for the last `WATCHED` saves only, ends it
after the op in flight, letting an op that writes into an argument it saved (`writes`:
``nn.RReLU``'s noise buffer) run first. `checkpoint_hooks` drives both.
"""
from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class StopRecompute(BaseException):
    """Raised once the recompute has produced every tensor backward needs (early stop); not an
    ``Exception``, so an ``except Exception:`` inside the function lets it through."""


_WRITES: dict = {}


def writes(func) -> bool:
    """Whether an ATen op writes into one of its arguments (its schema marks it ``(a!)``)."""
    hit = _WRITES.get(func)
    if hit is None:
        hit = _WRITES[func] = any(a.alias_info is not None and a.alias_info.is_write
                                  for a in func._schema.arguments)
    return hit


# The last WATCHED saved tensors decide how a recompute stops early: a matmul, the usual last
# op, saves two inputs. If they all require grad it stops at the last save; otherwise a
# StopAtOp starts watching there (the op in flight when it starts is one it cannot see).
WATCHED = 2


class StopAtOp(TorchDispatchMode):
    """Ends an early-stopping recompute at an op boundary once every tensor has been saved.

    Autograd saves an op's inputs *before* the op runs. Stopping right there is exact for an
    op that only reads them (the last ``softmax . V`` of an attention core is skipped), but not
    for one that writes into an argument it saves: ``rrelu_with_noise`` saves its ``noise``
    buffer and only then fills it, so stopping before it hands backward an uninitialised
    buffer (PyTorch's own non-reentrant checkpoint does, pytorch/pytorch#193671). Such an op
    runs first.

    A tensor an op writes after saving it is one of its buffer arguments (rrelu's noise, batch
    norm's running statistics), which never require grad. So the stopper is needed only when
    one of the last saved tensors does not require grad; otherwise (a matmul's two inputs,
    the usual end of a block) the recompute stops at the last save itself, at no cost.

    A mode started while an op is in flight does not see that op, only the ops its kernel
    calls; stopping at one of those would cut the op short. So when nothing has been seen
    since a mid-op start, the last saved tensor may be that op's, and the recompute is not
    stopped (it runs to the end, which is exact).
    """

    def __init__(self):
        super().__init__()
        self.active = False        # entered (it starts late, or not at all)
        self.mid_op = False        # entered from a pack hook, while an op was in flight
        self.pending = False       # the last saved tensor has been packed: stop at the next op
        self.seen = 0              # ops seen, those of the recompute's own pack hook aside
        self.quiet = False         # inside the pack hook

    def start(self, mid_op: bool):
        """Enter the mode (once)."""
        if not self.active:
            self.__enter__()
            self.active, self.mid_op = True, mid_op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.quiet:
            return func(*args, **(kwargs or {}))
        self.seen += 1
        if self.pending and not writes(func):
            raise StopRecompute
        out = func(*args, **(kwargs or {}))
        if self.pending:
            raise StopRecompute
        return out
