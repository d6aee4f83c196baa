"""The operations console: runs and dead letters in the browser, with redrive and purge.

Flower shows tasks; it cannot say how far a run has got, which keys were not
deleted and why, or move a dead letter back.  This is a small server-rendered
Tornado application (Flower already brings Tornado) that reads the run store
and the dead-letter queue, and redrives and purges through
:mod:`digest_cleanup.ops.redrive` and :mod:`digest_cleanup.ops.purge`, the same code as
the CLI.  It never
runs open: every request needs basic auth (:mod:`~digest_cleanup.console.auth`),
and every POST a CSRF token.
"""
