"""The loss at large vocabularies, on the course's GPT: what the logits cost a step, and what
`ckpt_lab.chunked_cross_entropy` saves.

At a 256-byte vocabulary the logits are a small part of a step; at 32K or 128K words they and
their gradient outweigh the rest of a small model's activations, and the step's peak sits in
the loss's backward (``log_softmax``'s backward holds three N x V tensors). `vocab_sweep`
measures one forward + backward of the GPT per vocabulary size, with the plain loss and with
the loss computed in checkpointed chunks, and reads where the peak sits.

`gpt_hidden` gives the rows entering the GPT's output projection (after the head's
LayerNorm), under the model's checkpoint policy: what `chunked_cross_entropy` takes in place
of the logits, with ``model.layers()[-1].out.weight``.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from ckpt_lab import formulas
from ckpt_lab.training.data import TextBatches, load_corpus
from ckpt_lab.training.losses import chunked_cross_entropy
from ckpt_lab.training.models import build_model, get_config
from ckpt_lab.measure.timing import measure_step


@contextlib.contextmanager
def _projection_skipped(model):
    """Run the GPT up to its head's LayerNorm: the output projection is an identity inside."""
    head = model.layers()[-1]
    out = head.out
    head.out = nn.Identity()
    try:
        yield out
    finally:
        head.out = out


def gpt_hidden(model, x):
    """The (B, T, C) rows entering the GPT's output projection, under its checkpoint policy."""
    with _projection_skipped(model):
        return model.run_layers(x)


def gpt_loss(model, x, y, chunks: int | None = None):
    """The GPT's loss: the model's own (chunks=None) or `chunked_cross_entropy` in ``chunks``."""
    if chunks is None:
        return model(x, y)
    weight = model.layers()[-1].out.weight
    return chunked_cross_entropy(gpt_hidden(model, x), weight, y, chunks)


def step_measurement(model, x, y, chunks: int | None = None, repeats: int = 3):
    """`measure_step` of one forward + backward of the GPT's loss (parameter gradients
    allocated beforehand: model state, not part of the peak)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)

    def step():
        gpt_loss(model, x, y, chunks).backward()
    return measure_step(step, repeats=repeats, device=x.device)


def _peak_point(log):
    return max(log.timeline, key=lambda p: p.live_bytes)


def vocab_sweep(vocab_sizes=(256, 32768, 131072), batch: int = 4, chunks=(2, 8),
                preset: str = "gpt-cpu", repeats: int = 3, device=None, **overrides) -> list[dict]:
    """Per vocabulary size: the step's peak with the plain loss and with each chunk count,
    where each peak sits, the logits' share of the plain peak, and the step's time.

    * ``logits_share``: what the loss holds at its own peak (3 N V: ``log_softmax``'s output,
      its incoming gradient and the one it writes; `formulas.cross_entropy_moments`, exact
      against track_memory) over the measured step peak, when the step peaks there;
    * ``rest_bytes``: the plain peak less those 3 N V: the model's other activations, all
      alive while the loss runs backward (backward has not reached the blocks yet);
    * per chunk count: the measured peak, ``predicted_bytes`` = rest + the chunked loss's own
      peak (`formulas.chunked_cross_entropy_peak_bytes`, tracked=True as measured here), the
      fraction of the plain peak saved, and the time ratio (untracked medians).
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    rows = []
    for vocab in vocab_sizes:
        cfg = get_config(preset, vocab_size=vocab, **overrides)
        x, y = TextBatches(load_corpus(), batch, cfg.block_size, seed=0).get(0)
        x, y = x.to(device), y.to(device)
        model = build_model(cfg, "none").to(device).train()
        n = batch * cfg.block_size
        plain = step_measurement(model, x, y, None, repeats)
        at = _peak_point(plain.log)
        loss_bytes = formulas.cross_entropy_peak_bytes(n, vocab, cfg.n_embd)
        in_loss = at.op.startswith("_log_softmax_backward")
        row = {
            "vocab": vocab, "rows": n, "n_embd": cfg.n_embd, "n_layer": cfg.n_layer,
            "logits_bytes": n * vocab * 4,
            "plain": {"peak_bytes": plain.peak_bytes, "seconds": plain.seconds,
                      "peak_op": at.op, "peak_phase": at.phase},
            "loss_peak_bytes": loss_bytes,
            "logits_share": loss_bytes / plain.peak_bytes if in_loss else None,
            "rest_bytes": plain.peak_bytes - loss_bytes if in_loss else None,
            "chunked": {},
        }
        for k in chunks:
            m = step_measurement(model, x, y, k, repeats)
            at = _peak_point(m.log)
            loss = formulas.chunked_cross_entropy_peak_bytes(n, vocab, cfg.n_embd, k,
                                                              tracked=True)
            row["chunked"][k] = {
                "peak_bytes": m.peak_bytes, "seconds": m.seconds,
                "peak_op": at.op, "peak_phase": at.phase,
                "loss_formula_bytes": loss,
                "predicted_bytes": row["rest_bytes"] + loss if in_loss else None,
                "saved": 1 - m.peak_bytes / plain.peak_bytes,
                "time_ratio": m.seconds / plain.seconds,
            }
        rows.append(row)
        del model
    return rows
