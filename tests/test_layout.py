"""The package's shape (CONTRIBUTING.md): modules in layers, imports only downward, no cycles."""

import ast
import re
from pathlib import Path

import jaxfn

PACKAGE = Path(jaxfn.__file__).resolve().parent
# The order data flows through a call; a module may import only modules listed before it.
LAYERS = [
    "_errors",
    "_jax_private",
    "_pytorch_names",
    "_keys",
    "_split",
    "_tracers",
    "_arguments",
    "_context",
    "_saves",
    "_outputs",
    "_gradients",
    "_anomaly",
    "_rule",
    "_tie",
    "_linear",
    "_reverse_mode",
    "_forward_mode",
    "_eager",
    "_host_values",
    "_host_call",
    "_host",
    "_finite_differences",
    "_primitive",
    "_closures",
    "_function",
    "_gradcheck",
    "_torch",
    "_compare",
    "__init__",
]


def _imports(path: Path) -> tuple[set[str], list[int]]:
    """The package modules ``path`` imports, and the lines of imports inside functions."""
    found, nested = set(), []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {alias.name for alias in node.names}
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and node.level == 1:
                    nested.append(node.lineno)
    return found, nested


def test_every_module_is_in_a_layer():
    assert sorted(p.stem for p in PACKAGE.glob("*.py")) == sorted(LAYERS)


def test_imports_go_only_downward_and_never_at_run_time():
    for path in PACKAGE.glob("*.py"):
        imported, nested = _imports(path)
        position = LAYERS.index(path.stem)
        assert all(LAYERS.index(name) < position for name in imported), (path.stem, imported)
        assert nested == [], f"{path.name} imports inside a function at lines {nested}"


def test_every_module_says_its_one_idea_and_contributing_lists_it():
    """One idea per module: its docstring's first line says it, and CONTRIBUTING.md's table of
    modules names every module (and none that is gone)."""
    contributing = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    listed = set(re.findall(r"^\| `(_\w+)\.py` \|", contributing, re.M))
    assert listed == {p.stem for p in PACKAGE.glob("_*.py")} - {"__init__"}
    for path in PACKAGE.glob("*.py"):
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        assert docstring and docstring.splitlines()[0].strip(), f"{path.name} has no docstring saying its idea"


def test_the_version_is_the_packages():
    import importlib.metadata

    assert jaxfn.__version__ == importlib.metadata.version("jaxfn")
