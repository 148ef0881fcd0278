# phalanx — every target installs what it needs first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install lint test e2e e2e-deps demo bench clean browser-deps plugin-test krew-archive

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# code health (configuration in pyproject.toml): ruff over the whole tree (generated gRPC code
# excluded), mypy --strict on solver/, cycle/, cluster/, controller/ and web/, the layering contracts
RUFF_SCOPE   := .
lint: install
	$(VENV)/bin/ruff check $(RUFF_SCOPE)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# each suite's slowest tests and its own time are printed at the end (docs/testing.md, "Time budget")
DURATIONS := --durations=15 --durations-min=5
TIMED     := bash hack/timed.sh

test: lint browser-deps plugin-test
	$(TIMED) unit $(PY) -m pytest tests/unit -q $(DURATIONS)
	$(TIMED) browser $(PY) -m pytest tests/browser -q $(DURATIONS)

# the kube-scheduler framework plugin (plugin/, Go): its unit tests against a fake framework handle
# and an in-process fake phalanx serve (Go module and build caches reused; modules only through
# the Go module proxy)
plugin-test:
	cd plugin && GOTOOLCHAIN=local GOFLAGS=-buildvcs=false go vet ./... && GOTOOLCHAIN=local GOFLAGS=-buildvcs=false go test ./...

# Debian's Chromium at /usr/bin/chromium drives the browser tests (Playwright's own browser
# download is not used). Installed only when missing, and said so; without root or apt, the
# target fails with the command to run.
browser-deps:
	@if command -v chromium >/dev/null; then \
	  echo "browser-deps: using $$(command -v chromium)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "browser-deps: chromium is missing; installing the Debian package chromium (apt-get install -y chromium)"; \
	  apt-get update && apt-get install -y chromium; \
	else \
	  echo "browser-deps: chromium is missing and cannot be installed here (needs root and apt-get)." >&2; \
	  echo "browser-deps: run: sudo apt-get install -y chromium   (or put a chromium on PATH)" >&2; \
	  exit 1; \
	fi

# what the e2e suite runs: the control plane and every tool, built pinned from their Go modules
# (stamped: a second run rebuilds nothing). CI starts it beside `make test` (.ci/run).
e2e-deps: install
	$(TIMED) build-k8s bash hack/build-k8s.sh
	$(TIMED) build-tools bash hack/build-tools.sh
	$(TIMED) build-lws bash hack/build-lws.sh
	$(TIMED) build-kueue bash hack/build-kueue.sh
	$(TIMED) build-karpenter bash hack/build-karpenter.sh
	$(TIMED) build-toxiproxy bash hack/build-toxiproxy.sh
	$(TIMED) build-kwok bash hack/build-kwok.sh
	bash hack/fetch-provisioning-crd.sh >/dev/null
	$(TIMED) build-plugin bash hack/build-plugin.sh
	$(TIMED) build-scheduler-perf bash hack/build-scheduler-perf.sh >/dev/null

e2e: e2e-deps
	$(TIMED) e2e $(PY) -m pytest tests/e2e -q $(DURATIONS)

# interactive (Ctrl-C stops it); scripts: make demo DEMO_ARGS="--duration 20 --headless"
demo: install
	$(VENV)/bin/phalanx demo $(DEMO_ARGS)

# quick versions of the simulated-cluster suites (a few minutes); `phalanx bench controller` needs
# the e2e control plane (see docs/benchmarks.md). Results go to build/bench/ (ignored by git), so the
# tree stays clean; `make bench BENCH_OUT=bench/results` updates the published ones.
BENCH_QUICK := solver preemption cache extender trace trace-defaults tenants composite fragmentation preemption-perf
BENCH_OUT   ?= build/bench
bench: install
	for suite in $(BENCH_QUICK); do \
	  $(VENV)/bin/phalanx bench $$suite --quick --json $(BENCH_OUT)/$$suite-quick.json || exit 1; \
	done

# the archive krew installs `kubectl phalanx` from (plugins/krew/phalanx.yaml), reproducible
krew-archive: install
	$(PY) hack/krew_archive.py dist/kubectl-phalanx.tar.gz

clean:
	rm -rf $(VENV) build *.egg-info
