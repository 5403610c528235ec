"""No import circle inside the package: an import scan of every module (module-level and lazy imports
alike) finds no two modules that import each other, directly or through others.  A package's
__init__ re-exporting its own submodules is not an edge (a submodule importing a name from its
package is the usual shape and closes no circle of code)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules(package: Path) -> dict[str, Path]:
    out = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_edges(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (any `import` or `from ... import` in its text)."""
    mods = modules(package)
    edges: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                here = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(here[:len(here) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                    else node.module
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name and not (is_package and target.startswith(name + ".")):
                    edges[name].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                found.append(sorted([v, *group]))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_scan_finds_a_circle_through_a_lazy_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import A\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub.b import B\nA = 1\n")
    (pkg / "sub" / "b.py").write_text("from pkg import A\nB = 2\n")  # the package's name: no circle
    (pkg / "c.py").write_text("def f():\n    from .sub import d\n")
    (pkg / "sub" / "d.py").write_text("from ..c import f\n")
    assert circles(import_edges(pkg)) == [["pkg.c", "pkg.sub.d"]]


def test_the_package_has_no_import_circle():
    assert circles(import_edges(ROOT / "rollpacker")) == []
