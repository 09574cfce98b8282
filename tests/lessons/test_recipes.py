"""docs/recipes.md cannot drift: every code block runs (or, for other tools' configs, is checked
against their sources), every figure equals its formula or the committed JSON it names, and no
other number stands in its prose.

Figures are links whose target is a committed JSON file or ckpt_lab/plan/formulas.py and whose title
says where the number comes from: a key path into the JSON (dots between keys, optionally
`/ divisor`), or a Python expression over `formulas`. The shown number must equal the value
rounded to the digits shown (a fraction such as 4/3 must equal it exactly).
"""
import json
import os
import re
from fractions import Fraction
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ckpt_lab import formulas
from ckpt_lab.training.data import TextBatches, load_corpus
from ckpt_lab.training.models import build_model, get_config

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "recipes.md"
TEXT = PAGE.read_text()

BLOCK = re.compile(r"<!-- test: ([\w-]+) -->\n```(\w+)\n(.*?)```", re.S)
ANY_BLOCK = re.compile(r"```(\w*)\n.*?```", re.S)
FIGURE = re.compile(r'\[([^\]]*\d[^\]]*)\]\(([^) "]+\.(?:json|py)) "([^"]+)"\)')
LINK = re.compile(r"\]\(([^) \"]+)(?: \"[^\"]*\")?\)")
BLOCKS = {name: (lang, code) for name, lang, code in BLOCK.findall(TEXT)}


# ------------------------------------------------------------------------------ the figures
def _shown(text: str):
    """The number a figure shows: 1.33 in '×1.33', Fraction(4, 3) in '×4/3', 10.6 in '10.6 GB'."""
    m = re.search(r"(\d+(?:\.\d+)?)(?:/(\d+))?", text)
    if m.group(2):
        return Fraction(int(m.group(1)), int(m.group(2))), None
    digits = len(m.group(1).split(".")[1]) if "." in m.group(1) else 0
    return float(m.group(1)), digits


def _value(target: str, title: str) -> float:
    if target.endswith(".json"):
        path, _, divisor = title.partition(" / ")
        node = json.loads((PAGE.parent / target).read_text())
        for key in path.split("."):
            node = node[key]
        return node / float(divisor) if divisor else node
    assert target.endswith("ckpt_lab/plan/formulas.py"), target
    return eval(title, {"formulas": formulas})


FIGURES = FIGURE.findall(TEXT)


def test_the_page_has_figures_of_both_kinds():
    kinds = {target.rsplit(".", 1)[-1] for _, target, _ in FIGURES}
    assert kinds == {"json", "py"} and len(FIGURES) >= 15


@pytest.mark.parametrize("text, target, title", FIGURES, ids=[f[0] for f in FIGURES])
def test_every_figure_is_its_formula_or_its_json(text, target, title):
    shown, digits = _shown(text)
    value = _value(target, title)
    if isinstance(shown, Fraction):
        assert abs(value - shown) < 1e-9, (text, value)
    else:
        assert round(value, digits) == shown, (text, value)


