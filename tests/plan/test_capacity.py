"""Capacity planner and the `python -m ckpt_lab plan` CLI; its layer formula for current
architectures (fused attention, GQA, SwiGLU) held to a measured tiny Llama."""
import math
from pathlib import Path
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F_nn
from torch import nn

from ckpt_lab import formulas as F
from ckpt_lab import track_memory
from ckpt_lab.__main__ import main
from ckpt_lab.plan.capacity import (ARCHITECTURES, TransformerConfig, cheapest, parse_bytes,
                               plan_table, step_flops, strategy_rows)

SMALL = TransformerConfig(layers=24, hidden=1024, heads=16, seq=2048, micro_batch=8)


def test_rows_follow_the_formulas():
    rows = strategy_rows(SMALL, parse_bytes("24GiB"))
    first = {r.strategy: r for r in rows if r.accumulation_steps == 1}
    layer = F.megatron_layer_bytes(2048, 8, 1024, 16)
    extra = 2048 * 8 * 1024 * (1 + 2 * 2) + 4 * 2048 * 8 * 50257
    assert first["none"].activation_bytes == 24 * layer + extra
    assert first["selective"].activation_bytes == 24 * F.megatron_layer_bytes(
        2048, 8, 1024, 16, selective=True) + extra
    assert first["none"].model_state_bytes == 16 * SMALL.num_params
    assert first["segments of 1 block"].activation_bytes < first["segments of 8 blocks"].activation_bytes \
        < first["none"].activation_bytes
    assert first["none"].recompute_overhead == 0 < first["selective"].recompute_overhead \
        < first["segments of 1 block"].recompute_overhead < first["recursive"].recompute_overhead
    # accumulation halves the micro-batch and with it every activation term
    assert {r.micro_batch for r in rows} == {8, 4, 2, 1}


def test_segments_of_k_blocks_recompute_what_the_glossary_says():
    """docs/glossary.md#segments-of-k-blocks: the planner leaves the last group of k blocks
    uncheckpointed (L - k blocks re-run, as checkpoint_sequential runs them), while the models'
    policy "every:k" checkpoints every group, the last included."""
    from ckpt_lab.training.models import build_model, get_config
    rows = {r.strategy: r for r in strategy_rows(SMALL, parse_bytes("24GiB")) if r.accumulation_steps == 1}
    one_forward = step_flops(SMALL, 8) / 3 - 2 * 8 * 2048 * 1024 * SMALL.vocab   # the blocks' forward
    for k in (1, 2, 4, 8):
        name = "segments of 1 block" if k == 1 else f"segments of {k} blocks"
        assert rows[name].recompute_overhead * step_flops(SMALL, 8) == pytest.approx(
            (24 - k) / 24 * one_forward, rel=1e-12)
    model = build_model(get_config("gpt-cpu", n_layer=4, n_embd=32, n_head=2, block_size=16), policy="every:2")
    blocks = [s for s in model.segments() if s[1] - s[0] == 2]
    assert len(blocks) == 2 and all(checkpointed for _, _, checkpointed in blocks)
    text = (Path(__file__).resolve().parents[2] / "docs" / "glossary.md").read_text()
    entry = text[text.index("### Segments of k blocks"):text.index("### Every k-th block")]
    assert "the last included, so every block is recomputed" in entry and "L − k of the L blocks" in entry


def test_cheapest_fitting_strategy_respects_headroom():
    rows = strategy_rows(SMALL, parse_bytes("24GiB"))
    best = cheapest(rows)
    assert best.fits and best.total_bytes <= 0.85 * parse_bytes("24GiB")
    assert all(r.recompute_overhead >= best.recompute_overhead for r in rows if r.fits)
    tight = strategy_rows(SMALL, parse_bytes("24GiB"), headroom=0.3)
    assert cheapest(tight).recompute_overhead > best.recompute_overhead
    assert cheapest(strategy_rows(SMALL, parse_bytes("1GB"))) is None


def test_table_says_why_nothing_fits():
    big = TransformerConfig(48, 4096, 32, 2048)
    text = plan_table(big, parse_bytes("80GB"))
    assert "nothing fits" in text and "model state" in text
    assert "cheapest that fits" in plan_table(SMALL, parse_bytes("80GB"))


def test_parse_bytes():
    assert parse_bytes("80GB") == 80 * 10**9
    assert parse_bytes("24GiB") == 24 * 2**30
    assert parse_bytes("1.5 MiB") == 3 * 2**19
    assert parse_bytes(1024) == 1024
    for bad in ("eighty", "-3GB", "0GB", 0):
        with pytest.raises(ValueError):
            parse_bytes(bad)


@pytest.mark.parametrize("kwargs", [dict(layers=0), dict(hidden=100, heads=3),
                                    dict(precision="fp64"), dict(optimizer="lion")])
