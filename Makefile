# The two commands of the README, plus helpers. Each target installs what it needs first.
SHELL := /bin/bash
VENV := .venv/bin
export SPARK_LOCAL_IP := 127.0.0.1
export PYSPARK_PYTHON := $(CURDIR)/.venv/bin/python
export PYSPARK_DRIVER_PYTHON := $(CURDIR)/.venv/bin/python

.PHONY: setup demo test lint bench
setup:
	@tools/bootstrap.sh

## Runs the main job on the embedded default (DEMO_ARGS: its options, e.g. DEMO_ARGS=--s3).
demo: setup
	@$(VENV)/python -m pipelines.demo $(DEMO_ARGS)

## Runs the test suite (lint and type checks included) on TEST_WORKERS pytest-xdist workers,
## whole files to a worker (their module fixtures start once), the slowest files first
## (tests/conftest.py). TEST_WORKERS=0: in this process, as a plain `pytest` runs.
TEST_WORKERS ?= 2
test: setup
	$(VENV)/ruff check .
	$(VENV)/mypy
	$(VENV)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: setup
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .
	$(VENV)/mypy

## Benchmarks, on demand: every file prints one JSON object as its last line.
bench: setup
	@for f in tests/perf/bench_*.py; do echo "== $$f"; $(VENV)/python "$$f" || exit 1; done
