"""Every Redis key the project uses, built in one place under one prefix (``dc`` by default).

Each key has one owner, the part of the store that writes it.  Another part's
script that must change it in the same atomic step includes the owner's fragment
(``scripts/run_*.lua``, ``scripts/sweep_lease.lua``) instead of writing it itself.

=================================  =========  ================================================
key                                owner      what it holds
=================================  =========  ================================================
``run:ID``                         runs       a run's hash: status, counters, plain fields
``run:ID:claims``, ``deliveries``  runs       attempts counted, and deliveries by claim
``run:ID:pending``, ``chains``     runs       batches in flight, and their open chains
``run:ID:retry_codes`` ...         runs       ``retried_codes``, ``skipped_keys``, ``progress``
``run:ID:redriven``                runs       batch ids an operator redrove
``runs``                           runs       every run id, scored by when it opened
``target:T:latest``                runs       the id of the target's most recent run
``latency:T``, ``timings:T``       runs       what the target's attempts took, from records
``run:ID:checkpoint``              sweeps     how far the listing got
``run:ID:sweep_lease``             sweeps     the fence of the slice sweeping the run
``run:ID:staged``, ``published``   sweeps     batches staged, and each one's published digest
``slot:T:SLOT``                    targets    the lock of a scheduled slot
``target:T:last_success`` ...      targets    ``probed``, ``verify``: the target's own record
``dlq:entries`` ...                dead       the dead-letter index (``order``, ``copies``,
                                   letters    ``stats``, ``digests``, ``run:ID``, ``target:T``)
``audit``                          dead       operators' actions, newest first
                                   letters
``budget:T``                       budget     the target's shared delete budget
``clock_skew``                     clock      the last wide clock skew seen, by target
                                   skews
=================================  =========  ================================================

The Celery queues a redrive reads and writes are the broker's, named by the
settings, not here.
"""

from __future__ import annotations

#: How long a finished run's state stays in Redis; the audit report is the durable record.
RUN_TTL_SECONDS = 35 * 24 * 3600
#: The run part's keys of one run: its hash (no suffix) and the ``run:ID:SUFFIX`` keys.
RUN_SUFFIXES = (
    "",
    "claims",
    "pending",
    "retry_codes",
    "retried_codes",
    "deliveries",
    "skipped_keys",
    "progress",
    "redriven",
    "chains",
)
#: The sweep part's keys of one run (``run:ID:SUFFIX``).
SWEEP_SUFFIXES = ("checkpoint", "sweep_lease", "staged", "published")
#: Every key of one run, both parts'.
RUN_KEY_SUFFIXES = RUN_SUFFIXES + SWEEP_SUFFIXES


class Keys:
    """The key names of one deployment, all under ``prefix``."""

    def __init__(self, prefix: str = "dc") -> None:
        self.prefix = prefix

    def key(self, *parts: str) -> str:
        """``prefix:part:part``; the named builders below are what the parts use."""
        return ":".join((self.prefix, *parts))

    def run(self, run_id: str, suffix: str = "") -> str:
        """The run's hash, or with ``suffix`` (one of :data:`RUN_KEY_SUFFIXES`) one of its keys."""
        return self.key("run", run_id) + (f":{suffix}" if suffix else "")

    def runs(self) -> str:
        return self.key("runs")

    def latest(self, target: str) -> str:
        return self.key("target", target, "latest")

    def latency(self, target: str) -> str:
        return self.key("latency", target)

    def timings(self, target: str) -> str:
        return self.key("timings", target)

    def sweep_lease(self, run_id: str) -> str:
        return self.run(run_id, "sweep_lease")

    def slot(self, target: str, slot: str) -> str:
        return self.key("slot", target, slot)

    def target(self, target: str, record: str) -> str:
        """One of the target's own records: ``last_success``, ``probed`` or ``verify``."""
        return self.key("target", target, record)

    def dead_letters(self, *parts: str) -> str:
        """The dead-letter index's keys; with no parts, the prefix they all start with."""
        return self.key("dlq", *parts) if parts else self.key("dlq", "")

    def audit(self) -> str:
        return self.key("audit")

    def budget(self, target: str) -> str:
        return self.key("budget", target)

    def clock_skews(self) -> str:
        return self.key("clock_skew")
