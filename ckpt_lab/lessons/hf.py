"""Hugging Face `transformers` models, checkpointed by their own switch and by ckpt_lab's.

Everything is built from a config with random weights (nothing is downloaded;
``HF_HUB_OFFLINE=1`` is set before `transformers` is imported). Lesson 11 uses these helpers
to measure what the switches people flip every day do:

* ``model.activation_checkpointing_enable`` (``gradient_checkpointing_enable`` before
  transformers 5): ``torch.utils.checkpoint`` around every decoder layer, optionally every
  n-th layer only; `enable_checkpointing` calls whichever the installed version has.
* ``use_cache``: a layer that writes a key/value cache keeps every layer's keys and values
  alive, which checkpointing would have freed, and its recompute writes the cache again.
  `measure_cache` shows both with ``torch.utils.checkpoint`` applied by hand (HF's own switch
  and `checkpoint_modules` refuse the combination).
* The reentrant trap: ``use_reentrant=True`` differentiates only through checkpoint inputs
  that require grad. With frozen embeddings (LoRA, adapters) no block input does, and every
  adapter inside a checkpointed block silently gets no gradient unless
  ``enable_input_require_grads`` makes the embedding output require grad. `add_lora` builds
  that situation in a few lines.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import os
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from torch import nn

from ckpt_lab.memory import track_memory

KINDS = ("llama", "gpt2")


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - the course pins it
        raise ImportError("lesson 11 needs Hugging Face transformers: pip install "
                          "'transformers>=5'") from e
    return transformers


def tiny_model(kind: str = "llama", layers: int = 4, hidden: int = 64, heads: int = 4,
               kv_heads: int = 2, seq: int = 64, vocab: int = 256, dropout: float | None = None,
               seed: int = 0, device=None) -> nn.Module:
    """A small causal LM from a config with random weights, in training mode, on ``device``.

    ``"llama"``: RMSNorm, rotary positions, grouped-query attention (``kv_heads``), SwiGLU MLP.
    ``"gpt2"``: LayerNorm, learned positions, GELU MLP, dropout 0.1 by default.
    """
    tf = _transformers()
    if kind == "llama":
        config = tf.LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                num_attention_heads=heads, num_key_value_heads=kv_heads,
                                intermediate_size=int(8 * hidden / 3), max_position_embeddings=seq,
                                attention_dropout=dropout or 0.0, bos_token_id=0,
                                eos_token_id=0, pad_token_id=0)
        cls = tf.LlamaForCausalLM
    elif kind == "gpt2":
        p = 0.1 if dropout is None else dropout
        config = tf.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
                               n_positions=seq, resid_pdrop=p, embd_pdrop=p, attn_pdrop=p,
                               bos_token_id=0, eos_token_id=0)
        cls = tf.GPT2LMHeadModel
    else:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return model.to(device).train()


def blocks(model: nn.Module) -> nn.ModuleList:
    """The repeated decoder layers: the longest ModuleList whose entries share one class."""
    best = None
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m) and len({type(c) for c in m}) == 1:
            if best is None or len(m) > len(best):
                best = m
    if best is None:
        raise ValueError(f"{type(model).__name__} has no ModuleList of repeated layers")
    return best


def block_class(model: nn.Module) -> type:
    """The class of the repeated decoder layer (what `checkpoint_modules` should match)."""
    return type(blocks(model)[0])


def enable_checkpointing(model, use_reentrant: bool = False, every_n_layers: int = 1) -> str:
    """Turn on the model's own checkpointing; returns the name of the method that did it."""
    name = ("activation_checkpointing_enable" if hasattr(model, "activation_checkpointing_enable")
            else "gradient_checkpointing_enable")
    method = getattr(model, name)
    kwargs = {"use_reentrant": use_reentrant}
    if every_n_layers != 1:
        if "every_n_layers" not in inspect.signature(method).parameters:
            # older transformers: turn every layer on, then switch the others off by hand
            enable_checkpointing(model, use_reentrant)
            for i, layer in enumerate(blocks(model)):
                if not hasattr(layer, "gradient_checkpointing"):
                    raise ValueError(f"{type(layer).__name__} has no gradient_checkpointing "
                                     "flag; use checkpoint_modules with a predicate")
                layer.gradient_checkpointing = i % every_n_layers == 0
            return name
        if name == "activation_checkpointing_enable":
            method(activation_checkpointing_kwargs=kwargs, every_n_layers=every_n_layers)
        else:
            method(gradient_checkpointing_kwargs=kwargs, every_n_layers=every_n_layers)
    elif name == "activation_checkpointing_enable":
        method(activation_checkpointing_kwargs=kwargs)
    else:
        method(gradient_checkpointing_kwargs=kwargs)
    return name


