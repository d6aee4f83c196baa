"""The target-kind seam: what a store must answer for the pipeline to clean it.

A kind answers two questions and nothing else:

* :meth:`TargetKind.scan` -- which keys have expired, streamed in pages;
* :meth:`TargetKind.delete` -- delete this batch and say what became of each key.

A scan may attach a *condition* to each expired key: what the key must still
be for its delete to go ahead (for S3, the ETag the listing saw).  The pipeline
carries conditions with their keys through batches, retries and dead letters,
and hands them back to :meth:`TargetKind.delete`, so the store itself refuses to
delete a key that was rewritten after it was listed.

Everything else (fan-out, retries, dead letters, run state, reports, metrics,
Flower names) is the pipeline's, and it never learns which kind it serves.
Keys are opaque strings to the pipeline: an S3 key, a primary key, a Redis key.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar, Literal

from digest_cleanup.kinds.options import parse_dataclass
from digest_cleanup.settings import Settings

__all__ = [
    "CHANGED_SINCE_LISTING",
    "Finding",
    "KeyResult",
    "Namespace",
    "Outcome",
    "Page",
    "TargetKind",
    "parse_dataclass",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Page:
    """One page of a scan.

    ``scanned`` counts every key looked at (expired or not), ``expired`` holds
    the expired ones in scan order, and ``cursor`` is where a later scan resumes:
    ``scan(cutoff, start_after=cursor)`` continues right after this page.  A page
    that ends inside a group the kind cannot split yet has ``cursor=None``, which
    keeps the previous resume position.
    """

    scanned: int
    expired: list[str]
    cursor: str | None
    #: One condition per expired key, in the same order (S3: its ETag); empty when
    #: the kind checks expiry itself at delete time.
    conditions: list[str] = dataclasses.field(default_factory=list)


#: The code of a key left alone because it no longer is what the sweep found expired.
CHANGED_SINCE_LISTING = "changed_since_listing"


class Outcome(enum.StrEnum):
    """What became of one key in a delete request."""

    #: Gone now, whether this request removed it or it was already absent.
    DELETED = "deleted"
    #: Left alone on purpose: it is no longer expired (rewritten since the sweep,
    #: code :data:`CHANGED_SINCE_LISTING`).
    SKIPPED = "skipped"
    #: Failed, but a later attempt may succeed.
    TRANSIENT = "transient"
    #: Failed, and retrying cannot help.
    PERMANENT = "permanent"


@dataclasses.dataclass(frozen=True, slots=True)
class KeyResult:
    """The outcome of one key; ``code`` and ``message`` explain failures."""

    key: str
    outcome: Outcome
    code: str = ""
    message: str = ""
    #: Seconds the store asked us to wait (``Retry-After``), if it said.
    retry_after: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Finding:
    """One thing ``digest-cleanup check`` found out about a target's store."""

    #: What was checked, such as ``conditional deletes``.
    check: str
    #: ``ok``; ``warning`` (works, but read this); ``problem`` (a run would fail or be unsafe).
    status: Literal["ok", "warning", "problem"]
    detail: str
    #: A short, stable reason code for a problem a run refuses to start on, such as
    #: ``conditions_not_honoured``; empty for the rest.
    code: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Namespace:
    """Where a target's keys live, for the check that refuses two nested targets.

    Two targets overlap when they name the same ``store`` and some key could start
    with both prefixes.  With no ``separator`` a prefix is a plain string, as a raw
    S3 prefix is (``statements`` does share keys with ``statements-archive/``).  With
    one (``"/"``) it names a folder or a path, compared segment by segment:
    ``/data/a`` holds ``/data/a/x`` but not ``/data/ab``.
    """

    store: str
    prefix: str
    separator: str = ""

    @classmethod
    def of(cls, where: Namespace | tuple[str, str]) -> Namespace:
        """A namespace from what :meth:`TargetKind.namespace` returned."""
        return where if isinstance(where, Namespace) else cls(*where)

    @property
    def folder(self) -> str:
        """The prefix as compared: a path-like one ends in its separator (the empty one stays)."""
        if self.separator and self.prefix and not self.prefix.endswith(self.separator):
            return self.prefix + self.separator
        return self.prefix

    def overlaps(self, other: Namespace) -> bool:
        """True when a key could lie in both: same store, one prefix inside the other."""
        a, b = self.folder, other.folder
        return self.store == other.store and (a.startswith(b) or b.startswith(a))