def _prose(text: str) -> str:
    """The page without code blocks, inline code, figures, link targets and HTML comments."""
    text = ANY_BLOCK.sub("", text)
    text = re.sub(r"<!--.*?-->", "", text)
    text = FIGURE.sub("", text)
    text = re.sub(r"`[^`]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return text


ALLOWED = re.compile(r"lessons? \d+|GPT-2|H200|FSDP[12]|fp32|bf16|fp16|transformers \d+")


def test_no_other_number_in_the_prose():
    """A number typed into the prose would rot: it must be a figure link (or code)."""
    stray = [m.group(0) for m in re.finditer(r"\S*\d\S*", ALLOWED.sub("", _prose(TEXT)))]
    assert stray == []


def test_every_relative_link_exists_and_the_readme_and_site_link_here():
    for target in LINK.findall(TEXT):
        if not target.startswith("http"):
            assert (PAGE.parent / target.split("#")[0]).exists(), target
    assert "(docs/recipes.md)" in (ROOT / "README.md").read_text()
    from tools import build_site
    assert "docs/recipes.md" in build_site.DOCS                # a page of the site


def test_every_code_block_is_tested():
    assert len(ANY_BLOCK.findall(TEXT)) == len(BLOCK.findall(TEXT)) == len(BLOCKS)
    for lang, code in BLOCKS.values():
        if lang == "python" and "checkpoint" in code and "torch.utils.checkpoint" in code:
            assert "use_reentrant=False" in code


# --------------------------------------------------------------------------- the code blocks
def _gpt():
    cfg = get_config("gpt-tiny", dropout=0.0)
    x, y = TextBatches(load_corpus(), 2, cfg.block_size, seed=0).get(0)
    return build_model(cfg, "none"), x, y


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def _plain(model, x, y):
    model.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    grads = _grads(model)
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _run(name: str, namespace: dict) -> dict:
    lang, code = BLOCKS[name]
    assert lang == "python"
    exec(compile(code, f"recipes.md:{name}", "exec"), namespace)
    return namespace


GPT_PARTS = re.compile(r"# ckpt_lab's GPT: (\S+), (\S+), (\S+);")


class _YourModel(nn.Module):
    """A learner's model with the parts the recipe names (the recipe supplies `forward`)."""

    def __init__(self, embed, blocks, head):
        super().__init__()
        self.embed, self.blocks, self.head = embed, nn.ModuleList(blocks), head


@pytest.mark.parametrize("name", ["blocks", "selective"])
def test_block_checkpointing_recipes_give_the_plain_gradients(name):
    """The recipe's `forward` runs as a real module's method, on the course GPT's parts taken
    by the expressions the recipe's comment names: a wrong attribute on either side fails."""
    gpt, x, y = _gpt()
    loss, grads = _plain(gpt, x, y)
    parts = [eval(expr, {"model": gpt}) for expr in GPT_PARTS.search(BLOCKS["blocks"][1]).groups()]
    forward = _run(name, {})["forward"]
    model = type("YourModel", (_YourModel,), {"forward": forward})(*parts)
    out = model(x, y)
    out.backward()
    assert torch.equal(out.detach(), loss)
    assert all(torch.equal(a, b) for a, b in zip(_grads(gpt), grads))
    assert sum(1 for _ in model.parameters()) == sum(1 for _ in gpt.parameters())


def test_checkpoint_sequential_recipe():
    torch.manual_seed(0)
    layers = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(16, 16), nn.GELU())])
    x = torch.randn(4, 16, requires_grad=True)
    ns = _run("sequential", {"layers": layers, "segments": 4, "x": x})
    assert torch.equal(ns["out"], layers(x))
    ns["out"].sum().backward()
    assert x.grad is not None


def test_compile_memory_budget_recipe():
    import torch._functorch.config as functorch_config
    before = functorch_config.activation_memory_budget
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
    try:
        ns = _run("compile", {"model": model, "x": torch.randn(4, 8)})
        assert functorch_config.activation_memory_budget == 0.5
        assert all(p.grad is not None for p in model.parameters())
        assert ns["compiled"] is not model
    finally:
        functorch_config.activation_memory_budget = before
        torch._dynamo.reset()


def test_save_on_cpu_recipe_gives_the_plain_gradients():
    gpt, x, y = _gpt()
    loss, grads = _plain(gpt, x, y)
    ns = _run("offload", {"model": gpt, "x": x, "targets": y})
    assert torch.equal(ns["loss"].detach(), loss)
    assert all(torch.equal(a, b) for a, b in zip(_grads(gpt), grads))


def test_hugging_face_recipe_checkpoints_without_the_cache():
    from ckpt_lab.lessons import hf
    model = hf.tiny_model("llama", layers=2, hidden=32, heads=4, kv_heads=2, seq=16)
    ids = torch.randint(256, (2, 16), generator=torch.Generator().manual_seed(0))
    plain = model(input_ids=ids, labels=ids).loss
    plain.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    _run("hf", {"model": model})
    assert model.config.use_cache is False
    on = getattr(model, "is_activation_checkpointing", None)
    assert on if on is not None else model.is_gradient_checkpointing
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.equal(loss, plain)
    assert all(torch.equal(p.grad, grads[n]) for n, p in model.named_parameters())


