# lbbench — two commands on a fresh machine:
#   make demo   replays the paper's workload through four routers on the simulated cluster
#   make test   runs the test suite
# Both create and fill .venv themselves.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
# torch for the learning extras. On a machine without a GPU, point TORCH_PIP_ARGS at a
# CPU wheel index (e.g. TORCH_PIP_ARGS="--index-url <cpu wheel index>") if plain pip
# would fetch a CUDA build.
TORCH_SPEC     ?= torch==2.13.0
TORCH_PIP_ARGS ?=

.PHONY: demo test test-fast test-live bench profiles vllm-env gateways-env venv venv-dev clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# core: what `lbbench run` needs on the simulator (no torch)
$(VENV)/.core: $(BIN)/python pyproject.toml
	$(PIP) install --quiet -e .
	touch $@

# dev: learning extras (torch CPU build, gymnasium, transformers, scikit-learn), plots, test tools
$(VENV)/.dev: $(VENV)/.core
	$(PIP) install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[learn,plot,dev,ray,live]"
	touch $@

venv: $(VENV)/.core
venv-dev: $(VENV)/.dev

demo: $(VENV)/.core
	$(BIN)/lbbench run --profile llama2-7b-v100 --instances 4 --workload paper-mix --rate 20 \
	    --requests 2000 --router round_robin,jsq,min_min,mcu --seeds 3 --out runs/demo

test: $(VENV)/.dev
	$(BIN)/python -m pytest -m "not live" -p no:cacheprovider

# the live tier: real vLLM (CPU build where there is no GPU) serving a tiny local model
test-live: $(VENV)/.dev vllm-env gateways-env
	LBBENCH_REQUIRE_LIVE=1 $(BIN)/python -m pytest -m live -p no:cacheprovider

vllm-env:
	PYTHON=$(PYTHON) bash scripts/make_vllm_env.sh

# production gateways (SGLang's model gateway, vllm-router) for the live tier and gateway benchmarks
gateways-env:
	PYTHON=$(PYTHON) bash scripts/make_gateways_env.sh

# the shipped llama3.1-8b profiles (vLLM V1, roofline steps) from the shipped calibration; rerun after refitting it
profiles: $(VENV)/.core
	$(BIN)/python scripts/derive_shipped_profiles.py

bench: $(VENV)/.dev
	$(BIN)/python bench/bench_sim.py
	$(BIN)/python bench/bench_replay.py

clean:
	rm -rf $(VENV) .venv-vllm .venv-gateways runs .pytest_cache
