"""What a target kind's author tests with: the plugin and the seam's test doubles.

* ``memory``: an in-memory target kind, the seam's test double;
  ``dispatcher``: a recording :class:`~digest_cleanup.pipeline.messaging.Dispatcher`.
* ``pipeline`` and ``plugin``: run a target through the real sweep -> batch ->
  dead-letter path in-process, as a function or as pytest fixtures
  (``pytest_plugins = ["digest_cleanup.testing.plugin"]``); ``worker``: the Celery
  worker in a thread of the test process that serves such a run.
* ``redis_server``: the throwaway Redis the plugin starts, and ``require``, the
  skip (a failure under CI) when something a test needs is missing.

The project's own rig (fault proxies, the AWS model, the browser client, the TLS and
ACL Redis) lives with its tests, not here, and the demo has its own servers.
"""
