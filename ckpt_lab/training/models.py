"""Three small models to checkpoint and measure, each a chain of layers a policy can cut.

* `MLPChain`: byte embedding, L identical blocks ``Linear(H, H) -> ReLU [-> Dropout]``, a
  linear head. The simplest case: every byte a block saves can be counted by hand.
* `GPT`: a decoder-only transformer in the minGPT spirit (token and position embeddings, L
  pre-norm blocks, LM head). Inside a block the attention projections, the attention core
  (scores, mask, softmax, dropout, weighted sum) and the MLP are separate submodules, so a
  policy can recompute the attention core alone ("selective", as in Megatron-LM) or whole
  blocks. The core is written out, so the ``n_head * T * T * B`` score tensors are real;
  ``attn_impl="sdpa"`` swaps in ``F.scaled_dot_product_attention`` to show what a fused kernel
  changes.
* `ResNet`: a stem, a chain of residual blocks with ``Conv2d`` and ``BatchNorm2d``, a pooled
  linear head. Recomputing a BatchNorm in training mode would update its running statistics a
  second time; `RecomputeSafeBatchNorm2d` skips the update while a backward pass is running,
  which is exactly when any checkpoint (ours or ``torch.utils.checkpoint``) recomputes.

Every model exposes ``model.layers()``, a list of modules whose composition is the forward up
to the loss, and takes a `CheckpointScheme` (or anything `CheckpointScheme.parse` accepts):
which of its blocks ckpt_lab checkpoints, and how. (Its old name `CheckpointPolicy` still works;
it is not PyTorch's ``torch.utils.checkpoint.CheckpointPolicy``, a per-operation save-or-recompute
decision.)
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from ..checkpoint import IMPLS, checkpoint, run_in_order, segment_starts
from ..measure.memory import current_phase

POLICY_IMPLS = IMPLS + ("torch",)
POLICY_NAMES = ("none", "every", "every:<k>", "selective",
                "[segment starts, e.g. 0, 4, 8]", "a plan with .boundaries")


# ------------------------------------------------------------------------------ the policy
@dataclass(frozen=True)
class CheckpointScheme:
    """Which blocks of a model to recompute in backward, and with which checkpoint implementation.

    kind:
      * ``"none"``: keep every activation.
      * ``"every"``: checkpoint the blocks in groups of ``group`` consecutive blocks (group=1:
        each block alone, Megatron's "full" recomputation). Only each group's input is kept;
        embedding and head run normally. ``"every:2"`` keeps the input of every 2nd block.
      * ``"selective"``: inside every block checkpoint only the attention core (scores, mask,
        softmax, dropout, weighted sum); GPT only.
      * ``"boundaries"``: segment starts over ``model.layers()`` (beginning with 0), applied
        like `checkpoint_sequential`: every segment but the last is checkpointed. This is the
        form a planner's plan takes.
    impl: ``"hooks"`` or ``"reentrant"`` (ckpt_lab's own) or ``"torch"``
      (``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``). A reentrant checkpoint
      needs an input that requires grad; token ids and images do not, so a checkpointed
      segment that starts at the model's input runs its first layer outside the checkpoint.
    """

    kind: str = "none"
    group: int = 1
    boundaries: tuple[int, ...] = ()
    impl: str = "hooks"

    def __post_init__(self):
        if self.kind not in ("none", "every", "selective", "boundaries"):
            raise ValueError(f"unknown policy kind {self.kind!r}; valid: none, every, "
                             "selective, boundaries")
        if self.impl not in POLICY_IMPLS:
            raise ValueError(f"impl must be one of {POLICY_IMPLS}, got {self.impl!r}")
        if isinstance(self.group, bool) or not isinstance(self.group, int) or self.group < 1:
            raise ValueError(f"group must be a positive int (blocks per checkpoint), "
                             f"got {self.group!r}")
        if self.kind == "boundaries" and not self.boundaries:
            raise ValueError("a 'boundaries' policy needs segment starts such as (0, 4, 8)")

    @classmethod
    def parse(cls, spec=None, impl: str | None = None) -> "CheckpointScheme":
        """A policy from None, a name ("none", "every", "every:2", "selective"), starts, or a plan.

        ``impl`` overrides the implementation; by default a given policy keeps its own and
        anything else gets ``"hooks"``.
        """
        if isinstance(spec, CheckpointScheme):
            return spec if impl is None else replace(spec, impl=impl)
        impl = "hooks" if impl is None else impl
        if spec is None:
            return cls("none", impl=impl)
        if isinstance(spec, str):
            name = spec.strip().lower()
            if name in ("none", "every", "selective"):
                return cls(name, impl=impl)
            if name.startswith("every:"):
                k = name.split(":", 1)[1]
                if not k.isdigit() or int(k) < 1:
                    raise ValueError(f"in {spec!r} the group size must be a positive integer, "
                                     "e.g. 'every:2'")
                return cls("every", group=int(k), impl=impl)
            raise ValueError(f"unknown checkpoint policy {spec!r}; valid: "
                             + ", ".join(POLICY_NAMES))
        starts = getattr(spec, "boundaries", spec)
        if isinstance(starts, (list, tuple)) and starts and all(
                isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in starts):
            return cls("boundaries", boundaries=tuple(int(b) for b in starts), impl=impl)
        raise ValueError(f"cannot read a checkpoint policy from {spec!r}; valid: "
                         + ", ".join(POLICY_NAMES))

    def __str__(self) -> str:
        if self.kind == "every" and self.group > 1:
            name = f"every:{self.group}"
        elif self.kind == "boundaries":
            name = str(list(self.boundaries))
        else:
            name = self.kind
        return f"{name} ({self.impl})"


# the old name (not torch.utils.checkpoint.CheckpointPolicy, a per-op decision)
CheckpointPolicy = CheckpointScheme


# ------------------------------------------------------------------- applying it to a chain
def _checkpointed(fn, *args, impl: str):
    """Call fn(*args) under the chosen checkpoint implementation."""
    if impl == "torch":
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False,
                                                 preserve_rng_state=True)
    return checkpoint(fn, *args, impl=impl)


class CheckpointedChain(nn.Module):
    """Base class: a model that is a chain of layers, run under a checkpoint policy.

    Subclasses build ``self.chain`` (an `nn.ModuleList` whose composition is the forward up
    to the loss) and set ``self.first_block`` / ``self.num_blocks`` (where the repeated
    blocks sit in the chain), then implement `loss`.
    """

    first_block: int = 1
    num_blocks: int = 0

    def layers(self) -> list[nn.Module]:
        """The modules whose composition is the forward up to the loss."""
        return list(self.chain)

    def blocks(self) -> list[nn.Module]:
        """The L repeated blocks (a slice of `layers`)."""
        return self.layers()[self.first_block:self.first_block + self.num_blocks]

    def set_policy(self, policy=None, impl: str | None = None) -> CheckpointScheme:
        """Parse, validate against this model and install a checkpoint policy; returns it."""
        policy = CheckpointScheme.parse(policy, impl)
        n = len(self.chain)
        if policy.kind == "every" and policy.group > self.num_blocks:
            raise ValueError(f"every:{policy.group} asks for groups of {policy.group} blocks "
                             f"but the model has {self.num_blocks}")
        if policy.kind == "boundaries":
            segment_starts(n, boundaries=policy.boundaries)
        if policy.kind == "selective" and not hasattr(self.blocks()[0], "attn"):
            raise ValueError(f"'selective' recomputes the attention core, which "
                             f"{type(self).__name__} does not have; use 'every' or 'every:k'")
        for block in self.blocks():
            if hasattr(block, "attn"):
                block.attn.core_impl = policy.impl if policy.kind == "selective" else None
        self.policy = policy
        return policy

    def segments(self) -> list[tuple[int, int, bool]]:
        """(start, end, checkpointed) spans of `layers` that the current policy runs."""
        n, p = len(self.chain), self.policy
        if p.kind in ("none", "selective"):
            return [(0, n, False)]
        if p.kind == "boundaries":
            starts = segment_starts(n, boundaries=p.boundaries)
            ends = starts[1:] + [n]
            return [(a, b, i < len(starts) - 1) for i, (a, b) in enumerate(zip(starts, ends))]
        a, b = self.first_block, self.first_block + self.num_blocks
        spans = [(0, a, False)] + [(s, min(s + p.group, b), True)
                                   for s in range(a, b, p.group)] + [(b, n, False)]
        return [s for s in spans if s[0] < s[1]]

    def run_layers(self, x):
        """Run `layers` on x under the current policy (the forward up to the loss)."""
        layers = self.layers()
        for a, b, ckpt in self.segments():
            if ckpt and self.policy.impl == "reentrant" and not _needs_grad(x):
                # A reentrant checkpoint needs an input that requires grad, or nothing inside
                # gets a gradient. Token ids never do, so the first layer runs outside.
                x, a = layers[a](x), a + 1
            if ckpt and a < b and torch.is_grad_enabled():
                x = _checkpointed(run_in_order(layers[a:b]), x, impl=self.policy.impl)
            else:
                x = run_in_order(layers[a:b])(x)
        return x

    def forward(self, x, targets=None):
        """Logits (no targets) or the scalar loss (with targets)."""
        out = self.run_layers(x)
        return out if targets is None else self.loss(out, targets)

    def loss(self, out, targets):
        """Cross-entropy of the chain's output against targets."""
        return F.cross_entropy(out.reshape(-1, out.size(-1)), targets.reshape(-1))


def _needs_grad(x) -> bool:
    return isinstance(x, torch.Tensor) and x.requires_grad


# ------------------------------------------------------------------------------ MLP chain
@dataclass
class MLPConfig:
    """An MLP chain on bytes: each position's byte -> H -> L blocks -> next-byte logits."""

    vocab_size: int = 256
    block_size: int = 64       # positions per row (tokens per row = batch_size * block_size)
    width: int = 256
    depth: int = 8
    dropout: float = 0.0


class MLPBlock(nn.Module):
    """Linear(H, H) -> ReLU [-> Dropout]."""

    def __init__(self, width: int, dropout: float = 0.0):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x):
        return self.drop(self.act(self.fc(x)))


class MLPChain(CheckpointedChain):
    """Embedding(V, H), L x MLPBlock(H), Linear(H, V): a next-byte model from the current byte."""

    def __init__(self, config: MLPConfig, policy=None, impl: str | None = None):
        super().__init__()
        self.config = config
        self.chain = nn.ModuleList(
            [nn.Embedding(config.vocab_size, config.width)]
            + [MLPBlock(config.width, config.dropout) for _ in range(config.depth)]
            + [nn.Linear(config.width, config.vocab_size)])
        self.first_block, self.num_blocks = 1, config.depth
        self.set_policy(policy, impl)


# ------------------------------------------------------------------------------------ GPT
@dataclass
class GPTConfig:
    """Sizes of a minGPT-style decoder. attn_impl: "manual" (scores are real) or "sdpa"."""

    vocab_size: int = 256
    block_size: int = 128      # context length T
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.1
    attn_impl: str = "manual"

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head "
                             f"({self.n_head})")
        if self.attn_impl not in ("manual", "sdpa"):
            raise ValueError(f"attn_impl must be 'manual' or 'sdpa', got {self.attn_impl!r}")


