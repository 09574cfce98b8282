"""Run inside the Colab-like environment (tests/test_install.py), from a folder outside the
repository: the installed wheel's explorers, driven headlessly, and its corpus and CLIs."""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import ipywidgets
import torch
from torch import nn

import ckpt_lab
from ckpt_lab.training import data
from ckpt_lab.lessons import widgets

report = {"ipywidgets": ipywidgets.__version__, "ckpt_lab_file": ckpt_lab.__file__,
          "sample_sha256": hashlib.sha256(data.load_corpus().to(torch.uint8).numpy().tobytes())
          .hexdigest(), "explorers": {}}


def drive(name, explorer, slider, value, field):
    """Set one slider, read the result again: the measurement and the figure must follow."""
    before, png = getattr(explorer.result, field), bytes(explorer.image.value)
    explorer.sliders[slider].value = value
    after = getattr(explorer.result, field)
    assert png.startswith(b"\x89PNG") and bytes(explorer.image.value) != png, name
    report["explorers"][name] = {"before": before, "after": after}


torch.manual_seed(0)
drive("segments_explorer", widgets.segments_explorer(layers=9, segments=3, batch=2, width=32,
                                                     positions=16), "segments", 1, "peak_bytes")
drive("seq_explorer", widgets.seq_explorer(seq=16, batch=2, n_embd=32, n_head=2, max_seq=64,
                                           step=16), "seq_len", 64, "measured_bytes")
torch.manual_seed(0)
chain = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                      nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 64), nn.ReLU(),
                      nn.Linear(64, 8))
plan = widgets.plan_explorer(chain, torch.randn(64, 16), budget_fraction=1.0)
drive("plan_explorer", plan, "budget", plan.sliders["budget"].min, "peak_bytes")
report["all_explorers"] = sorted(n for n in dir(widgets) if n.endswith("_explorer"))

# `python -m ckpt_lab.training.data` writes where it is run, never into site-packages
subprocess.run([sys.executable, "-m", "ckpt_lab.training.data", "--max-bytes", "20000"], check=True,
               capture_output=True)
report["data_cli_wrote"] = sorted(p.name for p in Path.cwd().iterdir())
report["package_files"] = sorted(p.name for p in Path(ckpt_lab.__file__).parent.rglob("*.txt"))
print(json.dumps(report))
