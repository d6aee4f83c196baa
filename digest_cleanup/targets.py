"""The targets file: what to clean, where, how old, and when.

Each ``[targets.NAME]`` table holds the common fields below plus the fields of
its kind (``kind = "s3"`` by default).  Everything is validated on load, and an
error names the target, the field and what would be accepted.

It is long because every common field's check and the sentence its error says live
here, so one module answers "what may a targets file say?".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from celery.schedules import crontab
from croniter import CroniterBadDateError, croniter

from digest_cleanup.clock import utcnow
from digest_cleanup.errors import CutoffError, TargetsFileError
from digest_cleanup.kinds import Namespace, TargetKind, load_kind
from digest_cleanup.settings import Settings

#: Keys in one DeleteObjects-sized batch unless the target says otherwise.
DEFAULT_BATCH_SIZE = 500
#: A run that finds more expired keys than this deletes nothing and fails
#: (``max_delete_exceeded``) unless forced.  About twice a weekly run of the
#: 120k-customer digest: large enough for a normal week, small enough to stop
#: ``retention_days = 0`` from wiping a bucket that holds a month of artifacts.
DEFAULT_MAX_DELETE = 250_000
#: A run that skips more than this share of its expired keys (kept as changed since
#: the listing) ends ``complete_with_failures``, not ``complete``.  A normal week
#: re-renders a few artifacts between listing and delete; a tenth is already a
#: pattern, such as a job rewriting the prefix while the run deletes.
DEFAULT_MAX_SKIPPED_SHARE = 0.1
#: How long after a missed slot beat still catches up on start (a weekly schedule).
CATCH_UP_WINDOW = timedelta(days=7)
#: How far back :meth:`Target.last_slot` looks for a slot before giving up.
SLOT_SEARCH = CATCH_UP_WINDOW * 5

#: The fields every target may set, whatever its kind: reserved, so no kind's
#: ``Options`` may use one of these names.
COMMON_FIELDS = frozenset(
    {
        "kind",
        "retention_days",
        "schedule",
        "batch_size",
        "max_delete",
        "description",
        "overlaps",
        "delete_rate",
        "max_skipped_share",
    }
)
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


@dataclasses.dataclass(frozen=True)
class Target:
    """One validated cleanup target."""

    name: str
    kind: str
    retention_days: int
    schedule: str
    batch_size: int
    max_delete: int
    description: str
    options: Any
    kind_class: type[TargetKind] = dataclasses.field(repr=False, compare=False)
    #: SHA-256 of the target's table as written, so a report shows which config ran.
    config_digest: str = ""
    #: Targets this one may overlap on purpose (``overlaps = ["other"]``).
    overlaps: tuple[str, ...] = ()
    #: Keys per second every worker together may delete (``delete_rate``); 0 is no
    #: budget, None the kind's default (see :meth:`delete_budget`).
    delete_rate: float | None = None
    #: Share of a run's expired keys it may skip and still end ``complete``.
    max_skipped_share: float = DEFAULT_MAX_SKIPPED_SHARE

    def delete_budget(self, settings: Settings) -> float:
        """Keys per second this target's deletes share across the fleet; 0: no budget.

        The target's ``delete_rate`` if it sets one, else its kind's default: on AWS
        S3 a little under the 3,500 writes per second of one partitioned prefix, on
        another endpoint none.
        """
        if self.delete_rate is not None:
            return self.delete_rate
        return self.kind_class.default_delete_rate(self.options, settings)

    def cutoff_for(self, now: datetime) -> datetime:
        """Keys last modified before this instant have expired."""
        return (now - timedelta(days=self.retention_days)).astimezone(UTC).replace(microsecond=0)

    def check_cutoff(self, cutoff: datetime, now: datetime | None = None) -> None:
        """Refuse a cutoff inside the retention window: it would delete keys still kept.

        ``now`` is the checker's own clock, never a time a message or a caller
        supplies: the check is what stops a forged or mistaken one.
        """
        latest = self.cutoff_for(now or utcnow())
        if cutoff > latest:
            raise CutoffError(
                f"cutoff {cutoff.isoformat()} is inside the retention window of target "
                f"{self.name} (retention_days = {self.retention_days}): objects modified after "
                f"{latest.isoformat()} must be kept; use a cutoff at or before "
                f"{latest.isoformat()}, or leave --cutoff out for the latest one"
            )

    def crontab(self) -> crontab:
        """The schedule as a Celery crontab (UTC)."""
        return _parse_crontab(self.name, self.schedule)

    def last_slot(self, now: datetime) -> datetime:
        """The latest scheduled instant at or before ``now`` (minute precision, UTC).

        Beat triggers and catch-ups both key their run on this slot, so two beats,
        or a beat restarted after downtime, agree on one run per slot.  croniter
        reads the expression only once Celery's crontab has accepted it, so both
        read the same language; ``day_or=False`` keeps Celery's rule that a
        restricted day of month and day of week must both match (cron's own is
        either).  A slot older than :data:`SLOT_SEARCH` is an error.
        """
        self.crontab()  # refuses what beat's crontab refuses, with the same message
        t = now.astimezone(UTC).replace(second=0, microsecond=0)
        try:
            # get_prev is strictly before its start: start a second late so t itself counts.
            slot: datetime = croniter(
                self.schedule, t + timedelta(seconds=1), day_or=False, max_years_between_matches=1
            ).get_prev(datetime)
        except CroniterBadDateError:  # none within a year: 29 February on a Monday, say
            slot = t - SLOT_SEARCH
        if t - slot >= SLOT_SEARCH:
            raise TargetsFileError(f"targets.{self.name}.schedule: no slot in the last 35 days")
        return slot

    def make_kind(self, settings: Settings) -> TargetKind:
        """A kind instance for this target."""
        return self.kind_class(self.name, self.options, settings)


@dataclasses.dataclass(frozen=True)
class Targets:
    """All targets from one file, by name."""

    path: Path
    by_name: Mapping[str, Target]

    def __iter__(self) -> Iterator[Target]:
        return iter(self.by_name.values())

    def __len__(self) -> int:
        return len(self.by_name)

    def get(self, name: str) -> Target:
        try:
            return self.by_name[name]
        except KeyError:
            known = ", ".join(sorted(self.by_name)) or "(none)"
            raise TargetsFileError(
                f"unknown target {name!r}; {self.path} defines: {known}"
            ) from None


def load_targets(path: Path, *, audit_url: str | None = None) -> Targets:
    """Read and validate a targets file (and that ``audit_url`` is in no target's scope)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TargetsFileError(
            f"CLEANUP_TARGETS_FILE: {path} does not exist; point CLEANUP_TARGETS_FILE at your "
            "targets file (examples/targets.toml shows the format)"
        ) from None
    except OSError as exc:
        raise TargetsFileError(f"CLEANUP_TARGETS_FILE: cannot read {path}: {exc}") from exc
    return parse_targets(text, path, audit_url=audit_url)


