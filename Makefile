# Every target does its own set-up on a fresh clone: a virtualenv with the
# project and its dev extra, the pinned reference npm packages in a user cache.
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/dsh-pipeline
REFERENCE := $(CACHE)/reference
export DSH_REFERENCE_DIR := $(REFERENCE)
# Jaeger, the OTLP receiver export-otel's test sends to: the version
# tools/jaeger/go.mod requires (a unit test holds the two together).
JAEGER_VERSION := v1.75.0
DSH_JAEGER ?= $(CACHE)/jaeger-$(JAEGER_VERSION)/jaeger
export DSH_JAEGER

.PHONY: demo test check docs lock setup reference kafka-jars prometheus postgres chromium jaeger bench clean

# The main job: the whole pipeline on a local broker, checked end to end.
demo: setup kafka-jars
	$(VENV)/bin/dsh-pipeline demo

# The integration tier waits on brokers, servers and browsers most of the
# time; the offline tiers (everything else: no servers) are CPU work that
# already runs spread over the cores in `make check`. So they run beside it,
# one step down in priority (their report follows the integration tier's,
# with its own pytest cache), and the run takes about as long as the
# integration tier alone.
test: setup reference kafka-jars prometheus postgres chromium docs
	$(VENV)/bin/mypy
	@offline=$$(mktemp) && trap 'rm -f "$$offline"' EXIT && \
	echo "offline tiers beside the integration tier: nice -n 5 $(VPY) -m pytest --ignore=tests/integration" && \
	{ nice -n 5 $(VPY) -m pytest --ignore=tests/integration -o cache_dir=.pytest_cache/offline >"$$offline" 2>&1 & } && \
	pid=$$! && echo "$(VPY) -m pytest tests/integration" && \
	{ $(VPY) -m pytest tests/integration; integration=$$?; } ; \
	wait $$pid; offline_status=$$?; cat "$$offline"; \
	echo "integration tier: exit $$integration; offline tiers: exit $$offline_status"; \
	[ $$integration -eq 0 ] && [ $$offline_status -eq 0 ]

# The unit tier alone: no broker, no servers; the contributor's fast loop,
# spread over the machine's cores (pytest-xdist: one worker per core). The
# type checker first (pyproject's [tool.mypy]: dsh_core strict, the rest at
# its default), so an error in the annotations fails before the tests run.
check: setup
	$(VENV)/bin/mypy
	$(VPY) -m pytest tests/unit tests/contract tests/docs -q -n auto

# The documentation site (Sphinx), warnings as errors.
docs: setup
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs docs/_build/html

setup: $(VENV)/.installed

# Every package, pip and the build backend included, at the version and
# hashes requirements.lock pins; then the project itself, without resolving.
$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --require-hashes --no-deps -r requirements.lock
	$(VPY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

# Pin every dependency (dev and docs extras, pip and setuptools) with hashes.
lock: setup
	printf 'pip\nsetuptools>=77\n' | $(VENV)/bin/uv pip compile pyproject.toml - --extra dev \
	  --generate-hashes --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
	  --no-header --quiet -o requirements.lock

# The reference implementation (npm, Node 20+), exactly as the lock file
# pins it (npm ci checks each tarball's integrity hash). Without node/npm the
# differential tests skip and say why.
reference:
	@if command -v npm >/dev/null 2>&1; then \
	  if ! cmp -s tools/reference/package-lock.json $(REFERENCE)/package-lock.json || [ ! -f $(REFERENCE)/.installed ]; then \
	    mkdir -p $(REFERENCE) && rm -f $(REFERENCE)/.installed && \
	    cp tools/reference/package.json tools/reference/package-lock.json tools/reference/.npmrc $(REFERENCE)/ && \
	    (cd $(REFERENCE) && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error) && touch $(REFERENCE)/.installed; \
	  fi; \
	else echo "node/npm not found: differential tests against the reference will be skipped"; fi

# Prometheus, promtool and Alertmanager, Debian's packages, for the
# real-Prometheus and alert-routing tests (which say why they are skipped
# where these cannot be installed).
prometheus:
	@if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1 \
	    || ! command -v prometheus-alertmanager >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      prometheus prometheus-alertmanager) >/dev/null 2>&1 \
	      || echo "apt-get could not install prometheus: the real-Prometheus tests will be skipped"; \
	  else echo "prometheus is not installed and apt-get needs root here: the real-Prometheus tests will be skipped"; fi; \
	fi

# PostgreSQL's server, Debian's package, for the PostgreSQL tests (which say
# why they are skipped where it cannot be installed). The check looks for
# Debian's binaries, not PATH: Debian keeps initdb off PATH.
postgres:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql) \
	      >/dev/null 2>&1 || echo "apt-get could not install postgresql: the PostgreSQL tests will be skipped"; \
	  else echo "postgresql is not installed and apt-get needs root here: the PostgreSQL tests will be skipped"; fi; \
	fi

# Debian's Chromium, which the viewer's browser test drives (skipped, saying
# why, where it cannot be installed).
chromium:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) \
	      >/dev/null 2>&1 || echo "apt-get could not install chromium: the browser test will be skipped"; \
	  else echo "chromium is not installed and apt-get needs root here: the browser test will be skipped"; fi; \
	fi

# Jaeger v2 (an OTLP receiver teams run) for the export-otel test, built once
# into the user cache from the Go module proxy; go build -mod=readonly checks
# every module against tools/jaeger/go.sum. Without Go the test is skipped,
# saying why. The first build takes about 8 min of CPU: `make test` does not
# wait for it, the test session starts it beside the other tests (at a lower
# priority) and runs the tests that need Jaeger last (tests/jaeger.py).
# Without a symbol table and DWARF (-s -w) the binary is 85 MB, not 121 MB.
jaeger:
	@if [ ! -x $(DSH_JAEGER) ]; then \
	  if command -v go >/dev/null 2>&1; then \
	    mkdir -p $(dir $(DSH_JAEGER)) && cd tools/jaeger && \
	    go build -mod=readonly -trimpath -buildvcs=false -ldflags='-s -w' -o $(DSH_JAEGER).tmp github.com/jaegertracing/jaeger/cmd/jaeger && \
	    mv $(DSH_JAEGER).tmp $(DSH_JAEGER) || echo "the Jaeger build failed: the export-otel test will be skipped"; \
	  else echo "go not found: the export-otel test against Jaeger will be skipped"; fi; \
	fi

# Apache Kafka broker jars from Maven Central into the user cache (once),
# checked against dsh_pipeline/pins.
kafka-jars: setup
	$(VPY) -c "from dsh_pipeline.kafka_jars import ensure_kafka_jars; print('kafka jars:', ensure_kafka_jars())"

bench: setup reference kafka-jars postgres chromium
	$(VPY) -m benchmarks.core
	$(VPY) -m benchmarks.produce
	$(VPY) -m benchmarks.pipeline
	$(VPY) -m benchmarks.limits
	$(VPY) -m benchmarks.gateway
	$(VPY) -m benchmarks.store
	$(VPY) -m benchmarks.views

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis docs/_build
