"""docs/recipes.md's switches for other stacks, run as the page writes them where they run here
(Accelerate, PyTorch Lightning, PEFT), checked against their sources where they do not
(DeepSpeed, Megatron-LM, torchtune).

A run builds a tiny Hugging Face Llama, takes plain autograd's loss and gradients, applies the
page's block unchanged, and asks for three things: the same loss and gradients bitwise (CPU,
fp32, no dropout), every decoder layer run a second time in backward (so the switch is on:
equal gradients alone would also hold for a switch that did nothing), and, for the sharded
runs, one process with a gloo group of its own that the test ends.

The packages are pinned in requirements.txt, which CI installs, so these tests run there;
`test_every_pinned_package_is_installed` fails rather than let them skip. They skip, saying
why, only where a package is absent (a plain `pip install .`).
"""
import ast
import importlib
import importlib.metadata
import itertools
import os
import re
import shlex
from pathlib import Path

import pytest
import torch
from test_recipes import BLOCKS, TEXT, _run

ROOT = Path(__file__).resolve().parents[2]
PINS = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#"))
STACKS = {"accelerate": "accelerate", "lightning": "lightning", "peft": "peft"}   # dist: module


def _need(dist: str):
    """The stack's module, or a skip that says how to install it."""
    return pytest.importorskip(
        STACKS[dist], reason=f"{dist} is not installed (pip install -r requirements.txt pins "
                             f"{dist}=={PINS[dist]}; pip install '.[test]' installs it too)")


# ------------------------------------------------------------------------------ versions
def test_every_pinned_package_is_installed():
    """CI installs requirements.txt: a stack test there must run, never skip."""
    missing = []
    for dist in PINS:
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(dist)
    for dist, module in STACKS.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    assert missing == [], f"pip install -r requirements.txt (missing: {missing})"


def test_each_tested_stack_names_the_version_it_pins():
    """The page's "written for `pkg==X`" is the version requirements.txt pins and CI runs."""
    stated = dict(re.findall(r"Written for `([\w-]+)==([\w.]+)`", TEXT))
    for dist in (*STACKS, "transformers", "torch"):
        assert stated.get(dist) == PINS[dist], (dist, stated.get(dist), PINS[dist])
    pyproject = (ROOT / "pyproject.toml").read_text()
    test_extra = pyproject.split("test = [")[1].split("]")[0]
    for dist in STACKS:
        assert re.search(rf'"{dist}>=[\d.]+(,<[\d.]+)?"', test_extra), dist


def test_untested_stacks_say_so_and_cite_their_documentation():
    for heading in ("## DeepSpeed", "## Megatron-LM", "## torchtune"):
        section = TEXT.split(heading)[1].split("\n## ")[0]
        assert "Untested here" in section, heading
        assert re.search(r"`[\w-]+==\d+\.\d+\.\d+`", section), heading     # the version
        assert "](https://" in section, heading                            # its docs, cited


# ------------------------------------------------------------------------------ the model
def _llama(dropout=None):
    from ckpt_lab.lessons import hf
    model = hf.tiny_model("llama", layers=2, hidden=32, heads=4, kv_heads=2, seq=16,
                          dropout=dropout)
    model.config.use_cache = False
    return model


IDS = torch.randint(256, (2, 16), generator=torch.Generator().manual_seed(0))


def _plain(model, seed=1):
    torch.manual_seed(seed)
    loss = model(input_ids=IDS, labels=IDS).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _count_runs(model):
    """Forward runs of each decoder layer's first norm: one per step plain, two checkpointed."""
    runs = []
    for layer in model.model.layers:
        layer.input_layernorm.register_forward_hook(lambda m, a, o: runs.append(m))
    return runs


def _full(grad):
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def _grads_by_name(named_parameters):
    """Gradients keyed as in the unwrapped model (checkpoint_wrapper adds a name part)."""
    return {n.replace("_checkpoint_wrapped_module.", ""): _full(p.grad)
            for n, p in named_parameters if p.grad is not None}


def _same(grads, expected):
    assert grads.keys() == expected.keys()
    return [n for n in expected if not torch.equal(grads[n], expected[n])]


