"""The package's layers, kept true: one folder per layer, imports point only down the layers
(measure < checkpoint < plan < training < the package's API < lessons; the same layer is
allowed), no import circle (lazy imports inside functions included), the library never imports
`ckpt_lab.lessons`. docs/architecture.md draws what this test enforces."""
import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ckpt_lab"

# bottom to top; a module may import its own layer and the layers below it
LAYERS = ["ckpt_lab._requirements", "ckpt_lab.measure", "ckpt_lab.checkpoint", "ckpt_lab.plan",
          "ckpt_lab.training", "ckpt_lab", "ckpt_lab.lessons"]
TOP_LEVEL_MODULES_AT_MOST = 4      # besides __init__.py and __main__.py


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(name: str) -> int:
    """The index in LAYERS of the folder `name` sits in (``ckpt_lab.__main__`` is the API's)."""
    if name == "ckpt_lab.__main__":
        return LAYERS.index("ckpt_lab")
    for i, layer in reversed(list(enumerate(LAYERS))):
        if name == layer or (layer != "ckpt_lab" and name.startswith(layer + ".")):
            return i
    raise AssertionError(f"{name} sits in no layer: put it in a layer's folder")


def imports_of(name: str) -> set[str]:
    """The ckpt_lab modules `name` imports anywhere in its file (functions included)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the submodule when there is one, else a name of pkg
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in MODULES and t != name}
    return found


GRAPH = {name: imports_of(name) for name in MODULES}
LIBRARY = [m for m in MODULES if not m.startswith("ckpt_lab.lessons")]


def test_the_layers_are_folders_and_every_module_sits_in_one():
    for layer in LAYERS[1:5] + LAYERS[6:]:
        assert (ROOT / Path(*layer.split(".")) / "__init__.py").exists(), f"{layer} is no folder"
    for name in MODULES:
        layer_of(name)


def test_the_package_top_level_holds_few_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py",
                                                                        "__main__.py"))
    assert len(top) <= TOP_LEVEL_MODULES_AT_MOST, f"move {top} into the layers' folders"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_only_down_the_layers(name):
    up = sorted(t for t in GRAPH[name] if layer_of(t) > layer_of(name))
    assert not up, (f"{name} ({LAYERS[layer_of(name)]}) imports {up} from a layer above it: "
                    "move what it needs down, or the module up")


@pytest.mark.parametrize("name", LIBRARY)
def test_the_library_never_imports_the_lessons(name):
    wrong = sorted(t for t in GRAPH[name] if t.startswith("ckpt_lab.lessons"))
    assert not wrong, f"{name} imports {wrong}: move what it needs into the library"


def test_no_import_circle_anywhere():
    seen, on_path, circles = set(), [], []

    def visit(node):
        if node in on_path:
            circles.append(on_path[on_path.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        on_path.append(node)
        for nxt in sorted(GRAPH[node]):
            visit(nxt)
        on_path.pop()

    for name in sorted(GRAPH):
        visit(name)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_check_sees_lazy_imports_and_the_package_root():
    """The graph must catch what a circle would hide in: an import inside a function."""
    assert "ckpt_lab.plan.profile" in GRAPH["ckpt_lab.plan.planner"]      # inside plan_chain
    assert "ckpt_lab.measure.memory" in GRAPH["ckpt_lab"]
    assert "ckpt_lab" in GRAPH["ckpt_lab.lessons.course"]                  # `import ckpt_lab`
    assert layer_of("ckpt_lab.lessons.course") > layer_of("ckpt_lab") > layer_of(
        "ckpt_lab.training.loop") > layer_of("ckpt_lab.plan.planner") > layer_of(
        "ckpt_lab.checkpoint.hooks") > layer_of("ckpt_lab.measure.memory")


def test_the_wheel_carries_every_package():
    """pyproject lists every folder of the package, so `pip install` (Colab) gets the lessons."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    folders = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert folders <= listed, f"missing from pyproject's packages: {sorted(folders - listed)}"


def test_the_architecture_page_draws_every_folder():
    """docs/architecture.md names every folder of the package (`name/`), and the package
    docstring and the README point there."""
    import ckpt_lab
    text = (ROOT / "docs" / "architecture.md").read_text()
    folders = sorted({f"{p.parent.name}/" for p in PACKAGE.rglob("__init__.py")} - {"ckpt_lab/"})
    assert {"measure/", "checkpoint/", "plan/", "training/", "lessons/"} <= set(folders)
    missing = [f for f in folders if f"{f}" not in text]
    assert not missing, f"docs/architecture.md does not draw {missing}"
    assert "docs/architecture.md" in ckpt_lab.__doc__
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()


def test_the_documented_calls_work_from_the_package():
    """Every name exported before the folders, and the submodules used by name, still work."""
    import ckpt_lab
    from ckpt_lab import capacity, distributed, formulas, parallel_formulas, planner
    for name in ckpt_lab.__all__:
        assert hasattr(ckpt_lab, name), name
    assert callable(ckpt_lab.checkpoint) and callable(planner.plan_chain)
    assert callable(distributed.launch) and callable(ckpt_lab.plan_modules)
    assert callable(formulas.megatron_layer_bytes) and callable(capacity.cheapest)
    assert callable(parallel_formulas.fsdp_state_bytes)
    assert ckpt_lab.checkpoint.checkpoint_sequential is ckpt_lab.checkpoint_sequential


def test_no_test_module_imports_a_conftest():
    """`make test` collects tests/ and notebooks/ together, so the module named `conftest` may
    be the notebooks' one: shared helpers live in modules with their own names (oracle.py)."""
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
                 if any(isinstance(n, ast.ImportFrom) and n.module == "conftest"
                        for n in ast.walk(ast.parse(p.read_text())))]
    assert not offenders, f"import from a module of its own, not conftest: {offenders}"
