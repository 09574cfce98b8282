"""Models: layers compose to the forward, policies parse and apply, gradients match exactly."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ckpt_lab import track_memory
from ckpt_lab.checkpoint import checkpoint_sequential
from ckpt_lab.training.models import (GPT, PRESETS, CheckpointScheme, GPTConfig, MLPChain,
                                      MLPConfig, ResNet, ResNetConfig, build_model, get_config)


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def text_batch(cfg, batch=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(cfg.vocab_size, (batch, cfg.block_size), generator=g)
    y = torch.randint(cfg.vocab_size, (batch, cfg.block_size), generator=g)
    return x, y


def image_batch(cfg, batch=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, cfg.in_channels, cfg.image_size, cfg.image_size, generator=g)
    return x, torch.randint(cfg.num_classes, (batch,), generator=g)


def grads_after_step(model, x, y, seed=1):
    """Loss, parameter gradients and buffers after one forward + backward."""
    torch.manual_seed(seed)
    loss = model(x, y)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()], \
        [b.clone() for b in model.buffers()]


def assert_same(a, b):
    la, ga, ba = a
    lb, gb, bb = b
    assert torch.equal(la, lb)
    assert len(ga) == len(gb) and all(torch.equal(u, v) for u, v in zip(ga, gb))
    assert len(ba) == len(bb) and all(torch.equal(u, v) for u, v in zip(ba, bb))


# ------------------------------------------------------------------------------- policies
@pytest.mark.parametrize("spec, kind, group, bounds", [
    (None, "none", 1, ()), ("none", "none", 1, ()), ("every", "every", 1, ()),
    ("every:3", "every", 3, ()), (" Selective ", "selective", 1, ()),
    ([0, 2, 4], "boundaries", 1, (0, 2, 4)), ((0, 3), "boundaries", 1, (0, 3)),
])
def test_policy_parse(spec, kind, group, bounds):
    p = CheckpointScheme.parse(spec, impl="reentrant")
    assert (p.kind, p.group, p.boundaries, p.impl) == (kind, group, bounds, "reentrant")


def test_policy_parse_accepts_a_plan_object_and_keeps_a_policy():
    class Plan:
        boundaries = [0, 1, 3]
    assert CheckpointScheme.parse(Plan()).boundaries == (0, 1, 3)
    numpy_starts = CheckpointScheme.parse([np.int64(0), np.int64(2)]).boundaries
    assert numpy_starts == (0, 2) and type(numpy_starts[1]) is int
    p = CheckpointScheme("every", group=2, impl="torch")
    assert CheckpointScheme.parse(p) is p
    assert CheckpointScheme.parse(p, impl="hooks").impl == "hooks"
    assert str(p) == "every:2 (torch)"


def test_checkpoint_policy_is_the_old_name_of_checkpoint_scheme():
    """Old code that imports CheckpointPolicy (not PyTorch's per-op one) keeps working."""
    import ckpt_lab
    assert ckpt_lab.CheckpointPolicy is ckpt_lab.CheckpointScheme is CheckpointScheme
    assert ckpt_lab.CheckpointPolicy.parse("every:2") == CheckpointScheme("every", group=2)


@pytest.mark.parametrize("spec", ["bogus", "every:0", "every:x", "every:-1", [], ["a"],
                                  [True], 3.5, {"boundaries": 1}])
def test_bad_policy_spec_raises_and_lists_valid_ones(spec):
    with pytest.raises(ValueError, match="valid|positive"):
        CheckpointScheme.parse(spec)


def test_bad_policy_for_a_model_raises():
    cfg = get_config("gpt-tiny")
    with pytest.raises(ValueError, match="impl"):
        build_model(cfg, "every", impl="magic")
    with pytest.raises(ValueError, match="groups of 3"):
        build_model(cfg, "every:3")           # only 2 blocks
    with pytest.raises(ValueError, match="strictly increasing"):
        build_model(cfg, [0, 2, 2])
    with pytest.raises(ValueError, match="strictly increasing"):
        build_model(cfg, [0, 9])
    with pytest.raises(ValueError, match="attention core"):
        build_model("mlp-tiny", "selective")
    with pytest.raises(ValueError, match="preset"):
        build_model("gpt-huge")


def test_segments_follow_the_policy():
    m = build_model("gpt-tiny")               # layers: embed, block, block, head
    assert m.segments() == [(0, 4, False)]
    m.set_policy("every")
    assert m.segments() == [(0, 1, False), (1, 2, True), (2, 3, True), (3, 4, False)]
    m.set_policy("every:2")
    assert m.segments() == [(0, 1, False), (1, 3, True), (3, 4, False)]
    m.set_policy([0, 2])                      # checkpoint_sequential: all but the last
    assert m.segments() == [(0, 2, True), (2, 4, False)]
    m.set_policy("selective")
    assert all(b.attn.core_impl == "hooks" for b in m.blocks())
    m.set_policy("none")
    assert all(b.attn.core_impl is None for b in m.blocks())


# ---------------------------------------------------------------------- layers == forward
@pytest.mark.parametrize("name", ["mlp-tiny", "gpt-tiny", "resnet-tiny"])
def test_layers_compose_to_forward(name):
    cfg = get_config(name, **({"dropout": 0.0} if hasattr(PRESETS[name], "dropout") else {}))
    m = build_model(cfg).eval()
    x, _ = image_batch(cfg) if name.startswith("resnet") else text_batch(cfg)
    out = x
    for layer in m.layers():
        out = layer(out)
    assert torch.equal(out, m(x))
    assert len(m.layers()) == len(m.blocks()) + 2


def test_presets_build_and_are_sized_as_promised():
    kinds = {"mlp": MLPChain, "gpt": GPT, "resnet": ResNet}
    for name in PRESETS:
        if name.endswith(("-tiny", "-cpu")):      # GPU presets are too big to build here
            assert isinstance(build_model(name), kinds[name.split("-")[0]])
    gpu = get_config("gpt-gpu")
    assert (gpu.n_layer, gpu.n_embd, gpu.block_size) == (12, 768, 1024)
    assert sum(p.numel() for p in build_model("gpt-cpu").parameters()) < 2_000_000
    assert get_config("gpt-tiny", dropout=0.0).dropout == 0.0
    assert PRESETS["gpt-tiny"].dropout == 0.1      # get_config copies, never mutates


def test_build_model_is_seeded():
    a, b = build_model("gpt-tiny", seed=3), build_model("gpt-tiny", seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_sdpa_attention_matches_the_written_out_core():
    cfg = get_config("gpt-tiny", dropout=0.0)
    manual = build_model(cfg)
    fused = build_model(get_config("gpt-tiny", dropout=0.0, attn_impl="sdpa"))
    x, y = text_batch(cfg)
    torch.testing.assert_close(fused(x, y), manual(x, y), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="attn_impl"):
        GPTConfig(attn_impl="flash")


def test_fused_attention_drops_the_score_tensors_on_cpu_without_dropout():
    """Without dropout, CPU sdpa runs a flash kernel that saves no T x T scores; with dropout
    it falls back to the math path, which saves them like the written-out core."""
    x, y = text_batch(get_config("gpt-tiny"), batch=4)

    def measure(attn_impl, dropout):
        model = build_model(get_config("gpt-tiny", attn_impl=attn_impl, dropout=dropout))
        with track_memory() as mem:
            model(x, y).backward()
        return mem.peak_bytes, {p.op for p in mem.timeline if "flash" in p.op}
    manual, _ = measure("manual", 0.0)
    fused, flash_ops = measure("sdpa", 0.0)
    assert fused < manual and flash_ops
    assert not measure("sdpa", 0.1)[1]


# ------------------------------------------------------------- checkpointing changes nothing
POLICIES = ["every", "every:2", "selective", [0, 2], [0, 1, 3]]


CASES = [(p, i, "manual") for p in POLICIES for i in ("hooks", "reentrant", "torch")] + \
        [("every", "hooks", "sdpa"), ("selective", "hooks", "sdpa"), ([0, 2], "reentrant", "sdpa")]


@pytest.mark.parametrize("policy, impl, attn_impl", CASES)
def test_gpt_gradients_bitwise_equal_under_every_policy(policy, impl, attn_impl):
    cfg = get_config("gpt-tiny", attn_impl=attn_impl)     # dropout 0.1
    x, y = text_batch(cfg)
    plain = grads_after_step(build_model(cfg), x, y)
    assert_same(grads_after_step(build_model(cfg, policy, impl), x, y), plain)


def test_gpt_gradients_equal_torch_utils_checkpoint_per_block():
    """The oracle: torch.utils.checkpoint (non-reentrant) around each block by hand."""
    cfg = get_config("gpt-tiny")
    x, y = text_batch(cfg)
    ours = grads_after_step(build_model(cfg, "every", impl="hooks"), x, y)
    ref = build_model(cfg)
    torch.manual_seed(1)
    h = ref.layers()[0](x)
    for block in ref.blocks():
        h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)
    loss = ref.loss(ref.layers()[-1](h), y)
    loss.backward()
    assert_same(ours, (loss.detach(), [p.grad for p in ref.parameters()],
                       list(ref.buffers())))


def test_boundaries_match_checkpoint_sequential_on_layers():
    cfg = get_config("gpt-tiny")
    x, y = text_batch(cfg)
    ours = grads_after_step(build_model(cfg, [0, 2]), x, y)
    ref = build_model(cfg)
    torch.manual_seed(1)
    loss = ref.loss(checkpoint_sequential(ref.layers(), x, boundaries=[0, 2]), y)
    loss.backward()
    assert_same(ours, (loss.detach(), [p.grad for p in ref.parameters()], list(ref.buffers())))


@pytest.mark.parametrize("policy", ["every", "every:2", [0, 3]])
def test_mlp_gradients_bitwise_equal(policy):
    cfg = get_config("mlp-tiny", dropout=0.2)
    x, y = text_batch(cfg)
    assert_same(grads_after_step(build_model(cfg, policy), x, y),
                grads_after_step(build_model(cfg), x, y))


def peak(model, x, y):
    torch.manual_seed(1)
    with track_memory() as mem:
        model(x, y).backward()
    return mem.peak_bytes


def test_policies_lower_the_measured_peak():
    cfg = get_config("gpt-tiny", block_size=32, n_layer=4)
    x, y = text_batch(cfg, batch=4)
    none = peak(build_model(cfg), x, y)
    every = peak(build_model(cfg, "every"), x, y)
    selective = peak(build_model(cfg, "selective"), x, y)
    assert every < selective < none


def test_mlp_block_saved_bytes_match_the_hand_count():
    """Linear saves its input (the previous block's output, counted there) and ReLU its output.
    On CPU, dropout is ``x * mask`` with a float32 mask that the multiply saves (CUDA's fused
    kernel saves a bool mask instead). So one fp32 block keeps 4*N*H bytes, 8*N*H with dropout
    (plus the dropout output, 4*N*H, which the next block's Linear saves as its input)."""
    N, H = 2 * 8, 16
    for dropout, bytes_per_elem in [(0.0, 4), (0.5, 8)]:
        m = build_model(MLPConfig(width=H, depth=3, block_size=8, dropout=dropout))
        h = m.layers()[0](torch.randint(256, (2, 8))).detach().requires_grad_()
        block = m.blocks()[0]
        outside = {p.untyped_storage().data_ptr() for p in block.parameters()}
        outside.add(h.untyped_storage().data_ptr())
        saved = {}

        def pack(t):
            st = t.untyped_storage()
            if st.data_ptr() not in outside:
                saved[st.data_ptr()] = st.nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block(h)
        assert sum(saved.values()) == N * H * bytes_per_elem


# ------------------------------------------------------------------------------ BatchNorm
@pytest.mark.parametrize("policy, impl", [("every", "hooks"), ("every", "reentrant"),
                                          ("every", "torch"), ("every:2", "hooks"),
                                          ([0, 2], "reentrant"), ([0, 1, 3], "torch")])
def test_resnet_batchnorm_stats_updated_once_under_checkpoint(policy, impl):
    cfg = get_config("resnet-tiny")
    x, y = image_batch(cfg)
    plain = build_model(cfg)
    ckpt = build_model(cfg, policy, impl)
    assert_same(grads_after_step(ckpt, x, y), grads_after_step(plain, x, y))
    for (name, a), b in zip(plain.named_buffers(), ckpt.buffers()):
        assert torch.equal(a, b), name
    assert int(ckpt.blocks()[0].bn1.num_batches_tracked) == 1


def test_batchnorm_stats_right_even_inside_a_user_phase_label():
    """A user's own phase label around backward must not hide torch's recompute."""
    from ckpt_lab.measure.memory import phase
    cfg = get_config("resnet-tiny")
    x, y = image_batch(cfg)
    model = build_model(cfg, "every", impl="torch")
    loss = model(x, y)
    with phase("my backward"):
        loss.backward()
    assert int(model.blocks()[0].bn1.num_batches_tracked) == 1


def test_plain_batchnorm_would_count_the_batch_twice():
    """The control: an ordinary BatchNorm2d under checkpoint updates its statistics twice."""
    bn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    torch.utils.checkpoint.checkpoint(bn, x, use_reentrant=False).sum().backward()
    assert int(bn[1].num_batches_tracked) == 2


def test_resnet_eval_mode_uses_running_stats():
    cfg = get_config("resnet-tiny")
    m = build_model(cfg, "every").eval()
    x, _ = image_batch(cfg)
    before = [b.clone() for b in m.buffers()]
    with torch.no_grad():
        out = m(x)
    assert out.shape == (4, cfg.num_classes)
    assert all(torch.equal(a, b) for a, b in zip(before, m.buffers()))
    assert F.softmax(out, -1).sum(-1).allclose(torch.ones(4))


def test_resnet_config_and_mlp_config_defaults_build():
    assert isinstance(build_model(ResNetConfig(channels=4, depth=1, image_size=4)), ResNet)
    assert isinstance(build_model(MLPConfig(width=8, depth=2)), MLPChain)
