"""Fine-tuning's model state: LoRA adapters, 4- and 8-bit bases (bitsandbytes), 8-bit and paged
AdamW. Each formula of `formulas` is held to a measurement on this CPU (peft's LoRA on a tiny
Llama built from a config, nothing downloaded; bitsandbytes 0.50 runs its 4-bit, 8-bit and 8-bit
Adam kernels on a CPU), and to the published figures of the LoRA, QLoRA and 8-bit optimizer
papers; `capacity` and `ckpt-lab plan` price the same."""
import subprocess
import sys

import pytest
import torch

from ckpt_lab import capacity, formulas as F, track_memory
from ckpt_lab.lessons import finetune as ft
from oracle import saved_storage_bytes

bnb = pytest.importorskip("bitsandbytes")
pytest.importorskip("peft")
GIB = 2 ** 30


# --------------------------------------------------------------- measured on this CPU
@pytest.mark.parametrize("rank, base_bits, optimizer", [
    (16, 16, "adamw"), (16, 16, "adamw8bit"), (16, 4, "adamw"), (16, 8, "adamw"),
    (8, 4, "paged_adamw8bit")])
def test_peft_lora_model_state_is_the_formula_within_1_percent(rank, base_bits, optimizer):
    measured = ft.measured_state(rank, base_bits, optimizer)
    planned = ft.planned_state(rank, base_bits, optimizer)
    assert abs(measured / planned.total - 1) < 0.01, (measured, planned)
    # the parts are what the formula says: frozen base, fp32 adapters and their gradients
    assert planned.adapters == planned.adapter_grads == 4 * sum(
        F.lora_numels(ft.tiny_shapes()[0], rank))


def test_the_measurement_sees_the_base_and_the_optimizer_change():
    """The 1% above is not slack that hides a part: each change moves the measured state by
    what the formula says it should, within 1% of the change."""
    pairs = [((16, 16, "adamw"), (16, 4, "adamw")),          # 16-bit base -> NF4
             ((16, 16, "adamw"), (16, 16, "adamw8bit"))]     # fp32 Adam -> 8-bit Adam
    for a, b in pairs:
        measured = ft.measured_state(*a) - ft.measured_state(*b)
        planned = ft.planned_state(*a).total - ft.planned_state(*b).total
        assert measured > 0 and abs(measured / planned - 1) < 0.01, (a, b, measured, planned)


def test_eight_bit_adamw_state_tensor_by_tensor():
    """bitsandbytes' AdamW8bit on a CPU: two uint8 states and an fp32 absmax per 256 values
    each; a tensor under 4096 values keeps fp32 states; the two quantisation maps (256 fp32
    each) are shared by every tensor."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*s)) for s in ((256, 64), (300, 70), (8, 64))]
    with track_memory() as mem:
        opt = bnb.optim.AdamW8bit(params, lr=1e-3)
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()
        for p in params:
            p.grad = None
    maps = 2 * 256 * 4
    assert mem.current_bytes == F.optimizer_state_bytes([p.numel() for p in params],
                                                        "adamw8bit") + maps
    assert all(opt.state[p]["state1"].dtype == torch.uint8 for p in params[:2])
    assert opt.state[params[2]]["state1"].dtype == torch.float32


def test_torch_adamw_state_is_two_fp32_states_and_a_step_count():
    model = torch.nn.Linear(64, 32)
    with track_memory() as mem:
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randn(4, 64)).sum().backward()
        opt.step()
        model.zero_grad(set_to_none=True)
    assert mem.current_bytes == F.optimizer_state_bytes([32 * 64, 32], "adamw")


@pytest.mark.parametrize("shape", [(512, 256), (176, 64), (100, 30)])
@pytest.mark.parametrize("bits, double_quant", [(4, True), (4, False), (8, False)])
def test_quantised_weight_bytes_are_what_bitsandbytes_stores(shape, bits, double_quant):
    w = torch.randn(*shape)
    with track_memory() as mem:
        if bits == 4:
            q = bnb.nn.Linear4bit(shape[1], shape[0], bias=False, quant_type="nf4",
                                  compress_statistics=double_quant)
            q.weight = bnb.nn.Params4bit(w.clone(), requires_grad=False, quant_type="nf4",
                                         compress_statistics=double_quant)
        else:
            q = bnb.nn.Linear8bitLt(shape[1], shape[0], bias=False, has_fp16_weights=False)
            q.weight = bnb.nn.Int8Params(w.clone(), requires_grad=False, has_fp16_weights=False)
        q = q.to("cpu")
        del w
    made = mem.current_bytes
    if bits == 4 and double_quant:
        made -= 1024 * (made - F.quantized_weight_bytes(*shape, 4) == 1024)   # a cached map
    assert made == F.quantized_weight_bytes(*shape, bits, double_quant)


def _lora(rank: int = 16):
    """A fresh LoRA config (peft fills a config in when it applies it: never reuse one)."""
    import peft
    return peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                           target_modules="all-linear")


def _saved_bytes(model, x) -> int:
    """Bytes of the distinct tensors autograd saves in a forward under bf16 autocast, the
    model's own parameters (frozen or not, quantised or not) left out."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return saved_storage_bytes(model, input_ids=x)[0]


