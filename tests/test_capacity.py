"""Capacity planner and the `python -m ckpt_lab plan` CLI."""
import subprocess
import sys

import pytest

from ckpt_lab import formulas as F
from ckpt_lab.__main__ import main
from ckpt_lab.capacity import (TransformerConfig, cheapest, parse_bytes, plan_table,
                               strategy_rows)

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
    assert first["every block"].activation_bytes < first["every 8 blocks"].activation_bytes \
        < first["none"].activation_bytes
    assert first["none"].recompute_overhead == 0 < first["selective"].recompute_overhead \
        < first["every block"].recompute_overhead < first["recursive"].recompute_overhead
    # accumulation halves the micro-batch and with it every activation term
    assert {r.micro_batch for r in rows} == {8, 4, 2, 1}


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


def test_cli_as_a_module():
    out = subprocess.run([sys.executable, "-m", "ckpt_lab", "plan", "--layers", "48",
                          "--hidden", "4096", "--heads", "32", "--seq", "2048",
                          "--micro-batch", "1", "--device-memory", "80GB"],
                         capture_output=True, text=True, check=True).stdout
    assert "every block" in out and "selective" in out and "nothing fits" in out
