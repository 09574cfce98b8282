"""The correctness catalogue: every case where a checkpoint can return other gradients than
plain autograd without a word, run through plain autograd, PyTorch's two designs and
ckpt_lab's two. Lesson 2 draws its grid from it; ``tests/checkpoint/test_checkpoint_adversarial.py``
holds ckpt_lab to it and pins PyTorch's outcomes.

A case builds fresh state, runs one forward and backward through a wrapper ``wrap(fn, *args)``
and returns what it is judged on: gradients, and the module state where the case is about
state. The scenarios themselves are in `ckpt_lab.checkpoint.case_scenarios`; this file is their
catalogue (`CASES`, with each design's outcome) and the code that runs a case under every
design. `outcome` compares one design with plain autograd, bitwise (CPU fp32):

* ``"right"``: the same values;
* ``"refuses"``: it raised (for ckpt_lab a ``CheckpointError`` naming the cause and the fix;
  plain autograd itself refuses a tensor modified in place after it was saved);
* ``"WRONG, silently"``: other values, or values where plain autograd refuses.

``Case.expected`` records each design's outcome on the pinned torch (2.13). Class 0 is lesson
2's six faults (`FAULTS`), each with the guard a real checkpoint needs against it; classes 1-7
follow issue 19: 1 nested outputs with a residual, 2 code that depends on grad mode, 3 modules
that change their own state in forward, 4 state changed between forward and backward, 5 an
optimizer step before backward with the module reached indirectly, 6 ``backward(inputs=...)``,
7 ``torch.compile`` (slow: inductor compiles C++); classes 8-11 follow issue 28: 8 Python state a
forward changes (plain attributes, a hook it registers and removes), 9 what only the reentrant
design meets (``create_graph``, hooks and leaves made inside, a tensor stored on ``self``), 10
arguments in a dataclass or a mapping, 11 versions of what the region itself read.
`LESSON_ROWS` are the rows lesson 2 shows: the six faults and one case per class of issue 19. A new case is one more entry in `CASES`; `grid` and
``plots.verdict_grid`` take any number of rows.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.utils.checkpoint as tuc

from . import checkpoint
from . import case_scenarios as fc

RIGHT, WRONG, REFUSES = "right", "WRONG, silently", "refuses"
DESIGNS = ("torch non-reentrant", "torch reentrant", "ckpt_lab hooks", "ckpt_lab reentrant")


def _torch(reentrant: bool):
    def wrap(fn, *args):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")        # torch's reentrant warns on some cases
            return tuc.checkpoint(fn, *args, use_reentrant=reentrant)
    return wrap


WRAPS = {
    "plain": lambda fn, *args: fn(*args),
    "torch non-reentrant": _torch(False),
    "torch reentrant": _torch(True),
    "ckpt_lab hooks": lambda fn, *args: checkpoint(fn, *args, impl="hooks"),
    "ckpt_lab reentrant": lambda fn, *args: checkpoint(fn, *args, impl="reentrant"),
}


@dataclass(frozen=True)
class Case:
    """One case: its class, how to run it, what each design does on torch 2.13."""

    cls: int
    name: str
    run: Callable                     # run(wrap) -> list of tensors (or None) to compare
    expected: dict                    # design -> RIGHT | REFUSES | WRONG
    refusal: str = ""                 # regex a ckpt_lab CheckpointError must match
    guard: str = ""                   # the check of a real checkpoint that catches it
    slow: bool = False
    exact: bool = True                # bitwise; else allclose (inductor fuses around the region)
    notes: str = field(default="", compare=False)


def _expect(torch_nr, torch_r, hooks, reentrant) -> dict:
    return dict(zip(DESIGNS, (torch_nr, torch_r, hooks, reentrant)))


_STEP = r"modified in place between the forward and the backward.*Call backward before"

CASES = [
    Case(0, "dropout (RNG)", fc.dropout, _expect(RIGHT, RIGHT, RIGHT, RIGHT), guard="RNG replay"),
    Case(0, "input edited after forward", fc.input_edited,
         _expect(REFUSES, REFUSES, REFUSES, REFUSES), guard="input versions",
         refusal=r"argument 0 .* was modified in place.*Clone it first",
         notes="plain autograd refuses too: Linear saved its input"),
    Case(0, "saved tensor edited inside", fc.saved_edited,
         _expect(WRONG, REFUSES, REFUSES, REFUSES), guard="saved-tensor versions",
         refusal=r"saved for backward.*modified in place after it was saved.*out-of-place",
         notes="plain autograd refuses too; torch's reentrant recompute runs under autograd"),
    Case(0, "optimizer step before backward (bias only)", fc.step_before_backward,
         _expect(WRONG, WRONG, REFUSES, REFUSES), guard="parameter versions", refusal=_STEP,
         notes="plain autograd is right: the step edits only the bias, which no op saves"),
    Case(0, "RReLU fills a saved buffer", fc.rrelu, _expect(WRONG, RIGHT, RIGHT, RIGHT),
         guard="early stop at an op boundary", notes="pytorch/pytorch#193671"),
    Case(0, "recompute differs (metadata)", fc.metadata,
         _expect(REFUSES, REFUSES, REFUSES, REFUSES), guard="metadata check",
         refusal=r"had shape .* in the recompute.*must run the same operations"),
    Case(1, "dict output + residual", fc.nested("dict"), _expect(RIGHT, WRONG, RIGHT, RIGHT)),
    Case(1, "list output + residual", fc.nested("list"), _expect(RIGHT, WRONG, RIGHT, RIGHT)),
    Case(1, "tuple holding a dict + residual", fc.nested("nested"),
         _expect(RIGHT, WRONG, RIGHT, RIGHT)),
    Case(2, "if torch.is_grad_enabled() branch", fc.grad_mode_branch,
         _expect(RIGHT, WRONG, RIGHT, RIGHT)),
    Case(2, "TransformerEncoder eval, padding mask", fc.encoder_eval,
         _expect(RIGHT, WRONG, RIGHT, RIGHT)),
    Case(2, "MultiheadAttention eval, padding mask", fc.attention_eval,
         _expect(RIGHT, WRONG, RIGHT, RIGHT)),
    Case(3, "FakeQuantize whose observer has seen data", fc.fake_quantize,
         _expect(WRONG, WRONG, RIGHT, RIGHT)),
    Case(3, "parametrizations.spectral_norm", fc.spectral(True),
         _expect(WRONG, WRONG, RIGHT, RIGHT)),
    Case(3, "nn.utils.spectral_norm", fc.spectral(False), _expect(WRONG, WRONG, RIGHT, RIGHT)),
    Case(3, "self.step += 1 buffer", fc.step_counter, _expect(WRONG, WRONG, RIGHT, RIGHT)),
    Case(3, "BatchNorm running statistics", fc.batch_norm, _expect(WRONG, WRONG, RIGHT, RIGHT),
         notes="gradients right everywhere; torch updates the statistics twice"),
    Case(4, "buffer modified in place before backward", fc.buffer_in_place,
         _expect(WRONG, WRONG, REFUSES, REFUSES),
         refusal=r"buffer 'shift' of Shifted was modified in place between the forward and "
                 r"the backward.*Change buffers after backward"),
    Case(4, "buffer replaced before backward", fc.buffer_replaced,
         _expect(WRONG, WRONG, RIGHT, RIGHT)),
    Case(4, "Parameter replaced before backward", fc.parameter_replaced,
         _expect(WRONG, WRONG, RIGHT, RIGHT)),
    Case(5, "optimizer step, module in a dict", fc.optimizer_step("dict"),
         _expect(WRONG, WRONG, REFUSES, REFUSES), refusal=_STEP,
         notes="plain autograd refuses too: Linear saved its weight"),
    Case(5, "optimizer step, partial(F.linear, weight=w)", fc.optimizer_step("partial"),
         _expect(WRONG, WRONG, REFUSES, REFUSES), refusal=_STEP),
    Case(5, "optimizer step, module as an attribute", fc.optimizer_step("attribute"),
         _expect(WRONG, WRONG, REFUSES, REFUSES), refusal=_STEP),
    Case(5, "bias-only step, partial(F.linear, bias=b)", fc.optimizer_step("partial", True),
         _expect(WRONG, WRONG, REFUSES, REFUSES), refusal=_STEP,
         notes="plain autograd is right: no op saves a bias; the recompute would use the new"),
    Case(6, "backward(inputs=[weight])", fc.partial_backward("parameter"),
         _expect(RIGHT, WRONG, RIGHT, RIGHT)),
    Case(6, "backward(inputs=[weight, x])", fc.partial_backward("parameter and input"),
         _expect(RIGHT, REFUSES, RIGHT, RIGHT)),
    Case(6, "torch.autograd.grad(loss, [weight])", fc.partial_backward("grad"),
         _expect(RIGHT, REFUSES, RIGHT, RIGHT)),
    Case(7, "torch.compile, aot_eager", fc.compiled("aot_eager"),
         _expect(RIGHT, RIGHT, RIGHT, RIGHT), slow=True),
    Case(7, "torch.compile, inductor", fc.compiled("inductor"),
         _expect(RIGHT, RIGHT, RIGHT, RIGHT), slow=True, exact=False,
         notes="compared with allclose: inductor fuses the code around the checkpoint"),
]

_CONTAINED = r"argument 1\.bias|argument 1\['bias'\]"

CASES += [
    Case(8, "dynamic RoPE: buffer re-registered, length in an int", fc.dynamic_rope,
         _expect(RIGHT, RIGHT, RIGHT, RIGHT), guard="plain attributes replayed",
         notes="Hugging Face's rope_type='dynamic'"),
    Case(8, "counter in a forward pre-hook", fc.pre_hook_counter,
         _expect(WRONG, WRONG, RIGHT, RIGHT), guard="plain attributes replayed"),
    Case(8, "hook registered and removed inside", fc.hook_inside,
         _expect(WRONG, RIGHT, RIGHT, RIGHT), guard="hooks an early stop leaves removed",
         notes="an early stop skips the removal: the hook stays on the module"),
    Case(9, "gradient penalty (create_graph=True)", fc.gradient_penalty,
         _expect(RIGHT, REFUSES, RIGHT, REFUSES), guard="create_graph refused by reentrant",
         refusal=r"create_graph=True.*Use impl='hooks'",
         notes="a reentrant recompute's gradients differentiated again sum in another order"),
    Case(9, "hook registered on the input inside", fc.hook_on_input,
         _expect(WRONG, WRONG, RIGHT, RIGHT), guard="recompute's own hooks dropped",
         notes="the hook would run on the recompute's input and again on the real one"),
    Case(9, "leaf requiring grad created inside", fc.leaf_inside,
         _expect(RIGHT, WRONG, RIGHT, RIGHT), guard="recomputed leaves matched to the forward's"),
    Case(9, "auxiliary loss stored on self (MoE)", fc.aux_loss,
         _expect(RIGHT, WRONG, RIGHT, REFUSES), guard="tensors that escape the outputs",
         refusal=r"not return.*self\.aux_loss.*Return it.*impl='hooks'"),
    Case(10, "mask in a dataclass edited before backward", fc.edited_in_container("dataclass"),
         _expect(WRONG, WRONG, REFUSES, REFUSES), guard="input versions, containers walked",
         refusal=_CONTAINED + r".*was modified in place.*Clone it first"),
    Case(10, "mask in a Mapping (BatchEncoding) edited", fc.edited_in_container("mapping"),
         _expect(WRONG, WRONG, REFUSES, REFUSES), guard="input versions, containers walked",
         refusal=_CONTAINED + r".*was modified in place.*Clone it first"),
    Case(11, "optimizer in backward, closure over the model", fc.optimizer_in_backward,
         _expect(RIGHT, RIGHT, RIGHT, RIGHT), guard="versions of what the region read",
         notes="torchtune's idiom: a later block steps before an earlier block's backward"),
    Case(11, "Embedding(max_norm) renormalises its weight", fc.own_parameter_changed("embedding"),
         _expect(RIGHT, REFUSES, RIGHT, RIGHT), guard="parameter versions after the forward",
         notes="torch's reentrant: no input requires grad, so no output does"),
    Case(11, "LazyLinear's first call", fc.own_parameter_changed("lazy"),
         _expect(RIGHT, RIGHT, RIGHT, RIGHT), guard="parameter versions after the forward"),
    Case(11, "except Exception inside the function", fc.catches_exception,
         _expect(REFUSES, RIGHT, RIGHT, RIGHT), guard="a stop signal no except Exception catches",
         notes="torch's early stop raises an Exception the function catches (AssertionError)"),
]

FAULTS = [c for c in CASES if c.cls == 0]
# lesson 2's grid: the six faults, then one case per class of issue 19
LESSON_ROWS = FAULTS + [next(c for c in CASES if c.name == name) for name in (
    "dict output + residual", "TransformerEncoder eval, padding mask",
    "parametrizations.spectral_norm", "buffer modified in place before backward",
    "optimizer step, module in a dict", "backward(inputs=[weight])", "torch.compile, aot_eager")]


def _same(a: list, b: list, exact: bool) -> bool:
    if len(a) != len(b):
        return False
    for u, v in zip(a, b):
        if (u is None) != (v is None):
            return False
        if u is not None and not (torch.equal(u, v) if exact
                                  else torch.allclose(u, v, rtol=1e-5, atol=1e-6)):
            return False
    return True


def reference(case: Case):
    """Plain autograd's result for the case, or the exception it raises."""
    try:
        return case.run(WRAPS["plain"])
    except RuntimeError as e:
        return e


