"""A checkpoint's arguments: what they hold, flattened and rebuilt, and fresh for the recompute.
(Design note 8, in NOTES.md.)

A checkpointed function may take tensors, modules and generators nested in lists, tuples and
dicts (and, for the version checks, in mappings and dataclasses), and may return tensors so
nested. `named_leaves` names each one found in the arguments (for the version checks' messages
and the module search of `hidden_inputs`); `flatten` and `unflatten`
turn arguments and outputs into flat lists and back, so each tensor in them is connected to the
graph; `fresh_input` gives the recompute its own leaf of an input. Both designs
(`checkpoint_hooks`, `checkpoint_reentrant`) use them; `tensors_in`, the tensors of a nested
argument list in order, serves `wrap` and `plan.recorded_step`, which watch blocks' arguments.
"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten


def _walk(obj, path: str, out: list, seen: set):
    """Collect (path, leaf) for tensors, modules and generators in nested lists, tuples, deques,
    mappings (a dict, Hugging Face's ``BatchEncoding``) and dataclasses."""
    if isinstance(obj, (torch.Tensor, nn.Module, torch.Generator)):
        out.append((path, obj))
        return
    if isinstance(obj, (str, bytes, int, float, bool, type(None))) or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (list, tuple, collections.deque)):
        for i, v in enumerate(obj):
            _walk(v, f"{path}[{i}]", out, seen)
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            _walk(v, f"{path}[{k!r}]", out, seen)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _walk(getattr(obj, f.name, None), f"{path}.{f.name}", out, seen)


def tensors_in(tree) -> list:
    """The tensors in nested lists, tuples and dicts, in order (``checkpoint_modules``' blocks)."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for item in tree for t in tensors_in(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in tensors_in(item)]
    return []


def named_leaves(args, kwargs) -> list[tuple[str, object]]:
    """Tensors, modules and generators in the arguments, named like ``argument 0[1]``."""
    out: list = []
    seen: set = set()
    for i, a in enumerate(args):
        _walk(a, f"argument {i}", out, seen)
    for k, v in kwargs.items():
        _walk(v, f"keyword argument {k!r}", out, seen)
    return out


TENSOR = object()   # marks an argument slot that the saved tensors fill


def flatten(tree) -> tuple[list, object]:
    """``tree_flatten``, with a shortcut for a tensor or a flat tuple/list (spec None, list)."""
    if isinstance(tree, torch.Tensor):
        return [tree], None
    if type(tree) in (tuple, list) and not any(isinstance(v, (list, tuple, dict))
                                               for v in tree):
        return list(tree), type(tree)
    return tree_flatten(tree)


def unflatten(flat: list, spec):
    """The inverse of `flatten`."""
    if spec is None:
        return flat[0]
    if spec in (tuple, list):
        return spec(flat)
    return tree_unflatten(flat, spec)


def fresh_input(t):
    """The recompute's copy of an input: a new leaf if it requires grad, else ``t`` itself."""
    if isinstance(t, torch.Tensor) and t.requires_grad:
        return t.detach().requires_grad_(True)
    return t
