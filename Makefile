# digest-cleanup: every target says what it does in its ## comment, and `make help` lists them.
PYTHON ?= python3
PYTEST_ARGS ?=
# Commands the tests look up on PATH, each with the Debian package that provides it
# (command:package). A test checks that the skip messages in tests/rig/tools.py
# name these same packages.
APT_TOOLS ?= chromium:chromium chromedriver:chromium-driver promtool:prometheus \
	redis-server:redis-server openssl:openssl systemd-analyze:systemd ip:iproute2 \
	faketime:faketime
# Root runs apt-get itself; anyone else goes through sudo.
SUDO = $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: help install test-tools test smoke lint format demo bench reliability screenshot worker beat flower metrics clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

install:  ## install the package with every extra and the dev tools
	$(PYTHON) -m pip install -e '.[dev]'

test-tools:  ## everything the tests use: the dev extra, then apt-get for the APT_TOOLS missing
	@report=$$(mktemp) && \
	$(PYTHON) -m pip install --quiet --quiet --report "$$report" -e '.[dev]' && \
	$(PYTHON) -c 'import json, sys; \
	new = ["%s %s" % (i["metadata"]["name"], i["metadata"]["version"]) \
	       for i in json.load(open(sys.argv[1]))["install"] if not i.get("is_direct")]; \
	print("pip: digest-cleanup[dev] installed editable;", \
	      "also installed " + ", ".join(new) if new else "every dependency was already present")' \
	"$$report"; status=$$?; rm -f "$$report"; exit $$status
	@missing=; for pair in $(APT_TOOLS); do \
	    command -v "$${pair%%:*}" >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; \
	done; \
	if [ -z "$$missing" ]; then \
	    echo "apt-get: nothing to install; on PATH: $(foreach t,$(APT_TOOLS),$(firstword $(subst :, ,$(t))))"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	    echo "missing:$$missing; there is no apt-get here, so install those with your package manager" >&2; exit 1; \
	else \
	    $(SUDO) apt-get update -qq && \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null && \
	    echo "apt-get: installed$$missing"; \
	fi

# Test processes of `make test` (pytest-xdist): each starts its own Redis and `weed mini`, and
# most end-to-end tests wait on servers rather than on the CPU, so two halve the wall time on
# a 2-core machine. Work stealing keeps both busy to the end: with xdist's default chunks, the
# longest end-to-end tests could leave one process running them alone for minutes.
# pytest-benchmark, when some other package installed it, refuses to load beside xdist with a
# warning the suite turns into an error; it is not used here.
TEST_WORKERS ?= 2

test:  ## the whole suite: unit, task and end-to-end tiers (needs no running services)
	$(PYTHON) -m pytest -m "not slow" -n $(TEST_WORKERS) --dist worksteal -p no:benchmark $(PYTEST_ARGS)

smoke:  ## `pip install .` alone in a fresh virtualenv runs a worker and a real run (SMOKE_ARGS=--venv DIR)
	$(PYTHON) -m tests.smoke.plain_install $(SMOKE_ARGS)

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

screenshot:  ## refresh docs/img/flower-tasks.png and console-*.png from real runs (chromium)
	DC_UPDATE_SCREENSHOT=1 $(PYTHON) -m pytest $(PYTEST_ARGS) \
		tests/e2e/test_ops_flower.py::test_flower_tasks_page_screenshot \
		tests/e2e/test_console_browser.py

worker:  ## a worker for the configured broker and targets (CLEANUP_* variables)
	$(PYTHON) -m celery -A digest_cleanup worker --loglevel=INFO

beat:  ## the scheduler (run exactly one per deployment; duplicate fires are absorbed anyway)
	$(PYTHON) -m celery -A digest_cleanup beat --loglevel=INFO

flower:  ## Flower on 127.0.0.1:5555 with basic auth from FLOWER_BASIC_AUTH=user:pass
	@test -n "$$FLOWER_BASIC_AUTH" || { echo "set FLOWER_BASIC_AUTH=user:password first: Flower is never started open" >&2; exit 2; }
	$(PYTHON) -m celery -A digest_cleanup flower --address=127.0.0.1 --port=5555

metrics:  ## the Prometheus endpoint on :9808
	$(PYTHON) -m digest_cleanup.cli metrics --port 9808

clean:  ## remove caches and build output
	rm -rf .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
