"""The test rig's layout: no import cycle, even under TYPE_CHECKING; nothing too long; not shipped.

``tests/rig`` is held to the package's own rules (tests/unit/test_layout.py): a module
over 350 lines or a function over 60 says "long because" in its docstring.  Imports are
read with those under ``if TYPE_CHECKING:`` included, since a cycle there is still two
modules that cannot be understood apart.  And the package never imports the rig, which
the wheel does not carry.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import digest_cleanup
import tests.rig
from tests.unit.test_layout import FUNCTION_LINES, MODULE_LINES, REASON

RIG = Path(tests.rig.__file__).parent
PACKAGE = Path(digest_cleanup.__file__).parent


def _rig_modules() -> dict[str, Path]:
    found = {}
    for path in sorted(RIG.rglob("*.py")):
        parts = path.relative_to(RIG).with_suffix("").parts
        found[".".join(["tests.rig", *(p for p in parts if p != "__init__")])] = path
    return found


def _imported(tree: ast.AST) -> Iterator[str]:
    """Every module name an import in ``tree`` may load, TYPE_CHECKING ones included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            base = node.module or ""
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


RIG_MODULES = _rig_modules()
GRAPH = {
    name: sorted({m for m in _imported(ast.parse(path.read_text())) if m in RIG_MODULES} - {name})
    for name, path in RIG_MODULES.items()
}


def _cycle(graph: Mapping[str, list[str]]) -> list[str]:
    """A cycle of ``graph`` (as the path that closes it), or [] when it has none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return []


def _long_without_reason(source: str) -> list[str]:
    """The module, and each function, past its limit without "long because" in its docstring."""
    tree = ast.parse(source)
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    sized = [("the module", tree, source.count("\n"), MODULE_LINES)] + [
        (n.name, n, (n.end_lineno or n.lineno) - n.lineno + 1, FUNCTION_LINES) for n in functions
    ]
    return [
        f"{name}: {length} lines, over {limit}, and its docstring does not say why it is {REASON}"
        for name, node, length, limit in sized
        if length > limit and REASON not in (ast.get_docstring(node) or "")
    ]


def test_no_rig_import_is_circular_even_for_type_checking() -> None:
    assert _cycle(GRAPH) == []


def test_the_cycle_check_sees_a_type_checking_import() -> None:
    # Given two modules whose only import back is under TYPE_CHECKING
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tests.rig.a import A\n"
    back = {m for m in _imported(ast.parse(source)) if m.startswith("tests.rig")}

    # Then the import counts, and the pair is a cycle
    assert back == {"tests.rig.a", "tests.rig.a.A"}
    assert _cycle({"tests.rig.a": ["tests.rig.b"], "tests.rig.b": ["tests.rig.a"]})
    # and the proxy and its connections, which once imported each other, no longer do
    assert "tests.rig.proxy_connections" in GRAPH["tests.rig.proxy"]
    assert "tests.rig.proxy" not in GRAPH["tests.rig.proxy_connections"]


@pytest.mark.parametrize("module", sorted(RIG_MODULES))
def test_rig_modules_and_functions_are_short_or_say_why(module: str) -> None:
    assert _long_without_reason(RIG_MODULES[module].read_text()) == [], module


def test_the_length_check_sees_a_long_function_and_its_reason() -> None:
    body = "    x = 1\n" * FUNCTION_LINES
    assert _long_without_reason(f"def f():\n{body}") == [
        f"f: {FUNCTION_LINES + 1} lines, over {FUNCTION_LINES}, and its docstring does not say "
        f"why it is {REASON}"
    ]
    assert _long_without_reason(f'def f():\n    """It is {REASON} of x."""\n{body}') == []


def test_the_package_never_imports_the_tests() -> None:
    reaching = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if any(
            m == "tests" or m.startswith("tests.") for m in _imported(ast.parse(path.read_text()))
        )
    ]
    assert reaching == [], f"the wheel has no tests package, yet these import it: {reaching}"
