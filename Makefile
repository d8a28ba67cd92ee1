# dl-nfv: `make demo` sets up and runs the main job; `make test` sets up and runs the tests.
# Both create .venv themselves and are idempotent. Override the torch requirement for a GPU
# machine, e.g.  make test TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126'

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test lint clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -c "import torch" 2>/dev/null || $(VENV)/bin/pip install $(TORCH_SPEC)
	$(VENV)/bin/pip install -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash examples/demo.sh

test: install
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) demo-out build *.egg-info
