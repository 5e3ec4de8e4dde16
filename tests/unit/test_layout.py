"""The shape of the code base: imports point one way, no cycles, the sidecar stands
alone, and the README's file list is the tree."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.utils import REPO, library_modules

#: Packages from the bottom up: a module may import only from its own layer or below.
LAYERS = ("sidecar", "spark_ext", "sts_harness", "benchmarks")
#: What other packages may import from the sidecar: its contract, client and wire code.
SIDECAR_PUBLIC = ("sidecar", "sidecar.contract", "sidecar.client", "sidecar.pb")
#: Third-party packages the sidecar must not need (it runs alone on GPU nodes).
NOT_IN_SIDECAR = ("pyspark", "pandas", "numpy", "deltalake", "matplotlib")


MODULES = library_modules(LAYERS)


def _imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports (at any depth of the file), resolved to a module
    of the tree when the imported name is one, else to the package imported from."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    return found


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _top(name: str) -> str:
    return name.split(".")[0]


def test_no_module_imports_from_a_package_above_it() -> None:
    wrong = [f"{mod} imports {imp}" for mod, imps in IMPORTS.items() for imp in imps
             if _top(imp) in LAYERS and LAYERS.index(_top(imp)) > LAYERS.index(_top(mod))]
    assert not wrong, wrong


def test_other_packages_use_only_the_sidecar_contract() -> None:
    wrong = [f"{mod} imports {imp}" for mod, imps in IMPORTS.items() for imp in imps
             if _top(mod) != "sidecar" and _top(imp) == "sidecar"
             and not any(imp == p or imp.startswith(p + ".") for p in SIDECAR_PUBLIC)]
    assert not wrong, wrong


def test_the_sidecar_needs_no_spark_side_package() -> None:
    wrong = [f"{mod} imports {imp}" for mod, imps in IMPORTS.items() if _top(mod) == "sidecar"
             for imp in imps if _top(imp) in NOT_IN_SIDECAR]
    assert not wrong, wrong


def test_no_import_cycles() -> None:
    graph = {mod: {i for i in imps if i in MODULES and i != mod} for mod, imps in IMPORTS.items()}
    # A package's __init__ re-exporting its own submodules is not a cycle edge back.
    for mod in graph:
        graph[mod] = {i for i in graph[mod] if not mod.startswith(i + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_checker_sees_a_violation() -> None:
    """The walker resolves relative and lazy imports (so the tests above can fail)."""
    text = "def f():\n    from spark_ext.pipeline import StsPipeline\n"
    tmp = REPO / "sidecar" / "__layout_probe__.py"
    try:
        tmp.write_text(text, encoding="utf-8")
        assert "spark_ext.pipeline" in _imports("sidecar.__layout_probe__", tmp)
    finally:
        tmp.unlink()


def _readme_layout() -> set[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    listed, folder = set(), ""
    for line in block.splitlines():
        if not line.strip():
            continue
        token = line.split()[0]
        if not line.startswith(" "):
            folder = token if token.endswith("/") else ""
        elif token.endswith(".py"):
            listed.add(folder + token)
    return listed


def test_readme_layout_lists_every_module() -> None:
    tree = {str(p.relative_to(REPO)) for p in MODULES.values()
            if p.name != "__init__.py"
            or p.parent.name in ("contract", "engines", "admission", "result_channels")}
    listed = _readme_layout()
    assert not tree - listed, f"modules missing from the README's Layout: {sorted(tree - listed)}"
    assert not listed - tree, f"README's Layout lists files that do not exist: {sorted(listed - tree)}"