class AttentionCore(nn.Module):
    """softmax(mask(q k^T / sqrt(d))) -> dropout -> @ v, on (B, n_head, T, d) tensors."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attn_impl = config.attn_impl
        self.dropout = config.dropout
        self.drop = nn.Dropout(config.dropout)
        mask = torch.tril(torch.ones(config.block_size, config.block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, config.block_size, config.block_size),
                             persistent=False)

    def forward(self, q, k, v):
        if self.attn_impl == "sdpa":
            return F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.drop(att)
        return att @ v


class SelfAttention(nn.Module):
    """Projections around an `AttentionCore`; the core alone can be checkpointed (selective)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.core = AttentionCore(config)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.core_impl: str | None = None   # set by the model's policy ("selective")

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in (q, k, v))
        if self.core_impl is not None and torch.is_grad_enabled():
            y = _checkpointed(self.core, q, k, v, impl=self.core_impl)
        else:
            y = self.core(q, k, v)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.drop(self.proj(y))


class FeedForward(nn.Module):
    """Linear(C, 4C) -> GELU -> Linear(4C, C) -> Dropout."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.attn = SelfAttention(config)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.mlp = FeedForward(config)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embed(nn.Module):
    """Token plus position embeddings, then dropout: (B, T) ids -> (B, T, C)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, idx):
        T = idx.size(1)
        pos = torch.arange(T, device=idx.device)
        return self.drop(self.tok(idx) + self.pos(pos))


