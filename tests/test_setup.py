"""The set-up files agree with each other, by version and not only by name, and with the README."""
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ckpt_lab import __main__ as cli

ROOT = Path(__file__).resolve().parents[1]
ALIASES = {"pytorch": "torch", "pytorch-cpu": "torch", "playwright-python": "playwright"}
CONDA_ONLY = {"python", "pip"}       # the interpreter and installer, not project packages
SITE = {"sphinx", "myst-nb", "myst-parser", "sphinx-book-theme", "pydata-sphinx-theme",
        "docutils", "sphinx-mathjax-offline"}    # tools/build_site.py; not for Binder
STACKS = {"accelerate", "lightning"}   # tests/lessons/test_recipes_stacks.py; not for Binder
TEST_ONLY = {"pytest", "nbval", "playwright", "ruff"} | SITE | STACKS
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _split(spec: str) -> tuple[str, str]:
    """('name', 'version specifier') of a pip or conda requirement line."""
    spec = spec.split("#")[0].strip()
    m = re.match(r"([A-Za-z0-9_.\-]+)\s*(.*)", spec)
    name, rest = m.group(1).lower().replace("_", "-"), m.group(2).strip()
    # conda: `=2.13.0` means 2.13.0.*; `==`, `>=`, `<` ... read as in pip.
    if re.match(r"=[^=]", rest):
        rest = "==" + rest[1:] + ".*"
    return ALIASES.get(name, name), rest


