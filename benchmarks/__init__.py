"""Benchmarks: `make bench` measures the pipeline against the alternatives in one run."""
