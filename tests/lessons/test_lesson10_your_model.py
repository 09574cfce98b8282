"""Lesson 10 invites a learner's own model: its gradient check runs on a token model too."""
from pathlib import Path
from types import SimpleNamespace

import nbformat
import torch
from torch import nn

from ckpt_lab.training.data import TextBatches, load_corpus
from ckpt_lab.training.models import build_model, get_config

LESSON = Path(__file__).resolve().parents[2] / "notebooks" / "10_your_own_model.ipynb"


def _cell(marker: str) -> str:
    return next(c.source for c in nbformat.read(LESSON, as_version=4).cells if marker in c.source)


def test_gradient_check_runs_on_a_ckpt_lab_gpt_fed_token_ids():
    cfg = get_config("gpt-tiny", dropout=0.1)
    torch.manual_seed(0)
    model = build_model(cfg, "none").train()
    x, _ = TextBatches(load_corpus(), 2, cfg.block_size, seed=0).get(0)
    layers = list(model.layers())
    plan = SimpleNamespace(boundaries=[0, 2])  # the cell applies the lesson's plan
    scope = {"torch": torch, "nn": nn, "model": model, "x": x, "layers": layers, "plan": plan,
             "rng_guess": SimpleNamespace(reveal=lambda: None)}  # the prediction it answers
    exec(_cell("def run_plan(t, starts"), scope)
    plain = scope["gradients"](lambda t: scope["run_plan"](t, [0]))
    planned = scope["gradients"](lambda t: scope["run_plan"](t, [0, 2]))
    assert len(plain) == len(list(model.parameters()))          # token ids take no gradient
    assert all(torch.equal(a, b) for a, b in zip(plain, planned))
    assert scope["same"](scope["planned"])                      # the cell's own verdict


def test_the_lesson_names_containers_its_cells_accept():
    text = _cell("**Your question:**")
    assert "a list of modules" not in text and "`nn.ModuleList`" in text
    model = nn.ModuleList([nn.Linear(4, 4), nn.GELU()])
    assert list(model.to("cpu").train()) and list(model.parameters())
