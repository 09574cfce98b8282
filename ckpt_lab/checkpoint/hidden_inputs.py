"""What a checkpointed function reaches beyond its tensor arguments: its modules and its leaves.
(Design note 6, in NOTES.md; the module search is written here only.)

A checkpoint must know the modules a function uses (to replay and check their state,
`module_state`) and the parameters it read (to check their versions; the reentrant design also
takes them as inputs). Neither is in the argument list in general:

* `modules_of` searches before the forward: the function itself, its ``self``, its closure, a
  ``partial``'s arguments, the globals it reads, its arguments, and modules held in lists,
  tuples, dicts and plain objects' attributes among those (one plain object deep). A module
  held deeper, or in a global dict, is not found (``tests/checkpoint/test_checkpoint_limits.py``).
* `graph_leaves` walks the graph the forward built, after it: every leaf tensor requiring grad
  that it reaches, however the function found it (``partial(F.linear, weight=w)``), and the
  nodes older than the forward that are the history of a tensor it captured.
"""
from __future__ import annotations

import dis
import functools
import inspect
import types

import torch
from torch import nn


_CONTAINERS = (nn.Module, list, tuple, dict, functools.partial, types.MethodType,
               types.FunctionType, types.SimpleNamespace)


def modules_of(fn, leaves) -> list[nn.Module]:
    """Modules ``fn`` may use, searched where the module docstring says."""
    found = [m for _, m in leaves if isinstance(m, nn.Module)]
    todo, seen = [fn], set()
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if isinstance(f, nn.Module):
            found.append(f)
        elif isinstance(f, functools.partial):
            todo += [f.func, *f.args, *f.keywords.values()]
        elif inspect.ismethod(f):
            todo.append(f.__self__)
        elif isinstance(f, (list, tuple)):
            todo += [v for v in f if isinstance(v, _CONTAINERS)]
        elif isinstance(f, dict):
            todo += [v for v in f.values() if isinstance(v, _CONTAINERS)]
        elif isinstance(f, types.FunctionType):
            for cell in f.__closure__ or ():
                try:
                    v = cell.cell_contents
                except ValueError:             # a cell not filled yet
                    continue
                if isinstance(v, _CONTAINERS) or _plain_object(v):
                    todo.append(v)          # (a wrapped module's forward is a bound method)
            for name in _global_names(f.__code__):
                v = f.__globals__.get(name)
                if isinstance(v, (nn.Module, list, tuple, dict)):
                    todo.append(v)
        elif _plain_object(f):                 # a user's object holding modules as attributes
            todo += [v for v in vars(f).values() if isinstance(v, (nn.Module, list, tuple, dict))]
    return list({id(m): m for m in found}.values())


def _plain_object(v) -> bool:
    """An instance of a user's class (not a tensor, module, type or builtin) with attributes."""
    return (hasattr(v, "__dict__") and not isinstance(v, (torch.Tensor, nn.Module, type,
                                                           types.ModuleType))
            and type(v).__module__ not in ("builtins", "torch"))


@functools.lru_cache(maxsize=1024)
def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """Names a function reads as globals (a notebook's model, a test's layer)."""
    return tuple({i.argval for i in dis.get_instructions(code)
                  if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")})


_ACCUMULATE = torch._C._functions.AccumulateGrad


def graph_leaves(outputs, since: int, inputs) -> tuple[list, list]:
    """The leaves requiring grad and the outside nodes that the forward's graph reaches."""
    # Walks back from the outputs to where the forward began: the leaves are parameters,
    # wherever the function found them (a module, a dict, an attribute, a partial(F.linear,
    # weight=w)); a node made before `since` (the autograd sequence number when the forward
    # began) that is no input's own is the history of a tensor the function captured.
    # One Python step per node.
    skip = {id(t) for t in inputs}
    own = {t.grad_fn for t in inputs if t.grad_fn is not None}
    todo = [o.grad_fn for o in outputs if o.grad_fn is not None]
    seen, leaves, before = set(), [], []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node) is _ACCUMULATE:
            if id(node.variable) not in skip:
                leaves.append(node.variable)
        elif node._sequence_nr() < since:
            if node not in own:
                before.append(node)
        else:
            todo += [f for f, _ in node.next_functions]
    return leaves, before
