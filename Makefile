# One command sets up and runs the main job; one sets up and passes the tests.
#   make run    -- create .venv, install coconet, run the main CoCoNet workload on the CPU
#   make test   -- create .venv, install coconet with its test tools, run ruff (lint) + basedpyright + lit + pytest
#   make fuzz   -- 20,000 fuzzer inputs (FUZZ_INPUTS=N FUZZ_SEED=S); make reliability: the report
#   make gpu-check -- on a machine with a CUDA GPU: install coconet[gpu-check] into .venv-gpu and
#                  validate the cuda backend (benchmarks/gpu_check.py -> gpu-check-results.md);
#                  without a GPU: one line saying so, exit 0, nothing installed
PYTHON ?= python3
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
# the PATH make was called with: gpu-check's interpreter is found on it, not in .venv
CALLER_PATH := $(PATH)
export PATH := $(BIN):$(PATH)

.PHONY: setup run test lint typecheck lit pytest clean gpu-check gpu-setup fuzz reliability

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

run: setup
	$(BIN)/coco-run examples/adam.mlir --np 4 --backend cpu --schedule ar-c --schedule rs-c-ag --schedule 'fuse(rs-c-ag)' --check --bench -q

# xDSL's ruff rule set (pyproject [tool.ruff]) and the formatter: CI fails on either
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# basedpyright (pyproject [tool.basedpyright]: every module; strict on dialects/, core/, ...): CI fails on a type
# error. The checker cannot follow setuptools' package-dir mapping (dialects/ installed as
# coconet.dialects), so it checks a tree of links laid out as the installed package
# (build/typecheck/coconet/dialects/coco.py -> dialects/coco.py; a folder's subpackages, such as
# coconet/schedule/, come with it), remade on every run so that new and removed files count.
# Its messages name files by their link in that tree. A folder mapped inside another mapped
# one (lowering/kernels) comes with its parent's copy.
TYPECHECK_TREE := build/typecheck
typecheck: setup
	rm -rf $(TYPECHECK_TREE)
	$(BIN)/python -c 'import os, shutil, sys, tomllib; \
		dirs = tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"]; \
		[shutil.copytree(os.path.abspath(d), os.path.join(sys.argv[1], *p.split(".")), \
			copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__")) \
			for p, d in dirs.items() \
			if not any(d.startswith(o + "/") for o in dirs.values())]' $(TYPECHECK_TREE)
	$(BIN)/basedpyright

lit: setup
	$(BIN)/lit -sv test/filecheck

# pytest-xdist workers: MPI tests launch their own ranks, but most of the suite is one Python
# process at a time, so two workers keep CI's two cores busy (PYTEST_JOBS=0: one process).
# worksteal: tests take milliseconds to a minute, and a long one dealt last idles a core.
PYTEST_JOBS ?= 2
pytest: setup
	$(BIN)/python -m pytest -q -n $(PYTEST_JOBS) --dist worksteal test

test: setup lint typecheck
	$(BIN)/lit -sv test/filecheck
	$(BIN)/python -m pytest -q -n $(PYTEST_JOBS) --dist worksteal test

# The fuzzer (test/fuzz): FUZZ_INPUTS mutated programs and pipelines (seed FUZZ_SEED) through
# parsing, verification, schedules, lowering and the sim; exit 1 on any traceback, hang or
# silent acceptance. The summary goes to fuzz-report.json.
FUZZ_INPUTS ?= 20000
FUZZ_SEED ?= 0
FUZZ_JOBS ?= 2
fuzz: setup
	$(BIN)/python test/fuzz/fuzz_driver.py --inputs $(FUZZ_INPUTS) --seed $(FUZZ_SEED) \
		--jobs $(FUZZ_JOBS) --json fuzz-report.json

# The reliability report (benchmarks/reliability.py): the fuzzer's counts and fault-injection
# timings on real MPI jobs, as the README quotes them.
reliability: setup
	$(BIN)/python benchmarks/reliability.py --inputs $(FUZZ_INPUTS) --seed $(FUZZ_SEED)

# gpu-check uses its own venv, made with --system-site-packages so that the CuPy (matching the
# driver's CUDA) and PyTorch a GPU image ships are reused rather than shadowed; cupy-cuda13x is
# installed only when no CuPy is importable. The venv is made from GPU_PYTHON as found on the
# PATH make was called with (not .venv's, whose torch is a CPU build). When that interpreter
# is itself a venv's (a GPU image's /opt/torch/.venv, say), --system-site-packages would reach
# only the base interpreter's packages: a .pth file adds that venv's. The extra installed is
# gpu-check (pytest and MPI), not test, whose pinned CPU torch would shadow the image's.
# GPU_PIP_ARGS passes options to pip: on a machine without a package index,
# GPU_PIP_ARGS='--no-index --find-links WHEELS --no-build-isolation' (WHEELS: xdsl and its
# dependencies, mpich, mpi4py). GPU_CHECK_ARGS passes options to the script
# (e.g. GPU_CHECK_ARGS='--quick --ranks 1,2').
GPU_VENV ?= .venv-gpu
GPU_BIN := $(abspath $(GPU_VENV))/bin
GPU_PYTHON ?= python3
GPU_PIP_ARGS ?=
GPU_CHECK_ARGS ?=
NO_GPU = gpu-check: no CUDA GPU visible ($(1)); nothing to check on this machine
PARENT_SITE = import sys, sysconfig; p = sysconfig.get_paths(); \
	print(*dict.fromkeys([p["purelib"], p["platlib"]]) if sys.prefix != sys.base_prefix else (), sep="\n")

gpu-setup: $(GPU_VENV)/.installed

$(GPU_VENV)/.installed: pyproject.toml
	PATH="$(CALLER_PATH)" $(GPU_PYTHON) -m venv --system-site-packages $(GPU_VENV)
	PATH="$(CALLER_PATH)" $(GPU_PYTHON) -c '$(PARENT_SITE)' > \
		"$$($(GPU_BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/gpu-image-venv.pth"
	$(GPU_BIN)/python -m pip install --quiet --upgrade $(GPU_PIP_ARGS) pip
	if $(GPU_BIN)/python -c 'import cupy' 2>/dev/null; then extras=gpu-check; else extras=cuda,gpu-check; fi; \
	$(GPU_BIN)/python -m pip install --quiet $(GPU_PIP_ARGS) -e ".[$$extras]"
	touch $@

# The GPU test comes first and is cheap (nvidia-smi), so a GPU-less machine installs nothing.
# Once nvidia-smi has listed a GPU, CuPy not seeing one is an error (--require-gpu), not a note.
gpu-check:
	@if ! command -v nvidia-smi >/dev/null 2>&1; then \
		echo "$(call NO_GPU,no nvidia-smi on PATH)"; exit 0; \
	fi; \
	if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then \
		echo "$(call NO_GPU,nvidia-smi lists no GPU)"; exit 0; \
	fi; \
	$(MAKE) --no-print-directory gpu-setup && \
	$(GPU_BIN)/python benchmarks/gpu_check.py --require-gpu $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) $(GPU_VENV) build *.egg-info .pytest_cache
