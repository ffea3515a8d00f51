# Every target bootstraps .venv on first use (infra/bootstrap.sh); later runs reuse it.
SHELL := /bin/bash
VENV := .venv/bin
DAY ?= $(shell date -u -d yesterday +%Y-%m-%d)
export BROKERLENS_HOME ?= $(CURDIR)/var

.PHONY: bootstrap test run bench lock clean

bootstrap:
	@infra/bootstrap.sh

## make test: the whole test suite (real Spark, Delta, Airflow, SMTP)
test: bootstrap
	$(VENV)/pytest $(PYTEST_ARGS)

## make run [DAY=YYYY-MM-DD]: demo data for DAY, then the daily pipeline on it
run: bootstrap
	$(VENV)/brokerlens demo-data --date $(DAY)
	$(VENV)/brokerlens run --date $(DAY)
	@echo "outputs under $(BROKERLENS_HOME): landing/ lake/ reports/ outbox/"

## make lock: recompile requirements/lock.txt from requirements/requirements.in
lock: bootstrap
	$(VENV)/uv pip compile -q --python-version 3.11 requirements/requirements.in -o requirements/lock.txt

clean:
	rm -rf var .pytest_cache
