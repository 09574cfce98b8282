"""The set-up files agree with each other and with the README."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALIASES = {"pytorch": "torch", "pytorch-cpu": "torch"}
CONDA_ONLY = {"python", "pip"}       # the interpreter and installer, not project packages


def _name(spec: str) -> str:
    name = re.split(r"[<>=!~ \[;]", spec.strip(), maxsplit=1)[0].lower()
    return ALIASES.get(name, name)


def requirement_names() -> set[str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return {_name(line) for line in lines if line.strip() and not line.startswith("#")}


def conda_names(path: Path) -> set[str]:
    names, inside = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("dependencies:"):
            inside = True
        elif inside and line.strip().startswith("- "):
            names.add(_name(line.strip()[2:]))
    return names - CONDA_ONLY


def test_three_dependency_lists_name_the_same_packages():
    pip = requirement_names()
    assert conda_names(ROOT / "environment.yml") == pip
    assert conda_names(ROOT / "binder" / "environment.yml") == pip


def test_requirements_pin_exact_versions_and_torch_is_the_tested_one():
    lines = [l for l in (ROOT / "requirements.txt").read_text().splitlines()
             if l.strip() and not l.startswith("#")]
    assert all("==" in l for l in lines), "every requirement is pinned with =="
    assert "torch==2.13.0" in lines


def test_pyproject_ranges_are_loose_and_cover_the_runtime_packages():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = {_name(d): d for d in meta["dependencies"]}
    assert deps["torch"] == "torch>=2.4"
    assert set(deps) <= requirement_names()
    assert not any("==" in d for d in meta["dependencies"])


def test_binder_uses_cpu_pytorch_and_installs_the_package():
    assert "pytorch-cpu" in (ROOT / "binder" / "environment.yml").read_text()
    post = (ROOT / "binder" / "postBuild").read_text()
    assert "set -e" in post and "pip install" in post and "-e ." in post


def test_readme_shows_the_two_commands_first_and_ci_calls_the_test_one():
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```")[1]
    assert "make lab" in first_block and "make test" in first_block
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [l for l in ci.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    assert commands[-1].strip() == "make test"
    assert "set -euo pipefail" in ci
