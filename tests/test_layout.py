"""The house rules, read off the source: which zone may import which, who may talk to etcd, no cycles.

Every `import` counts, also those inside functions (lazy imports still tie the zones together);
only imports under `if TYPE_CHECKING:` are left out, since they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Source folder -> the package it installs as (pyproject.toml's package-dir).
ROOTS = {REPO / "spotrun": "spotrun", REPO / "tui": "spotrun.tui", REPO / "providers": "spotrun.providers"}

# Zone of a module: the first package below `spotrun` (the modules directly in spotrun/ are "shared",
# except the CLI's own).
SHARED = {"spotrun", "spotrun.errors", "spotrun.fmt", "spotrun.log", "spotrun.paths"}
CLI = {"spotrun.cli", "spotrun.__main__"}

# zone -> the zones it may import (besides itself and "shared").
ALLOWED: dict[str, set[str]] = {
    "shared": set(),
    "recipe": {"providers"},
    "providers": set(),
    "state": {"recipe"},
    "node": {"state", "recipe", "providers"},
    "elastic": {"node", "state", "providers"},
    "controller": {"state", "recipe", "providers", "node"},
    "simulate": {"controller", "state", "recipe", "providers"},
    "client": {"controller", "state", "recipe", "providers", "simulate", "node"},
    "tui": {"client", "state"},
    "cli": {"client", "controller", "state", "recipe", "providers", "simulate", "tui", "node", "elastic"},
}
# The TUI acts through the client's small API only, not through the client's internals.
TUI_CLIENT_MODULES = {"spotrun.client.api"}
ETCD_CLIENT = ("pyetcd", "etcd3", "grpc")


def _module_name(path: Path) -> str:
    for root, package in ROOTS.items():
        if path.is_relative_to(root):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join([package, *parts])
    raise AssertionError(path)


def _sources() -> dict[str, Path]:
    found = {}
    for root in ROOTS:
        for path in root.rglob("*.py"):
            if "__pycache__" not in path.parts:
                found[_module_name(path)] = path
    return found


SOURCES = _sources()


def _zone(module: str) -> str:
    if module in CLI:
        return "cli"
    if module in SHARED:
        return "shared"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "shared"


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped.update(id(n) for n in ast.walk(child))
    return skipped


def _imports(module: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import of `module` that can run."""
    tree = ast.parse(SOURCES[module].read_text())
    skipped = _type_checking_nodes(tree)
    top = {id(n) for n in tree.body} | {id(n) for stmt in tree.body if isinstance(stmt, ast.Try) for n in stmt.body}
    out = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                # `from spotrun.client import console` imports the module spotrun.client.console.
                sub = f"{node.module}.{alias.name}"
                out.append((sub if sub in SOURCES else node.module, node.lineno, id(node) in top))
    return sorted(set(out))


def _own(name: str) -> str | None:
    """The project module `name` refers to (a module or the package holding a name), else None."""
    while name and name not in SOURCES:
        name = name.rpartition(".")[0]
    return name or None


def test_every_zone_imports_only_what_it_may() -> None:
    wrong = []
    for module in sorted(SOURCES):
        zone = _zone(module)
        for name, line, _ in _imports(module):
            target = _own(name)
            if target is None or not target.startswith("spotrun"):
                continue
            other = _zone(target)
            if other in (zone, "shared"):
                continue
            ok = other in ALLOWED[zone]
            if zone == "tui" and other == "client":
                ok = target in TUI_CLIENT_MODULES
            if not ok:
                wrong.append(f"{SOURCES[module].relative_to(REPO)}:{line}: {zone} imports {target} ({other})")
    assert not wrong, "imports that cross the zone rules (see CONTRIBUTING.md):\n" + "\n".join(wrong)


def test_only_the_state_package_imports_the_etcd_client() -> None:
    wrong = [
        f"{SOURCES[module].relative_to(REPO)}:{line}: imports {name}"
        for module in sorted(SOURCES)
        if _zone(module) != "state"
        for name, line, _ in _imports(module)
        if name.split(".")[0] in ETCD_CLIENT
    ]
    assert not wrong, "\n".join(wrong)


def test_imports_have_no_cycle() -> None:
    # Lazy imports count too: a cycle hidden in a function still ties two modules into one.
    graph = {
        module: {t for name, _, _top in _imports(module) if (t := _own(name)) and t != module} for module in SOURCES
    }
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_the_rules_name_exactly_the_zones_that_exist() -> None:
    # A new package under spotrun/ gets its place in ALLOWED before anything may import it.
    zones = {_zone(module) for module in SOURCES}
    assert zones == set(ALLOWED), f"without rules: {sorted(zones - set(ALLOWED))}, gone: {sorted(set(ALLOWED) - zones)}"
