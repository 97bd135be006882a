"""Imports run one way (``pytest tests/test_layering.py`` checks it): io and schemas at the bottom, the
stages above them, streaming and the CLI on top; a package never imports one of its own layer or above,
and no module imports itself back through others (no circles, function-level imports included)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Lowest first. A package may import only packages of a lower layer (and itself).
LAYERS: list[set[str]] = [
    {"pipelines.schemas", "pipelines", "pipelines.errors", "pipelines.lazy", "pipelines.durations", "pipelines.redact"},
    {"pipelines.settings", "pipelines.secrets"},
    {
        "pipelines.optional",
        "pipelines.jobservers",
        "pipelines.dataflow_job",
        "pipelines.harness_logs",
        "pipelines.worker_pool",
    },
    {"pipelines.io", "pipelines.runners"},
    {"pipelines.features", "pipelines.generator", "pipelines.model", "pipelines.store", "pipelines.inspect"},
    {"pipelines.precompute"},
    {"pipelines.similarity"},
    {"pipelines.transfer"},
    {"pipelines.streaming"},
    {"pipelines.cli"},
    {"pipelines.__main__"},
]
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted((ROOT / "pipelines").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {name for name in found if name.split(".")[0] == "pipelines"}


def _package(module: str) -> str:
    """The layered unit a module belongs to: ``pipelines.<package>``."""
    return ".".join(module.split(".")[:2])


MODULES = dict(_modules())
GRAPH = {name: {m for m in _imports(path) if m in MODULES and m != name} for name, path in MODULES.items()}


def test_every_package_has_a_layer() -> None:
    assert {_package(m) for m in MODULES} <= set(LAYER_OF)


def test_imports_run_one_way() -> None:
    wrong = [
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if _package(target) != _package(module) and LAYER_OF[_package(target)] >= LAYER_OF[_package(module)]
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_circles() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in GRAPH[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    assert not circles, circles
