"""checkpoint_modules on real block-structured models, against plain autograd and
torch.utils.checkpoint (the oracles); profile_modules against the measurement
(plan_modules: tests/plan/test_plan_modules.py)."""
import copy
import pickle

import pytest
import torch
import torch.utils.checkpoint as tuc
from torch import nn

from ckpt_lab import checkpoint_modules, track_memory
from ckpt_lab.training.models import GPT, Block, GPTConfig
from ckpt_lab.checkpoint.wrap import matched_modules
from ckpt_lab.plan.module_planner import profile_modules
from oracle import same

IMPLS = ["hooks", "reentrant"]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def grads(model, run, seed=7):
    """Loss and every parameter gradient after one forward+backward with a fixed RNG seed."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = run()
    loss.backward()
    return [loss.detach()] + [p.grad for p in model.parameters()]


def torch_checkpointed(model, cls):
    """The oracle: the same blocks under torch.utils.checkpoint (non-reentrant); undo fn."""
    blocks = [m for m in model.modules() if isinstance(m, cls)]
    for m in blocks:
        original = m.forward
        m.forward = (lambda f: lambda *a, **k: tuc.checkpoint(
            f, *a, use_reentrant=False, preserve_rng_state=True, **k))(original)
    return lambda: [m.__dict__.pop("forward") for m in blocks]


def gpt(dropout=0.1):
    return GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=3, n_head=2, n_embd=32,
                         dropout=dropout))


IDX = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
TGT = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("impl", IMPLS)
def test_gpt_blocks_bitwise_equal_to_plain_and_to_torch(impl):
    model = gpt()
    run = lambda: model(IDX, TGT)  # noqa: E731
    plain = grads(model, run)
    undo = torch_checkpointed(model, Block)
    oracle = grads(model, run)
    undo()
    handle = checkpoint_modules(model, Block, impl=impl)
    assert handle.names == ["chain.1", "chain.2", "chain.3"]
    ours = grads(model, run)
    handle.remove()
    assert same(plain, ours) and same(oracle, ours)
    assert same(plain, grads(model, run))


def test_gpt_blocks_free_memory_like_torch():
    model = gpt(dropout=0.0)
    run = lambda: model(IDX, TGT).backward()  # noqa: E731
    peaks = {}
    for name in ("plain", "ours", "torch"):
        handle = checkpoint_modules(model, Block) if name == "ours" else None
        undo = torch_checkpointed(model, Block) if name == "torch" else None
        with track_memory() as mem:
            run()
        peaks[name] = mem.peak_bytes
        handle and handle.remove()
        undo and undo()
    assert peaks["ours"] == peaks["torch"] < peaks["plain"] / 2


def encoder(dropout=0.1):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=dropout,
                                       batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)


@pytest.mark.parametrize("impl", IMPLS)
def test_transformer_encoder_with_masks_bitwise(impl):
    model = encoder()
    x = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(2)).requires_grad_()
    causal = torch.ones(10, 10, dtype=torch.bool).triu(1)
    pad = torch.zeros(2, 10, dtype=torch.bool)
    pad[1, 7:] = True
    run = lambda: model(x, mask=causal, src_key_padding_mask=pad).sum()  # noqa: E731

    def with_x(out):
        g, x.grad = x.grad, None
        return out + [g]

    plain = with_x(grads(model, run))
    undo = torch_checkpointed(model, nn.TransformerEncoderLayer)
    oracle = with_x(grads(model, run))
    undo()
    with checkpoint_modules(model, nn.TransformerEncoderLayer, impl=impl) as handle:
        assert handle.names == ["layers.0", "layers.1", "layers.2"]
        ours = with_x(grads(model, run))
    assert same(plain, ours) and same(oracle, ours)


class KwBlock(nn.Module):
    """A block in the style of a Hugging Face decoder layer: keyword tensors, tuple output."""

    def __init__(self, width=16):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.drop = nn.Dropout(0.3)

    def forward(self, x, bias=None, scale=1.0, output_extra=False, **unused):
        y = self.drop(torch.tanh(self.fc(x))) * scale
        if bias is not None:
            y = y + bias
        return (x + y, None, y.sum()) if output_extra else (x + y,)


class KwModel(nn.Module):
    def __init__(self, depth=3, width=16):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(width, width)
        self.blocks = nn.ModuleList(KwBlock(width) for _ in range(depth))
        self.bias = nn.Parameter(torch.randn(width))

    def forward(self, x):
        h = self.inp(x)
        extra = 0
        for b in self.blocks:
            out = b(h, bias=self.bias * 0.5, scale=2.0, output_extra=True)
            h, extra = out[0], extra + out[2]
            assert out[1] is None
        return h.pow(2).mean() + extra


X = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("impl", IMPLS)
def test_keyword_tensors_get_gradients_and_tuples_come_back(impl):
    model = KwModel()
    run = lambda: model(X)  # noqa: E731
    plain = grads(model, run)
    assert model.bias.grad is not None and model.bias.grad.abs().sum() > 0
    undo = torch_checkpointed(model, KwBlock)
    oracle = grads(model, run)
    undo()
    with checkpoint_modules(model, lambda name, m: name in ("blocks.0", "blocks.1", "blocks.2"), impl=impl) as h:
        assert h.names == ["blocks.0", "blocks.1", "blocks.2"]
        ours = grads(model, run)
    assert same(plain, ours) and same(oracle, ours)


class PositionalBlock(nn.Module):
    """Called the way GPT-2's model calls its blocks: positional None and flags among tensors."""

    def __init__(self, width=16):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x, past=None, mask=None, flag=False):
        y = torch.tanh(self.fc(x))
        return (x + (y if mask is None else y * mask),) if not flag else (x + y, past)


