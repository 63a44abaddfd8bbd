# The two set-up commands of the README: `make demo` and `make test`. Each creates the venv
# and installs what it needs on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_DIR ?= $(CURDIR)/.demo

.PHONY: demo test install bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: the CPU build on disk; a bare `torch` could pull a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

test: install
	$(PY) -m pytest -q

demo: install
	DEMO_DIR="$(DEMO_DIR)" PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo.sh

bench: install
	$(PY) benchmarks/bench_cli.py

clean:
	rm -rf $(DEMO_DIR) build *.egg-info
