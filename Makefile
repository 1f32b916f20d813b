# `make test` is the whole suite: it creates .venv if needed, installs gpupool with its
# test extras, then runs ruff, mypy and pytest. `make demo` runs the main job.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint typecheck pytest demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest -n 2 -p no:cacheprovider

demo: $(STAMP)
	$(BIN)/gpupool demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