def test_bad_configs(kwargs):
    base = dict(layers=2, hidden=64, heads=4, seq=16)
    with pytest.raises(ValueError):
        TransformerConfig(**{**base, **kwargs})


def test_bad_device_and_headroom():
    with pytest.raises(ValueError, match="device_bytes"):
        strategy_rows(SMALL, 0)
    with pytest.raises(ValueError, match="headroom"):
        strategy_rows(SMALL, 10**9, headroom=1.5)


def test_cli_in_process(capsys):
    assert main(["plan", "--layers", "24", "--hidden", "1024", "--heads", "16", "--seq",
                 "2048", "--micro-batch", "8", "--device-memory", "24GiB", "--precision",
                 "fp32", "--optimizer", "sgd", "--headroom", "0.9"]) == 0
    out = capsys.readouterr().out
    assert "fp32 + sgd" in out and "budget 90%" in out and "recursive" in out
    with pytest.raises(SystemExit):
        main(["plan", "--layers", "2", "--hidden", "30", "--heads", "4", "--seq", "8",
              "--device-memory", "1GB"])
    assert "divisible" in capsys.readouterr().err


def test_cli_refuses_a_depth_it_cannot_table(capsys):
    """The table's work grows with the layers: a bound, said up front, not a hang."""
    with pytest.raises(SystemExit):
        main(["plan", "--layers", "99999999", "--hidden", "64", "--heads", "4", "--seq", "16",
              "--device-memory", "80GB"])
    assert "layers must be at most 10,000" in capsys.readouterr().err


def test_cli_as_a_module():
    out = subprocess.run([sys.executable, "-m", "ckpt_lab", "plan", "--layers", "48",
                          "--hidden", "4096", "--heads", "32", "--seq", "2048",
                          "--micro-batch", "1", "--device-memory", "80GB"],
                         capture_output=True, text=True, check=True).stdout
    assert "segments of 1 block" in out and "every" not in out and "selective" in out and "nothing fits" in out


# --------------------------------------------------------------------- a tiny Llama, measured
class FusedRMSNorm(torch.autograd.Function):
    """RMSNorm keeping only its input and rstd for backward, as fused kernels (Apex,
    TransformerEngine) do; torch's composite CPU `nn.RMSNorm` also keeps x * rstd."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return x * rstd * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat = x * rstd
        g = grad * weight
        gx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        return gx, (grad * xhat).flatten(0, -2).sum(0), None


class TinyLlamaBlock(nn.Module):
    """A Llama-style block: RMSNorm, RoPE, grouped-query attention (eager or SDPA), SwiGLU."""

    def __init__(self, hidden, heads, kv_heads, intermediate, seq, attention, mlp="swiglu"):
        super().__init__()
        self.h, self.a, self.kv, self.hd = hidden, heads, kv_heads, hidden // heads
        self.attention, self.mlp = attention, mlp
        self.n1, self.n2 = nn.Parameter(torch.ones(hidden)), nn.Parameter(torch.ones(hidden))
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)
        if mlp == "swiglu":
            self.gate = nn.Linear(hidden, intermediate, bias=False)
        freqs = 1.0 / 10000 ** (torch.arange(0, self.hd, 2) / self.hd)
        angles = torch.outer(torch.arange(seq).float(), freqs).repeat(1, 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.register_buffer("future", ~torch.tril(torch.ones(seq, seq, dtype=torch.bool)),
                             persistent=False)

    def rope(self, t):
        t1, t2 = t.chunk(2, dim=-1)
        return t * self.cos + torch.cat((-t2, t1), dim=-1) * self.sin

    def forward(self, x):
        B, T, C = x.shape
        h = FusedRMSNorm.apply(x, self.n1, 1e-5)
        q = self.rope(self.q(h).view(B, T, self.a, self.hd).transpose(1, 2))
        k = self.rope(self.k(h).view(B, T, self.kv, self.hd).transpose(1, 2))
        v = self.v(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        if self.attention == "sdpa":
            y = F_nn.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               enable_gqa=self.kv != self.a)
        else:   # Llama's repeat_kv: expand the kv heads to all query heads (a copy)
            k, v = (t[:, :, None].expand(B, self.kv, self.a // self.kv, T, self.hd)
                    .reshape(B, self.a, T, self.hd) for t in (k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
            y = att.masked_fill(self.future, float("-inf")).softmax(-1) @ v
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        h = FusedRMSNorm.apply(x, self.n2, 1e-5)
        if self.mlp == "swiglu":
            return x + self.down(F_nn.silu(self.gate(h)) * self.up(h))
        return x + self.down(F_nn.gelu(self.up(h)))


class TinyLlama(nn.Module):
    """Embedding, blocks, final RMSNorm, untied output projection, cross-entropy."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(TinyLlamaBlock(cfg.hidden, cfg.heads, cfg.kv_heads,
                                                   cfg.intermediate, cfg.seq, cfg.attention,
                                                   cfg.mlp) for _ in range(cfg.layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden))
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, idx, targets):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.out(FusedRMSNorm.apply(x, self.norm, 1e-5))
        return F_nn.cross_entropy(logits.flatten(0, 1), targets.flatten())


