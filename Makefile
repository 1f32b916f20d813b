# `make test` is the whole suite: it creates .venv if needed, installs gpupool with its
# test, torch, ray, lightning, huggingface and notebook extras, then runs ruff, mypy and pytest. `make demo` runs the main job.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The job library's tests run real PyTorch on the CPU; this version's CPU build is what this
# kind of machine has on disk (a bare `torch` would fetch a CUDA build of several GB).
TORCH ?= torch==2.13.0

.PHONY: test system lint typecheck pytest demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/pip || $(PYTHON) -m venv --clear $(VENV)  # a venv cut short is made again
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet '$(TORCH)'
	$(BIN)/pip install --quiet -e '.[test,torch,ray,lightning,huggingface,notebook]'
	touch $(STAMP)

test: system lint typecheck pytest

# Debian's postgresql, prometheus, chromium and chromium-driver: installed when run as root,
# otherwise named with the line that installs them (tools/system-packages).
system:
	tools/system-packages

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/ruff format --check src tests benchmarks tools

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest -n 2 -p no:cacheprovider

demo: $(STAMP)
	$(BIN)/gpupool demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
