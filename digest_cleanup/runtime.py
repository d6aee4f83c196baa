"""The per-process context every task and command works through.

It holds the settings, the targets, one Redis client and one kind instance per
target.  Clients are made lazily, and :meth:`Runtime.after_fork` drops them in a
fresh pool child, because sockets and connection pools must not cross a fork.
"""

from __future__ import annotations

import threading
from functools import cached_property

import redis

from digest_cleanup.kinds import TargetKind
from digest_cleanup.runs import RunStore
from digest_cleanup.settings import Settings
from digest_cleanup.targets import Target, Targets, load_targets


class Runtime:
    """Lazily built clients for one process."""

    def __init__(self, settings: Settings, targets: Targets | None = None) -> None:
        self.settings = settings
        self._targets = targets
        self._lock = threading.Lock()
        self._kinds: dict[str, TargetKind] = {}

    @property
    def targets(self) -> Targets:
        if self._targets is None:
            self._targets = load_targets(self.settings.targets_file)
        return self._targets

    @cached_property
    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(
            self.settings.broker_url,
            socket_timeout=30,
            socket_connect_timeout=5,
            health_check_interval=30,
        )

    @cached_property
    def store(self) -> RunStore:
        return RunStore(self.redis, self.settings.key_prefix)

    def target(self, name: str) -> Target:
        return self.targets.get(name)

    def kind(self, name: str) -> TargetKind:
        """The kind instance serving target ``name`` in this process."""
        with self._lock:
            kind = self._kinds.get(name)
            if kind is None:
                kind = self._kinds[name] = self.targets.get(name).make_kind(self.settings)
            return kind

    def after_fork(self) -> None:
        """Forget clients inherited from the parent process."""
        self.__dict__.pop("redis", None)
        self.__dict__.pop("store", None)
        self._kinds = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        for kind in self._kinds.values():
            kind.close()
        self._kinds = {}
        if "redis" in self.__dict__:
            self.redis.close()
