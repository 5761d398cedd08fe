# One command sets up and runs the main job; one sets up and passes the tests.
#   make run    -- create .venv, install coconet, run the main CoCoNet workload on the CPU
#   make test   -- create .venv, install coconet with its test tools, run lit + pytest
PYTHON ?= python3
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)

.PHONY: setup run test lit pytest clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

run: setup
	$(BIN)/coco-run examples/adam.mlir --np 4 --backend cpu --schedule ar-c --schedule rs-c-ag --schedule 'fuse(rs-c-ag)' --check --bench -q

lit: setup
	$(BIN)/lit -sv test/filecheck

pytest: setup
	$(BIN)/python -m pytest -q test

test: setup
	$(BIN)/lit -sv test/filecheck
	$(BIN)/python -m pytest -q test

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