def outcome(case: Case, design, ref=None) -> tuple[str, object]:
    """(RIGHT | REFUSES | WRONG, the exception or the result) of one design on a case; `design`
    is a name in `WRAPS` or a wrapper ``wrap(fn, *args)``."""
    wrap = WRAPS[design] if isinstance(design, str) else design
    ref = reference(case) if ref is None else ref
    try:
        got = case.run(wrap)
    except Exception as e:  # noqa: BLE001 (torch raises RuntimeError, ckpt_lab CheckpointError)
        return REFUSES, e
    if isinstance(ref, Exception):
        return WRONG, got
    return (RIGHT if _same(ref, got, case.exact) else WRONG), got


def grid(cases, wraps: dict) -> dict:
    """``table[case name][wrap name]``: "right", "WRONG, silently" or "refuses (ErrorType)"
    for every case under every wrap (a design name's wrap or your own), for lesson 2's grid."""
    table = {}
    for case in cases:
        ref = reference(case)
        table[case.name] = {}
        for name, wrap in wraps.items():
            label, detail = outcome(case, wrap, ref)
            table[case.name][name] = (f"{label} ({type(detail).__name__})" if label == REFUSES
                                      else label)
    return table


if __name__ == "__main__":
    print(f"{'case':48}" + "".join(f"{d:>21}" for d in DESIGNS))
    for name, row in grid(CASES, {d: WRAPS[d] for d in DESIGNS}).items():
        print(f"{name:48}" + "".join(f"{row[d].split(' (')[0]:>21}" for d in DESIGNS))