@pytest.mark.parametrize("impl", IMPLS)
def test_positional_none_and_flags_among_tensors(impl):
    torch.manual_seed(0)
    blocks = nn.ModuleList(PositionalBlock() for _ in range(2))
    mask = torch.ones(16)
    x = torch.randn(4, 16, requires_grad=True)

    def run():
        h = x
        for b in blocks:
            h = b(h, None, mask, False)[0]
        return h.pow(2).sum()

    plain = grads(blocks, run) + [x.grad]
    x.grad = None
    with checkpoint_modules(blocks, PositionalBlock, impl=impl):
        ours = grads(blocks, run) + [x.grad]
    assert same(plain, ours)


def test_forward_hooks_run_once_and_keep_their_effect():
    model = KwModel()
    calls = {"pre": 0, "post": 0}

    def pre(module, args, kwargs):
        calls["pre"] += 1
        return args, dict(kwargs, scale=kwargs["scale"] * 0.5)

    def post(module, args, out):
        calls["post"] += 1
        return (out[0] * 1.5,) + tuple(out[1:])

    hooks = [model.blocks[1].register_forward_pre_hook(pre, with_kwargs=True),
             model.blocks[1].register_forward_hook(post)]
    run = lambda: model(X)  # noqa: E731
    plain = grads(model, run)
    assert calls == {"pre": 1, "post": 1}
    handle = checkpoint_modules(model, KwBlock)
    ours = grads(model, run)
    assert calls == {"pre": 2, "post": 2}       # not re-run by the recompute
    assert same(plain, ours)
    handle.remove()
    assert len(model.blocks[1]._forward_hooks) == 1 and len(model.blocks[1]._forward_pre_hooks) == 1
    for h in hooks:
        h.remove()


def test_remove_restores_the_model_exactly():
    model = gpt()
    keys = list(model.state_dict())
    classes = [type(m) for m in model.modules()]
    forward_attrs = [("forward" in m.__dict__) for m in model.modules()]
    model.eval()
    with torch.no_grad():
        before = model(IDX)
    handle = checkpoint_modules(model, Block)
    assert list(model.state_dict()) == keys and handle.active
    with torch.no_grad():
        assert torch.equal(model(IDX), before)      # no_grad: the blocks run as before
    handle.remove()
    handle.remove()                                 # idempotent
    assert not handle.active
    assert list(model.state_dict()) == keys
    assert [type(m) for m in model.modules()] == classes
    assert [("forward" in m.__dict__) for m in model.modules()] == forward_attrs
    with torch.no_grad():
        assert torch.equal(model(IDX), before)


def test_remove_puts_back_a_forward_someone_else_installed():
    model = KwModel()
    block = model.blocks[0]
    theirs = block.forward
    block.forward = lambda *a, **k: theirs(*a, **k)   # e.g. Accelerate's device hook
    installed = block.forward
    handle = checkpoint_modules(model, KwBlock)
    assert block.forward is not installed
    handle.remove()
    assert block.forward is installed


def test_errors_say_what_to_do():
    model = gpt()
    with pytest.raises(ValueError, match="matched no submodule.*Block"):
        checkpoint_modules(model, nn.TransformerEncoderLayer)
    with pytest.raises(ValueError, match="inside it"):
        checkpoint_modules(model, (Block, nn.LayerNorm))
    with pytest.raises(ValueError, match="inside it"):
        checkpoint_modules(model, lambda name, m: True)
    with pytest.raises(TypeError, match="not an nn.Module"):
        checkpoint_modules(model, int)
    with pytest.raises(TypeError, match="predicate"):
        checkpoint_modules(model, "Block")
    with pytest.raises(ValueError, match="impl"):
        checkpoint_modules(model, Block, impl="torch")
    handle = checkpoint_modules(model, Block)
    with pytest.raises(ValueError, match="already checkpointed"):
        checkpoint_modules(model, Block)
    handle.remove()
    checkpoint_modules(model, Block).remove()