@pytest.fixture
def one_process(monkeypatch):
    """The environment `torchrun --nproc_per_node=1` gives a script; restored, group ended."""
    import torch.distributed as dist
    saved, threads = dict(os.environ), torch.get_num_threads()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(30500 + os.getpid() % 1000))
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                        "LOCAL_WORLD_SIZE": "1", "OMP_NUM_THREADS": str(threads)}.items():
        monkeypatch.setenv(name, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------ Accelerate
def _accelerate_on_cpu(monkeypatch):
    """Accelerate takes its FSDP path only on an accelerator (on a CPU it wraps in DDP):
    `Accelerator` here sets its state to FSDP, so `prepare` runs its FSDP2 code unchanged."""
    import accelerate
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    class FSDPOnCPU(accelerate.Accelerator):
        def __init__(self, *args, fsdp_plugin=None, **kwargs):
            super().__init__(*args, fsdp_plugin=fsdp_plugin, **kwargs)
            self.state.distributed_type = DistributedType.FSDP
            self.state.fsdp_plugin = fsdp_plugin

    monkeypatch.setattr(accelerate, "Accelerator", FSDPOnCPU)
    return lambda: AcceleratorState._reset_state(reset_partial_state=True)


def _accelerate_step(monkeypatch, block_namespace_of, dropout=None):
    """(loss, gradients, layer runs, plain loss, plain gradients) of an Accelerate block."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    reset = _accelerate_on_cpu(monkeypatch)
    model = _llama(dropout)
    loss0, grads0 = _plain(model)
    runs = _count_runs(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    try:
        ns = block_namespace_of({"model": model, "optimizer": optimizer})
        model, accelerator = ns["model"], ns["accelerator"]
        assert all(isinstance(layer, CheckpointWrapper) for layer in model.model.layers)
        torch.manual_seed(1)
        loss = model(input_ids=IDS, labels=IDS).loss
        accelerator.backward(loss)
        return loss.detach(), _grads_by_name(model.named_parameters()), runs, loss0, grads0
    finally:
        reset()


def test_accelerate_plugin_checkpoints_each_layer_with_the_plain_gradients(monkeypatch,
                                                                           one_process):
    _need("accelerate")
    loss, grads, runs, loss0, grads0 = _accelerate_step(
        monkeypatch, lambda ns: _run("accelerate", ns))
    assert torch.equal(loss, loss0)
    assert _same(grads, grads0) == []
    assert len(runs) == 2 * 2                      # two layers, each run again in backward


def _config_file_plugin(tmp_path, monkeypatch):
    """The plugin `accelerate launch --config_file` builds from the page's YAML: launch's own
    parser and environment, then the plugin reading that environment in the training script."""
    from accelerate import FullyShardedDataParallelPlugin
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env
    lang, code = BLOCKS["accelerate-config"]
    assert lang == "yaml"
    config = tmp_path / "fsdp2.yaml"
    config.write_text(code)
    args = launch_command_parser().parse_args(["--config_file", str(config), "train.py"])
    args, _, _ = _validate_launch_command(args)
    for name, value in prepare_multi_gpu_env(args).items():
        if name.startswith(("FSDP_", "ACCELERATE_USE_FSDP")):
            monkeypatch.setenv(name, value)
    return FullyShardedDataParallelPlugin()


def test_accelerate_config_file_turns_on_the_same_switch(tmp_path, monkeypatch, one_process):
    _need("accelerate")
    plugin = _config_file_plugin(tmp_path, monkeypatch)
    assert plugin.activation_checkpointing is True and plugin.fsdp_version == 2

    def prepare(ns):
        import accelerate
        ns["accelerator"] = accelerate.Accelerator(fsdp_plugin=plugin)
        ns["model"], _ = ns["accelerator"].prepare(ns["model"], ns["optimizer"])
        return ns
    loss, grads, runs, loss0, grads0 = _accelerate_step(monkeypatch, prepare)
    assert torch.equal(loss, loss0) and _same(grads, grads0) == [] and len(runs) == 4


def test_accelerate_fsdp2_switch_does_not_replay_dropout(monkeypatch, one_process):
    """Its FSDP2 path wraps with preserve_rng_state=False: with attention dropout the recompute
    draws other masks than the forward did, and every weight's gradient comes out different
    (the loss, computed in the forward, is the same). The page says so."""
    _need("accelerate")
    loss, grads, runs, loss0, grads0 = _accelerate_step(
        monkeypatch, lambda ns: _run("accelerate", ns), dropout=0.5)
    assert torch.equal(loss, loss0) and len(runs) == 4
    differ = _same(grads, grads0)
    inside = [n for n in grads0 if ".layers." in n]
    assert set(inside) <= set(differ)
    section = " ".join(TEXT.split("## Accelerate")[1].split("\n## ")[0].split())
    assert "preserve_rng_state=False" in section and "the gradients are wrong" in section


# ------------------------------------------------------------------------------ Lightning
def test_lightning_fsdp_strategy_policy_wraps_each_layer_with_the_plain_gradients():
    """What runs here: the page's strategy, its policy applied by Lightning's own function (the
    one `FSDPStrategy` calls after sharding) to an unsharded model. The sharded run needs a GPU,
    and Lightning says so for `accelerator="cpu"`."""
    _need("lightning")
    from lightning.fabric.strategies.fsdp import _setup_activation_checkpointing
    from lightning.pytorch import Trainer
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    model = _llama()
    loss0, grads0 = _plain(model)
    runs = _count_runs(model)
    strategy = _run("lightning-fsdp", {"Layer": type(model.model.layers[0])})["strategy"]
    _setup_activation_checkpointing(model, strategy._activation_checkpointing_kwargs)
    assert all(isinstance(layer, CheckpointWrapper) for layer in model.model.layers)
    loss, grads = _plain(model)
    assert torch.equal(loss, loss0)
    assert _same({n.replace("_checkpoint_wrapped_module.", ""): g for n, g in grads.items()},
                 grads0) == []
    assert len(runs) == 4
    with pytest.raises(ValueError, match="requires a GPU accelerator"):
        Trainer(accelerator="cpu", devices=1, strategy=strategy)


def test_lightning_model_parallel_hook_runs_a_step_with_the_plain_gradients(one_process):
    _need("lightning")
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import ModelParallelStrategy
    model = _llama()
    loss0, grads0 = _plain(model)
    runs = _count_runs(model)
    configure_model = _run("lightning-model-parallel", {})["configure_model"]

    class Module(pl.LightningModule):
        def __init__(self, model):
            super().__init__()
            self.model, self.seen = model, {}

        def training_step(self, batch, index):
            torch.manual_seed(1)
            loss = self.model(input_ids=batch, labels=batch).loss
            self.seen["loss"] = loss.detach()
            return loss

        def on_before_optimizer_step(self, optimizer):
            self.seen["grads"] = _grads_by_name(self.model.named_parameters())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    module = type("YourModule", (Module,), {"configure_model": configure_model})(model)
    trainer = pl.Trainer(accelerator="cpu", devices=1, strategy=ModelParallelStrategy(),
                         max_steps=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(list(IDS), batch_size=len(IDS)))
    assert torch.equal(module.seen["loss"], loss0)
    assert _same(module.seen["grads"], grads0) == []
    assert len(runs) == 4


# ------------------------------------------------------------------------------ PEFT
def test_peft_lora_under_the_models_switch_gives_the_adapters_their_plain_gradients():
    _need("peft")
    from peft import LoraConfig, get_peft_model
    model = _run("peft", {"model": _llama()})["model"]
    assert model.base_model.model.is_activation_checkpointing
    plain = get_peft_model(_llama(), LoraConfig(r=16, lora_alpha=32,
                                                 target_modules=["q_proj", "v_proj"]))
    adapters = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():         # B starts at zero, which would leave A without a gradient
        for name, p in adapters.items():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
            plain.get_parameter(name).copy_(p)
    loss0, grads0 = _plain(plain)
    runs = _count_runs(model.base_model.model)
    loss, grads = _plain(model)
    assert torch.equal(loss, loss0)
    assert grads.keys() == adapters.keys() and _same(grads, grads0) == []
    assert all(grads[n].abs().sum() > 0 for n in grads)
    assert len(runs) == 4


# ------------------------------------------------------------------------------ DeepSpeed
# Names read from deepspeedai/DeepSpeed: ACT_CHKPT_* in
# deepspeed/runtime/activation_checkpointing/config.py (key: default), and the functions and
# `configure`'s parameters in deepspeed/runtime/activation_checkpointing/checkpointing.py.
DEEPSPEED_KEYS = {"partition_activations": False, "number_checkpoints": None,
                  "contiguous_memory_optimization": False,
                  "synchronize_checkpoint_boundary": False, "profile": False,
                  "cpu_checkpointing": False}
DEEPSPEED_FUNCTIONS = {"configure", "checkpoint", "non_reentrant_checkpoint", "reset",
                       "is_configured", "get_cuda_rng_tracker", "model_parallel_cuda_manual_seed"}
DEEPSPEED_CONFIGURE = ("mpu_", "deepspeed_config", "partition_activations",
                       "contiguous_checkpointing", "num_checkpoints", "checkpoint_in_cpu",
                       "synchronize", "profile")


def test_deepspeed_config_uses_deepspeeds_keys_and_a_valid_combination():
    import json
    lang, code = BLOCKS["deepspeed"]
    assert lang == "json"
    section = json.loads(code)["activation_checkpointing"]
    assert section.keys() == DEEPSPEED_KEYS.keys()
    for key, default in DEEPSPEED_KEYS.items():
        assert isinstance(section[key], bool) if default is False else \
            section[key] is None or isinstance(section[key], int), key
    assert section["partition_activations"] and section["cpu_checkpointing"]   # the two named
    if section["contiguous_memory_optimization"]:      # configure() asserts both
        assert section["partition_activations"] and section["number_checkpoints"]


def test_deepspeed_calls_are_deepspeeds():
    lang, code = BLOCKS["deepspeed-api"]
    assert lang == "python"
    calls = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)]
    named = {}
    for call in calls:
        f = call.func
        if isinstance(f, ast.Attribute) and ast.unparse(f.value) == "deepspeed.checkpointing":
            named[f.attr] = call
    assert set(named) == {"configure", "checkpoint"} and set(named) <= DEEPSPEED_FUNCTIONS
    configure = named["configure"]
    assert len(configure.args) <= 1 and {k.arg for k in configure.keywords} <= set(
        DEEPSPEED_CONFIGURE[1:])
    assert len(named["checkpoint"].args) == 2 and not named["checkpoint"].keywords


# ------------------------------------------------------------------------------ Megatron-LM
# _add_training_args in megatron/training/arguments.py (NVIDIA/Megatron-LM).
MEGATRON_FLAGS = {"--recompute-granularity": {"full", "selective"},
                  "--recompute-method": {"uniform", "block"},
                  "--recompute-num-layers": "int", "--recompute-activations": None,
                  "--recompute-modules": {"core_attn", "moe_act", "layernorm", "mla_up_proj",
                                          "mlp", "moe", "shared_experts"},
                  "--distribute-saved-activations": None}


def test_megatron_flags_are_megatrons():
    lang, code = BLOCKS["megatron"]
    assert lang == "bash"
    section = TEXT.split("## Megatron-LM")[1].split("\n## ")[0]
    mentioned = set(re.findall(r"--[\w-]+", section))
    assert mentioned <= set(MEGATRON_FLAGS), mentioned - set(MEGATRON_FLAGS)
    assert {"--recompute-granularity", "--recompute-method", "--recompute-num-layers"} <= \
        set(re.findall(r"--[\w-]+", code))
    methods = set()
    for line in code.splitlines():
        words = line.split("#")[0].split()
        for flag, value in itertools.pairwise(words):
            allowed = MEGATRON_FLAGS.get(flag)
            if isinstance(allowed, set) and flag != "--recompute-modules":
                assert value in allowed, (flag, value)
            elif allowed == "int":
                assert value.isdigit(), (flag, value)
            if flag == "--recompute-method":
                methods.add(value)
    assert methods == {"uniform", "block"}                # both methods shown


# ------------------------------------------------------------------------------ torchtune
# recipes/full_finetune_single_device.py and recipes/configs/llama3_2/ in pytorch/torchtune.
TORCHTUNE_KEYS = {"enable_activation_checkpointing", "enable_activation_offloading"}
TORCHTUNE_CONFIGS = {"full_finetune_single_device": {"llama3_2/1B_full_single_device"}}


def test_torchtune_command_uses_the_recipes_keys():
    lang, code = BLOCKS["torchtune"]
    assert lang == "bash"
    words = shlex.split(code.replace("\\\n", " "))
    assert words[:2] == ["tune", "run"]
    recipe, config = words[2], words[words.index("--config") + 1]
    assert config in TORCHTUNE_CONFIGS[recipe]
    overrides = dict(w.split("=") for w in words if "=" in w)
    assert overrides == {key: "True" for key in TORCHTUNE_KEYS}   # offloading needs both