def test_fsdp2_recipe_wraps_then_shards_in_one_process(monkeypatch):
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FSDPModule
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(29500 + os.getpid() % 1000))
    from ckpt_lab.lessons import hf
    model = hf.tiny_model("llama", layers=2, hidden=32, heads=4, kv_heads=2, seq=16)
    model.config.use_cache = False
    ids = torch.randint(256, (2, 16), generator=torch.Generator().manual_seed(0))
    expected = model(input_ids=ids, labels=ids).loss.detach()
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        _run("fsdp", {"model": model})          # a real Hugging Face Llama, its own attributes
        assert all(isinstance(b, CheckpointWrapper) and isinstance(b, FSDPModule)
                   for b in model.model.layers)
        assert isinstance(model, FSDPModule)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        assert torch.equal(loss.detach(), expected)
        assert all(p.grad is not None for p in model.parameters())
    finally:
        dist.destroy_process_group()


def test_alloc_conf_recipe_sets_expandable_segments():
    lang, code = BLOCKS["alloc-conf"]
    assert lang == "bash"
    assignment = code.split()[0]
    name, _, value = assignment.partition("=")
    assert name == "PYTORCH_CUDA_ALLOC_CONF"
    assert dict(kv.split(":") for kv in value.split(",")) == {"expandable_segments": "True"}
    from benchmarks import gpu_check
    assert gpu_check.ALLOC_CONF == name          # the GPU check measures this very setting


def test_chunked_cross_entropy_recipe_is_the_models_loss():
    """On a real Hugging Face Llama (h: what its final norm receives), and the GPT's final norm
    the recipe's comment names."""
    from ckpt_lab.lessons import hf
    model = hf.tiny_model("llama", layers=2, hidden=32, heads=4, kv_heads=2, seq=16)
    ids = torch.randint(256, (2, 16), generator=torch.Generator().manual_seed(0))
    seen = {}
    model.model.norm.register_forward_hook(lambda m, args, out: seen.update(h=args[0]))
    logits = model(input_ids=ids, use_cache=False).logits
    ns = _run("chunked", {"model": model, "h": seen["h"], "targets": ids})
    torch.testing.assert_close(ns["loss"], F.cross_entropy(logits.flatten(0, 1), ids.flatten()),
                               rtol=1e-5, atol=1e-7)
    gpt, x, y = _gpt()
    h = x
    for layer in gpt.layers()[:-1]:
        h = layer(h)
    norm = re.search(r"ckpt_lab's GPT: (\S+)\)", BLOCKS["chunked"][1]).group(1)
    torch.testing.assert_close(eval(norm, {"model": gpt})(h) @ gpt.chain[-1].out.weight.T, gpt(x))


# --------------------------------------------------------------- the words around the figures
def _paragraph(key: str) -> str:
    """The paragraph of the page whose figures name `key`."""
    return next(p for p in TEXT.split("\n\n") if key in p)


GPU = json.loads((ROOT / "benchmarks" / "results" / "gpu" / "gpu_check.json").read_text())
FULL, EARLY_STOP, SWIGLU = "(10**9, 10**6, 1.0)", "(10**9, 10**6, 2 / 3)", "(10**9, 10**6, 7 / 9)"


def test_segments_of_two_blocks_are_named_as_segments_and_re_run_every_block():
    policies = GPU["policies"]["policies"]
    # ckpt_lab's every:2 checkpoints each pair, the last included: every block is re-run
    assert policies["every:2"]["recompute_flops"] == policies["every"]["recompute_flops"]
    words = " ".join(_paragraph("every:2.peak_ratio").split())
    assert "Segments of two blocks" in words and "still re-run every block" in words
    assert "every:2.flop_ratio" in words                 # the same recompute, shown
    assert not re.search(r"every (second|2nd|other) block keeps", " ".join(TEXT.split()))


def test_each_price_of_checkpointing_every_block_states_its_condition():
    for paragraph in TEXT.split("\n\n"):
        words = " ".join(paragraph.split())
        if FULL in words:
            assert "with dropout" in words, words[:80]
        if EARLY_STOP in words or SWIGLU in words:
            assert "early stop" in words and ("no dropout" in words or "without it" in words)
        if EARLY_STOP in words:        # each figure names the MLP it holds for
            assert "GPT" in words and SWIGLU in words and "SwiGLU" in words
    assert sum(EARLY_STOP in p for p in TEXT.split("\n\n")) >= 2      # blocks and Hugging Face
    assert "most LLMs" not in TEXT


