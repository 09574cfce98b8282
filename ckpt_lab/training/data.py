"""Data that needs no download: a byte-level corpus of Python stdlib source, and toy images.

The corpus is built from the standard library's own ``.py`` files, which every Python has,
chosen deterministically (sorted names, a fixed number of bytes from each). One fixed sample is
committed as ``data/stdlib_sample.txt`` and shipped inside the wheel (as ``ckpt_lab/corpus/``,
see pyproject.toml), so every install reads the same bytes whatever its Python; rebuild it
with ``python -m ckpt_lab.training.data``. Batches are drawn from a ``torch.Generator`` seeded by
``(seed, step)``, so two runs, or a run resumed at step k, see the same batches.
"""
from __future__ import annotations

import argparse
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

SAMPLE_NAME = "stdlib_sample.txt"
# An installed wheel holds the sample in the package (ckpt_lab/corpus/); a checkout (or an
# editable install) holds the same file in the repository's data/ folder.
_PACKAGE = Path(__file__).resolve().parents[1]
_INSTALLED = _PACKAGE / "corpus" / SAMPLE_NAME
_CHECKOUT = _PACKAGE.parent / "data" / SAMPLE_NAME
SAMPLE_PATH = _INSTALLED if _INSTALLED.exists() else _CHECKOUT
SAMPLE_MAX_BYTES = 262_144
PER_FILE_BYTES = 8_192


# --------------------------------------------------------------------------- the corpus
def stdlib_sources(root: str | os.PathLike | None = None) -> list[Path]:
    """Top-level stdlib modules (``*.py`` not starting with ``_``), sorted by name."""
    root = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory of Python source files")
    return sorted((p for p in root.glob("*.py") if not p.name.startswith("_")),
                  key=lambda p: p.name)


def build_corpus(root: str | os.PathLike | None = None, max_bytes: int = SAMPLE_MAX_BYTES,
                 per_file_bytes: int = PER_FILE_BYTES) -> bytes:
    """The first ``per_file_bytes`` of each stdlib module (whole lines), up to ``max_bytes``.

    Each file's excerpt is preceded by a ``# ---- file: NAME ----`` line. Only ASCII files
    are used, so one byte is one character.
    """
    if max_bytes < 1 or per_file_bytes < 1:
        raise ValueError("max_bytes and per_file_bytes must be positive")
    parts, total, too_big = [], 0, 0
    for path in stdlib_sources(root):
        text = path.read_bytes()
        if not text.isascii():
            continue
        cut = text[:per_file_bytes]
        if len(text) > per_file_bytes and b"\n" in cut:
            cut = cut[:cut.rindex(b"\n") + 1]
        part = f"# ---- file: {path.name} ----\n".encode() + cut
        if not part.endswith(b"\n"):
            part += b"\n"
        if total + len(part) > max_bytes:
            too_big = len(part)
            break
        parts.append(part)
        total += len(part)
    if not parts and too_big:
        raise ValueError(f"the first excerpt ({too_big:,} bytes) is larger than "
                         f"max_bytes={max_bytes:,}; raise max_bytes")
    if not parts:
        raise ValueError(f"no ASCII *.py files found under {root}; pass the stdlib directory")
    return b"".join(parts)


