"""A target kind for the files of a local directory, deleted once older than the cutoff.

A key is a file's absolute path under the target's ``directory``; it has expired
when its modification time is before the cutoff.  The scan gives each expired
file a condition, its fingerprint ``mtime_ns:size:inode``.

A filesystem has no conditional delete, so :meth:`LocalDirKind.delete` moves each
file aside before deciding:

1. rename ``NAME`` to ``.NAME.deleting-TOKEN`` in the same folder, ``TOKEN`` being
   this attempt's own.  A rename is atomic: from then on no writer reaches the
   file by its name, and no other attempt can move it too;
2. re-check the moved file against the scan's fingerprint and the cutoff;
3. unlink it if it is unchanged; otherwise put it back with ``link``, which never
   replaces a file written at ``NAME`` meanwhile, and report it SKIPPED.

Two attempts of one batch may run at once (a redelivery racing a slow attempt).
An attempt that finds ``NAME`` gone while another attempt's ``.NAME.deleting-*``
copy exists cannot know yet whether the file comes back, so it reports the key
TRANSIENT (``delete_in_progress``) and its retry sees the outcome.  A crash
between steps 1 and 3 leaves the moved copy behind: :meth:`LocalDirKind.check`
lists such copies for an operator to put back.  A writer that keeps the file open
across the rename can still change it after step 2; only writers that write a
new file and rename it into place are fully covered.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from digest_cleanup.errors import TargetsFileError
from digest_cleanup.kinds import (
    CHANGED_SINCE_LISTING,
    Finding,
    KeyResult,
    Namespace,
    Outcome,
    Page,
    TargetKind,
)

logger = logging.getLogger(__name__)

#: Keys per page of a scan.
PAGE_SIZE = 1000
#: What a condition written by the scan looks like.
_FINGERPRINT = re.compile(r"^\d+:\d+:\d+$")
#: The infix of a file moved aside by a delete attempt.
ASIDE = ".deleting-"


@dataclasses.dataclass(frozen=True)
class LocalDirOptions:
    """The fields of a local directory target."""

    #: The absolute path of the directory whose files are cleaned, subfolders included.
    directory: str


class LocalDirKind(TargetKind):
    """Files under a directory, expired by their modification time."""

    name = "localdir"
    Options = LocalDirOptions
    max_batch_size = 1000
    options: LocalDirOptions

    @classmethod
    def parse_options(cls, target: str, raw: Mapping[str, Any]) -> LocalDirOptions:
        """Refuse a relative path, or the root, which would reach every file."""
        options: LocalDirOptions = super().parse_options(target, raw)
        directory = os.path.normpath(options.directory)
        if not os.path.isabs(directory) or directory == os.sep:
            raise TargetsFileError(
                f"targets.{target}.directory: {options.directory!r} must be an absolute "
                "path below the root, such as '/srv/digests'"
            )
        return LocalDirOptions(directory=directory)

    @classmethod
    def namespace(cls, options: LocalDirOptions) -> Namespace:
        """The directory, compared by path segment: ``/srv/a`` does not hold ``/srv/ab``.

        Its keys start with it, so it is also what :meth:`log_prefixes` shows of them.
        """
        return Namespace("file://", options.directory, separator="/")

    def describe(self) -> str:
        return f"file://{self.options.directory}"

    def scan(self, cutoff: datetime, start_after: str | None = None) -> Iterator[Page]:
        """Page through the files in sorted path order, marking those modified before the cutoff."""
        paths = sorted(
            os.path.join(folder, name)
            for folder, _, names in os.walk(self.options.directory)
            for name in names
            if not name.startswith(".")  # moved-aside copies and hidden files
        )
        if start_after is not None:
            paths = [p for p in paths if p > start_after]
        for i in range(0, len(paths), PAGE_SIZE):
            page = paths[i : i + PAGE_SIZE]
            expired, conditions = [], []
            for path in page:
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue  # deleted since the walk: scanned, not expired
                if st.st_mtime < cutoff.timestamp():
                    expired.append(path)
                    conditions.append(_fingerprint(st))
            yield Page(scanned=len(page), expired=expired, cursor=page[-1], conditions=conditions)

    def delete(
        self, keys: Sequence[str], cutoff: datetime, conditions: Sequence[str] = ()
    ) -> list[KeyResult]:
        """Move each file aside under this attempt's name, re-check it, then unlink or put back."""
        token = uuid.uuid4().hex[:12]
        listed = list(conditions) or [""] * len(keys)
        return [
            self._delete_one(key, cond, cutoff, token)
            for key, cond in zip(keys, listed, strict=True)
        ]

    def _delete_one(self, path: str, condition: str, cutoff: datetime, token: str) -> KeyResult:
        folder, name = os.path.split(path)
        aside = os.path.join(folder, f".{name}{ASIDE}{token}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            if any(n.startswith(f".{name}{ASIDE}") for n in _names(folder)):
                busy = "another attempt has moved this file aside"
                return KeyResult(path, Outcome.TRANSIENT, "delete_in_progress", busy, 1.0)
            return KeyResult(path, Outcome.DELETED)  # already gone: deleting is idempotent
        except OSError as exc:
            return _failed(path, exc)
        try:
            st = os.stat(aside)
            if st.st_mtime >= cutoff.timestamp() or (condition and _fingerprint(st) != condition):
                _put_back(aside, path)
                logger.warning("kept %s: changed since listing", path)
                return KeyResult(
                    path, Outcome.SKIPPED, CHANGED_SINCE_LISTING, "changed since listing"
                )
            os.unlink(aside)
        except OSError as exc:
            return _failed(path, exc)
        return KeyResult(path, Outcome.DELETED)

    def out_of_scope(self, key: str) -> str | None:
        """Refuse anything but a normalised path of a visible file under the directory."""
        if os.path.normpath(key) != key or not key.startswith(self.options.directory + os.sep):
            return f"not a file under {self.options.directory}"
        if os.path.basename(key).startswith("."):
            return "a hidden file, or a copy a delete moved aside"
        return None

    def condition_problem(self, condition: str) -> str | None:
        """Refuse anything but the fingerprint its scan writes."""
        if not _FINGERPRINT.match(condition):
            return f"{condition!r} is not a fingerprint mtime_ns:size:inode"
        return None

    def check(self) -> list[Finding]:
        """Say whether the directory can be read, and list copies a crashed delete left aside."""
        if not os.access(self.options.directory, os.R_OK | os.W_OK | os.X_OK):
            return [Finding("access", "problem", f"cannot read and write {self.describe()}")]
        left = sum(
            ASIDE in name for _, _, names in os.walk(self.options.directory) for name in names
        )
        if left:
            detail = f"{left} files moved aside by a crashed delete: rename each back"
            return [Finding("moved-aside copies", "warning", detail)]
        return [Finding("access", "ok", f"{self.describe()} is readable and writable")]


def _fingerprint(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns}:{st.st_size}:{st.st_ino}"


def _names(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


def _put_back(aside: str, path: str) -> None:
    """Give the file its name again, unless a new file was written there meanwhile."""
    # A newer file there stays: it replaced the moved one, as a rewrite would.
    with contextlib.suppress(FileExistsError):
        os.link(aside, path)
    os.unlink(aside)


def _failed(path: str, exc: OSError) -> KeyResult:
    if isinstance(exc, PermissionError):
        return KeyResult(path, Outcome.PERMANENT, "permission_denied", str(exc)[:200])
    return KeyResult(path, Outcome.TRANSIENT, "io_error", str(exc)[:200])