def test_qlora_keeps_no_dequantised_copy_and_lora_keeps_what_the_planner_adds():
    """bitsandbytes saves the packed 4-bit weight for backward and dequantises again there, so a
    QLoRA forward keeps exactly the activations of LoRA on a bf16 base. Per layer, LoRA under
    autocast keeps more than full training: the adapters' outputs, their 16-bit copies and a
    copy of the input per adapter (`formulas.lora_layer_extra_bytes`), less the outputs of the
    frozen norms, which full training keeps for their weights' gradients and the planner's
    fused norms never count: so the planner's extra reads high, by under a quarter."""
    import peft
    x = torch.randint(0, ft.TINY["vocab_size"], (2, 64))
    full, on_bf16 = {}, {}
    for layers in (2, 3):
        full[layers] = _saved_bytes(ft.tiny_llama(num_hidden_layers=layers), x)
        on_bf16[layers] = _saved_bytes(
            peft.get_peft_model(ft.tiny_llama(num_hidden_layers=layers), _lora()), x)
    on_nf4 = _saved_bytes(peft.get_peft_model(ft.quantize_linears(
        ft.tiny_llama(num_hidden_layers=3), 4), _lora()), x)
    assert on_nf4 == on_bf16[3]
    measured = (on_bf16[3] - on_bf16[2]) - (full[3] - full[2])       # one layer's extra
    shapes = F.transformer_linear_shapes(256, 4, 2, "swiglu", 688)
    planned = F.lora_layer_extra_bytes(x.numel(), shapes, 16, 2)
    assert measured < planned < 1.25 * measured, (measured, planned)


def test_without_autocast_peft_keeps_fp32_copies_of_the_inputs():
    """The trap: a bf16 model with fp32 adapters run without autocast casts each adapted
    layer's input to fp32 and saves that copy: over 20% more kept than under autocast."""
    import peft
    x = torch.randint(0, ft.TINY["vocab_size"], (2, 64))
    model = peft.get_peft_model(ft.tiny_llama(), _lora())
    with_autocast = _saved_bytes(model, x)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=x)
    assert sum(seen.values()) > 1.2 * with_autocast


def test_a_quantised_step_dequantises_one_weight_at_a_time():
    """Each 4-bit matmul dequantises its weight into a temporary and frees it before the next,
    so a step's peak with a 4-bit base stays within one dequantised weight (the formula's
    extra) of the same step on a bf16 base: no copy per layer is kept."""
    import peft
    x = torch.randint(0, ft.TINY["vocab_size"], (2, 32))
    peaks = {}
    for bits in (16, 4):
        model = ft.tiny_llama()
        if bits == 4:
            ft.quantize_linears(model, 4)
        model = peft.get_peft_model(model, _lora())
        with track_memory() as mem, torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=x, labels=x).loss.backward()
        peaks[bits] = mem.peak_bytes
    shapes, _ = ft.tiny_shapes()
    one = F.dequantized_copy_bytes(shapes, 4, compute_bytes=2)
    assert one == 2 * max(o * i for o, i in shapes)
    assert abs(peaks[4] - peaks[16]) <= one, (peaks, one)
    assert F.dequantized_copy_bytes(shapes, 16) == 0


