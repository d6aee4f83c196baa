"""Test helpers for digest-cleanup users and its own suite.

* ``servers``: real Redis and S3 (``weed mini``) servers on free loopback ports.
* ``faults``: a fault-injecting proxy in front of S3 (throttling, outages, denied keys).
* ``seed``: fast seeding of many objects over raw HTTP.
* ``stack``: worker, beat and CLI processes wired to those servers.
* ``memory``: an in-memory target kind, the seam's test double.
* ``pipeline`` and ``plugin``: run a target through the real sweep -> batch ->
  dead-letter path in-process, as a function or as pytest fixtures
  (``pytest_plugins = ["digest_cleanup.testing.plugin"]``).
"""
