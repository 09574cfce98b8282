"""The package's two layers, kept true: the library never imports `ckpt_lab.lessons`, and no
module imports itself back through others (no import circle, lazy imports inside functions
included). docs/architecture.md draws what this test enforces."""
import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ckpt_lab"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


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


def test_the_package_has_both_layers():
    assert "ckpt_lab.lessons" in MODULES and "ckpt_lab.checkpoint" in MODULES
    assert {"ckpt_lab.lessons.course", "ckpt_lab.lessons.widgets", "ckpt_lab.lessons.plots",
            "ckpt_lab.lessons.exercises"} <= set(MODULES)


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
    assert "ckpt_lab.profile" in GRAPH["ckpt_lab.planner"]          # inside plan_chain
    assert "ckpt_lab.memory" in GRAPH["ckpt_lab"]
    assert "ckpt_lab" in GRAPH["ckpt_lab.lessons.course"]           # `import ckpt_lab`


def test_the_wheel_carries_every_package():
    """pyproject lists every folder of the package, so `pip install` (Colab) gets the lessons."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    folders = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert folders <= listed, f"missing from pyproject's packages: {sorted(folders - listed)}"


def test_every_library_module_is_named_where_the_library_is_described():
    """The package docstring, docs/architecture.md and the README's table name every library
    module (`name` in backticks), so a split or a new file cannot leave them behind."""
    import ckpt_lab
    places = {"ckpt_lab/__init__.py": ckpt_lab.__doc__,
              "docs/architecture.md": (ROOT / "docs" / "architecture.md").read_text(),
              "README.md": (ROOT / "README.md").read_text()}
    names = sorted(m.rpartition(".")[2] for m in LIBRARY if m != "ckpt_lab")
    assert {"checkpoint", "guards", "module_state"} <= set(names)
    for place, text in places.items():
        missing = [n for n in names if f"`{n}`" not in text]
        assert not missing, f"{place} does not name {missing}"


def test_every_lesson_support_module_is_named_in_the_architecture_page():
    """docs/architecture.md names every module of ckpt_lab.lessons (a package as `name/`)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    lessons = PACKAGE / "lessons"
    names = sorted({p.stem for p in lessons.glob("*.py") if p.stem != "__init__"}
                   | {f"{p.name}/" for p in lessons.iterdir() if (p / "__init__.py").exists()})
    assert {"course", "plots/", "exercises/"} <= set(names)
    missing = [n for n in names if f"`{n}`" not in text]
    assert not missing, f"docs/architecture.md does not name {missing}"