def test_a_block_writing_a_cache_is_refused_while_training():
    model = KwModel()
    block = model.blocks[0]
    h = torch.randn(2, 16)
    with checkpoint_modules(model, KwBlock):
        with pytest.raises(ValueError, match="use_cache=False"):
            block.forward(h, use_cache=True)
        with pytest.raises(ValueError, match="past_key_values"):
            block.forward(h, past_key_values=object())
        with torch.no_grad():                      # generation: nothing is recomputed
            block.forward(h, past_key_values=None)


def test_reentrant_with_frozen_input_gives_the_blocks_their_gradients():
    """The LoRA trap: no input of a block requires grad. ckpt_lab's reentrant node takes the
    parameters the forward read as inputs too, so they get plain autograd's gradients."""
    model = KwModel()
    model.inp.requires_grad_(False)     # frozen embedding, as under LoRA: h has no grad
    model.bias.requires_grad_(False)
    run = lambda: model(X)  # noqa: E731
    plain = grads(model, run)
    with checkpoint_modules(model, KwBlock, impl="reentrant"):
        ours = grads(model, run)
    assert all(g is None for g in plain[1:4]) and all(g is not None for g in plain[4:])
    assert same([g for g in plain if g is not None], [g for g in ours if g is not None])
    assert [g is None for g in plain] == [g is None for g in ours]


def test_matched_modules_in_call_order_and_profile():
    model = gpt(dropout=0.0)
    assert [n for n, _ in matched_modules(model, Block)] == ["chain.1", "chain.2", "chain.3"]
    prof = profile_modules(model, Block, lambda: model(IDX, TGT))
    blocks, input_bytes, other = prof.blocks, prof.input_bytes, prof.other_saved_bytes
    assert prof.shared_args_bytes == 0
    assert [b.name for b in blocks] == ["chain.1", "chain.2", "chain.3"]
    assert input_bytes == 2 * 16 * 32 * 4
    assert all(b.out_bytes == input_bytes for b in blocks)
    assert len({b.act_bytes for b in blocks}) == 1 and blocks[0].act_bytes > 4 * input_bytes
    assert other > 0


def test_policy_is_passed_to_checkpoint():
    model = gpt()
    run = lambda: model(IDX, TGT)  # noqa: E731
    plain = grads(model, run)
    kept = {}
    for policy in (None, "save_matmuls"):
        with checkpoint_modules(model, Block, policy=policy):
            assert same(plain, grads(model, run))
            with track_memory() as mem:
                loss = run()
                kept[policy] = mem.current_bytes
            del loss
    with track_memory() as mem:
        loss = run()
        kept["plain"] = mem.current_bytes
    assert kept[None] < kept["save_matmuls"] < kept["plain"]


def test_context_fn_determinism_check_and_debug_are_passed_to_checkpoint():
    """PyTorch's selective contexts run under checkpoint_modules, as under checkpoint; bad
    options are refused when the modules are wrapped, not at the first step."""
    import functools
    model = gpt(dropout=0.0)
    run = lambda: model(IDX, TGT)  # noqa: E731
    plain = grads(model, run)
    asked = []

    def policy(ctx, op, *args, **kwargs):
        asked.append(op)
        return tuc.CheckpointPolicy.PREFER_RECOMPUTE

    context_fn = functools.partial(tuc.create_selective_checkpoint_contexts, policy)
    with checkpoint_modules(model, Block, context_fn=context_fn, determinism_check="fingerprint",
                            debug=True):
        assert same(plain, grads(model, run))
    assert asked
    with pytest.raises(ValueError, match="determinism_check"):
        checkpoint_modules(model, Block, determinism_check="bits")
    with pytest.raises(ValueError, match="not both"):
        checkpoint_modules(model, Block, context_fn=context_fn, policy="save_matmuls")


class _ScaledBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x, scale, mask):
        return torch.tanh(self.lin(x) * scale + mask)


