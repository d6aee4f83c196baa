"""The project's own test rig: servers, proxies, the AWS model, a browser client.

None of it ships in the wheel; it builds on the demo's servers, process stack and
seeding (:mod:`digest_cleanup.demo`), and adds what only the tests need.

* ``servers``: the demo's Redis and ``weed mini``, with passwords, ACL users, TLS and
  a crash-restart for Redis, and ``required_*`` helpers that skip a test without the
  server (fail it under CI); ``tools``: the tools the tests need, and the line that
  installs each.
* ``proxy``: a reverse proxy in front of S3 for a rule set to extend
  (``proxy_connections`` is its HTTP side); ``faults`` is the fault-injecting one
  (throttling, outages, denied keys), with ``s3_messages`` for S3's XML bodies and
  ``s3_listings`` for rewriting list pages.
* ``aws_model``: a proxy that imitates AWS S3's write budget, SlowDown and latency,
  with ``aws_budget`` for its arithmetic and its records.
* ``stack``: worker, beat and CLI processes wired to those servers.
* ``webdriver``: a small W3C WebDriver client for headless Chromium.

Seeding is the demo's own :mod:`digest_cleanup.demo.seed`.
"""