def write_corpus(path: str | os.PathLike, **kwargs) -> Path:
    """Build the corpus and write it atomically to ``path``; returns the path."""
    path = Path(path)
    data = build_corpus(**kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def load_corpus(path: str | os.PathLike | None = None) -> torch.Tensor:
    """The corpus as a 1-D int64 tensor of byte values (vocabulary of 256).

    Without a path it reads the committed sample, the same bytes in a checkout and in an
    installed wheel, never this Python's own standard library. It never downloads.
    """
    if path is None and not SAMPLE_PATH.exists():
        raise ValueError(f"the corpus sample {SAMPLE_PATH} is missing from this install; "
                         "reinstall ckpt-lab from a wheel or the repository (`pip install .`)")
    path = Path(SAMPLE_PATH if path is None else path)
    if not path.exists():
        raise ValueError(f"{path} does not exist; rebuild it with `python -m ckpt_lab.training.data`")
    data = path.read_bytes()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def decode(tokens) -> str:
    """Byte values back to text."""
    return bytes(int(t) for t in tokens).decode("ascii", errors="replace")


def split_corpus(tokens: torch.Tensor, val_fraction: float = 0.1):
    """(train, val): the last ``val_fraction`` of the corpus is held out."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n = int(len(tokens) * (1 - val_fraction))
    return tokens[:n], tokens[n:]


# ------------------------------------------------------------------------------ batches
def _generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


@dataclass
class TextBatches:
    """Random windows of a token stream: ``get(step)`` gives (x, y), y = x shifted by one."""

    tokens: torch.Tensor
    batch_size: int = 8
    block_size: int = 64
    seed: int = 0

    def __post_init__(self):
        if self.tokens.dim() != 1 or len(self.tokens) <= self.block_size + 1:
            raise ValueError(f"need a 1-D token tensor longer than block_size + 1 "
                             f"({self.block_size + 1}), got shape {tuple(self.tokens.shape)}")
        if self.batch_size < 1 or self.block_size < 1:
            raise ValueError("batch_size and block_size must be positive")

    def get(self, step: int):
        """The batch for ``step``: the same on every call and every run."""
        starts = torch.randint(len(self.tokens) - self.block_size - 1, (self.batch_size,),
                               generator=_generator(self.seed, step))
        offsets = torch.arange(self.block_size)
        x = self.tokens[starts[:, None] + offsets]
        y = self.tokens[starts[:, None] + offsets + 1]
        return x, y

    def tokens_per_batch(self) -> int:
        """Tokens in one batch (batch_size * block_size)."""
        return self.batch_size * self.block_size


@dataclass
class ImageBatches:
    """Toy images: class c is noise plus a fixed random pattern for c; ``get(step)`` -> (x, y)."""

    batch_size: int = 16
    image_size: int = 32
    channels: int = 3
    num_classes: int = 10
    noise: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if min(self.batch_size, self.image_size, self.channels, self.num_classes) < 1:
            raise ValueError("batch_size, image_size, channels and num_classes must be positive")
        g = _generator(self.seed, -1)
        self.patterns = torch.randn(self.num_classes, self.channels, self.image_size,
                                    self.image_size, generator=g)

    def get(self, step: int):
        """The batch for ``step``: the same on every call and every run."""
        g = _generator(self.seed, step)
        y = torch.randint(self.num_classes, (self.batch_size,), generator=g)
        x = self.patterns[y] + self.noise * torch.randn(
            self.batch_size, self.channels, self.image_size, self.image_size, generator=g)
        return x, y

    def tokens_per_batch(self) -> int:
        """Images in one batch (what "tokens per second" counts for a conv net)."""
        return self.batch_size


def batches_for(config, batch_size: int, tokens: torch.Tensor | None = None, seed: int = 0):
    """Batches that fit a model config: text for MLP/GPT configs, images for a ResNet config."""
    if hasattr(config, "image_size"):
        return ImageBatches(batch_size, config.image_size, config.in_channels,
                            config.num_classes, seed=seed)
    if tokens is None:
        tokens = split_corpus(load_corpus())[0]
    return TextBatches(tokens, batch_size, config.block_size, seed)


def main(argv=None):
    """Command line: build a corpus sample from this Python's stdlib, into the current folder.

    It never writes into an installed package: the default is ./stdlib_sample.txt; to rebuild
    the repository's sample, run it from the repository root with ``--out data/stdlib_sample.txt``.
    """
    ap = argparse.ArgumentParser(prog="python -m ckpt_lab.training.data",
                                 description=main.__doc__.splitlines()[0])
    ap.add_argument("--out", default=SAMPLE_NAME,
                    help=f"file to write (default: ./{SAMPLE_NAME})")
    ap.add_argument("--root", default=None, help="stdlib directory (default: this Python's)")
    ap.add_argument("--max-bytes", type=int, default=SAMPLE_MAX_BYTES)
    ap.add_argument("--per-file-bytes", type=int, default=PER_FILE_BYTES)
    args = ap.parse_args(argv)
    if _PACKAGE in Path(args.out).resolve().parents:
        ap.error(f"--out {args.out} is inside the installed package; write elsewhere")
    path = write_corpus(args.out, root=args.root, max_bytes=args.max_bytes,
                        per_file_bytes=args.per_file_bytes)
    print(f"wrote {path.stat().st_size:,} bytes to {path}")


if __name__ == "__main__":
    main()
