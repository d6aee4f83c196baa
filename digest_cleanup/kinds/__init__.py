"""Target kinds, found by name.

A kind is looked up, in order, among the built-in kinds (:data:`BUILTIN_KINDS`, read
from this source tree, so a kind shipped here works without reinstalling), the
``digest_cleanup.kinds`` entry point group (so a kind can live in another package;
Python sees an entry point only once its package is installed), and finally as a
``package.module:Class`` import path written straight into the targets file.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from digest_cleanup.errors import TargetsFileError
from digest_cleanup.kinds.base import (
    CHANGED_SINCE_LISTING,
    Finding,
    KeyResult,
    Namespace,
    Outcome,
    Page,
    TargetKind,
)

__all__ = [
    "CHANGED_SINCE_LISTING",
    "Finding",
    "KeyResult",
    "Namespace",
    "Outcome",
    "Page",
    "TargetKind",
    "load_kind",
]

#: Kinds that ship with digest-cleanup, imported only when a target uses them.
BUILTIN_KINDS = {
    "s3": "digest_cleanup.kinds.s3:S3Kind",
    "postgres": "digest_cleanup.kinds.postgres:PostgresKind",
}

#: The entry point group another package registers its kinds under.
ENTRY_POINT_GROUP = "digest_cleanup.kinds"


def load_kind(name: str, *, target: str = "?") -> type[TargetKind]:
    """Return the kind class called ``name``, or explain which kinds exist."""
    spec = BUILTIN_KINDS.get(name)
    if spec is None:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name == name:
                spec = ep.value
                break
    if spec is None and ":" in name:
        spec = name
    if spec is None:
        known = sorted(
            set(BUILTIN_KINDS) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
        )
        raise TargetsFileError(
            f"targets.{target}.kind: unknown kind {name!r}; the known kinds are "
            f"{', '.join(known)}, or write a 'package.module:Class' path. A kind registered "
            f"under the {ENTRY_POINT_GROUP!r} entry point group is known only once its "
            "package is installed: after adding or renaming the entry point, (re)install "
            "the package that declares it (for a source tree: pip install -e .)"
        )
    module_name, _, attr = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise TargetsFileError(
            f"targets.{target}.kind: cannot load {spec!r} ({exc}); install the package "
            "that provides it (for postgres: pip install 'digest-cleanup[postgres]')"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, TargetKind)):
        raise TargetsFileError(f"targets.{target}.kind: {spec!r} is not a TargetKind subclass")
    return cls
