"""No import circle among the project's modules (issues 21, 26): a module that needs another's
caller should be handed what it needs instead. Every import counts: module-level ones,
TYPE_CHECKING ones, and imports inside functions. An import deferred into a function still ties
the two modules together; deferring it only hides the circle from the interpreter."""
from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("serving", "registry", "preprocess")


def modules(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def imports(tree: ast.Module, module: str, is_package: bool) -> list[str]:
    """Every name ``module`` imports, wherever the import statement stands (relative ones resolved)."""
    names: list[str] = []
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*here[:len(here) - node.level + 1], *([node.module] if node.module else [])]) \
                if node.level else node.module or ""
            names += [f"{base}.{alias.name}" for alias in node.names] + [base]
    return names


def import_graph(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Each module and the project modules it imports."""
    mods = modules(root, packages)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        found = imports(ast.parse(path.read_text()), name, path.name == "__init__.py")
        graph[name] = {t for t in map(resolve, found) if t and t != name}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        return exc.args[1]
    return None


def test_no_import_circle():
    found = circle(import_graph())
    assert found is None, f"import circle: {' -> '.join(found)}"


def test_the_check_sees_a_circle_added_to_the_tree():
    graph = import_graph()
    assert "serving.worker.shadow" in graph["serving.worker.dataplane"]
    graph["serving.worker.shadow"].add("serving.worker.dataplane")
    assert circle(graph)


def test_the_check_sees_a_circle_hidden_in_a_function(tmp_path):
    """A planted pair: ``a`` imports ``b`` at the top, ``b`` imports ``a`` inside a function
    (relatively, as the old onnxruntime factory did with its budgeted twin)."""
    package = tmp_path / "planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from planted.b import helper\n\n\nclass Engine:\n    pass\n")
    (package / "b.py").write_text("def helper():\n    from .a import Engine\n\n    return Engine\n")
    (package / "c.py").write_text("import planted.a\n")
    graph = import_graph(tmp_path, ("planted",))
    assert graph["planted.b"] == {"planted.a"} and graph["planted.c"] == {"planted.a"}
    assert set(circle(graph)) == {"planted.a", "planted.b"}
    (package / "b.py").write_text("def helper():\n    return None\n")
    assert circle(import_graph(tmp_path, ("planted",))) is None


# The control plane's side never imports the workers': the registry and the LLM package's control-plane
# parts (the engine launcher, adapters' checks, names) are below them.
LOWER = ("registry", "serving.llm.launch", "serving.llm.adapters", "serving.llm.checks", "serving.llm.naming",
         "serving.llm.folder", "serving.llm.routing.names", "serving.prediction_log")
# The LLM and embeddings packages' worker parts use the worker's core (errors, runtime, the data plane, and
# the front ends' shared toolkit, frontends/body.py) but never the app that assembles them, nor another
# protocol's front end.
WORKER_TOP = ("serving.worker.app", "serving.worker.main", "serving.worker.frontends")
FRONT_END_TOOLKIT = "serving.worker.frontends.body"


def test_no_import_points_up_from_the_registry_or_the_launcher_into_the_worker():
    graph = import_graph()
    upward = {m: sorted(d for d in deps if d.startswith("serving.worker"))
              for m, deps in graph.items() if m.startswith(LOWER)}
    assert {m: d for m, d in upward.items() if d} == {}


def test_the_llm_and_embeddings_packages_never_import_the_workers_app_or_front_ends():
    graph = import_graph()
    upward = {m: sorted(d for d in deps if d.startswith(WORKER_TOP) and d != FRONT_END_TOOLKIT)
              for m, deps in graph.items() if m.startswith(("serving.llm", "serving.embeddings"))}
    assert {m: d for m, d in upward.items() if d} == {}
