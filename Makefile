# Every target bootstraps .venv on first use (infra/bootstrap.sh); later runs reuse it.
SHELL := /bin/bash
VENV := .venv/bin
DAY ?= $(shell date -u -d yesterday +%Y-%m-%d)
export BROKERLENS_HOME ?= $(CURDIR)/var

.PHONY: help bootstrap lint test test-all test-fast run stack-up stack-down bench lock clean

help: ## every target, one line each
	@awk -F':.*## ' '/^[a-z-]+:.*## / {printf "  make %-11s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

bootstrap: ## create .venv with the locked dependencies (every target does it first)
	@infra/bootstrap.sh

## make lint: ruff's lint and format check over the repository's Python, mypy on the package
## (configured in pyproject.toml; .pre-commit-config.yaml runs the same on each commit)
lint: bootstrap ## ruff (lint, format check) and mypy
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .
	$(VENV)/mypy

## make test: the test suite CI runs (real Spark, Delta, Airflow, SMTP, headless Chromium, a live
## Pulsar broker; the browser and Prometheus are installed if missing: infra/install-test-tools.sh):
## every test but those marked heavy, on two pytest-xdist workers (tests/conftest.py: the tests
## that wait on a live broker or Airflow run beside the rest; 1,389 s against 1,720 s in one
## process, 2026-11-29, 2 cores). PYTEST_ARGS passes anything else to pytest.
test: bootstrap lint ## make lint, then the test suite (all but the heavy tests) on two pytest-xdist workers
	infra/install-test-tools.sh
	$(VENV)/pytest -m "not heavy" -n 2 $(PYTEST_ARGS)

## make test-all: make test and the heavy tests (the wheel in a fresh venv, the standalone Spark
## cluster, the bench harness end to end, the daily DAG run twice, the docs'
## example queries): before a release, or when one of those changes
test-all: bootstrap lint ## every test, the heavy ones included
	infra/install-test-tools.sh
	$(VENV)/pytest $(PYTEST_ARGS)

## make test-fast: the inner loop (2.5 minutes), the tests not marked slow (more than 5 s
## each: Airflow, whole CLI runs, whole stages), pulsar (the live broker) or heavy; it
## installs the browser and Prometheus when missing, as make test does (a Prometheus test is in it)
test-fast: bootstrap ## the inner loop: the tests of a few seconds each (no Airflow, live broker or whole stage)
	infra/install-test-tools.sh
	$(VENV)/pytest -m "not slow and not pulsar and not heavy" $(PYTEST_ARGS)

## make run [DAY=YYYY-MM-DD]: demo data for DAY, then the daily Airflow DAG on it (airflow dags
## test), with the local SMTP sink receiving the mail; says step k of n and how long each took
## (the full log is in $(BROKERLENS_HOME)/stack/run-DAY.log); prints where tables, report and mail are.
## RUN_ARGS=--spark-submit runs brokerlens_daily_spark_submit instead (a spark-submit per task)
run: bootstrap ## demo data for DAY (yesterday), then the daily Airflow DAG on it
	infra/stack.sh run-day $(DAY) --demo-data $(RUN_ARGS)

## make stack-up / stack-down: Airflow standalone (UI on 127.0.0.1:8080) and the SMTP sink
stack-up: bootstrap ## Airflow standalone, the SMTP sink and the Spark Connect server
	infra/stack.sh up

stack-down: ## stop them
	infra/stack.sh down

## make bench [BENCH_ARGS=...]: dispatch stages at 3 sizes (0.7M, 2.7M, 10.8M records) against a
## plain Spark pass and DuckDB, 3 consecutive days, landing, a large cluster's day (windows of 2,000 partitions,
## projected to 50,000), the demo day through the daily DAG (Spark Connect against the stage server's last
## commit, alternated), the interceptor's dispatch overhead on a live 4.0.7 standalone (--only interceptor
## runs that alone); results in $(BROKERLENS_HOME)/bench/results.json
## (python -m brokerlens_bench --help; BENCH_ARGS="--latest infra/bench/latest.json --page docs/benchmarks.md"
## refreshes the committed figures)
bench: bootstrap ## the benchmarks, separate from the tests (BENCH_ARGS=...)
	$(VENV)/python -m brokerlens_bench $(BENCH_ARGS)

## make lock: recompile requirements/lock.txt from pyproject.toml (with its extras) and requirements/requirements.in
lock: bootstrap ## recompile requirements/lock.txt
	$(VENV)/uv pip compile -q --python-version 3.11 --extra airflow --extra dev \
		pyproject.toml requirements/requirements.in -o requirements/lock.txt

clean: ## remove var/ and pytest's cache
	rm -rf var .pytest_cache
