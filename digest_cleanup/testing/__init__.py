"""Test helpers for digest-cleanup users and its own suite.

* ``servers``: real Redis and S3 (``weed mini``) servers on free loopback ports;
  ``tools``: the tools the tests need, and the line that installs each.
* ``proxy``: a reverse proxy in front of S3 for a rule set to extend;
  ``faults`` is the fault-injecting one (throttling, outages, denied keys), with
  ``s3_messages`` for S3's XML bodies.
* ``seed``: fast seeding of many objects over raw HTTP.
* ``stack``: worker, beat and CLI processes wired to those servers.
* ``memory``: an in-memory target kind, the seam's test double;
  ``dispatcher``: a recording :class:`~digest_cleanup.pipeline.messaging.Dispatcher`.
* ``pipeline`` and ``plugin``: run a target through the real sweep -> batch ->
  dead-letter path in-process, as a function or as pytest fixtures
  (``pytest_plugins = ["digest_cleanup.testing.plugin"]``).
"""
