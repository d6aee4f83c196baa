"""The package's layout: imports flow one way, nothing is circular, nothing is too long.

The layers, from the bottom: errors and the clock; the settings; logging; the
kinds; the targets file (a target names its kind); the pipeline; then the
edges: the Celery wiring, the test plugin, the CLI and the console, the demo.  A module may
import its own layer and those below it, never one above, and no import is
circular even inside a layer.  Imports under ``if TYPE_CHECKING`` count as well:
a cycle the type checker alone sees still ties the modules into one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import digest_cleanup

PACKAGE = Path(digest_cleanup.__file__).parent
#: Layers by module-name prefix, bottom first; the longest matching prefix wins.
LAYERS = {
    "errors": 0,
    "clock": 0,
    "settings": 1,
    "logs": 2,
    "kinds": 3,
    "targets": 4,
    "model": 5,  # what messages and records hold: batches, dead letters, a run's view
    "store": 6,  # everything that talks to Redis, with its scripts
    "audit": 6,  # the durable record in S3: reports
    "pipeline": 7,  # the sweep and the attempt: what happens to a batch
    "ops": 8,  # what operators read and do: progress, metrics, capacity, redrive, purge
    "tasks": 9,  # the Celery-facing layer: tasks, app, broker options, beat schedule
    "app": 9,
    "broker": 9,
    "beat_schedule": 9,
    "testing": 10,
    "demo.servers": 10,  # the demo's Redis and S3 launchers, which the plugin's Redis reuses
    "cli": 11,
    "console": 11,  # an edge beside the CLI: it serves what the CLI prints, never the Celery app
    "demo": 12,
    "": 13,  # the package itself: ``celery -A digest_cleanup`` builds the app there
}
#: Who may import the Celery app module: the Celery wiring and the entry points.
APP_IMPORTERS = ("tasks", "app", "beat_schedule", "cli", "testing", "demo", "")
#: A module this long, or a function this long, says why in its docstring.
MODULE_LINES, FUNCTION_LINES = 350, 60
REASON = "long because"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(p for p in parts if p != "__init__")
        found[name] = path
    return found


def _imports(path: Path, name: str) -> Iterator[str]:
    """Modules of the package ``path`` imports, anywhere, ``if TYPE_CHECKING`` included."""
    tree = ast.parse(path.read_text())
    modules = _modules()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            assert node.level == 0, f"{name}: relative import"
            base = node.module or ""
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            if target == "digest_cleanup" or target.startswith("digest_cleanup."):
                inner = target.removeprefix("digest_cleanup").removeprefix(".")
                # Every import loads the package itself first, so importing it is no edge.
                if inner and inner in modules:
                    yield inner
                    # ... and runs each parent package's __init__ on the way (one of
                    # the importer's own parents has run already): an edge wherever
                    # that __init__ imports something of the package itself.
                    parts = inner.split(".")
                    for depth in range(1, len(parts)):
                        parent = ".".join(parts[:depth])
                        own = name == parent or name.startswith(parent + ".")
                        if not own and _runs_imports(modules[parent]):
                            yield parent


def _runs_imports(init: Path) -> bool:
    """Whether a package's ``__init__`` imports any module of digest_cleanup."""
    return init.name == "__init__.py" and "digest_cleanup" in "".join(
        ast.unparse(node)
        for node in ast.walk(ast.parse(init.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
    )


def _layer(name: str) -> int:
    prefix = max((p for p in LAYERS if name == p or name.startswith(p + ".") or p == ""), key=len)
    return LAYERS[prefix]


GRAPH = {name: sorted(set(_imports(path, name)) - {name}) for name, path in _modules().items()}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_flow_down_the_layers(module):
    upward = [dep for dep in GRAPH[module] if _layer(dep) > _layer(module)]
    assert not upward, f"{module} (layer {_layer(module)}) reaches up to {upward}"


def test_no_import_is_circular():
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in GRAPH[node]:
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for module in GRAPH:
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_only_the_celery_wiring_and_the_entry_points_import_the_app():
    importers = [m for m, deps in GRAPH.items() if "app" in deps]
    wrong = [m for m in importers if _layer(m) < LAYERS["tasks"] or m.startswith("pipeline")]
    assert not wrong, wrong
    assert all(m == "" or m.split(".")[0] in APP_IMPORTERS for m in importers), importers


def test_an_import_for_the_type_checker_is_an_edge(tmp_path):
    # Given a module that imports a kind only for the type checker
    module = tmp_path / "checked.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from digest_cleanup.kinds.s3 import S3Kind\n"
    )
    # Then the graph has the edge, so a cycle through it is seen
    assert "kinds.s3" in set(_imports(module, "checked"))


def test_the_checks_see_a_reach_up_and_a_cycle():
    # The graph is read from the source: a pipeline module importing the app would show
    assert "app" in GRAPH["tasks.base"]
    assert _layer("pipeline.sweep") < _layer("app")
    assert _layer("kinds.s3") < _layer("targets") < _layer("store.runs")
    # Importing demo.servers runs demo/__init__ too: an edge while that file imports the
    # demo, none while it imports nothing (as now)
    assert _runs_imports(PACKAGE / "kinds" / "__init__.py")
    assert "kinds" in GRAPH["audit.reports"]  # it imports only kinds.s3_client
    assert not _runs_imports(PACKAGE / "demo" / "__init__.py")
    assert "demo" not in GRAPH["testing.redis_server"]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_modules_and_functions_are_short_or_say_why(module):
    path = _modules()[module]
    source = path.read_text()
    tree = ast.parse(source)
    lines = source.count("\n")
    if lines > MODULE_LINES:
        assert REASON in (ast.get_docstring(tree) or ""), (
            f"{module}: {lines} lines; split it, or say in its docstring why it is {REASON}"
        )
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_LINES:
                assert REASON in (ast.get_docstring(node) or ""), (
                    f"{module}.{node.name}: {length} lines; split it, or say why it is {REASON}"
                )