def pip_specs() -> dict[str, str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return dict(_split(l) for l in lines if l.strip() and not l.startswith("#"))


def conda_specs(path: Path) -> dict[str, str]:
    specs, inside = {}, False
    for line in path.read_text().splitlines():
        if line.startswith("dependencies:"):
            inside = True
        elif inside and line.strip().startswith("- "):
            name, spec = _split(line.strip()[2:])
            specs[name] = spec
    return specs


def all_files() -> dict[str, dict[str, str]]:
    return {"requirements.txt": pip_specs(),
            "environment.yml": conda_specs(ROOT / "environment.yml"),
            "binder/environment.yml": conda_specs(ROOT / "binder" / "environment.yml"),
            "pyproject.toml": dict(_split(d) for d in PYPROJECT["project"]["dependencies"])}


def test_dependency_lists_name_the_same_packages():
    pip = set(pip_specs())
    assert set(conda_specs(ROOT / "environment.yml")) - CONDA_ONLY == pip
    assert set(conda_specs(ROOT / "binder" / "environment.yml")) - CONDA_ONLY == pip - TEST_ONLY
    assert set(PYPROJECT["project"]["dependencies"]) and \
        set(all_files()["pyproject.toml"]) <= pip


def test_every_pin_satisfies_every_range_in_every_file():
    files = all_files()
    checked = 0
    for name in pip_specs():
        specs = {f: s[name] for f, s in files.items() if name in s and s[name]}
        pins = {f: Version(re.sub(r"^==|\.\*$", "", s)) for f, s in specs.items()
                if s.startswith("==")}
        assert "requirements.txt" in pins, f"{name} is not pinned in requirements.txt"
        for pin_file, pin in pins.items():
            for range_file, spec in specs.items():
                assert pin in SpecifierSet(spec), (
                    f"{name}: {pin_file} pins {pin}, outside {range_file}'s {spec!r}")
                checked += 1
    assert checked > 20


def test_the_version_check_catches_a_mismatch():
    assert Version("2.12.0") not in SpecifierSet(_split("pytorch-cpu=2.13.0")[1])
    assert Version("2.13.0") in SpecifierSet(_split("pytorch-cpu=2.13.0")[1])
    assert _split("playwright-python>=1.40") == ("playwright", ">=1.40")


def test_python_range_is_stated_once_and_matches_what_we_run():
    assert PYPROJECT["project"]["requires-python"] == ">=3.11"
    assert conda_specs(ROOT / "binder" / "environment.yml")["python"] == "==3.11.*"
    assert conda_specs(ROOT / "environment.yml")["python"].startswith(">=3.11")
    readme = (ROOT / "README.md").read_text()
    assert "Python 3.11" in readme and "3.10" not in readme


def test_requirements_pin_exact_versions_and_torch_is_the_tested_one():
    lines = [l for l in (ROOT / "requirements.txt").read_text().splitlines()
             if l.strip() and not l.startswith("#")]
    assert all("==" in l for l in lines), "every requirement is pinned with =="
    assert "torch==2.13.0" in lines


def test_pyproject_ranges_are_loose_and_accept_what_colab_ships():
    deps = all_files()["pyproject.toml"]
    assert deps["torch"] == ">=2.13"
    assert not any("==" in d for d in PYPROJECT["project"]["dependencies"])
    # Colab's ipywidgets, numpy and matplotlib; torch: ckpt_lab refuses below 2.13 (see
    # ckpt_lab/_requirements.py: older torch crashed its tests), so a Colab runtime with an older
    # torch is told to upgrade it at import, and every torch from 2.13 on is accepted
    for name, colab in {"ipywidgets": "7.7.1", "torch": "2.13.0", "numpy": "2.0.2",
                        "matplotlib": "3.10.0"}.items():
        assert Version(colab) in SpecifierSet(deps[name]), name
    assert Version("2.14.1") in SpecifierSet(deps["torch"])


def test_conda_uses_playwrights_python_package():
    env = (ROOT / "environment.yml").read_text()
    assert re.search(r"^  - playwright-python\b", env, re.M)
    assert not re.search(r"^  - playwright\b(?!-)", env, re.M)


def test_binder_pins_cpu_torch_has_no_test_tools_and_installs_the_package():
    specs = conda_specs(ROOT / "binder" / "environment.yml")
    assert specs["torch"] == "==" + pip_specs()["torch"][2:] + ".*"
    assert "pytorch-cpu" in (ROOT / "binder" / "environment.yml").read_text()
    assert not TEST_ONLY & set(specs)
    post = (ROOT / "binder" / "postBuild").read_text()
    assert "set -e" in post and "pip install" in post and "--no-deps" in post


def test_notebook_memory_budget_is_binders():
    conftest = (ROOT / "notebooks" / "conftest.py").read_text()
    assert re.search(r'"CKPT_LAB_NB_BUDGET_MIB", 1024\)', conftest)


def test_readme_shows_the_two_commands_first_and_ci_calls_the_test_one():
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```")[1]
    assert "make lab" in first_block and "make test" in first_block
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [l for l in ci.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    assert commands[-1].strip() == "make test"
    assert "set -euo pipefail" in ci


@pytest.mark.parametrize("argv0, prog", [("/venv/bin/ckpt-lab", "ckpt-lab"),
                                         ("/x/ckpt_lab/__main__.py", "python -m ckpt_lab")])
def test_cli_usage_names_the_program_it_was_started_as(argv0, prog, capsys):
    assert cli.program_name(argv0) == prog
    assert cli.build_parser(cli.program_name(argv0)).format_usage().startswith(f"usage: {prog} ")


def _make_dry_run(tmp_path, path_dirs=(), **variables):
    """The commands `make .venv/.ready` would run (nothing is run), with a chosen PATH."""
    env = dict(os.environ, PATH=os.pathsep.join([*map(str, path_dirs), "/usr/bin", "/bin"]))
    args = ["make", "-n", "-B", "-C", str(ROOT), ".venv/.ready",
            *(f"{k}={v}" for k, v in variables.items())]
    return subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("make") is None or sys.platform == "darwin",
                    reason="needs make on Linux")
def test_make_picks_the_cpu_torch_index_without_an_nvidia_gpu(tmp_path):
    cpu = "https://download.pytorch.org/whl/cpu"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100'\n")
    (fake / "nvidia-smi").chmod(0o755)
    none = tmp_path / "nogpu"           # an nvidia-smi that finds no GPU, ahead of any real one
    none.mkdir()
    (none / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (none / "nvidia-smi").chmod(0o755)
    # the recipe asks the index only when it is not empty: `[ -n "INDEX" ] && ...`
    assert f'[ -n "{cpu}" ]' in _make_dry_run(tmp_path, [none])        # no GPU
    assert '[ -n "" ]' in _make_dry_run(tmp_path, [fake])              # a GPU: default index
    assert '[ -n "" ]' in _make_dry_run(tmp_path, TORCH_INDEX="")
    own = "https://download.pytorch.org/whl/cu128"
    assert f'[ -n "{own}" ]' in _make_dry_run(tmp_path, [fake], TORCH_INDEX=own)
    # a torch wheel pip already has locally wins: the index is only asked when that fails
    assert "--dry-run --no-index --no-deps" in _make_dry_run(tmp_path)
