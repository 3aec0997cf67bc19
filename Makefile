# Two commands for a newcomer: `make demo` and `make test`. Each creates
# ./.venv and installs what is missing first; a second run installs nothing.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.lagdoctor-installed
PYSPARK_VERSION := 4.3.0
# The OS trust store, so a TLS-intercepting proxy's CA (as pip.conf names it) works too.
UV_PIP := $(BIN)/uv pip install --python $(BIN)/python --system-certs

# spark-submit finds SPARK_HOME through the first python3 on PATH: the venv's.
export PATH := $(BIN):$(PATH)
export SPARK_LOCAL_IP ?= 127.0.0.1
export AIRFLOW__CORE__LOAD_EXAMPLES := False

.PHONY: demo test check install clean bench airflow browser postgres kafka redis topology s3jars

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "lagdoctor needs Python >= 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	@command -v java >/dev/null || { echo "lagdoctor needs a Java 17+ runtime for Spark (apt-get install openjdk-17-jre-headless)"; exit 1; }
	@echo "==> setting up $(VENV) (first run: about a minute; later runs skip this)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check 'uv>=0.13,<0.14'
	@echo "==> installing lagdoctor with Airflow, Spark, Kafka and Slack dependencies"
	@$(UV_PIP) -e '.[test]'
	@# The Spark provider's pyspark-client overwrites pyspark's files: repair last.
	@echo "==> restoring pyspark $(PYSPARK_VERSION) over pyspark-client's files"
	@$(UV_PIP) --force-reinstall --no-deps pyspark==$(PYSPARK_VERSION)
	@$(BIN)/python -c 'import pyspark, sys; v = pyspark.__version__; sys.exit(0 if v == "$(PYSPARK_VERSION)" else f"pyspark is {v}, expected $(PYSPARK_VERSION)")'
	@touch $(STAMP)
	@echo "==> installed"

demo: $(STAMP) kafka
	@$(BIN)/python -m lagdoctor.lab.demo

# The whole suite, one file per process at a time, longest first (tests/durations.json): most
# tests wait on a broker, a JVM or a schedule, so three processes share two cores well.
TEST_WORKERS ?= 3
PYTEST_ARGS ?=
test: $(STAMP) browser postgres kafka redis s3jars
	@$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The tier without a broker, Spark, Airflow or the topology: what to run while working.
CHECK_WORKERS ?= 2
check: $(STAMP) browser postgres
	@$(BIN)/python -m pytest -q -n $(CHECK_WORKERS) -m "not broker and not spark and not airflow and not topology"

# Headless Chromium for the lag page's browser test (Debian's package, ~25 s once).
browser:
	@if [ ! -x /usr/bin/chromium ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "==> installing Debian's chromium for the browser test"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else \
			echo "==> no /usr/bin/chromium and no root: the browser test will be skipped"; \
		fi; \
	fi

# Debian's PostgreSQL for the state tests: the suite starts a throwaway server
# on a free loopback port (tests/fixtures/postgres.py) and stops it at the end.
postgres:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "==> installing Debian's postgresql for the state tests"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
		else \
			echo "==> no PostgreSQL binaries and no root: the PostgreSQL state tests will be skipped"; \
		fi; \
	fi

# Debian's redis-server: the Celery broker of the cluster topology (its test and
# `lagdoctor topology`), run by lagdoctor on a loopback port, never as a service.
redis:
	@if ! command -v redis-server >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "==> installing Debian's redis-server for the cluster topology"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
		else \
			echo "==> no redis-server and no root: the cluster topology test will be skipped"; \
		fi; \
	fi

# Apache Kafka's jars for the embedded broker, from Maven Central into the user's
# cache folder (~45 MB, once; lagdoctor/kafka/broker.py). Needs Java 17+ and Maven.
kafka: $(STAMP)
	@if ! command -v mvn >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "==> installing Debian's maven to fetch Apache Kafka"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null; \
		else \
			echo "lagdoctor fetches Apache Kafka with Maven: install it (apt-get install maven)"; exit 1; \
		fi; \
	fi
	@$(BIN)/python -m lagdoctor.kafka.broker --quiet-if-present

# Airflow (scheduler, DAG processor, triggerer, API server on 127.0.0.1) on the embedded broker with the
# DAGs, the lag page and the demo's live incidents; waits as long as they live, saying what for.
airflow: $(STAMP) kafka
	@$(BIN)/python -m lagdoctor.lab.standalone

# hadoop-aws and the AWS SDK bundle (658 MiB, once, SHA-1 checked) for Spark's s3a:// reads of an
# object-store data root: the S3 and topology tests, `make topology` (lagdoctor/s3jars.py).
s3jars: $(STAMP)
	@$(BIN)/python -m lagdoctor.s3jars --quiet-if-present

# A cluster on this machine, each part a real server on loopback (lagdoctor/lab/topology.py): PostgreSQL,
# Redis, SeaweedFS (S3), Spark standalone (master + 2 workers), Kafka, Airflow with two Celery workers.
topology: $(STAMP) postgres kafka redis s3jars
	@$(BIN)/lagdoctor topology

bench: $(STAMP)
	@$(BIN)/python bench/snapshot_bench.py

clean:
	rm -rf $(VENV) .demo .bench .topology .topology.previous .connect-server
