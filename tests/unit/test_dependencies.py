"""Every third-party module the package imports is a declared dependency, or an extra's.

The imports are read from the source (those under ``if TYPE_CHECKING:`` are not run, so
they do not count), each top-level module is mapped to the distributions that install it
(``importlib.metadata.packages_distributions()``), and one of them must be named in
pyproject.toml.  An import at a module's top level is needed by whoever imports the
module, so it must be a plain dependency unless the module is one of the few that only
an extra's users import.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import digest_cleanup

PACKAGE = Path(digest_cleanup.__file__).parent
PYPROJECT = PACKAGE.parent / "pyproject.toml"
#: Modules (by name prefix inside the package) only an extra's users import, and the extra.
EXTRA_MODULES = {
    "kinds.postgres": "postgres",
    "ops.metrics": "metrics",
    "testing": "testing",
}
#: Extras that are this project's development tools, not something the package may import.
NOT_FOR_THE_PACKAGE = frozenset({"dev"})


def _normal(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(requirements: list[str]) -> set[str]:
    names = set()
    for requirement in requirements:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert match, requirement
        names.add(_normal(match.group(0)))
    return names - {"digest-cleanup"}


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    """The plain dependencies, and each extra's, from pyproject.toml."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    extras = {
        extra: _requirement_names(requirements)
        for extra, requirements in project.get("optional-dependencies", {}).items()
    }
    return _requirement_names(project["dependencies"]), extras


def _runtime_imports(tree: ast.AST) -> Iterator[tuple[str, bool]]:
    """(top-level module, imported at the module's top level) for each import that runs."""
    type_checking = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    top_level = {id(node) for node in getattr(tree, "body", [])}
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            yield name.split(".")[0], id(node) in top_level


def _third_party() -> dict[tuple[str, str], bool]:
    """(package module, third-party top-level module) -> whether it is imported at top level."""
    found: dict[tuple[str, str], bool] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(p for p in path.relative_to(PACKAGE).with_suffix("").parts)
        module = module.removesuffix(".__init__").removesuffix("__init__")
        for top, at_top in _runtime_imports(ast.parse(path.read_text())):
            if top in sys.stdlib_module_names or top in ("digest_cleanup", "__future__"):
                continue
            found[module, top] = found.get((module, top), False) or at_top
    return found


def _extra_of(module: str) -> str | None:
    for prefix, extra in EXTRA_MODULES.items():
        if module == prefix or module.startswith((prefix + ".", prefix + "_")):
            return extra
    return None


def test_every_imported_distribution_is_declared() -> None:
    core, extras = _declared()
    usable = core.union(
        *(names for extra, names in extras.items() if extra not in NOT_FOR_THE_PACKAGE)
    )
    installed = importlib.metadata.packages_distributions()
    undeclared, unknown, not_core = [], [], []
    for (module, top), at_top in sorted(_third_party().items()):
        distributions = {_normal(d) for d in installed.get(top, [])}
        if not distributions:
            unknown.append(f"{module}: {top}")
        elif not distributions & usable:
            undeclared.append(f"{module}: {top} (from {sorted(distributions)})")
        elif at_top:
            extra = _extra_of(module)
            needed = core if extra is None else core | extras.get(extra, set())
            if not distributions & needed:
                where = "a plain dependency" if extra is None else f"the {extra!r} extra"
                not_core.append(f"{module}: {top} at its top level needs {where}")
    assert unknown == [], f"imported, but no installed distribution provides it: {unknown}"
    assert undeclared == [], f"imported, but not in pyproject.toml's dependencies: {undeclared}"
    assert not_core == [], not_core


def test_the_check_reads_what_the_package_imports() -> None:
    # The console serves with tornado at its top level, and the Celery wiring imports celery.
    found = _third_party()
    assert found[("console.app", "tornado")] is True
    assert found[("app", "celery")] is True
    # An import only for the type checker is not one that runs.
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import mypy_boto3_s3\n"
    assert list(_runtime_imports(ast.parse(source))) == [("typing", True)]
    # A plain dependency is told from an extra's.
    core, extras = _declared()
    assert "tornado" in core
    assert "psycopg" in extras["postgres"]
    assert "psycopg" not in core