def test_early_stop_without_dropout_skips_each_blocks_down_projection():
    """The 2/3 behind +22%: with torch's default early stop and no dropout the recompute stops
    before the MLP's down projection, 8 B s h^2 of a block's 24 B s h^2 + 4 B s^2 h."""
    from torch.utils.flop_counter import FlopCounterMode
    cfg = get_config("gpt-tiny", dropout=0.0)
    x, y = TextBatches(load_corpus(), 2, cfg.block_size, seed=0).get(0)

    def step_flops(model, early=True):
        with torch.utils.checkpoint.set_checkpoint_early_stop(early), \
                FlopCounterMode(display=False) as counter:
            model(x, y).backward()
        return counter.get_total_flops()
    plain = step_flops(build_model(cfg, "none"))
    model = build_model(cfg, "none")
    model.set_policy("every", impl="torch")
    b, s, h, n = x.size(0), cfg.block_size, cfg.n_embd, cfg.n_layer
    layer, down = 24 * b * s * h ** 2 + 4 * b * s ** 2 * h, 8 * b * s * h ** 2
    assert step_flops(model, early=False) - plain == n * layer
    assert step_flops(model) - plain == n * (layer - down)


def test_early_stop_without_dropout_skips_two_ninths_of_a_swiglu_block():
    """The 7/9 behind +26%: in a Llama block (SwiGLU, intermediate i = 8h/3, as many key/value
    heads as heads) the weight matmuls are 2 B s (4 h^2 + 3 h i) = 24 B s h^2 forward and the down
    projection 2 B s h i of them, two ninths; the recompute of HF's switch skips it. (On CPU,
    FlopCounterMode counts no FLOPs for SDPA's attention kernel.)"""
    from torch.utils.flop_counter import FlopCounterMode
    from ckpt_lab.lessons import hf
    b, s, h, n = 2, 16, 48, 2
    model = hf.tiny_model("llama", layers=n, hidden=h, heads=4, kv_heads=4, seq=s)
    ids = torch.randint(256, (b, s), generator=torch.Generator().manual_seed(0))

    def step_flops():
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        return counter.get_total_flops()
    plain = step_flops()
    model.config.use_cache = False
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    i = model.config.intermediate_size
    layer, down = 2 * b * s * (4 * h * h + 3 * h * i), 2 * b * s * h * i
    assert i == 8 * h // 3 and Fraction(down, layer) == Fraction(2, 9)
    assert step_flops() - plain == n * (layer - down)


def test_fragmentation_is_what_the_gpu_check_records_not_what_the_json_holds():
    section = TEXT.split("## Allocator fragmentation")[1].split("\n## ")[0]
    words = " ".join(section.split())
    assert "The GPU check (`scripts/gpu_check.sh`) records" in words
    # the committed run predates the fragmentation record: the page must say so, until a GPU
    # run adds it (then this fails and the sentence goes)
    assert ("fragmentation" in GPU) != ("predates it" in words)


def test_trainer_switch_names_are_the_pinned_transformers_fields():
    """The Trainer's switch is named as the pinned transformers names it; the old names are
    given as what they are (deprecated aliases), not as the way to do it."""
    import dataclasses
    from transformers import TrainingArguments
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    words = " ".join(_paragraph("## Hugging Face").split()) + " " + " ".join(
        _paragraph("With the `Trainer`").split())
    named = set(re.findall(r"`((?:activation|gradient)_checkpointing(?:_kwargs)?)=", words))
    assert named == {"activation_checkpointing", "activation_checkpointing_kwargs"}
    assert named <= fields and {"gradient_checkpointing", "gradient_checkpointing_kwargs"} <= fields
    assert "deprecated aliases" in words


def test_sqrt_l_segments_come_with_their_condition():
    words = " ".join(TEXT.split("## A chain of layers")[1].split("\n## ")[0].split())
    assert "best only when each layer keeps about what it passes on" in words
    assert "transformer blocks keep far more than they pass on" in words


def test_the_compile_budget_warns_that_the_peak_can_rise():
    words = " ".join(TEXT.split("## Under `torch.compile`")[1].split("\n## ")[0].split())
    assert "can peak higher" in words and "measure each peak" in words