# ------------------------------------------------------------------ published figures
def test_qlora_double_quantisation_saves_0373_bits_about_3_gb_at_65b():
    """Dettmers et al. 2023 (QLoRA), sec. 3: the constants cost 32/64 = 0.5 bits a weight,
    double-quantised 8/64 + 32/(64 x 256) = 0.127, "a reduction of 0.373 bits per parameter",
    about 3 GB for a 65B model."""
    n = 4096 * 4096 * 64                                     # large: the tables do not count
    single = F.quantized_weight_bytes(4096, 4096 * 64, 4, double_quant=False)
    double = F.quantized_weight_bytes(4096, 4096 * 64, 4, double_quant=True)
    assert abs((single * 8 / n - 4) - 0.5) < 1e-4
    assert abs((double * 8 / n - 4) - 0.127) < 5e-4
    assert abs((single - double) * 8 / n - 0.373) < 5e-4
    assert 2.9e9 < (single - double) / n * 65.2e9 < 3.1e9


LLAMA_65B = dict(layers=80, hidden=8192, heads=64, seq=2048, vocab=32000, intermediate=22016,
                 mlp="swiglu", style="llama", attention="sdpa")


def test_qlora_65b_from_over_780_gb_to_under_48_gb():
    """QLoRA's abstract: finetuning LLaMA 65B needs "more than 780 GB" in regular 16-bit
    (16-bit weights and gradients, fp32 Adam: 12 bytes a parameter) and under 48 GB as QLoRA
    (NF4 base, r = 64 adapters on every linear layer, paged AdamW)."""
    cfg = capacity.TransformerConfig(**LLAMA_65B, lora_rank=64, base_bits=4,
                                     optimizer="paged_adamw")
    assert 65.0e9 < cfg.num_params < 65.5e9                 # LLaMA 65B: 65.2B
    assert cfg.num_params * (2 + 2 + 8) > 780e9
    assert cfg.model_state_bytes < 48e9
    # paged: the optimizer's state may leave the GPU while activations peak
    assert cfg.pageable_bytes == cfg.finetune_state().optimizer > 0


def test_lora_gpt3_175b_q_and_v_at_rank_4():
    """Hu et al. 2021 (LoRA), sec. 4.2: GPT-3 175B with r = 4 on the query and value
    projections: a checkpoint of "roughly" 35 MB instead of 350 GB, and training memory of
    350 GB (the frozen fp16 base) instead of 1.2 TB."""
    shapes = [(12288, 12288), (12288, 12288)] * 96
    adapters = sum(F.lora_numels(shapes, 4))
    assert 33e6 < 2 * adapters < 40e6                       # fp16 adapters: 37.7 MB, "35MB"
    gpt3 = capacity.TransformerConfig(layers=96, hidden=12288, heads=96, seq=2048)
    state = F.lora_state_bytes(shapes, gpt3.num_params - 12288 ** 2 * 2 * 96, 4)
    assert abs(state.base / 350e9 - 1) < 0.01 and state.total < 1.01 * state.base


def test_eight_bit_adam_saves_75_percent_of_the_optimizer_state():
    """Dettmers et al. 2022 (8-bit optimizers): 8-bit Adam keeps 2 bytes a parameter where
    32-bit Adam keeps 8, saving 75% (the block constants take 0.4% of it back)."""
    n = [1 << 24]
    saving = 1 - F.optimizer_state_bytes(n, "adamw8bit") / F.optimizer_state_bytes(n, "adamw")
    assert 0.745 < saving < 0.75
    assert F.model_state_per_param("mixed", "adamw8bit").total == pytest.approx(10.03125)


# -------------------------------------------------------------- capacity and the CLI
def test_llama2_7b_on_24_gb_full_lora_qlora():
    """The lesson's question: only adapters fit the state on 24 GB; at sequence 4096 LoRA and
    QLoRA fit only with checkpointing."""
    gpu = capacity.parse_bytes("24GB")
    budget = capacity.DEFAULT_HEADROOM * gpu
    full = capacity.TransformerConfig.named("llama2-7b", micro_batch=1)
    assert full.model_state_bytes > budget
    assert capacity.TransformerConfig.named("llama2-7b", optimizer="adamw8bit"
                                            ).model_state_bytes > budget
    for bits in (16, 4):
        cfg = capacity.TransformerConfig.named("llama2-7b", lora_rank=16, base_bits=bits)
        rows = {r.strategy: r for r in capacity.strategy_rows(cfg, gpu)}
        assert not rows["none"].fits and rows["segments of 1 block"].fits
    qlora = capacity.TransformerConfig.named("llama2-7b", lora_rank=16, base_bits=4)
    assert 3.5 * GIB < qlora.model_state_bytes < 4.5 * GIB


