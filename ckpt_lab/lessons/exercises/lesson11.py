"""Exercises of lesson 11: which switch checkpoints the model in your stack.

Three committed predictions, each measured the way the lesson measures it, at the lesson's CPU
sizes (the Hugging Face models are the same on every device; the GPT block is lesson 11's
CPU-size block), and one build task: a context function for PyTorch's selective API that keeps
every second matmul's output, run through ``torch.utils.checkpoint`` on blocks of two kinds and
judged on its gradients (bitwise against plain autograd) and on the bytes it keeps. The third
prediction asks what share of the bytes that policy keeps, measured without a policy: the
matmul outputs' sizes, recorded in the order the block makes them.
"""
from __future__ import annotations

import functools
import math
import warnings

import torch

from .base import Exercise, _number, near, one_of

LAYERS, BATCH, SEQ, VOCAB = 6, 2, 64, 256      # the lesson's tiny Hugging Face models


def _quiet_transformers():
    import transformers
    transformers.logging.set_verbosity_error()


@functools.lru_cache(maxsize=None)
def peak_drop() -> float:
    """Measured: plain step peak (activations) / the one with Hugging Face's own switch, tiny
    Llama, CPU; the gradients allocated before each step, as model state."""
    from ckpt_lab.lessons import hf
    _quiet_transformers()
    model = hf.tiny_model("llama", layers=LAYERS)
    ids = hf.token_batch(BATCH, SEQ, VOCAB)
    plain = hf.train_step(model, ids, grads_allocated=True)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    checkpointed = hf.train_step(model, ids, grads_allocated=True)
    return plain.peak_bytes / checkpointed.peak_bytes


def _peak_drop(answer):
    value, expected = _number(answer), peak_drop()
    if value <= 0:
        return False, "Give a factor above 0: the plain peak divided by the checkpointed one."
    if abs(math.log(value / expected)) <= math.log(1.25):
        return True, (f"x{expected:.2f} measured. The kept bytes fell further: the step peak "
                      "comes in the backward, where the kept inputs, one recomputed layer and "
                      "the logits' gradient are alive at once.")
    if value > expected:
        return False, (f"Too high: x{expected:.2f} measured. The kept bytes fell about that much, "
                       "but the step peak comes in the backward: the kept inputs, one recomputed "
                       "layer and the logits' gradient are alive there at once.")
    return False, (f"Too low: x{expected:.2f} measured. In the plain step most of the step peak "
                   "is the activations the forward keeps; checkpointing removes all but each "
                   "layer's input, so it falls several-fold. (Counted with the gradients made in "
                   "the backward, it falls by less.)")


@functools.lru_cache(maxsize=None)
def trap_adapters_with_grad(layers: int = LAYERS, every: int = 3,
                            use_peft: bool | None = None) -> int:
    """Measured: adapter tensors that get a gradient when a tiny Llama with LoRA on q_proj and
    v_proj (everything else frozen; peft's adapters where peft is installed, unless
    ``use_peft`` says otherwise) is checkpointed reentrantly on every `every`-th layer, without
    enable_input_require_grads."""
    from ckpt_lab.lessons import hf
    _quiet_transformers()
    model = hf.lora_llama(layers, use_peft=use_peft)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True},
                                          every_n_layers=every)
    model.disable_input_require_grads()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.train_step(model, hf.token_batch(BATCH, SEQ, VOCAB))
    return hf.trainable_with_grad(model)


_trap_adapters = near(
    trap_adapters_with_grad, 0,
    right="{expected} of 24: layer 0's input is the frozen embedding's output, so its four "
          "adapter tensors get nothing; layer 3's input comes from layers with trainable "
          "adapters, so it is fine. Only a UserWarning says so.",
    low="Too few: a reentrant checkpoint loses gradients only when none of its inputs requires "
        "grad. Which checkpointed layer gets an input computed by trainable adapters in an "
        "earlier layer?",
    high="Too many: layer 0 is checkpointed and its input, the frozen embedding's output, does "
         "not require grad: its adapters (A and B of q_proj and v_proj) get nothing, and the step "
         "runs on without an error.")


# ------------------------------------------------------------------- selective checkpointing
MATMULS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm)
B, T, H, N_HEAD = 2, 64, 64, 4           # the lesson's CPU-size GPT block


def gpt_block(dropout: float = 0.1, seed: int = 0):
    """Lesson 11's GPT block (attention written out) at its CPU sizes, and an input for it."""
    from ckpt_lab.training.models import Block, GPTConfig
    torch.manual_seed(seed)
    block = Block(GPTConfig(n_embd=H, n_head=N_HEAD, block_size=T, dropout=dropout))
    return block, torch.randn(B, T, H, generator=torch.Generator().manual_seed(seed + 1))