def disable_checkpointing(model) -> None:
    """Turn the model's own checkpointing off (whichever method name the version has)."""
    (getattr(model, "activation_checkpointing_disable", None)
     or model.gradient_checkpointing_disable)()


def token_batch(batch: int, seq: int, vocab: int, seed: int = 0, device=None) -> torch.Tensor:
    """Random token ids (B, T), reproducible."""
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))
    return ids.to(device)


@dataclass
class StepResult:
    """One training step: the loss, every parameter's gradient, bytes alive after the forward
    (what backward needs) and the peak of the whole step."""

    loss: torch.Tensor
    grads: list
    kept_bytes: int
    peak_bytes: int


def train_step(model, ids, use_cache: bool = False, seed: int = 0) -> StepResult:
    """Forward with labels and backward under `track_memory`, with a fixed dropout seed."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with track_memory() as mem:
        out = model(input_ids=ids, labels=ids, use_cache=use_cache)
        kept = mem.current_bytes
        loss = out.loss
        del out
        loss.backward()
    return StepResult(loss.detach(), [p.grad for p in model.parameters()], kept, mem.peak_bytes)


def same_grads(a: StepResult, b: StepResult, exact: bool = True) -> bool:
    """Equal losses and gradients (None where the other is None too): bitwise, or with
    ``exact=False`` to float tolerance (CUDA's fused attention backward accumulates with
    atomics, so two runs may differ in the last bits)."""
    eq = torch.equal if exact else (lambda u, v: torch.allclose(u, v, rtol=1e-4, atol=1e-6))
    if not eq(a.loss, b.loss) or len(a.grads) != len(b.grads):
        return False
    return all((x is None and y is None) or (x is not None and y is not None and eq(x, y))
               for x, y in zip(a.grads, b.grads))


def block_input_bytes(model, batch: int, seq: int) -> int:
    """Bytes of one decoder layer's input (B, T, hidden): what a checkpointed layer keeps."""
    return batch * seq * model.config.hidden_size * model.dtype.itemsize


# ------------------------------------------------------------------------------- the cache
def kv_cache_bytes(config, batch: int, seq: int, dtype_bytes: int = 4) -> int:
    """Keys and values of every layer: 2 x layers x B x T x kv_heads x head_dim x bytes."""
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * layers * batch * seq * heads * head_dim * dtype_bytes


@contextlib.contextmanager
def torch_checkpointed_blocks(model):
    """``torch.utils.checkpoint`` (non-reentrant) around every decoder layer, applied by hand
    the way older code did it: no guard against a key/value cache."""
    layers = list(blocks(model))
    for layer in layers:
        layer.forward = (lambda f: lambda *a, **k: torch.utils.checkpoint.checkpoint(
            f, *a, use_reentrant=False, **k))(layer.forward)
    try:
        yield layers
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)


@dataclass
class CacheMeasurement:
    """Bytes alive after the forward with use_cache off and on, plain and checkpointed, and
    the tokens the cache holds after the forward and after backward (the recompute writes)."""

    plain_off: int
    plain_on: int
    checkpointed_off: int
    checkpointed_on: int
    tokens_after_forward: int
    tokens_after_backward: int


def _kept(model, ids, use_cache):
    with track_memory() as mem:
        out = model(input_ids=ids, labels=ids, use_cache=use_cache)
        kept = mem.current_bytes
    return kept, out


def measure_cache(model, ids) -> CacheMeasurement:
    """What ``use_cache=True`` costs during training, without and with checkpointing."""
    plain_off, _ = _kept(model, ids, False)
    plain_on, _ = _kept(model, ids, True)
    with torch_checkpointed_blocks(model):
        ckpt_off, _ = _kept(model, ids, False)
        ckpt_on, out = _kept(model, ids, True)
        cache = out.past_key_values
        before = cache.get_seq_length()
        out.loss.backward()
        after = cache.get_seq_length()
    model.zero_grad(set_to_none=True)
    return CacheMeasurement(plain_off, plain_on, ckpt_off, ckpt_on, before, after)


