"""``versions = "all"``: listing expired keys by version, and deleting them in a safe order.

:func:`scan_versions` groups a listing's versions by key; a key expires when its
newest data version is older than the cutoff, and then every version and delete
marker of it is expired.

With ``versions = "all"`` a batch holds every version and delete marker the
listing found of each of its keys (the sweep never splits a key's versions over
two batches: :meth:`~digest_cleanup.kinds.base.TargetKind.group`).  Deleting a
key's delete marker makes its newest remaining data version current again, so
deleting the marker while a data version stays (locked, under legal hold, failed)
makes a deleted statement readable, while the run reports it deleted.  So one
batch goes in three steps:

1. one listing of the batch's key range says which of its versions are delete
   markers and which data versions each key still has: the store says so, not the
   message;
2. one DeleteObjects for the data versions;
3. one DeleteObjects for the delete markers of the keys that have no data version
   left.  A key whose only entries are delete markers goes here at once.

A key that still has a data version keeps its markers, each reported with code
:data:`MARKER_KEPT` and a message naming the version that stayed:

* a version of this batch stayed: the markers share its fate, dead-lettered
  beside a permanent failure (a redrive sends them together again) and retried
  beside a transient one (the retry carries them together);
* a version newer than the cutoff appeared (the key was written again since it
  was listed): the key lives again, and its markers are skipped as
  ``changed_since_listing``; its old versions, named by id, still go;
* an expired version this batch does not hold (a batch from before batches kept
  a key's versions together, or one of a key with more versions than a batch
  takes): the markers are retried until that version is gone.

A data version written between step 1 and step 3 is newer than every marker, so
deleting the markers then leaves that version current: nothing older comes back.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from digest_cleanup.errors import PermanentError, TransientError
from digest_cleanup.kinds.base import CHANGED_SINCE_LISTING, Outcome, Page
from digest_cleanup.kinds.s3_client import aware, mapped_errors
from digest_cleanup.kinds.s3_delete import VERSION_SEPARATOR, Batch, Deletion

if TYPE_CHECKING:
    from mypy_boto3_s3.type_defs import (
        ListObjectVersionsOutputTypeDef,
        ListObjectVersionsRequestTypeDef,
        ObjectVersionTypeDef,
    )

    from digest_cleanup.kinds.s3_options import S3Target

    class Entry(ObjectVersionTypeDef):
        """A listed version or delete marker (whose fields are a version's), and which."""

        marker: bool


#: The code of a delete marker kept because a data version of its key stayed.
MARKER_KEPT = "marker_kept"


def scan_versions(kind: S3Target, cutoff: datetime, start_after: str | None) -> Iterator[Page]:
    """Group versions by key; a key expires when its newest data version is old.

    A page ends at the last key it completes, so a key's versions are never split
    over two pages (the sweep's batches rely on it).
    """
    kind.require_versioning()
    # A plain dict: ``KeyMarker`` is not among the stubs' paginate arguments, yet
    # botocore sends it with the first page's request.
    params: dict[str, Any] = {"Bucket": kind.options.bucket, "Prefix": kind.options.prefix}
    if start_after:
        params["KeyMarker"] = start_after
    paginator = kind.client.get_paginator("list_object_versions")
    key: str | None = None
    group: list[Entry] = []
    for response in paginator.paginate(**params):
        # A cast, as mypy types no TypedDict spread into a dict literal: each is an Entry,
        # since a delete marker's fields are among a version's.
        entries = cast(
            "list[Entry]",
            [
                *({**v, "marker": False} for v in response.get("Versions", [])),
                *({**m, "marker": True} for m in response.get("DeleteMarkers", [])),
            ],
        )
        _refuse_mangled_keys(kind, response, entries)
        entries.sort(key=lambda e: e["Key"])  # stable: keeps each key's newest-first order
        expired: list[str] = []
        done_key: str | None = None
        for entry in entries:
            if entry["Key"] != key:
                if key is not None:
                    expired.extend(_expired_versions(key, group, cutoff))
                    done_key = key
                key, group = entry["Key"], []
            group.append(entry)
        yield Page(scanned=len(entries), expired=expired, cursor=done_key)
    if key is not None:
        yield Page(scanned=0, expired=_expired_versions(key, group, cutoff), cursor=key)


def _refuse_mangled_keys(
    kind: S3Target, response: ListObjectVersionsOutputTypeDef, entries: list[Entry]
) -> None:
    """Fail the listing if a server that ignored ``encoding-type=url`` replaced a character.

    SeaweedFS 4.48 writes a control character in a ListObjectVersions key as U+FFFD;
    a delete of that name and version then answers "deleted" while the object stays.
    """
    if response.get("EncodingType") == "url":
        return
    mangled = next((e["Key"] for e in entries if "\ufffd" in e["Key"]), None)
    if mangled is not None:
        raise PermanentError(
            "listing_not_encoded",
            f"targets.{kind.target}: the server listed versions without URL-encoding "
            f"their keys, and {mangled!r} holds U+FFFD where it could not write a "
            "character, so its versions cannot be named for a delete; rename or delete "
            "that key by hand, or set versions = 'current'",
        )


def _expired_versions(key: str, group: list[Entry], cutoff: datetime) -> list[str]:
    """Every version of ``key``, data versions first, unless its newest data version is new.

    A key with only delete markers left expires too.  Markers come last so that a
    key too large for one batch is split before them (see ``cut_batches``).
    """
    data = [e for e in group if not e["marker"]]
    newest = max((aware(e["LastModified"]) for e in data), default=None)
    if newest is not None and newest >= cutoff:
        return []
    markers = [e for e in group if e["marker"]]
    return [f"{key}{VERSION_SEPARATOR}{e['VersionId']}" for e in (*data, *markers)]


@dataclasses.dataclass
class StoredKey:
    """What the store holds of one key: its data versions and its delete markers."""

    #: Version id -> LastModified of each data version.
    data: dict[str, datetime] = dataclasses.field(default_factory=dict)
    markers: set[str] = dataclasses.field(default_factory=set)


class VersionedDeletion(Deletion):
    """The delete path of a ``versions = "all"`` target: data versions first, then markers."""

    def _send_open(self, batch: Batch, cutoff: datetime) -> None:
        """Delete the open versions of ``batch`` in the three steps of the module docstring."""
        open_ = batch.open()
        if not open_:
            return
        names = [self._name(key) for key in batch.keys]
        try:
            stored = self._stored_versions(sorted({names[i]["Key"] for i in open_}))
        except (TransientError, PermanentError) as exc:
            # Without the store's word no marker can be told apart: delete nothing.
            outcome = Outcome.TRANSIENT if isinstance(exc, TransientError) else Outcome.PERMANENT
            for i in open_:
                batch.set(i, outcome, exc.code, f"listing the batch's versions: {exc.message}")
            return
        markers = {i for i in open_ if names[i]["VersionId"] in stored[names[i]["Key"]].markers}
        # A version the store no longer lists is gone: sending it is answered "deleted".
        self._send(batch, [i for i in open_ if i not in markers])
        data_of: dict[str, list[int]] = {}
        for j, name in enumerate(names):  # settled before this call too (a null version)
            if j not in markers:
                data_of.setdefault(name["Key"], []).append(j)
        ready = []
        for i in sorted(markers):
            key = names[i]["Key"]
            if not self._keep_marker(batch, i, key, stored[key], data_of.get(key, []), cutoff):
                ready.append(i)
        self._send(batch, ready)

    def _keep_marker(
        self,
        batch: Batch,
        index: int,
        key: str,
        stored: StoredKey,
        mine: list[int],
        cutoff: datetime,
    ) -> bool:
        """Settle marker ``index`` as kept, and say so, when a data version of ``key`` stays."""
        gone = {
            self._name(batch.keys[j])["VersionId"]
            for j in mine
            if batch.done[j].outcome is Outcome.DELETED
        }
        staying = [v for v in stored.data if v not in gone]
        if not staying:
            return False
        failed = [batch.done[j] for j in mine if batch.done[j].outcome is not Outcome.DELETED]
        why = "deleting this delete marker would make that version readable again; kept"
        if failed:
            first = failed[0]
            outcomes = {r.outcome for r in failed}
            outcome = Outcome.TRANSIENT if outcomes == {Outcome.TRANSIENT} else Outcome.PERMANENT
            batch.set(
                index,
                outcome,
                MARKER_KEPT,
                f"version {first.key} stayed ({first.code}: {first.message}); {why}",
                first.retry_after if outcome is Outcome.TRANSIENT else None,
            )
            return True
        newer = [v for v in staying if stored.data[v] >= cutoff]
        if newer:
            batch.set(
                index,
                Outcome.SKIPPED,
                CHANGED_SINCE_LISTING,
                f"{key} was written again since it was listed (version {newer[0]}, "
                f"{stored.data[newer[0]].isoformat()}); its delete markers are kept",
            )
            return True
        batch.set(
            index,
            Outcome.TRANSIENT,
            MARKER_KEPT,
            f"version {key}{VERSION_SEPARATOR}{staying[0]} is not in this batch and still "
            f"there; {why} until it is gone",
        )
        return True

    def _stored_versions(self, keys: list[str]) -> dict[str, StoredKey]:
        """What the store holds of each of ``keys`` (sorted): one listing over their range.

        The listing starts just before the first key (``KeyMarker`` lists the keys
        after it) and stops past the last, so a batch costs about one request per
        1,000 versions in its range, where a listing per key would cost one per key.
        """
        found = {key: StoredKey() for key in keys}
        last = keys[-1]
        # By character on purpose: an S3 key is a string, not a path.
        prefix = os.path.commonprefix([keys[0], last])  # noqa: RUF071
        params: ListObjectVersionsRequestTypeDef = {"Bucket": self.options.bucket, "Prefix": prefix}
        if keys[0][:-1]:
            params["KeyMarker"] = keys[0][:-1]
        with mapped_errors():
            while True:
                response = self.client.list_object_versions(**params)
                for version in response.get("Versions", []):
                    if version["Key"] in found:
                        stored = found[version["Key"]]
                        stored.data[version["VersionId"]] = aware(version["LastModified"])
                for marker in response.get("DeleteMarkers", []):
                    if marker["Key"] in found:
                        found[marker["Key"]].markers.add(marker["VersionId"])
                if not response.get("IsTruncated"):
                    return found
                next_key = response.get("NextKeyMarker")
                if not next_key:
                    # Ending here could miss a marker, and delete it with the data.
                    raise TransientError(
                        "listing_truncated",
                        "ListObjectVersions was truncated with no NextKeyMarker",
                    )
                if next_key > last:
                    return found
                params["KeyMarker"] = next_key
                params.pop("VersionIdMarker", None)
                if response.get("NextVersionIdMarker"):
                    params["VersionIdMarker"] = response["NextVersionIdMarker"]