class _SharedArgs(nn.Module):
    """Blocks called with a parameter, a buffer and a mask built in each forward."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.full((32,), 0.5))
        self.register_buffer("bias", torch.ones(32))
        self.blocks = nn.ModuleList(_ScaledBlock() for _ in range(3))

    def forward(self, x):
        mask = torch.zeros(x.shape[0], 32) + self.bias    # an activation every block shares
        for block in self.blocks:
            x = block(x, self.scale, mask)
        return x.sum()


def test_parameters_passed_to_blocks_are_not_shared_activations():
    model, x = _SharedArgs(), torch.randn(8, 32, requires_grad=True)
    prof = profile_modules(model, _ScaledBlock, lambda: model(x))
    mask_bytes = 8 * 32 * 4
    assert prof.shared_args_bytes == mask_bytes          # the mask; not the scale parameter
    assert prof.other_saved_bytes == 0                   # nothing saved outside the blocks
    names = [b.name for b in prof.blocks[:2]]
    with track_memory() as mem:
        loss = model(x)
        plain_kept = mem.current_bytes
    del loss
    with checkpoint_modules(model, lambda name, m: name in names):
        with track_memory() as mem:
            loss = model(x)
            kept = mem.current_bytes
        del loss
    assert plain_kept - kept == prof.checkpoint_saving_bytes(names)


def _post_norm_encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.1, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)


def _exact_cases():
    """(model, block class, step) triples whose blocks save, share and pass tensors differently."""
    causal = torch.ones(10, 10, dtype=torch.bool).triu(1)
    pad = torch.zeros(2, 10, dtype=torch.bool)
    pad[1, 7:] = True
    x_grad = torch.randn(2, 10, 32, requires_grad=True)
    x_data = torch.randn(2, 10, 32)                      # the caller holds it; nothing saves it
    pre, post, shared, g = encoder(), _post_norm_encoder(), _SharedArgs(), gpt()
    return {
        "pre-norm encoder, masks": (pre, nn.TransformerEncoderLayer,
                                    lambda: pre(x_grad, mask=causal,
                                                src_key_padding_mask=pad).sum()),
        "post-norm encoder, input without grad": (post, nn.TransformerEncoderLayer,
                                                  lambda: post(x_data).sum()),
        "blocks saving each other's outputs": (shared, _ScaledBlock,
                                               lambda: shared(x_grad[0])),
        "course GPT": (g, Block, lambda: g(IDX, TGT)),
    }


@pytest.mark.parametrize("case", list(_exact_cases()))
def test_checkpoint_saving_is_exact_for_every_subset_of_blocks(case):
    import itertools
    model, cls, run = _exact_cases()[case]

    def kept_after_forward():
        torch.manual_seed(1)
        with track_memory() as mem:
            out = run()
            kept = mem.current_bytes
        del out
        return kept

    torch.manual_seed(1)
    prof = profile_modules(model, cls, run)
    names = [b.name for b in prof.blocks]
    plain = kept_after_forward()
    for r in range(1, len(names) + 1):
        for chosen in itertools.combinations(names, r):
            with checkpoint_modules(model, lambda name, m: name in chosen):
                saving = plain - kept_after_forward()
            assert saving == prof.checkpoint_saving_bytes(chosen), chosen


# ------------------------------------------------- a wrapped model copies like the plain one
def _wrapped_and_plain():
    """A GPT with its blocks checkpointed, a plain twin, and other weights for their copies."""
    model = gpt(dropout=0.0)
    plain = copy.deepcopy(model)
    handle = checkpoint_modules(model, Block)
    other = {k: v * 0.5 for k, v in model.state_dict().items()}
    plain.load_state_dict(other)
    return model, handle, plain, other


def _runs_like(twin, plain):
    """``twin`` gives ``plain``'s logits and gradients, bit for bit (so it runs its own weights)."""
    assert torch.equal(twin(IDX), plain(IDX))
    assert same(grads(twin, lambda: twin(IDX, TGT)), grads(plain, lambda: plain(IDX, TGT)))


@pytest.mark.parametrize("how", ["deepcopy", "AveragedModel"])
def test_a_copy_of_a_wrapped_model_runs_its_own_weights(how):
    model, handle, plain, other = _wrapped_and_plain()
    twin = (copy.deepcopy(model) if how == "deepcopy"
            else torch.optim.swa_utils.AveragedModel(model).module)
    twin.load_state_dict(other)
    _runs_like(twin, plain)
    handle.remove()
    _runs_like(twin, plain)
    assert "forward" in twin.chain[1].__dict__          # the copy stays checkpointed


def test_a_wrapped_model_pickles_and_saves_like_the_plain_one(tmp_path):
    model, _, plain, other = _wrapped_and_plain()
    torch.save(model, tmp_path / "model.pt")
    for twin in (pickle.loads(pickle.dumps(model)),
                 torch.load(tmp_path / "model.pt", weights_only=False)):
        twin.load_state_dict(other)
        _runs_like(twin, plain)
