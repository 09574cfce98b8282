"""The source articles' formulas as they stand and corrected (lesson 9's audit)."""
import pytest

from ckpt_lab import formulas as F
from ckpt_lab.lessons import audit


def test_article_a_as_stated_and_corrected():
    assert audit.article_saving_fraction(48, 8) == pytest.approx(0.8333, abs=1e-4)
    a = F.megatron_layer_bytes(2048, 1, 4096, 32)
    corrected = audit.corrected_saving_fraction(48, 8, a, 2 * 2048 * 4096)
    assert 0.86 < corrected < 0.875  # 1 - 6/48 - 7 b / (48 a)
    with pytest.raises(ValueError):
        audit.article_saving_fraction(0, 1)


def test_article_b_as_stated_and_corrected():
    mib = 1024 * 1024
    args = (100, 8, 512, 1024)
    assert audit.article_mem_no_ckpt(*args) == 800 * mib == 838_860_800
    assert audit.article_mem_ckpt(*args) == 104 * mib  # (10 + 1) + 2 tensors of 8 MiB
    assert audit.article_printed_ckpt(*args) == pytest.approx(10.4)  # the extra / 10
    assert audit.article_claimed_ckpt(*args) == 80 * mib
    assert audit.corrected_mem_ckpt(*args) == 152 * mib  # 9 kept inputs + a 10-layer segment
    assert 1 - audit.corrected_mem_ckpt(*args) / audit.article_mem_no_ckpt(*args) == pytest.approx(0.81)