class LMHead(nn.Module):
    """Final LayerNorm and the projection to vocabulary logits."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln = nn.LayerNorm(config.n_embd)
        self.out = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, x):
        return self.out(self.ln(x))


class GPT(CheckpointedChain):
    """Embed, L x Block, LMHead: ``layers()`` has L + 2 entries, blocks at 1..L."""

    def __init__(self, config: GPTConfig, policy=None, impl: str | None = None):
        super().__init__()
        self.config = config
        self.chain = nn.ModuleList([Embed(config)]
                                   + [Block(config) for _ in range(config.n_layer)]
                                   + [LMHead(config)])
        self.first_block, self.num_blocks = 1, config.n_layer
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):   # minGPT: scale residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        self.set_policy(policy, impl)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)


# --------------------------------------------------------------------------------- ResNet
@dataclass
class ResNetConfig:
    """A residual conv net on (B, in_channels, image_size, image_size) images."""

    in_channels: int = 3
    channels: int = 16
    depth: int = 4             # residual blocks
    num_classes: int = 10
    image_size: int = 32


class RecomputeSafeBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d that does not update running statistics when its forward is a recompute.

    A checkpoint re-runs the forward inside backward; in training mode that would count each
    batch twice in ``running_mean``/``running_var``/``num_batches_tracked``. A forward that
    runs while autograd executes a backward (ckpt_lab's "recompute" phase, or any node of
    ``torch.utils.checkpoint``) is a recompute, so it normalises with the batch statistics
    as usual and lets the update land on throw-away copies of the running statistics (copies,
    not ``None``, so the recompute saves the same tensors as the forward did).
    """

    def forward(self, x):
        if self.training and _recomputing():
            return F.batch_norm(x, self.running_mean.clone(), self.running_var.clone(),
                                self.weight, self.bias, True, self._momentum(), self.eps)
        return super().forward(x)

    def _momentum(self) -> float:
        return 0.0 if self.momentum is None else self.momentum