def parse_targets(
    text: str, path: Path = Path("<string>"), *, audit_url: str | None = None
) -> Targets:
    """Validate the TOML text of a targets file.

    Besides each table, it refuses two targets whose scopes overlap (one could
    delete the other's longer-kept keys) unless one names the other in
    ``overlaps``, and an audit location (``CLEANUP_AUDIT_URL``) inside a target's
    scope, where a run could delete the reports.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TargetsFileError(f"{path}: not valid TOML: {exc}") from exc
    extra = sorted(set(doc) - {"targets"})
    if extra:
        raise TargetsFileError(
            f"{path}: unknown top-level key {', '.join(map(repr, extra))}; "
            "define targets as [targets.NAME] tables"
        )
    tables = doc.get("targets")
    if not isinstance(tables, dict) or not tables:
        raise TargetsFileError(f"{path}: no targets; add a [targets.NAME] table")
    by_name: dict[str, Target] = {}
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise TargetsFileError(f"targets.{name}: must be a table, got {table!r}")
        by_name[name] = parse_target(name, table)
    _check_overlaps(by_name.values(), audit_url)
    return Targets(path=path, by_name=by_name)


def _check_overlaps(targets: Iterable[Target], audit_url: str | None) -> None:
    placed = [(t, t.kind_class.namespace(t.options)) for t in targets]
    located = [(t, Namespace.of(where)) for t, where in placed if where is not None]
    for i, (a, where_a) in enumerate(located):
        for b, where_b in located[i + 1 :]:
            if not where_a.overlaps(where_b):
                continue
            if b.name in a.overlaps or a.name in b.overlaps:
                continue
            raise TargetsFileError(
                f"targets.{a.name} and targets.{b.name} overlap: {_place(where_a)} and "
                f"{_place(where_b)}; a run of one could delete the other's keys before "
                f"their retention ends. Give them disjoint prefixes, or, if the overlap is "
                f'intended, add overlaps = ["{b.name}"] to targets.{a.name}'
            )
    if audit_url is None:
        return
    bucket, _, prefix = audit_url.removeprefix("s3://").partition("/")
    # An S3 prefix is a plain string (no separator): a report key is an S3 key.
    audit = Namespace(f"s3://{bucket}", prefix)
    for t, where in located:
        if where.overlaps(audit):
            raise TargetsFileError(
                f"CLEANUP_AUDIT_URL: {audit_url} lies in the scope of targets.{t.name} "
                f"({_place(where)}), whose runs could delete the audit reports; "
                "point CLEANUP_AUDIT_URL at a prefix no target covers"
            )


def _place(where: Namespace) -> str:
    """``store/prefix`` as an overlap error shows it."""
    return f"{where.store}/{where.prefix}"


def _check_options_names(name: str, kind_class: type[TargetKind]) -> None:
    """Refuse a kind whose ``Options`` reuse a common field's name: it would never get it."""
    clash = sorted(COMMON_FIELDS & {f.name for f in dataclasses.fields(kind_class.Options)})
    if clash:
        raise TargetsFileError(
            f"targets.{name}.kind: {kind_class.__module__}.{kind_class.__qualname__}.Options "
            f"has {', '.join(map(repr, clash))}, reserved for every target "
            f"({', '.join(sorted(COMMON_FIELDS))}); rename the kind's field"
        )