def save_matmuls(ctx, op, *args, **kwargs):
    """The lesson's policy: keep what a matrix multiply produces, recompute everything else."""
    from torch.utils.checkpoint import CheckpointPolicy
    return (CheckpointPolicy.MUST_SAVE if op.overloadpacket in MATMULS
            else CheckpointPolicy.PREFER_RECOMPUTE)


def _matmul_output_bytes(block, x) -> list[int]:
    """Bytes of each matmul output of one forward of ``block``, in the order they are made."""
    with torch.no_grad(), _MatmulOutputs() as seen:
        block(x)
    return seen.sizes


@functools.lru_cache(maxsize=None)
def every_second_share() -> float:
    """Measured: what keeping the 1st, 3rd, 5th ... matmul output keeps, as a share of what
    `save_matmuls` keeps, on the lesson's GPT block (its input kept by both). `save_matmuls`'
    bytes come from a checkpointed step; the every-second policy's from the block's input (a
    full recompute's kept bytes) plus its odd matmul outputs, recorded without any policy."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from ckpt_lab.lessons import stack
    block, x = gpt_block()
    selective = functools.partial(create_selective_checkpoint_contexts, save_matmuls)
    full = stack.measure("full", lambda t: checkpoint(block, t, use_reentrant=False), block, x)
    sac = stack.measure("sac", lambda t: checkpoint(block, t, use_reentrant=False,
                                                    context_fn=selective), block, x)
    every_second = full.kept_bytes + sum(_matmul_output_bytes(block, x)[::2])
    return every_second / sac.kept_bytes


def every_second_choice() -> str:
    """The measured share as the prediction's choice: 'under half', 'about half', 'over half'."""
    share = every_second_share()
    return "under half" if share < 0.45 else "over half" if share > 0.55 else "about half"


_every_second_share = one_of(
    ("under half", "about half", "over half"), every_second_choice,
    right="Over half: 60%. The policy keeps the outputs of q, k and v (3H per token), the heads "
          "(H) and the MLP's up projection (4H): 8H of the 14H that save_matmuls keeps, plus the "
          "block's input (H) in both. Half the matmuls is not half the bytes.",
    wrong="Not what was measured ({expected}).",
    hints={"about half": "Half the matmuls, but not half the bytes: the outputs differ in size. "
                         "Add up the 1st, 3rd and 5th (3H + H + 4H) against all six (3H + "
                         "n_h T + H + H + 4H + H, with n_h T = 4H here): over half.",
           "under half": "Add up what is kept: the 1st, 3rd and 5th outputs are 3H, H and 4H "
                         "per token, 8H of save_matmuls' 14H (n_h T = 4H here), plus the "
                         "input in both: over half."},
    normalise=str.lower)


