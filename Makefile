# phalanx — every target installs what it needs first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test e2e demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: install
	$(PY) -m pytest tests/unit -q

e2e: install
	bash hack/build-k8s.sh
	$(PY) -m pytest tests/e2e -q

demo: install
	$(VENV)/bin/phalanx demo

bench: install
	$(VENV)/bin/phalanx bench solver --quick --json bench/results/solver-quick.json

clean:
	rm -rf $(VENV) build *.egg-info