def parse_target(name: str, table: Mapping[str, Any]) -> Target:
    """Validate one ``[targets.NAME]`` table."""
    if not _NAME.match(name):
        raise TargetsFileError(
            f"targets.{name}: a target name is 1-63 lowercase letters, digits, '-' or '_'"
        )
    kind_name = table.get("kind", "s3")
    if not isinstance(kind_name, str):
        raise TargetsFileError(f"targets.{name}.kind: expected a string, got {kind_name!r}")
    kind_class = load_kind(kind_name, target=name)
    _check_options_names(name, kind_class)

    retention = _require(name, table, "retention_days", int)
    if retention < 0:
        raise TargetsFileError(
            f"targets.{name}.retention_days: {retention} is negative; use the number of days "
            "a key must be kept (0 or more)"
        )
    schedule = _require(name, table, "schedule", str)
    _parse_crontab(name, schedule)
    batch_size = _optional(name, table, "batch_size", int, DEFAULT_BATCH_SIZE)
    if not 1 <= batch_size <= kind_class.max_batch_size:
        raise TargetsFileError(
            f"targets.{name}.batch_size: {batch_size} is outside 1..{kind_class.max_batch_size} "
            f"(the most one {kind_name} delete request takes)"
        )
    max_delete = _optional(name, table, "max_delete", int, DEFAULT_MAX_DELETE)
    if max_delete < 1:
        raise TargetsFileError(
            f"targets.{name}.max_delete: {max_delete} must be at least 1; it caps how many "
            "keys one run may delete"
        )
    description = _optional(name, table, "description", str, "")
    delete_rate = _delete_rate(name, table)
    max_skipped_share = _max_skipped_share(name, table)
    overlaps = _optional(name, table, "overlaps", list, [])
    if not all(isinstance(o, str) for o in overlaps):
        raise TargetsFileError(
            f"targets.{name}.overlaps: expected a list of target names, got {overlaps!r}"
        )
    own = {k: v for k, v in table.items() if k not in COMMON_FIELDS}
    options = kind_class.parse_options(name, own)
    digest = hashlib.sha256(
        json.dumps({"name": name, **table}, sort_keys=True, default=str).encode()
    ).hexdigest()
    return Target(
        name=name,
        kind=kind_name,
        retention_days=retention,
        schedule=schedule,
        batch_size=batch_size,
        max_delete=max_delete,
        description=description,
        options=options,
        kind_class=kind_class,
        config_digest=digest,
        overlaps=tuple(overlaps),
        delete_rate=delete_rate,
        max_skipped_share=max_skipped_share,
    )


def _delete_rate(name: str, table: Mapping[str, Any]) -> float | None:
    """``delete_rate``: keys per second, a number above 0, or 0 for no budget."""
    if "delete_rate" not in table:
        return None
    value = table["delete_rate"]
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise TargetsFileError(
            f"targets.{name}.delete_rate: expected keys per second (a number, 0 for no "
            f"budget), got {value!r}; AWS S3 allows about 3500 per partitioned prefix"
        )
    return float(value)


def _max_skipped_share(name: str, table: Mapping[str, Any]) -> float:
    """``max_skipped_share``: a number from 0 to 1."""
    value = table.get("max_skipped_share", DEFAULT_MAX_SKIPPED_SHARE)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise TargetsFileError(
            f"targets.{name}.max_skipped_share: expected a share between 0 and 1 (0.1 is a "
            f"tenth of a run's expired keys; 1 lets every key be skipped), got {value!r}"
        )
    return float(value)


def _parse_crontab(name: str, schedule: str) -> crontab:
    fields = schedule.split()
    if len(fields) != 5:
        raise TargetsFileError(
            f"targets.{name}.schedule: {schedule!r} has {len(fields)} fields; use a 5-field "
            "crontab in UTC: minute hour day-of-month month day-of-week, e.g. '0 3 * * 0'"
        )
    minute, hour, dom, month, dow = fields
    try:
        return crontab(
            minute=minute, hour=hour, day_of_month=dom, month_of_year=month, day_of_week=dow
        )
    except (ValueError, TypeError) as exc:
        raise TargetsFileError(
            f"targets.{name}.schedule: {schedule!r} is not valid: {exc}"
        ) from exc


def _require(name: str, table: Mapping[str, Any], field: str, typ: type[Any]) -> Any:
    if field not in table:
        raise TargetsFileError(f"targets.{name}: missing required field {field!r}")
    return _optional(name, table, field, typ, None)


def _optional(name: str, table: Mapping[str, Any], field: str, typ: type[Any], default: Any) -> Any:
    value = table.get(field, default)
    if field in table and (not isinstance(value, typ) or (isinstance(value, bool) and typ is int)):
        raise TargetsFileError(f"targets.{name}.{field}: expected {typ.__name__}, got {value!r}")
    return value