class TargetKind(ABC):
    """Base class of every target kind.

    Subclasses set :attr:`name`, define an ``Options`` dataclass for their own
    fields in the targets file, and implement :meth:`scan`, :meth:`delete`,
    :meth:`out_of_scope` and :meth:`describe`.  One instance serves one target
    in one process, so it may hold a client or a connection pool.
    """

    #: The ``kind = "..."`` name in the targets file.
    name: ClassVar[str]
    #: The kind's own fields in a ``[targets.NAME]`` table, as a frozen dataclass.
    Options: ClassVar[type[Any]]

    def __init__(self, target: str, options: Any, settings: Settings) -> None:
        self.target = target
        self.options = options
        #: The process settings; ``settings.env`` holds secrets a kind's options may name.
        self.settings = settings

    @classmethod
    def parse_options(cls, target: str, raw: Mapping[str, Any]) -> Any:
        """Build :attr:`Options` from the target's table, refusing unknown or mistyped fields."""
        return parse_dataclass(cls.Options, target, raw)

    @abstractmethod
    def scan(self, cutoff: datetime, start_after: str | None = None) -> Iterator[Page]:
        """Stream the target's keys in a stable order, page by page, marking expired ones."""

    @abstractmethod
    def delete(
        self, keys: Sequence[str], cutoff: datetime, conditions: Sequence[str] = ()
    ) -> list[KeyResult]:
        """Delete ``keys`` (all in scope, at most the kind's batch limit); one result per key.

        ``conditions`` are the scan's, one per key (``""`` where the scan gave none,
        or empty when no key has one).  Check and delete must be one step in the
        store: a key that no longer is what the scan found expired is left alone
        and reported :attr:`Outcome.SKIPPED` with :data:`CHANGED_SINCE_LISTING`.

        Must be idempotent: deleting an absent key is :attr:`Outcome.DELETED`.
        An error that fails the whole request is reported on every key, not raised.
        """

    @abstractmethod
    def out_of_scope(self, key: str) -> str | None:
        """Why ``key`` is not this target's to delete, or ``None`` when it is."""

    @abstractmethod
    def describe(self) -> str:
        """A short human location such as ``s3://bucket/prefix``."""

    #: The most keys one :meth:`delete` call accepts.
    max_batch_size: ClassVar[int] = 1000
    #: Per-key codes that mean the store is pushing back on the request rate: each lowers
    #: the target's shared delete budget (see :mod:`digest_cleanup.store.budget`).
    throttle_codes: ClassVar[frozenset[str]] = frozenset()

    def group(self, key: str) -> str:
        """The group ``key`` belongs to: the sweep never splits a group over two batches.

        Keys whose deletes must be ordered against each other (an S3 key's versions
        and delete markers) share a group, so one :meth:`delete` call sees them all.
        A scan yields a group's keys one after another, all in one page.  The
        default puts every key in a group of its own.
        """
        return key

    @classmethod
    def default_delete_rate(cls, options: Any, settings: Settings) -> float:
        """Keys per second a target of this kind may delete when it sets no ``delete_rate``.

        0 means no budget: the store sets no known limit.  The default is 0.
        """
        return 0.0

    @classmethod
    def namespace(cls, options: Any) -> Namespace | tuple[str, str] | None:
        """Where a target's keys live, for the overlap check and the log scrubber.

        A ``(store, prefix)`` pair is compared as plain strings, so a folder ends in
        ``/``; a :class:`Namespace` with ``separator="/"`` is compared by path
        segment (a directory, a path).  ``None`` (the default) means the kind cannot
        tell, and its targets are not checked.
        """
        return None

    @classmethod
    def log_prefixes(cls, options: Any) -> tuple[str, ...]:
        """The leading parts of a target's keys that a log line may show as they are.

        Keys carry customer ids, so before any line is written the log scrubber
        (:mod:`digest_cleanup.logs`) takes every word of it that starts with one of
        these as a key of the target and hashes its customer part.  The default is
        the namespace's prefix (an S3 prefix, a directory), else an option named
        ``prefix``; a kind whose keys look otherwise in its messages (``session:``
        before a Redis key, say) returns its own.  A target whose kind declares none
        is named in a warning when a worker starts, since its keys cannot be found.
        """
        where = cls.namespace(options)
        prefix = Namespace.of(where).prefix if where else getattr(options, "prefix", "")
        return (prefix,) if isinstance(prefix, str) and prefix else ()

    def scope(self) -> dict[str, Any]:
        """Everything that decides which keys are this target's, for the scope digest.

        A batch carries the digest of its target's scope when it was listed; a worker
        whose scope differs refuses it (``target_changed``).  The default is every
        option of the target.
        """
        return {"kind": self.name, **dataclasses.asdict(self.options)}

    @functools.cached_property
    def scope_digest(self) -> str:
        """A short, stable digest of :meth:`scope`; an instance's options never change."""
        text = json.dumps(self.scope(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def conditional(self) -> bool:
        """True when the store checks each delete against what the scan saw."""
        return True

    def condition_problem(self, condition: str) -> str | None:
        """Why ``condition`` must not be sent with a delete, or ``None`` when it may.

        Every batch's conditions pass this before anything is deleted, so a kind
        that checks deletes against what its scan saw says here what a condition
        looks like (an S3 ETag, say) and refuses anything else, such as ``*``.
        The default accepts every condition.
        """
        return None

    def server_time(self) -> datetime | None:
        """The store's own clock, as last seen (an HTTP ``Date`` header, say), or ``None``.

        The retention check takes the earliest of this, Redis's clock and the
        worker's (see :mod:`digest_cleanup.pipeline.trusted_clock`).  The default
        is ``None``: the kind cannot tell.
        """
        return None

    def remaining(self, cutoff: datetime) -> int:
        """How many expired keys are still present (for ``verify``)."""
        return sum(len(page.expired) for page in self.scan(cutoff))

    def verify_extra(self, cutoff: datetime) -> dict[str, int]:
        """Extra counts ``verify`` reports, such as noncurrent versions; none by default."""
        return {}

    def check(self) -> list[Finding]:
        """Probe the store before a first run: access, permissions, and what deletes rely on.

        It may write and remove a probe key of its own, never a target's key.
        The default checks nothing.
        """
        return []

    def probe_conditions(self) -> list[Finding]:
        """Prove that the store refuses a delete whose condition no longer holds.

        A run does not start until this passes for its target's scope (see
        :func:`digest_cleanup.pipeline.lifecycle.start`): a store that ignores
        conditions would delete keys rewritten after listing.  A problem finding
        refuses the run, under the finding's ``code``.  It may write and remove
        probe keys of its own, never a target's key.  The default proves nothing
        and finds nothing, for kinds whose delete checks the key itself.
        """
        return []

    def prepare(self) -> None:  # noqa: B027 - optional hook, most kinds build nothing ahead
        """Build clients ahead of the first task; called once when a worker process starts.

        It must not contact the store: a worker starts even while the store is down,
        and the first task reports the problem as usual.
        """

    def close(self) -> None:  # noqa: B027 - optional hook, most kinds hold nothing to close
        """Release clients or connections."""
