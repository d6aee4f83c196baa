# digest-cleanup: every target here is named in the README.
PYTHON ?= python3
PYTEST_ARGS ?=

.PHONY: help install test lint format demo bench reliability screenshot worker beat flower metrics clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

install:  ## install the package with every extra and the dev tools
	$(PYTHON) -m pip install -e '.[dev]'

test:  ## the whole suite: unit, task and end-to-end tiers (needs no running services)
	$(PYTHON) -m pytest -m "not slow" $(PYTEST_ARGS)

lint:  ## ruff (lint and format check) and mypy --strict
	$(PYTHON) -m ruff check digest_cleanup tests benchmarks
	$(PYTHON) -m ruff format --check digest_cleanup tests benchmarks
	$(PYTHON) -m mypy

format:  ## apply ruff's fixes and formatting
	$(PYTHON) -m ruff check --fix digest_cleanup tests benchmarks
	$(PYTHON) -m ruff format digest_cleanup tests benchmarks

demo:  ## embedded Redis and S3, 120k seeded artifacts, a weekly run with progress and report
	$(PYTHON) -m digest_cleanup.demo $(DEMO_ARGS)

bench:  ## the 120k benchmark against the alternatives; writes BENCHMARKS.md
	$(PYTHON) -m benchmarks.run $(BENCH_ARGS)

reliability:  ## the fault suite (worker kills, Redis restarts, S3 faults); writes RELIABILITY.md
	$(PYTHON) -m pytest -m slow tests/reliability $(PYTEST_ARGS)

screenshot:  ## refresh docs/img/flower-tasks.png from a real run (needs chromium and chromedriver)
	DC_UPDATE_SCREENSHOT=1 $(PYTHON) -m pytest tests/e2e/test_ops_flower.py -k screenshot $(PYTEST_ARGS)

worker:  ## a worker for the configured broker and targets (CLEANUP_* variables)
	$(PYTHON) -m celery -A digest_cleanup worker --loglevel=INFO

beat:  ## the scheduler (run exactly one per deployment; duplicate fires are absorbed anyway)
	$(PYTHON) -m celery -A digest_cleanup beat --loglevel=INFO

flower:  ## Flower on 127.0.0.1:5555 with basic auth from FLOWER_BASIC_AUTH=user:pass
	@test -n "$$FLOWER_BASIC_AUTH" || { echo "set FLOWER_BASIC_AUTH=user:password first: Flower is never started open" >&2; exit 2; }
	$(PYTHON) -m celery -A digest_cleanup flower --address=127.0.0.1 --port=5555

metrics:  ## the Prometheus endpoint on :9808
	$(PYTHON) -m digest_cleanup.cli metrics --port 9808

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