def test_lora_adds_r_wide_outputs_and_a_quantised_base_one_dequantised_weight():
    plain = capacity.TransformerConfig.named("llama2-7b")
    lora = capacity.TransformerConfig.named("llama2-7b", lora_rank=16)
    qlora = capacity.TransformerConfig.named("llama2-7b", lora_rank=16, base_bits=4)
    act = {n: capacity.strategy_rows(c, 2 ** 50)[0].activation_bytes
           for n, c in (("plain", plain), ("lora", lora), ("qlora", qlora))}
    shapes = lora.linear_shapes()
    assert act["lora"] - act["plain"] == 32 * F.lora_layer_extra_bytes(4096, shapes, 16, 2)
    assert act["qlora"] - act["lora"] == 2 * 11008 * 4096


def test_a_paged_optimizer_counts_against_the_state_not_on_top_of_activations():
    cfg = capacity.TransformerConfig.named("llama2-7b", micro_batch=4, lora_rank=16,
                                           optimizer="paged_adamw")
    row = capacity.strategy_rows(cfg, 2 ** 50)[0]
    assert row.total_bytes == row.activation_bytes + row.model_state_bytes - cfg.pageable_bytes
    tiny = capacity.StrategyRow("none", 1, 1, 10, 100, 0.0, True, pageable_bytes=50)
    assert tiny.total_bytes == 100                          # the optimizer's step is the floor


@pytest.mark.parametrize("kwargs, match", [
    (dict(base_bits=4), "give a LoRA rank"),
    (dict(lora_rank=0), "lora_rank must be an int from 1 to 4096"),
    (dict(lora_rank=5000), "lora_rank must be an int from 1 to 4096"),
    (dict(lora_rank=2.5), "lora_rank must be an int"),
    (dict(lora_rank=16, base_bits=3), "base_bits must be one of"),
    (dict(lora_rank=16, precision="fp16-megatron"), "precision must be 'mixed'"),
    (dict(lora_rank=16, base_bits=4, precision="fp32"), "quantised base computes in 16 bits"),
    (dict(optimizer="lion"), "optimizer must be one of"),
])
def test_bad_fine_tuning_options_say_what_to_do(kwargs, match):
    with pytest.raises(ValueError, match=match):
        capacity.TransformerConfig.named("llama2-7b", **kwargs)


def test_formulas_refuse_bad_sizes():
    with pytest.raises(ValueError, match="rank"):
        F.lora_numels([(4, 4)], 0)
    with pytest.raises(ValueError, match="bits"):
        F.quantized_weight_bytes(4, 4, 2)
    with pytest.raises(ValueError, match="numels"):
        F.optimizer_state_bytes([0], "adamw8bit")
    with pytest.raises(ValueError, match="optimizer"):
        F.optimizer_state_bytes([4], "adafactor")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ckpt_lab", "plan", *args],
                          capture_output=True, text=True)


def test_cli_prices_qlora_with_8bit_adam():
    out = _cli("--arch", "llama2-7b", "--lora-rank", "16", "--base-bits", "4", "--optimizer",
               "adamw8bit", "--device-memory", "24GB")
    assert out.returncode == 0, out.stderr
    assert "LoRA r=16 on every block's linear layers, 4-bit frozen base, adamw8bit" in out.stdout
    cfg = capacity.TransformerConfig.named("llama2-7b", lora_rank=16, base_bits=4,
                                           optimizer="adamw8bit")
    assert f"{cfg.model_state_bytes / GIB:.2f}G" in out.stdout
    assert "cheapest that fits: segments of" in out.stdout


@pytest.mark.parametrize("args, match", [
    (("--base-bits", "4"), "give a LoRA rank"),
    (("--lora-rank", "-1"), "lora_rank must be an int from 1"),
    (("--base-bits", "2", "--lora-rank", "8"), "invalid choice"),
    (("--optimizer", "adamw4bit"), "invalid choice"),
])
def test_cli_bounds_its_fine_tuning_inputs(args, match):
    out = _cli("--arch", "llama2-7b", "--device-memory", "24GB", *args)
    assert out.returncode == 2 and match in out.stderr, out.stderr


def test_cli_says_to_try_adapters_when_the_state_alone_does_not_fit():
    out = _cli("--arch", "llama2-7b", "--device-memory", "24GB")
    assert "nothing fits" in out.stdout and "--lora-rank 16" in out.stdout
