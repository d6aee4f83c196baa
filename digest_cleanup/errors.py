"""Every error digest-cleanup raises, in one tree.

::

    CleanupError
    ├── ConfigError                 bad settings or targets file; exit code 2
    │   ├── SettingsError           an environment variable (names it)
    │   └── TargetsFileError        the targets file (names the target and field)
    ├── UsageError                  a bad CLI argument; exit code 2
    │   └── CutoffError             a cutoff inside the target's retention window
    ├── RunStateError               the run store is missing or inconsistent
    ├── DeadLetterError             a dead-letter operation was refused
    └── StoreError                   one key could not be deleted
        ├── TransientError          retry later: throttling, 5xx, timeouts
        └── PermanentError          never retried: access denied, locked, out of scope
            ├── PoisonMessage       a message that does not decode; dead-lettered at once
            └── RefusedBatch        a batch a delete-time check refuses; dead-lettered whole

Retry policy keys off :class:`TransientError` versus :class:`PermanentError`,
never off message text.  Kinds map their own low-level errors into these with
:func:`classify` tables of their own; the pipeline only sees the classes and
their short ``code``.
"""

from __future__ import annotations


class CleanupError(Exception):
    """Root of every error digest-cleanup raises on purpose."""


class ConfigError(CleanupError):
    """Configuration that cannot work; the message names the setting and the fix."""


class SettingsError(ConfigError):
    """An environment setting is invalid."""

    def __init__(self, name: str, problem: str, fix: str) -> None:
        self.name = name
        super().__init__(f"{name}: {problem}; {fix}")


class TargetsFileError(ConfigError):
    """The targets file is missing, unreadable or invalid."""


class UsageError(CleanupError):
    """A command-line argument is invalid."""


class CutoffError(UsageError):
    """A cutoff that would delete keys still inside their target's retention window."""


class RunStateError(CleanupError):
    """The run store does not hold what the operation needs."""


class DeadLetterError(CleanupError):
    """A dead-letter operation was refused."""


class StoreError(CleanupError):
    """One key (or a whole batch request) failed; ``code`` is short and stable."""

    def __init__(self, code: str, message: str, *, retry_after: float | None = None) -> None:
        self.code = code
        self.message = message
        self.retry_after = retry_after
        super().__init__(f"{code}: {message}")


class TransientError(StoreError):
    """Worth retrying: throttling, server errors, timeouts, lost connections."""


class PermanentError(StoreError):
    """Retrying cannot help: access denied, object lock, out of scope."""


class PoisonMessage(PermanentError):
    """A message that can never succeed; it is dead-lettered at once, never retried."""


class RefusedBatch(PermanentError):
    """A batch that decoded but that a delete-time check refuses; nothing in it is deleted.

    It is dead-lettered whole, with all its keys and their conditions, as an entry
    that can be redriven once its cause is fixed (the target's configuration put
    back, say).
    """
