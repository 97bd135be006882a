# GEM feature and representation pipelines. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LOCK := constraints.txt
DEMO_DIR ?= out/demo
B ?=
PYTEST_ARGS ?=

.PHONY: prism help setup lock demo docs test test-unit bench capacity lint services-up services-down kafka-up kafka-down redis-up redis-down redis-cluster-up redis-cluster-down s3-up s3-down browser prometheus prometheus-check prometheus-up prometheus-down clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  make %-15s %s\n", $$1, $$2}'

setup: $(STAMP) ## create .venv and install the project (a second run takes seconds)

# The lock (constraints.txt) pins every package; a change to it or to pyproject.toml reinstalls.
$(STAMP): pyproject.toml $(LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c $(LOCK) --upgrade pip
	$(PY) -m pip install -q -c $(LOCK) -e '.[dev]'
	@touch $(STAMP)

lock: ## re-resolve pyproject.toml's version ranges into constraints.txt (then make setup)
	PYTHON=$(PYTHON) bash scripts/lock.sh

demo: setup ## generate ~1M events, build histories, inspect them (embedded defaults)
	DEMO_DIR=$(DEMO_DIR) bash scripts/demo.sh

test: setup docs prism browser prometheus services-up redis-cluster-up s3-up flink-jobserver spark-jobserver flink-up ## start the real services (Kafka, Redis, S3Proxy, Flink) and run every test
	$(PY) -m pytest $(PYTEST_ARGS)

docs: setup ## build the documentation site (docs/, mkdocs build --strict) into out/site
	NO_MKDOCS_2_WARNING=1 PYTHONPATH=$(CURDIR) $(VENV)/bin/mkdocs build --strict --site-dir out/site

test-unit: setup ## only the fast tests (no real services)
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

bench: setup ## run the benchmarks (B=name for one, QUICK=1 for small inputs)
	$(PY) bench/run.py $(B)

capacity: setup ## render docs/operations/capacity.md from bench/capacity.json (make bench B=capacity measures it)
	$(PY) -c 'import sys; from bench.capacity_model import main; sys.exit(main(sys.argv[1:]))'

lint: setup ## ruff (lint and format check) and mypy, over the package, tests and bench
	$(VENV)/bin/ruff check pipelines tests bench
	$(VENV)/bin/ruff format --check pipelines tests bench
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

s3-up: ## start the project's S3-compatible store (S3Proxy) on 127.0.0.1:19900 (jar from Maven on first run)
	bash scripts/s3proxy.sh up

s3-down: ## stop the project's S3Proxy (its objects stay in .cache/s3proxy/data)
	bash scripts/s3proxy.sh down

browser: ## install Debian's chromium and chromium-driver (the HTML report tests open pages in it)
	bash scripts/browser.sh install

redis-cluster-up: ## start the project's 6-node Redis Cluster on 127.0.0.1:17000-17005 (3 masters, 3 replicas)
	bash scripts/redis-cluster.sh up

redis-cluster-down: ## stop the project's Redis Cluster (and forget its membership)
	bash scripts/redis-cluster.sh down

prometheus: ## install Debian's prometheus and promtool (the monitoring tests run their own servers)
	bash scripts/prometheus.sh install

prometheus-check: prometheus ## promtool: check deploy/prometheus's config and rules, run the rules' unit tests
	bash scripts/prometheus.sh check

prometheus-up: prometheus ## start Prometheus on 127.0.0.1:19090 with deploy/prometheus/prometheus.yml
	bash scripts/prometheus.sh up

prometheus-down: ## stop the Prometheus started by prometheus-up (its data stays in .cache/prometheus)
	bash scripts/prometheus.sh down

# Beam versions: the SDK's from the lock (its one statement), the Flink runner's from
# deploy/versions.env (the file says why they differ). Read with sed, not `include`, so that
# `make help` (which greps $(MAKEFILE_LIST)) lists only real makefiles.
VERSIONS := deploy/versions.env
BEAM_VERSION := $(shell sed -n 's/^apache-beam==//p' $(LOCK))
BEAM_FLINK_RUNNER_VERSION := $(shell sed -n 's/^BEAM_FLINK_RUNNER_VERSION=//p' $(VERSIONS))
FLINK_MINOR := $(shell sed -n 's/^FLINK_MINOR=//p' $(VERSIONS))
BEAM_SPARK_RUNNER_VERSION := $(shell sed -n 's/^BEAM_SPARK_RUNNER_VERSION=//p' $(VERSIONS))
ifeq ($(BEAM_VERSION),)
$(error no apache-beam==VERSION line in $(LOCK))
endif
PRISM := .cache/bin/prism
# Marks which Beam release .cache/bin/prism was built from: a new Beam in the lock rebuilds it.
PRISM_BUILT := .cache/bin/.prism-v$(BEAM_VERSION)

prism: $(PRISM_BUILT) ## build Beam's Prism runner at the locked Beam SDK version (Go module proxy; once)

$(PRISM_BUILT):
	@mkdir -p $(dir $(PRISM))
	GOBIN=$(abspath $(dir $(PRISM))) go install github.com/apache/beam/sdks/v2/go/cmd/prism@v$(BEAM_VERSION)
	@rm -f $(dir $(PRISM)).prism-v* && touch $@

clean: ## remove outputs (keeps .venv)
	rm -rf out .pytest_cache .mypy_cache .ruff_cache

# Flink cluster and the Flink/Spark job servers (after the version variables it reads).
include deploy/flink/targets.mk
