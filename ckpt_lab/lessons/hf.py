"""Small Hugging Face `transformers` models and the situations lesson 11 measures on them.

Everything is built from a config with random weights (nothing is downloaded;
``HF_HUB_OFFLINE=1`` is set before `transformers` is imported). The switches a learner flips
(``model.activation_checkpointing_enable(...)``, ``use_cache=False``,
``enable_input_require_grads``) are called in the lesson's own cells; this module only builds
the models and the situations and measures a training step:

* `tiny_model`: a Llama-style or GPT-2-style causal LM from a config; `block_class` finds its
  repeated decoder layer (what `ckpt_lab.checkpoint_modules` matches).
* `train_step`: one forward and backward under `track_memory`, with a fixed dropout seed:
  the loss, every gradient, bytes alive after the forward and the step's peak, with the
  gradients made in the backward (PyTorch's default, ``zero_grad(set_to_none=True)``: the
  step peak (activations + gradients)) or allocated before the step as model state
  (``grads_allocated=True``: the step peak (activations)).
* `measure_cache`: what ``use_cache=True`` costs in training, with ``torch.utils.checkpoint``
  applied by hand the way older training code did (the model's own switch and
  `checkpoint_modules` both refuse the combination, so it cannot be shown through them).
* `add_lora`: freeze every weight and add low-rank adapters, the situation in which a
  reentrant checkpoint loses gradients; `lora_llama` builds that model with ``peft``'s LoRA
  where ``peft`` is installed (the lesson types ``get_peft_model`` in its own cell), with
  `add_lora`'s hand-written adapters where it is not.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import warnings
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from torch import nn

from ckpt_lab.measure.memory import track_memory

KINDS = ("llama", "gpt2")

# peft imports bitsandbytes, whose CPU backend logs a warning about an optional kernel package
# that lesson 11 never uses; lesson 8's finetune module silences the same logger.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


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


def layer_names(model: nn.Module, every: int = 1) -> list[str]:
    """Qualified names of every `every`-th decoder layer (0, k, 2k, ...), as
    ``named_modules`` gives them: what `ckpt_lab.plan.module_planner.profile_modules` prices."""
    layers = blocks(model)
    prefix = next(name for name, m in model.named_modules() if m is layers)
    return [f"{prefix}.{i}" for i in range(0, len(layers), every)]


def block_class(model: nn.Module) -> type:
    """The class of the repeated decoder layer (what `checkpoint_modules` should match)."""
    return type(blocks(model)[0])


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


def train_step(model, ids, use_cache: bool = False, seed: int = 0,
               grads_allocated: bool = False) -> StepResult:
    """Forward with labels and backward under `track_memory`, with a fixed dropout seed.

    The gradients are made in the backward (``zero_grad(set_to_none=True)``, PyTorch's
    default), so the peak is the step peak (activations + gradients); with
    ``grads_allocated=True`` every trainable parameter's gradient is allocated (zeros) before
    the step, as model state, and the peak is the step peak (activations)."""
    model.zero_grad(set_to_none=True)
    if grads_allocated:
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
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


# ------------------------------------------------------------------------------------- LoRA
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


def has_peft() -> bool:
    """Whether Hugging Face ``peft`` can be imported here."""
    try:
        import peft  # noqa: F401
    except ImportError:
        return False
    return True


def lora_llama(layers: int = 6, rank: int = 4, seed: int = 0, device=None,
               use_peft: bool | None = None) -> nn.Module:
    """A tiny Llama with LoRA adapters (A and B) on q_proj and v_proj, everything else frozen:
    ``peft``'s when it is installed (or ``use_peft=True``), else `add_lora`'s. Both adapters start
    random (``init_lora_weights=False``: peft would start B at zero, which gives A a gradient
    of zero), as after some training steps."""
    model = tiny_model("llama", layers=layers, device=device)
    if use_peft if use_peft is not None else has_peft():
        from peft import LoraConfig, get_peft_model
        config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"],
                            init_lora_weights=False)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return get_peft_model(model, config)
    add_lora(model, rank=rank, seed=seed)
    return model


def trainable_with_grad(model) -> int:
    """How many trainable parameters got a gradient in the last backward."""
    return sum(1 for p in model.parameters() if p.requires_grad and p.grad is not None)


NO_INPUT_GRAD = "None of the inputs have requires_grad=True"   # PyTorch's reentrant warning


def checked_step(model, ids, reference: StepResult, exact: bool = True) -> dict:
    """One `train_step` against a reference step: trainable tensors that got a gradient,
    whether the loss and gradients equal the reference's, the step peak, the first line of
    a RuntimeError that stopped the step (else ""), and whether PyTorch warned that no input
    of a checkpoint requires grad."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run = train_step(model, ids)
            out = dict(grads=trainable_with_grad(model), same=same_grads(reference, run, exact),
                       peak=run.peak_bytes, error="")
        except RuntimeError as err:
            out = dict(grads=0, same=False, peak=None, error=str(err).splitlines()[0])
    out["warned"] = any(NO_INPUT_GRAD in str(w.message) for w in caught)
    return out
