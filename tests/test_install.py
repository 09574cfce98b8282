"""The course as a learner gets it: a wheel built from this repository (not editable), installed
into an environment like Colab's (ipywidgets 7.7.1 and its 7.x companions), used from a folder
outside the repository.

To stay fast the environment is a venv whose own site-packages (the wheel, ipywidgets 7.7.1)
come first and whose `.pth` file then adds the main environment's site-packages, so torch,
numpy and matplotlib are reused rather than installed again.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.1.0"


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """(python, bin folder, work folder) of a Colab-like environment holding the built wheel."""
    tmp = tmp_path_factory.mktemp("colab_like")
    src = tmp / "src"                     # a clean copy, so no stale build/ leaks into the wheel
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "artifacts", "build", "*.egg-info", "__pycache__", "_site",
        "notebooks", "benchmarks", "tests", ".ipynb_checkpoints"))
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
          "-w", str(tmp / "dist"), str(src)])
    wheel, = (tmp / "dist").glob("ckpt_lab-*.whl")

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
                .stdout.strip())
    main = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz_main_environment.pth").write_text("\n".join(sorted(main)) + "\n")
    _run([py, "-m", "pip", "install", "--quiet", "--no-deps", "--ignore-installed",
          "-r", str(ROOT / "tests" / "colab_like.txt"), str(wheel)])
    work = tmp / "work"
    work.mkdir()
    return py, venv / "bin", work, wheel


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return dict(env, MPLBACKEND="Agg")


def test_wheel_is_named_for_the_version_and_carries_the_corpus(colab):
    import zipfile
    *_, wheel = colab
    assert wheel.name == f"ckpt_lab-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        assert z.read("ckpt_lab/corpus/stdlib_sample.txt") == \
            (ROOT / "data" / "stdlib_sample.txt").read_bytes()
        assert "PSF" in z.read("ckpt_lab/corpus/README.md").decode() or \
            "Python Software Foundation" in z.read("ckpt_lab/corpus/README.md").decode()


def test_every_explorer_works_from_the_wheel_under_ipywidgets_7(colab):
    py, _, work, _ = colab
    out = _run([py, str(ROOT / "tests" / "colab_like_driver.py")], cwd=work, env=_env())
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["ipywidgets"] == "7.7.1"
    assert str(work.parent / "venv") in report["ckpt_lab_file"]          # the wheel, not the repo
    assert report["sample_sha256"] == hashlib.sha256(
        (ROOT / "data" / "stdlib_sample.txt").read_bytes()).hexdigest()   # the same bytes
    assert sorted(report["explorers"]) == report["all_explorers"]         # every explorer
    for name, r in report["explorers"].items():
        assert r["before"] != r["after"], name                           # the slider moved it
    assert report["data_cli_wrote"] == ["stdlib_sample.txt"]             # into the cwd ...
    assert report["package_files"] == ["stdlib_sample.txt"]              # ... not the package


def test_installed_requirements_hold_and_the_cli_names_itself(colab):
    py, bin_dir, work, _ = colab
    check = _run([py, "-c", "from importlib import metadata; from packaging.requirements import "
                  "Requirement; import sys\n"
                  "bad = [r for r in map(Requirement, metadata.requires('ckpt-lab')) if not r.marker "
                  "and metadata.version(r.name) not in r.specifier]\n"
                  "print(bad); sys.exit(bool(bad))"], cwd=work, env=_env())
    assert check.stdout.strip() == "[]"
    usage = _run([bin_dir / "ckpt-lab", "plan", "--help"], cwd=work, env=_env()).stdout
    assert usage.startswith("usage: ckpt-lab plan ")
    table = _run([bin_dir / "ckpt-lab", "plan", "--layers", "4", "--hidden", "256", "--heads", "4",
                  "--seq", "128", "--device-memory", "8GB"], cwd=work, env=_env()).stdout
    assert "GiB" in table or "MiB" in table
