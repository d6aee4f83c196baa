"""The guide's tests; the package in ``localdir_package/`` runs its own tests elsewhere."""

#: Collected by test_kind_in_another_package.py in a subprocess, outside this repository.
collect_ignore = ["localdir_package"]
