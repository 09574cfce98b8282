"""What a block saves for backward, tensor by tensor, matched to the formula's terms.

A lesson collects every tensor autograd saves with PyTorch's own hooks::

    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        block(x)

`by_term` then keeps each storage once (a view saved twice, or by two ops, is one tensor in
memory), leaves out the parameters, and walks the storages in the order they were saved
against the terms of `formulas.gpt_block_terms`, which lists them in the order the block's
forward runs. Each term takes the storages that make it up (a layer norm's mean and 1/std
are two storages, one term); a storage that fits no term raises, so a change in what PyTorch
saves shows up instead of being averaged away.

`MEGATRON_TERM` maps each of our terms onto Korthikanti et al.'s (None: not in the paper), and
`mapping_table` lays the two side by side in bytes per T·B·H (docs/notation.md's letters), with
a column of our terms in fp32 where asked.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from ckpt_lab.plan.formulas import ATTENTION_CORE_TERMS

# Our GPT block's terms (formulas.gpt_block_terms) -> Megatron's (formulas.megatron_layer_terms).
MEGATRON_TERM = {
    "ln1 input (residual)": "layernorm 1 input",
    "ln1 mean, rstd": None,
    "qkv input (ln1 output)": "QKV projection input",
    "q copy (for q @ k^T)": "Q and K (for QK^T)",
    "k^T copy (for q @ k^T)": "Q and K (for QK^T)",
    "causal mask (~mask, bool)": None,
    "softmax output": "softmax output",
    "attention dropout mask": "attention dropout mask",
    "attention dropout output (for @ v)": "attention dropout output (for x V)",
    "v copy (for @ v)": "V (for x V)",
    "proj input (contiguous core output)": "output projection input",
    "proj dropout mask": "attention output dropout mask",
    "ln2 input (residual)": "layernorm 2 input",
    "ln2 mean, rstd": None,
    "fc input (ln2 output)": "MLP up-projection input",
    "GELU input (4H)": "GeLU input (4H)",
    "mlp proj input (GELU output, 4H)": "MLP down-projection input (4H)",
    "mlp dropout mask": "MLP dropout mask",
}
# The terms selective recomputation drops: everything the attention core makes and saves.
CORE_TERMS = ("causal mask (~mask, bool)", "softmax output", "attention dropout mask",
              "attention dropout output (for @ v)")
# Megatron's groups: attention 11 TBH + 5 n_h T^2 B, MLP 19 TBH, the two layer norms 4 TBH.
_GROUP = {"layernorm 1 input": "layer norms", "layernorm 2 input": "layer norms",
          "MLP up-projection input": "MLP", "GeLU input (4H)": "MLP",
          "MLP down-projection input (4H)": "MLP", "MLP dropout mask": "MLP"}


def distinct(saved: Iterable[torch.Tensor], exclude: Iterable[torch.Tensor] = ()) -> list:
    """The saved tensors, one per storage, in the order first saved; `exclude`'s storages
    (the parameters) left out."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen, out = set(), []
    for t in saved:
        key = t.untyped_storage().data_ptr()
        if key not in skip and key not in seen:
            seen.add(key)
            out.append(t)
    return out


def by_term(saved: Iterable[torch.Tensor], terms: dict[str, int],
            exclude: Iterable[torch.Tensor] = ()) -> dict[str, int]:
    """Measured bytes of each of `terms` (name -> predicted bytes, in forward order), from the
    distinct saved storages in the order they were saved.

    A term takes one of the next few storages that has exactly its size (an op may save its
    second argument first: `@ v` saves the copy of v before the probabilities), else the run
    of storages from the front that adds up to it (a layer norm's mean and 1/std)."""
    storages = [t.untyped_storage().nbytes() for t in distinct(saved, exclude)]
    measured = {}
    for name, predicted in terms.items():
        ahead = [j for j, b in enumerate(storages[:3]) if b == predicted]
        if predicted and ahead:
            got = storages.pop(ahead[0])
        else:
            got = 0
            while predicted and got < predicted and storages:
                got += storages.pop(0)
        if got != predicted:
            raise ValueError(f"the saved storages do not line up with term {name!r}: "
                             f"{got:,} bytes measured where the formula has {predicted:,}. "
                             "PyTorch saves something else here now: compare "
                             "distinct(saved) with formulas.gpt_block_terms term by term.")
        measured[name] = got
    if storages:
        raise ValueError(f"{len(storages)} saved storages ({sum(storages):,} bytes) are in no "
                         "term of the formula")
    return measured


def group_of(term: str) -> str:
    """Megatron's group of one of the paper's terms: 'attention', 'MLP' or 'layer norms'."""
    return _GROUP.get(term, "attention")


def mapping_table(ours: dict[str, int], paper: dict[str, int], tbh: int, per_head: float,
                  fp32: dict[str, int] | None = None) -> str:
    """A Markdown table: each of our terms in bytes per T·B·H next to Megatron's term and group.

    `ours` and `paper` must be at the same dtypes (2-byte activations, 1-byte masks); terms
    that grow with T^2 are shown as multiples of n_h T / H (`per_head`). `fp32`, the same
    terms at other dtypes (fp32 with 4-byte masks, as on a CPU), adds a column beside ours."""
    def size(name, b):
        if name in CORE_TERMS[1:]:
            return f"{b / (tbh * per_head):g} · n_h T/H"
        return f"{b / tbh:.3g}"

    extra = fp32 is not None
    rows = ["| our tensor | bytes / TBH |" + (" fp32, CPU |" if extra else "")
            + " Megatron's term | its group |",
            "|---|---|" + ("---|" if extra else "") + "---|---|"]
    for name, b in ours.items():
        theirs = MEGATRON_TERM[name]
        group = "" if theirs is None else group_of(theirs)
        wide = f" {size(name, fp32[name])} |" if extra else ""
        rows.append(f"| {name} | {size(name, b)} |{wide} {theirs or '(not in the paper)'} | "
                    f"{group} |")
    linear = sum(v for k, v in paper.items() if k not in ATTENTION_CORE_TERMS) / tbh
    quad = sum(v for k, v in paper.items() if k in ATTENTION_CORE_TERMS) / (tbh * per_head)
    rows.append(f"| **Megatron, in all** | **{linear:g} + {quad:g} · n_h T/H** |"
                + (" |" if extra else "") + " | |")
    return "\n".join(rows)


_VIEWS = ("TBackward0", "ViewBackward0", "TransposeBackward0", "PermuteBackward0",
          "ExpandBackward0", "UnsafeViewBackward0")


def _kind(t: torch.Tensor) -> str:
    """'bf16 copy of a weight' when autocast cast t from a parameter, else 'activation, <dtype>'."""
    fn = t.grad_fn
    while fn is not None and type(fn).__name__ in _VIEWS:
        fn = fn.next_functions[0][0]
    if fn is not None and type(fn).__name__ == "ToCopyBackward0" \
            and type(fn.next_functions[0][0]).__name__ == "AccumulateGrad":
        return f"{str(t.dtype).replace('torch.', '')} copy of a weight"
    return f"activation, {str(t.dtype).replace('torch.', '')}"


def by_kind(saved: Iterable[torch.Tensor], exclude: Iterable[torch.Tensor] = ()) -> dict:
    """Bytes of the distinct saved storages by kind: activations by dtype, and the low-precision
    copies of weights that autocast makes for its matmuls (and autograd keeps)."""
    out: dict[str, int] = {}
    for t in distinct(saved, exclude):
        kind = _kind(t)
        out[kind] = out.get(kind, 0) + t.untyped_storage().nbytes()
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
