# GEM feature and representation pipelines. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= out/demo
B ?=
PYTEST_ARGS ?=

.PHONY: prism help setup demo test test-unit bench lint services-up services-down kafka-up kafka-down redis-up redis-down clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  make %-15s %s\n", $$1, $$2}'

setup: $(STAMP) ## create .venv and install the project (a second run takes seconds)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: setup ## generate ~1M events, build histories, inspect them (embedded defaults)
	DEMO_DIR=$(DEMO_DIR) bash scripts/demo.sh

test: setup prism services-up ## start the real services and run every test
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: setup ## only the fast tests (no real services)
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

bench: setup ## run the benchmarks (B=name for one, QUICK=1 for small inputs)
	$(PY) bench/run.py $(B)

lint: setup ## ruff and mypy
	$(VENV)/bin/ruff check pipelines schemas tests bench
	$(VENV)/bin/mypy

services-up: kafka-up redis-up ## start the services the tests need
	@true

services-down: kafka-down redis-down ## stop the services started by services-up
	@true

kafka-up: ## start the project's Kafka broker on 127.0.0.1:19092 (jars from Maven on first run)
	bash scripts/kafka.sh up

kafka-down: ## stop the project's Kafka broker (its data stays in .cache/kafka)
	bash scripts/kafka.sh down

redis-up: ## start the project's Redis on 127.0.0.1:16379 (apt-get installs redis-server if missing)
	bash scripts/redis.sh up

redis-down: ## stop the project's Redis (no persistence: the store is rebuilt by precompute)
	bash scripts/redis.sh down

BEAM_VERSION := 2.77.0
PRISM := .cache/bin/prism

prism: $(PRISM) ## build Beam's Prism runner at the pinned Beam version (Go module proxy; once)

$(PRISM):
	@mkdir -p $(dir $(PRISM))
	GOBIN=$(abspath $(dir $(PRISM))) go install github.com/apache/beam/sdks/v2/go/cmd/prism@v$(BEAM_VERSION)

clean: ## remove outputs (keeps .venv)
	rm -rf out .pytest_cache .mypy_cache .ruff_cache
