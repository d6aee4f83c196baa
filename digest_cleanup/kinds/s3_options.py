"""The fields of an S3 target, and what the S3 kind's own modules read of the kind.

:class:`S3Target` is the kind as :mod:`~digest_cleanup.kinds.s3_delete`,
:mod:`~digest_cleanup.kinds.s3_versions`, :mod:`~digest_cleanup.kinds.s3_check` and
:mod:`~digest_cleanup.kinds.s3_probe` see it.  They sit below
:mod:`~digest_cleanup.kinds.s3`, which imports them, so they name this protocol
rather than :class:`~digest_cleanup.kinds.s3.S3Kind`: no import, not even one for
the type checker, goes back up.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from digest_cleanup.settings import Settings


@dataclasses.dataclass(frozen=True)
class S3Options:
    """Fields of an S3 target."""

    bucket: str
    prefix: str
    #: An empty prefix means the whole bucket; it must be asked for by name.
    allow_whole_bucket: bool = False
    #: ``current``: delete the current version (versioned buckets gain delete markers);
    #: ``all``: delete every version and delete marker of an expired key.
    versions: Literal["current", "all"] = "current"
    #: Send each key's listed ETag with its delete, so S3 keeps a key rewritten since.
    #: Turn off only for a server that refuses the condition (``digest-cleanup check``).
    conditional_deletes: bool = True
    #: The prefix names a folder, so it must end in ``/``: ``statements`` without one
    #: also matches ``statements-archive/``.  ``false`` asks for that raw match by name.
    prefix_is_folder: bool = True


class S3Target(Protocol):
    """One S3 target's kind, as its delete, versions, check and probe modules use it."""

    #: The target's name in the targets file.
    target: str
    settings: Settings

    @property
    def name(self) -> str:
        """The kind's name, ``s3``."""

    @property
    def options(self) -> S3Options: ...

    @property
    def client(self) -> S3Client:
        """The process's shared client for the target."""

    @property
    def all_versions(self) -> bool:
        """True when a key is one version of a key (``versions = "all"``)."""

    def require_versioning(self) -> None:
        """Raise unless the bucket's versioning is enabled."""

    def describe(self) -> str:
        """``s3://bucket/prefix``."""
