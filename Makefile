# Echelon — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install proto demo up test test-all chaos bench lint clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

proto: $(STAMP)
	$(PY) -m echelon.tools.genproto

demo: $(STAMP)
	$(VENV)/bin/echelon demo

up: $(STAMP)
	$(VENV)/bin/echelon up --agents 4 --matchers 2

test: $(STAMP)
	$(PY) -m pytest -q

chaos: $(STAMP)
	$(PY) -m pytest -q -m chaos tests/chaos

bench: $(STAMP)
	$(PY) -m pytest -q -m bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