def _recomputing() -> bool:
    """True inside a checkpoint's recompute: ckpt_lab labels it; any other runs in backward."""
    return current_phase() == "recompute" or torch._C._current_autograd_node() is not None


class ConvBNReLU(nn.Sequential):
    """Conv2d(3x3, no bias) -> BatchNorm2d -> ReLU."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                         RecomputeSafeBatchNorm2d(c_out), nn.ReLU())


class ResBlock(nn.Module):
    """relu(x + bn(conv(relu(bn(conv(x))))))."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = RecomputeSafeBatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = RecomputeSafeBatchNorm2d(channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class PoolHead(nn.Module):
    """Global average pool and a linear classifier."""

    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        return self.fc(x.mean(dim=(2, 3)))


class ResNet(CheckpointedChain):
    """Stem, L x ResBlock, PoolHead: ``layers()`` has L + 2 entries, blocks at 1..L."""

    def __init__(self, config: ResNetConfig, policy=None, impl: str | None = None):
        super().__init__()
        self.config = config
        self.chain = nn.ModuleList([ConvBNReLU(config.in_channels, config.channels)]
                                   + [ResBlock(config.channels) for _ in range(config.depth)]
                                   + [PoolHead(config.channels, config.num_classes)])
        self.first_block, self.num_blocks = 1, config.depth
        self.set_policy(policy, impl)


# -------------------------------------------------------------------------------- presets
PRESETS = {
    # tests: a forward + backward in milliseconds
    "mlp-tiny": MLPConfig(block_size=16, width=32, depth=4),
    "gpt-tiny": GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.1),
    "resnet-tiny": ResNetConfig(channels=8, depth=2, image_size=8),
    # lessons on a 2-core CPU with 1.5 GB RAM: a training step well under a second
    "mlp-cpu": MLPConfig(block_size=64, width=256, depth=8),
    "gpt-cpu": GPTConfig(block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.1),
    "resnet-cpu": ResNetConfig(channels=16, depth=4, image_size=32),
    # a GPU: GPT-2 small sizes and wider nets
    "mlp-gpu": MLPConfig(block_size=256, width=2048, depth=16),
    "gpt-gpu": GPTConfig(block_size=1024, n_layer=12, n_head=12, n_embd=768, dropout=0.1),
    "resnet-gpu": ResNetConfig(channels=64, depth=8, image_size=64),
}

MODEL_CLASSES = {MLPConfig: MLPChain, GPTConfig: GPT, ResNetConfig: ResNet}


def get_config(name: str, **overrides):
    """A fresh copy of a preset config, with fields overridden (e.g. dropout=0.0)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides)


def build_model(config, policy=None, impl: str | None = None, seed: int | None = 0):
    """A model from a config or a preset name, initialised from ``seed`` (None: global RNG)."""
    if isinstance(config, str):
        config = get_config(config)
    cls = MODEL_CLASSES.get(type(config))
    if cls is None:
        raise ValueError(f"no model for a {type(config).__name__}; pass one of "
                         f"{', '.join(c.__name__ for c in MODEL_CLASSES)} or a preset name")
    if seed is None:
        return cls(config, policy, impl)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(config, policy, impl)
