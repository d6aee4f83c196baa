"""The target-kind seam holds: the pipeline never learns which kind it serves.

Sweep, batches, retries, dead letters, run state and reports must work for any
kind behind :class:`~digest_cleanup.kinds.TargetKind`.  These tests read the
pipeline's source, so an S3 or PostgreSQL shortcut taken in one of those modules
fails here before it ships.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import digest_cleanup
from digest_cleanup.kinds import BUILTIN_KINDS

PACKAGE = Path(digest_cleanup.__file__).parent

#: The modules that must serve every kind alike: every layer between the kinds and the edges.
_LAYERS = ("model", "store", "pipeline", "ops", "tasks")
PIPELINE_MODULES = (
    *sorted(
        str(p.relative_to(PACKAGE)) for layer in _LAYERS for p in (PACKAGE / layer).rglob("*.py")
    ),
    "app.py",
    "beat_schedule.py",
    "broker.py",
)
#: Store client libraries, each allowed in its kind's modules only: exactly these.
STORE_LIBRARIES = {
    "boto3": {"kinds/s3_client.py"},
    "botocore": {"kinds/s3_client.py", "kinds/s3_delete.py"},
    "psycopg": {"kinds/postgres.py", "kinds/postgres_catalog.py", "kinds/postgres_errors.py"},
}
#: Kind modules by the name a targets file uses, from the registry itself.
KIND_MODULES = {name: spec.partition(":")[0] for name, spec in BUILTIN_KINDS.items()}
#: Every module of the built-in kinds (``s3_client``, ``s3_delete``, ...), all but the seam.
KIND_PARTS = sorted(
    f"digest_cleanup.kinds.{p.stem}"
    for p in (PACKAGE / "kinds").glob("*.py")
    if p.stem not in ("__init__", "base")
)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _strings(path: Path) -> set[str]:
    """Every string literal in ``path`` except docstrings (which may name kinds as examples)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                docstrings.add(doc)
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    } - docstrings


def _is_or_under(module: str, parent: str) -> bool:
    return module == parent or module.startswith(parent + ".")


@pytest.mark.parametrize("module", PIPELINE_MODULES)
def test_pipeline_module_imports_no_store_client_and_no_kind(module: str) -> None:
    # Given a module of the pipeline
    imports = _imports(PACKAGE / module)

    # Then it imports no store's client library and no particular kind
    forbidden = [*STORE_LIBRARIES, *KIND_MODULES.values(), *KIND_PARTS]
    leaks = sorted(i for i in imports for f in forbidden if _is_or_under(i, f))
    assert leaks == [], f"{module} imports {leaks}"


@pytest.mark.parametrize("module", PIPELINE_MODULES)
def test_pipeline_module_never_branches_on_a_kind_name(module: str) -> None:
    # Given every string literal in a pipeline module
    strings = _strings(PACKAGE / module)

    # Then none names a built-in kind or its location scheme
    names = set(KIND_MODULES)
    leaks = sorted(
        s
        for s in strings
        if s in names
        or any(s.startswith(f"{name}://") for name in names)
        or any(module_name in s for module_name in KIND_MODULES.values())
    )
    assert leaks == [], f"{module} names a kind: {leaks}"


def test_store_libraries_are_imported_only_by_their_kind() -> None:
    # Given every module of the package outside the test helpers and the demo (which
    # starts, seeds and lists an S3 server of its own)
    outside = ("testing", "demo")
    modules = [p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in outside]

    # Then boto3 and botocore appear only in the S3 kind, psycopg only in the postgres kind
    users = {
        library: {
            p.relative_to(PACKAGE).as_posix()
            for p in modules
            if any(_is_or_under(i, library) for i in _imports(p))
        }
        for library in STORE_LIBRARIES
    }
    assert users == STORE_LIBRARIES


def test_pipeline_imports_and_registers_its_tasks_without_any_store_library() -> None:
    # Given an interpreter in which boto3, botocore and psycopg cannot be imported
    blocked = sorted(STORE_LIBRARIES)
    modules = [
        "digest_cleanup." + m.removesuffix(".py").replace("/", ".") for m in PIPELINE_MODULES
    ]
    script = "\n".join(
        [
            "import importlib, sys",
            f"for name in {blocked!r}: sys.modules[name] = None",
            f"for name in {modules!r}: importlib.import_module(name)",
            "from digest_cleanup.app import create_app",
            "from digest_cleanup.settings import Settings",
            "app = create_app(Settings())",
            "app.loader.import_default_modules()",
            "print(sorted(t for t in app.tasks if t.startswith('digest_cleanup.')))",
            f"print(sorted(n for n in sys.modules if n.split('.')[0] in {blocked!r}"
            " and sys.modules[n] is not None))",
        ]
    )

    # When the whole pipeline and its Celery tasks are imported
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )

    # Then that works, and no store library was loaded along the way
    assert result.returncode == 0, result.stderr
    tasks, loaded = result.stdout.splitlines()[-2:]
    assert tasks == str(
        ["digest_cleanup.delete_batch", "digest_cleanup.sweep", "digest_cleanup.trigger"]
    )
    assert loaded == "[]"