# ------------------------------------------------------------------------ LoRA and the trap
class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update: W x + (alpha / r) B A x."""

    def __init__(self, base: nn.Linear, rank: int = 4, alpha: float = 8.0):
        super().__init__()
        self.base = base.requires_grad_(False)
        w = base.weight
        self.A = nn.Parameter(torch.randn(rank, base.in_features, device=w.device,
                                          dtype=w.dtype) / math.sqrt(base.in_features))
        self.B = nn.Parameter(torch.randn(base.out_features, rank, device=w.device,
                                          dtype=w.dtype) * 0.01)
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.A.t() @ self.B.t()) * self.scale


def add_lora(model, targets=("q_proj", "v_proj"), rank: int = 4, seed: int = 0) -> list[str]:
    """Freeze every weight and wrap the named linear layers with LoRA adapters; returns the
    names of the trainable parameters."""
    model.requires_grad_(False)
    wrapped = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, module in list(model.named_modules()):
            for child_name, child in list(module.named_children()):
                if child_name in targets and isinstance(child, nn.Linear):
                    setattr(module, child_name, LoRALinear(child, rank))
                    wrapped.append(f"{name}.{child_name}")
    if not wrapped:
        raise ValueError(f"no nn.Linear named one of {targets} in {type(model).__name__}")
    return [n for n, p in model.named_parameters() if p.requires_grad]


def trainable_with_grad(model) -> int:
    """How many trainable parameters got a gradient in the last backward."""
    return sum(1 for p in model.parameters() if p.requires_grad and p.grad is not None)


@dataclass
class TrapResult:
    """One way of checkpointing a LoRA model: adapters that got a gradient, whether every
    gradient equals the plain run's, the step's peak, or the error it raised."""

    setting: str
    adapters_with_grad: int
    adapters: int
    same_as_plain: bool
    peak_bytes: int | None
    error: str | None = None


def reentrant_trap(model, ids) -> list[TrapResult]:
    """Train a model whose only trainable weights are adapters inside the decoder layers
    (frozen embeddings: no block input requires grad) under the usual switches."""
    from ckpt_lab.modules import checkpoint_modules
    adapters = sum(1 for p in model.parameters() if p.requires_grad)
    out: list[TrapResult] = []
    plain = train_step(model, ids)

    def run(setting, setup, teardown):
        setup()
        try:
            r = train_step(model, ids)
            out.append(TrapResult(setting, trainable_with_grad(model), adapters,
                                  same_grads(plain, r, exact=not ids.is_cuda), r.peak_bytes))
        except (RuntimeError, ValueError) as e:
            out.append(TrapResult(setting, 0, adapters, False, None,
                                  str(e).split("\n")[0]))
        finally:
            teardown()
            model.zero_grad(set_to_none=True)

    def own(reentrant, every=1, input_grads=False):
        def setup():
            enable_checkpointing(model, use_reentrant=reentrant, every_n_layers=every)
            # transformers 5 turns input grads on by itself; undo it to show why it does
            if not input_grads:
                model.disable_input_require_grads()
        return setup

    def off():
        disable_checkpointing(model)
        model.disable_input_require_grads()

    out.append(TrapResult("no checkpointing", trainable_with_grad(model), adapters, True,
                          plain.peak_bytes))
    run("reentrant, every layer", own(True), off)
    run("reentrant, every 2nd layer", own(True, 2), off)
    run("reentrant + enable_input_require_grads", own(True, input_grads=True), off)
    run("non-reentrant (use_reentrant=False)", own(False), off)
    handle = []
    run("checkpoint_modules, impl='reentrant'",
        lambda: handle.append(checkpoint_modules(model, block_class(model), impl="reentrant")),
        lambda: [h.remove() for h in handle])
    handle.clear()
    run("checkpoint_modules, impl='hooks'",
        lambda: handle.append(checkpoint_modules(model, block_class(model))),
        lambda: [h.remove() for h in handle])
    return out