def tiny(attention="sdpa", kv_heads=2, mlp="swiglu", layers=2):
    return TransformerConfig(layers=layers, hidden=128, heads=8, seq=64, vocab=256,
                             micro_batch=2, precision="fp32", kv_heads=kv_heads, mlp=mlp,
                             intermediate=352, attention=attention, style="llama")


def test_tiny_llama_has_the_parameters_it_claims_and_a_correct_norm():
    for cfg in (tiny(), tiny(kv_heads=8, mlp="gelu")):
        assert sum(p.numel() for p in TinyLlama(cfg).parameters()) == cfg.num_params
    x = torch.randn(4, 128, dtype=torch.float64, requires_grad=True)
    w = torch.randn(128, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: FusedRMSNorm.apply(a, b, 1e-5), (x, w))
    ref = nn.RMSNorm(128, eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(w)
    assert torch.allclose(ref(x), FusedRMSNorm.apply(x, w, 1e-5))


@pytest.mark.parametrize("attention,kv_heads,mlp", [
    ("sdpa", 2, "swiglu"), ("sdpa", 8, "swiglu"), ("eager", 2, "swiglu"),
    ("eager", 8, "gelu"), ("sdpa", 4, "gelu")])
def test_layer_formula_matches_a_measured_llama_block(attention, kv_heads, mlp):
    """Bytes a block keeps for backward, measured, against `transformer_layer_terms` (fp32):
    within 1% (the formula leaves out the norms' per-token rstd), for each attention/GQA/MLP."""
    torch.manual_seed(0)
    cfg = tiny(attention, kv_heads, mlp, layers=1)
    block = TinyLlama(cfg).blocks[0]
    with track_memory() as mem:
        x = torch.randn(2, 64, 128, requires_grad=True)
        out = block(x)
        saved = mem.current_bytes - out.untyped_storage().nbytes()
    del out
    terms = F.transformer_layer_terms(64, 2, 128, 8, kv_heads, mlp, 352, attention, False, 4)
    assert 1.0 <= saved / sum(terms.values()) <= 1.01, (saved, terms)


def test_gqa_saves_activations_only_with_a_fused_kernel():
    def saved(cfg):
        block = TinyLlama(cfg).blocks[0]
        with track_memory() as mem:
            out = block(torch.randn(2, 64, 128, requires_grad=True))
            return mem.current_bytes - out.untyped_storage().nbytes()
    sbh = 2 * 64 * 128 * 4
    # eager: K and V are repeated to all heads before they are saved, so GQA changes nothing
    assert saved(tiny("eager", 2, layers=1)) == saved(tiny("eager", 8, layers=1))
    # sdpa (enable_gqa): K and V stay at 2 of 8 heads: 2 x 3/4 sbh less
    assert saved(tiny("sdpa", 8, layers=1)) - saved(tiny("sdpa", 2, layers=1)) == 2 * sbh * 3 // 4


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_planner_activations_match_a_measured_tiny_llama(attention):
    """The planner's no-checkpoint activations (layers + final norm, head input and fp32
    log-probabilities) against what a whole tiny Llama keeps after forward and loss."""
    torch.manual_seed(0)
    cfg = tiny(attention)
    model = TinyLlama(cfg)
    idx = torch.randint(0, 256, (2, 64))
    with track_memory() as mem:
        loss = model(idx, idx)
        kept = mem.current_bytes - loss.untyped_storage().nbytes()
    row = strategy_rows(cfg, 2 ** 40)[0]
    assert row.strategy == "none" and row.accumulation_steps == 1
    assert 1.0 <= kept / row.activation_bytes <= 1.01


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_attention_on_cuda_keeps_no_scores():
    """On a GPU in bf16, with PyTorch's FlashAttention kernel (GQA taken as it is): the block
    keeps what the formula says in 2-byte activations, within 3% (statistics, RNG state)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    cfg = tiny("sdpa", 2, layers=1)
    block = TinyLlama(cfg).blocks[0].to("cuda", torch.bfloat16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), track_memory() as mem:
        x = torch.randn(2, 64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        out = block(x)
        saved = mem.current_bytes - out.untyped_storage().nbytes()
    terms = F.transformer_layer_terms(64, 2, 128, 8, 2, "swiglu", 352, "sdpa", False, 2)
    assert 1.0 <= saved / sum(terms.values()) <= 1.03, (saved, terms)


# ------------------------------------------------------- current architectures, by the numbers
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_named_architectures_have_their_published_parameter_counts(name):
    """Within 1% of the released checkpoint's count (in fact exact: the formula counts every
    matrix, bias and norm), including GQA for Llama 2 70B and the Llama 3 models."""
    arch = ARCHITECTURES[name]
    n = TransformerConfig.named(name).num_params
    assert abs(n / arch.params - 1) < 0.01
    assert n == arch.params


def test_named_llamas_are_current_architectures():
    c7, c70 = TransformerConfig.named("llama2-7b"), TransformerConfig.named("llama2-70b")
    assert (c7.mlp, c7.attention, c7.style, c7.dropout, c7.kv_heads) == \
        ("swiglu", "sdpa", "llama", False, 32)
    assert c70.kv_heads == 8 and c70.intermediate == F.swiglu_intermediate(8192, 1.3, 4096)
    assert c7.intermediate == F.swiglu_intermediate(4096) == 11008
    assert TransformerConfig.named("llama2-7b", micro_batch=4).micro_batch == 4
    with pytest.raises(ValueError, match="unknown architecture"):
        TransformerConfig.named("llama9")


def test_default_layer_terms_and_flops_are_megatrons():
    for s, b, h, a in ((2048, 8, 1024, 16), (64, 2, 128, 4)):
        assert sorted(F.transformer_layer_terms(s, b, h, a).values()) == \
            sorted(F.megatron_layer_terms(s, b, h, a).values())
    cfg = TransformerConfig(24, 1024, 16, 2048, micro_batch=8)
    for rec in ("none", "selective"):
        assert step_flops(cfg, 8, rec) == F.transformer_flops(24, 1024, 2048, 8, 50257, rec)


def test_each_option_changes_the_layer_as_it_should():
    s, b, h, a = 4096, 1, 4096, 32
    sbh = s * b * h
    eager = F.transformer_layer_terms(s, b, h, a, dropout=False)
    fused = F.transformer_layer_terms(s, b, h, a, attention="sdpa", dropout=False)
    # fused attention: the a s^2 b softmax output goes, a 4-byte logsumexp per row comes
    assert sum(eager.values()) - sum(fused.values()) == 2 * a * s * s * b - 4 * a * s * b
    # GQA shrinks K and V only with a fused kernel
    assert F.transformer_layer_terms(s, b, h, a, 8, dropout=False) == eager
    gqa = F.transformer_layer_terms(s, b, h, a, 8, attention="sdpa", dropout=False)
    assert sum(fused.values()) - sum(gqa.values()) == 2 * 2 * sbh * 3 // 4
    # SwiGLU: four I-wide tensors instead of two
    swi = F.transformer_layer_terms(s, b, h, a, mlp="swiglu", intermediate=11008, dropout=False)
    assert sum(swi.values()) - sum(eager.values()) == 2 * (4 * 11008 - 2 * 4 * h) * s * b
    # selective recomputation with a fused core can drop only the logsumexp
    rows = {r.strategy: r for r in strategy_rows(TransformerConfig.named("llama2-7b"), 10**12)
            if r.accumulation_steps == 1}
    assert rows["none"].activation_bytes - rows["selective"].activation_bytes == 4 * 32 * 4096 * 32
    assert rows["selective"].recompute_overhead > 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(kv_heads=3), "multiple of kv_heads"), (dict(mlp="relu"), "mlp"),
    (dict(attention="flash2"), "attention"), (dict(style="t5"), "style"),
    (dict(dropout="yes"), "dropout"), (dict(intermediate=0), "intermediate")])
def test_bad_architecture_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransformerConfig(2, 64, 4, 16, **kwargs)


def test_cli_names_an_architecture_and_takes_the_options(capsys):
    assert main(["plan", "--arch", "llama2-70b", "--seq", "2048", "--device-memory", "141GB"]) == 0
    out = capsys.readouterr().out
    assert "68.98B parameters" in out and "64 heads (8 kv)" in out and "seq 2048" in out
    assert main(["plan", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "16",
                 "--kv-heads", "2", "--mlp", "swiglu", "--attention", "sdpa", "--style",
                 "llama", "--dropout", "off", "--device-memory", "1GB"]) == 0
    assert "swiglu MLP 256" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["plan", "--layers", "2", "--device-memory", "1GB"])
    assert "--arch" in capsys.readouterr().err


def test_the_table_states_the_basis_of_recompute_and_both_units_of_the_device():
    """Every recompute percentage says what it is a share of; a GB device size shows its GiB."""
    text = plan_table(SMALL, parse_bytes("141GB"))
    assert "device 141.0 GB = 131.3 GiB" in text
    assert "share of a step's (forward + backward)" in text
    assert text.splitlines()[-1].endswith("of a step's FLOPs")
