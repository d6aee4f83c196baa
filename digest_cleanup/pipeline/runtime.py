"""The per-process context every task and command works through.

It holds the settings, the targets, one Redis client, one kind instance per
target, and the :class:`~digest_cleanup.pipeline.messaging.Dispatcher` that
everything the pipeline sends goes through (the worker wiring installs one).
Clients are made lazily, and :meth:`Runtime.after_fork` drops them in a fresh
pool child, because sockets and connection pools must not cross a fork.
A worker process that runs tasks calls :meth:`Runtime.prepare` when it starts,
so the first task after a quiet week does not pay for building them.
"""

from __future__ import annotations

import logging
import threading
from functools import cached_property

import redis

from digest_cleanup.errors import ConfigError
from digest_cleanup.kinds import TargetKind
from digest_cleanup.pipeline.messaging import BATCH_QUEUE, Dispatcher
from digest_cleanup.settings import Settings
from digest_cleanup.store.budget import BudgetState, DeleteBudget
from digest_cleanup.store.dead_letters import DeadLetterQueue
from digest_cleanup.store.runs import RunStore
from digest_cleanup.targets import Target, Targets, load_targets

logger = logging.getLogger("digest_cleanup.runtime")


class Runtime:
    """Lazily built clients for one process."""

    def __init__(
        self,
        settings: Settings,
        targets: Targets | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.settings = settings
        self._targets = targets
        self._dispatcher = dispatcher
        self._lock = threading.Lock()
        self._kinds: dict[str, TargetKind] = {}
        self._budgets: dict[str, DeleteBudget | None] = {}

    @property
    def targets(self) -> Targets:
        if self._targets is None:
            self._targets = load_targets(
                self.settings.targets_file, audit_url=self.settings.audit_url
            )
        return self._targets

    @cached_property
    def redis(self) -> redis.Redis:
        tls = {"ssl_check_hostname": True} if self.settings.broker_url.startswith("rediss:") else {}
        return redis.Redis.from_url(
            self.settings.broker_url,
            **tls,
            socket_timeout=30,
            socket_connect_timeout=5,
            health_check_interval=30,
        )

    @cached_property
    def store(self) -> RunStore:
        return RunStore(self.redis, self.settings.key_prefix)

    @cached_property
    def dead_letters(self) -> DeadLetterQueue:
        return self.store.dead_letter_queue(
            queue=self.settings.dead_letter_queue, work_queue=BATCH_QUEUE
        )

    @property
    def dispatcher(self) -> Dispatcher:
        """Where this process sends batches, retries, dead letters and sweep slices."""
        if self._dispatcher is None:
            raise RuntimeError(
                "this runtime cannot send messages: build it with a dispatcher "
                "(digest_cleanup.app.create_app installs the Celery one)"
            )
        return self._dispatcher

    @dispatcher.setter
    def dispatcher(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher

    def target(self, name: str) -> Target:
        return self.targets.get(name)

    def kind(self, name: str) -> TargetKind:
        """The kind instance serving target ``name`` in this process."""
        with self._lock:
            kind = self._kinds.get(name)
            if kind is None:
                kind = self._kinds[name] = self.targets.get(name).make_kind(self.settings)
            return kind

    def budget(self, name: str) -> DeleteBudget | None:
        """Target ``name``'s shared delete budget, or None when it has none."""
        with self._lock:
            if name not in self._budgets:
                rate = self.targets.get(name).delete_budget(self.settings)
                self._budgets[name] = self.store.budget(name, rate) if rate > 0 else None
            return self._budgets[name]

    def budget_state(self, name: str) -> BudgetState | None:
        """Target ``name``'s delete budget as it stands, or None: no budget, or a target
        this process's targets file no longer has (an old run's, say), or cannot be read."""
        try:
            known = name in self.targets.by_name
        except ConfigError:
            return None
        budget = self.budget(name) if known else None
        return budget.state() if budget is not None else None

    def prepare(self) -> None:
        """Build every target's clients now (see :meth:`TargetKind.prepare`); never raises.

        A target that cannot be prepared is logged and left to fail its first task
        with the usual error, so one bad target does not keep a worker from serving
        the others.
        """
        try:
            names = [target.name for target in self.targets]
        except Exception as exc:  # the worker reports a bad targets file itself
            logger.debug("no targets to prepare: %s", exc)
            return
        for name in names:
            try:
                self.kind(name).prepare()
            except Exception as exc:
                logger.warning(
                    "target %s: could not prepare its client (%s: %s); its tasks will "
                    "report the same error",
                    name,
                    type(exc).__name__,
                    exc,
                )

    def after_fork(self) -> None:
        """Forget clients inherited from the parent process."""
        self.__dict__.pop("redis", None)
        self.__dict__.pop("store", None)
        self.__dict__.pop("dead_letters", None)
        self._kinds = {}
        self._budgets = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        for kind in self._kinds.values():
            kind.close()
        self._kinds = {}
        if "redis" in self.__dict__:
            self.redis.close()
