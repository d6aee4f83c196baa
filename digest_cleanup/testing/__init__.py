"""Test helpers for digest-cleanup users and its own suite.

``servers`` starts real Redis and S3 servers on free loopback ports, ``faults``
puts a fault-injecting proxy in front of S3.
"""
