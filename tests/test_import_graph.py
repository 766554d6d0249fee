"""No import circle among the project's modules (issue 21): a module that needs another's caller
should be handed what it needs instead. Module-level imports count, TYPE_CHECKING ones included;
imports inside functions (deferred on purpose) do not."""
from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("serving", "registry", "preprocess")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def module_level_imports(tree: ast.Module) -> list[str]:
    names: list[str] = []
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        elif isinstance(node, (ast.If, ast.Try)):
            pending += node.body + node.orelse + [n for h in getattr(node, "handlers", []) for n in h.body]
    return names


def import_graph() -> dict[str, set[str]]:
    """Each module and the project modules it imports."""
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets = {resolve(imported) for imported in module_level_imports(ast.parse(path.read_text()))}
        graph[name] = {t for t in targets if t and t != name}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        return exc.args[1]
    return None


def test_no_import_circle():
    assert circle(import_graph()) is None, f"import circle: {circle(import_graph())}"


def test_the_check_sees_a_circle():
    graph = import_graph()
    assert "serving.worker.shadow" in graph["serving.worker.dataplane"]
    graph["serving.worker.shadow"].add("serving.worker.dataplane")
    assert circle(graph)