# -------------------------------------------------------------------- the build task: a policy
def _mlp_block(seed: int):
    """Three Linear layers (an odd number of matmuls), GELU between, tanh at the end."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(H, 2 * H), torch.nn.GELU(),
                               torch.nn.Linear(2 * H, 2 * H), torch.nn.GELU(),
                               torch.nn.Linear(2 * H, H), torch.nn.Tanh())


def _pair(kind: str):
    """Two blocks of one kind in sequence, and an input: what the judge checkpoints."""
    if kind == "gpt":
        (a, x), (b, _) = gpt_block(seed=0), gpt_block(seed=2)
    else:
        a, b = _mlp_block(0), _mlp_block(1)
        x = torch.randn(4 * B, T, H, generator=torch.Generator().manual_seed(3))
    return torch.nn.Sequential(a, b), x


class _MatmulOutputs(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the bytes of every matmul's output, in call order."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in MATMULS:
            self.sizes.append(out.numel() * out.element_size())
        return out


def _every_second_bytes(model, x) -> int:
    """Bytes of the 1st, 3rd, 5th ... matmul output of each block, counted in each apart."""
    total, h = 0, x
    for block in model:
        total += sum(_matmul_output_bytes(block, h)[::2])
        with torch.no_grad():
            h = block(h)
    return total


def _step(model, x, checkpointed: bool, context_fn=None):
    """One measured step of the blocks in sequence: plain, or each block checkpointed
    (non-reentrant), with ``context_fn`` when given."""
    from torch.utils.checkpoint import checkpoint

    from ckpt_lab.lessons import stack
    extra = {} if context_fn is None else {"context_fn": context_fn}

    def run(t):
        for block in model:
            t = checkpoint(block, t, use_reentrant=False, **extra)
        return t
    return stack.measure("step", run if checkpointed else model, model, x)


def _every_second_matmul(answer):
    from ckpt_lab.lessons import stack
    if not callable(answer):
        return False, ("Pass your function itself: check('11.every_second_matmul', "
                       "every_second_matmul). It takes no argument and returns "
                       "create_selective_checkpoint_contexts(policy).")
    try:
        contexts = answer()
    except NotImplementedError:
        contexts = None
    except Exception as e:  # the learner's code: report, do not raise
        return False, f"Your function raised {type(e).__name__}: {e}"
    if contexts is None:
        return False, ("not answered yet: every_second_matmul returns None. It returns "
                       "create_selective_checkpoint_contexts(policy), for a policy that tells "
                       "a matmul by op.overloadpacket in MATMULS. Hint: torch.utils.checkpoint "
                       "calls context_fn once per checkpoint call.")
    if not (isinstance(contexts, tuple) and len(contexts) == 2):
        return False, ("Return the pair create_selective_checkpoint_contexts(policy) gives: a "
                       "forward context and a recompute context.")
    for kind in ("gpt", "mlp"):
        model, x = _pair(kind)
        plain, full = _step(model, x, False), _step(model, x, True)
        want = full.kept_bytes + _every_second_bytes(model, x)
        try:
            yours = _step(model, x, True, answer)
        except Exception as e:  # a policy that decides differently in the recompute fails here
            return False, (f"Two {kind.upper()} blocks, each checkpointed: the step raised "
                           f"{type(e).__name__}: {str(e).splitlines()[0][:160]}. The policy "
                           "returns CheckpointPolicy.MUST_SAVE or PREFER_RECOMPUTE for every op.")
        what = f"two {'GPT blocks' if kind == 'gpt' else 'three-layer MLP blocks'}"
        if not stack.same(plain, yours, exact=True):
            return False, (f"{what}: the gradients differ from plain autograd's. The policy "
                           "must only choose what to keep; leave the ops themselves alone.")
        if yours.kept_bytes != want:
            more = yours.kept_bytes > want
            return False, (f"{what}: kept {yours.kept_bytes:,} bytes after the forward, expected "
                           f"{want:,} (the blocks' inputs plus the 1st, 3rd, 5th ... matmul "
                           "output of each block). "
                           + ("You keep too much: every matmul? Alternate, counting from 1."
                              if more else
                              "You keep too little: does your count restart in each "
                              "checkpoint call? torch.utils.checkpoint calls context_fn once "
                              "per call: create the counter inside every_second_matmul.")
                           + (" (Three matmuls per block here: an odd count shows a counter "
                              "carried over.)" if kind == "mlp" else ""))
    return True, ("both kinds of block, each checkpointed twice in one step: gradients bitwise "
                  "equal to plain autograd, and the kept bytes are the blocks' inputs plus every "
                  "second matmul output, to the byte. This is torchtitan's op-level SAC policy: "
                  "half the matmuls kept, half re-run.")


EXERCISES = [
    Exercise("11.peak_drop", "A tiny Llama (6 layers, batch 2 x 64 tokens): Hugging Face's own "
             "switch checkpoints every layer. By what factor does the step peak (activations) "
             "fall (plain / checkpointed), the weight gradients allocated before the step as "
             "model state?", _peak_drop, peak_drop),
    Exercise("11.trap_adapters", "The same 6-layer Llama with LoRA (A and B) on q_proj and v_proj "
             "of every layer, everything else frozen, checkpointed with use_reentrant=True and "
             "every_n_layers=3, input grads NOT enabled: how many of the 24 adapter tensors get "
             "a gradient?", _trap_adapters, trap_adapters_with_grad),
    Exercise("11.every_second_share", "Lesson 11's GPT block (H = 64, n_h = 4, T = 64): its six "
             "matmuls output 3H, n_h T, H, H, 4H and H numbers per token, in that order. A SAC "
             "policy that keeps only the 1st, 3rd and 5th matmul outputs keeps what share of "
             "the bytes save_matmuls (every matmul output) keeps, the block's input kept by "
             "both: 'under half', 'about half' or 'over half'?", _every_second_share,
             every_second_choice),
    Exercise("11.every_second_matmul", "Build task: write every_second_matmul(), a context_fn "
             "for torch.utils.checkpoint: a fresh policy per checkpoint call that keeps the 1st, "
             "3rd, 5th ... matmul output (mm, addmm, bmm) of that call and recomputes everything "
             "else; it returns create_selective_checkpoint_contexts(policy). It is run through "
             "torch.utils.checkpoint(..., use_reentrant=False) on two kinds of block.",
             _every_second_matmul),
]
