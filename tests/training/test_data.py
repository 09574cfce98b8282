"""Data: the committed corpus, the deterministic builder, and seeded batches."""
import hashlib
import re
from pathlib import Path

import pytest
import torch

from ckpt_lab.training.data import (SAMPLE_MAX_BYTES, SAMPLE_PATH, ImageBatches, TextBatches,
                           batches_for, build_corpus, decode, load_corpus, main, split_corpus,
                           stdlib_sources)
from ckpt_lab.training import data as data_module
from ckpt_lab.training.models import get_config


def test_committed_sample_is_small_ascii_python():
    data = SAMPLE_PATH.read_bytes()
    assert 100_000 < len(data) <= SAMPLE_MAX_BYTES
    assert data.isascii()
    assert data.startswith(b"# ---- file: ")
    assert b"def " in data and b"import " in data


def test_load_corpus_is_byte_tokens():
    tokens = load_corpus()
    assert tokens.dtype == torch.int64 and tokens.dim() == 1
    assert len(tokens) == SAMPLE_PATH.stat().st_size
    assert int(tokens.max()) < 128
    assert decode(tokens[:13]) == "# ---- file: "
    with pytest.raises(ValueError, match="python -m ckpt_lab.training.data"):
        load_corpus("/nonexistent/corpus.txt")


def fake_stdlib(tmp_path):
    (tmp_path / "b.py").write_text("import os\n" * 50)
    (tmp_path / "a.py").write_text("x = 1\ny = 2\n")
    (tmp_path / "_private.py").write_text("hidden = True\n")
    (tmp_path / "c.py").write_bytes("s = 'caf\u00e9'\n".encode())   # not ASCII: skipped
    (tmp_path / "notes.txt").write_text("not python\n")
    return tmp_path


def test_build_corpus_is_sorted_cut_at_lines_and_deterministic(tmp_path):
    root = fake_stdlib(tmp_path)
    assert [p.name for p in stdlib_sources(root)] == ["a.py", "b.py", "c.py"]
    text = build_corpus(root, per_file_bytes=25).decode()
    assert text == ("# ---- file: a.py ----\nx = 1\ny = 2\n"
                    "# ---- file: b.py ----\nimport os\nimport os\n")
    assert build_corpus(root, per_file_bytes=25) == build_corpus(root, per_file_bytes=25)
    assert build_corpus(root, max_bytes=40) == b"# ---- file: a.py ----\nx = 1\ny = 2\n"
    with pytest.raises(ValueError, match="not a directory"):
        build_corpus(tmp_path / "missing")
    with pytest.raises(ValueError, match="larger than max_bytes=10; raise max_bytes"):
        build_corpus(root, max_bytes=10)


def test_command_line_rebuild_writes_the_file(tmp_path, capsys):
    (tmp_path / "lib").mkdir()
    root = fake_stdlib(tmp_path / "lib")
    out = tmp_path / "out" / "corpus.txt"
    main(["--root", str(root), "--out", str(out), "--per-file-bytes", "25"])
    assert out.read_bytes() == build_corpus(root, per_file_bytes=25)
    assert "wrote" in capsys.readouterr().out


def test_this_pythons_stdlib_builds_a_corpus():
    data = build_corpus(max_bytes=20_000)
    assert 0 < len(data) <= 20_000 and data.isascii()


def test_text_batches_are_seeded_shifted_and_step_indexed():
    tokens = torch.arange(1000)
    b = TextBatches(tokens, batch_size=4, block_size=8, seed=7)
    x, y = b.get(3)
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    x2, _ = TextBatches(tokens, 4, 8, seed=7).get(3)
    assert torch.equal(x, x2)
    assert not torch.equal(b.get(4)[0], x)
    assert not torch.equal(TextBatches(tokens, 4, 8, seed=8).get(3)[0], x)
    assert b.tokens_per_batch() == 32
    with pytest.raises(ValueError, match="longer than block_size"):
        TextBatches(torch.arange(5), 2, 8)


def test_batches_do_not_touch_the_global_rng():
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    TextBatches(torch.arange(100), 2, 4).get(0)
    ImageBatches(2, 4).get(0)
    assert torch.equal(torch.rand(1), expected)


def test_image_batches_are_seeded_and_learnable():
    b = ImageBatches(batch_size=64, image_size=4, channels=2, num_classes=3, noise=0.1, seed=1)
    x, y = b.get(0)
    assert x.shape == (64, 2, 4, 4) and y.shape == (64,)
    assert torch.equal(x, ImageBatches(64, 4, 2, 3, noise=0.1, seed=1).get(0)[0])
    # with little noise, the nearest class pattern is the label
    dist = ((x[:, None] - b.patterns[None]) ** 2).flatten(2).sum(-1)
    assert torch.equal(dist.argmin(1), y)


def test_split_and_batches_for_configs():
    train, val = split_corpus(torch.arange(100), 0.1)
    assert len(train) == 90 and torch.equal(val, torch.arange(90, 100))
    with pytest.raises(ValueError, match="val_fraction"):
        split_corpus(torch.arange(10), 1.0)
    assert isinstance(batches_for(get_config("gpt-tiny"), 4), TextBatches)
    imgs = batches_for(get_config("resnet-tiny"), 4)
    assert isinstance(imgs, ImageBatches) and imgs.get(0)[0].shape == (4, 3, 8, 8)


def test_a_missing_sample_is_a_clear_error_not_a_rebuild(monkeypatch, tmp_path):
    import ckpt_lab.training.data as data
    monkeypatch.setattr(data, "SAMPLE_PATH", tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="missing from this install"):
        data.load_corpus()


def test_sample_matches_the_checksum_its_readme_states():
    readme = (Path(__file__).resolve().parents[2] / "data" / "README.md").read_text()
    digest = re.search(r"sha256 `([0-9a-f]{64})`", readme).group(1)
    assert hashlib.sha256(SAMPLE_PATH.read_bytes()).hexdigest() == digest


def test_command_line_writes_to_the_current_folder_by_default(tmp_path, monkeypatch, capsys):
    (tmp_path / "lib").mkdir()
    root = fake_stdlib(tmp_path / "lib")
    monkeypatch.chdir(tmp_path)
    main(["--root", str(root), "--per-file-bytes", "25"])
    assert (tmp_path / "stdlib_sample.txt").read_bytes() == build_corpus(root, per_file_bytes=25)
    with pytest.raises(SystemExit):
        main(["--root", str(root), "--out", str(Path(data_module.__file__).parent / "x.txt")])
    assert "inside the installed package" in capsys.readouterr().err
