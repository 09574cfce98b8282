"""Recursive bisection: checkpoints inside checkpoints, for memory that grows as log L.

``checkpoint_sequential`` with sqrt(L) segments keeps sqrt(L) segment inputs plus one
segment's activations: O(sqrt L) memory for one extra forward. Nesting does better. Split the
chain in two; checkpoint the first half (keep only its input) and treat the second half the
same way, recursively; a piece of at most ``min_layers`` layers just runs. In backward, each
checkpointed half is recomputed *with the same recursion*, so it too keeps only O(log) inputs.

* memory: about one kept input per level plus ``min_layers`` layers' activations, O(log L);
* work: a layer is re-run once for every level at which it lies in a first half, which adds
  (L/2) log2 L layer forwards for a power of two L (``formulas.bisection_cost``): O(L log L).

Nesting needs the inner checkpoint's kept input to be freeable too: with ``impl="hooks"``
``checkpoint`` saves its inputs through the enclosing checkpoint's hooks, so an inner input is
itself only a handle that the outer recompute fills; with ``impl="reentrant"`` the outer
forward runs under a pack hook that keeps nothing, so the inner checkpoints' saved inputs are
dropped there too.
"""
from __future__ import annotations

from . import checkpoint, layer_list


def checkpoint_recursive(layers, x, min_layers: int = 1, impl: str = "hooks",
                         preserve_rng_state: bool = True):
    """Run ``layers`` on ``x``, checkpointing first halves recursively down to ``min_layers``."""
    layers = layer_list(layers)
    if not layers:
        raise ValueError("checkpoint_recursive needs at least one layer")
    if isinstance(min_layers, bool) or not isinstance(min_layers, int) or min_layers < 1:
        raise ValueError(f"min_layers must be an int >= 1 (the largest piece run without a "
                         f"checkpoint), got {min_layers!r}")
    opts = dict(impl=impl, preserve_rng_state=preserve_rng_state)

    def run(part, x):
        while len(part) > min_layers:
            half = len(part) // 2
            x = checkpoint(run, part[:half], x, **opts)
            part = part[half:]
        for layer in part:
            x = layer(x)
        return x

    return run(layers, x)
