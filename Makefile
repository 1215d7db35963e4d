# growlm quick start: `make demo` (set up, then train the main job) and `make test` (set up, then run the tests).
# Both are idempotent: setup reinstalls only when setup.py changes.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.growlm-installed
APT_PACKAGES := numactl openmpi-bin libopenmpi-dev g++ python3-venv  # g++: DeepSpeed builds ops at run time
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# the main job: a small GPT on the built-in corpus, 2 ranks, ZeRO-2; bf16 where the CPU computes it natively
# (AVX512-BF16 or AMX-BF16), else fp32: without them a bf16 matmul is emulated, about 15x slower than fp32
DEMO_PRECISION ?= $(shell grep -qsE 'avx512_bf16|amx_bf16' /proc/cpuinfo && echo bf16 || echo fp32)
# ARCH=llama: the Llama main job instead, llama-cpu-small grown once on the way (growth/plans/llama_cpu_small.yaml;
# output in runs/demo-llama)
ARCH ?= gpt2
ifeq ($(ARCH),llama)
DEMO_ARGS ?= --growth_plan growth/plans/llama_cpu_small.yaml --seq_len 128 --max_steps 80 --eval_interval 20 \
	--log_interval 5 --ds_config ds_configs/zero2_$(DEMO_PRECISION).json --final_eval_tokens 65536 \
	--out_dir runs/demo-llama
else
DEMO_ARGS ?= --preset cpu-small --seq_len 128 --max_steps 80 --eval_interval 20 --log_interval 5 \
	--ds_config ds_configs/zero2_$(DEMO_PRECISION).json --final_eval_tokens 65536 --out_dir runs/demo
endif

# GPU nodes without internet: `make wheelhouse` here (PY_VERSION, PLATFORM: the nodes' Python and platform tags;
# NODE_FREEZE: a node's `python -m pip list --format=freeze`, copied here: then only what the node lacks, resolved
# against the node's versions, which WHEELHOUSE/node-constraints.txt pins), copy the folder over,
# `make install-offline WHEELHOUSE=DIR` there (NODE_PYTHON: the node's Python with its CUDA torch)
WHEELHOUSE ?= wheelhouse
PY_VERSION ?=
PLATFORM ?=
NODE_FREEZE ?=
NODE_PYTHON ?= python3

.PHONY: setup demo test test-unit lint clean wheelhouse install-offline gpu-check

setup: $(STAMP)

$(STAMP): setup.py
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:" $$missing; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[mpi,dev]'  # one package, growlm: the repository's top level (setup.py)
	touch $(STAMP)

demo: setup
	@case "$(ARCH)" in gpt2|llama) ;; *) echo "make demo: ARCH=$(ARCH): use gpt2 (the default) or llama" >&2; exit 2;; esac
	rm -rf runs/demo$(if $(filter llama,$(ARCH)),-llama)
	MASTER_ADDR=127.0.0.1 OMP_NUM_THREADS=1 $(BIN)/deepspeed --num_gpus 2 --master_addr 127.0.0.1 \
		--master_port 29500 train.py $(DEMO_ARGS)

# test: pytest-xdist workers (TEST_WORKERS); a test file runs whole on one worker (its fixtures are shared). A worker
# that crashes (a segmentation fault) ends the run with the test it was running named: pytest-xdist 3.8 under
# --dist loadfile can wait forever, workers idle, once a crashed worker is replaced (--max-worker-restart 0)
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --max-worker-restart 0 --durations=30

test-unit: setup  # tests/unit only: no process started, about 2.5 minutes on 2 cores
	$(BIN)/python -m pytest -q -m "not dist"

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# gpu-check: the default sections in under 9 minutes on one H200 -> eval/results/gpu/<device>/ (SMOKE=1: tiny shapes
# on the CPU; SECTIONS=compile,fp16,offload: the others, e.g. in a second lease); no setup: it runs in .venv where
# there is one, else in NODE_PYTHON's environment (an offline install)
gpu-check:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(NODE_PYTHON)) -m growlm.eval.bench.gpu_check --out eval/results/gpu \
		$(if $(SMOKE),--smoke) $(if $(SECTIONS),--sections $(SECTIONS))

wheelhouse: setup  # growlm, DeepSpeed (built from its sdist) and every dependency except torch and CUDA libraries
	$(BIN)/python install/wheelhouse.py --out $(WHEELHOUSE) $(if $(PY_VERSION),--python_version $(PY_VERSION)) \
		$(foreach p,$(PLATFORM),--platform $(p)) $(if $(NODE_FREEZE),--node_freeze $(NODE_FREEZE))

# install-offline: pip --no-index from WHEELHOUSE into NODE_PYTHON's environment; its torch is pinned, never replaced,
# and so is every package that WHEELHOUSE/node-constraints.txt pins (checked first: install/node_check.py)
install-offline:
	@ls "$(WHEELHOUSE)"/growlm-*.whl >/dev/null 2>&1 || { echo "make install-offline: no growlm wheel in \
	WHEELHOUSE=$(WHEELHOUSE): build the folder with make wheelhouse where there is internet and copy it here"; exit 2; }
	@torch=$$("$(NODE_PYTHON)" -c "from importlib.metadata import version; print(version('torch'))" 2>/dev/null) || { \
	echo "make install-offline: $(NODE_PYTHON) has no torch: install the node's CUDA torch first (growlm never \
	installs torch offline)"; exit 2; }; \
	node="$(WHEELHOUSE)/node-constraints.txt"; set --; \
	if [ -f "$$node" ]; then "$(NODE_PYTHON)" install/node_check.py "$$node" || exit 2; set -- --constraint "$$node"; \
		echo "keeping the node's $$(grep -c == "$$node") packages at their versions ($$node)"; fi; \
	pin=$$(mktemp); echo "torch==$$torch" > $$pin; echo "keeping torch $$torch"; \
	export PIP_CONFIG_FILE=/dev/null; \
	"$(NODE_PYTHON)" -m pip install -q --no-index --find-links "$(WHEELHOUSE)" --constraint $$pin "$$@" \
		"$(WHEELHOUSE)"/growlm-*.whl && \
	"$(NODE_PYTHON)" -m pip install -q --no-index --no-deps --force-reinstall "$(WHEELHOUSE)"/growlm-*.whl; \
	rc=$$?; rm -f $$pin; exit $$rc

clean:  # run folders here, and growlm's cache (the prepared built-in corpus, the small-vocabulary corpus)
	rm -rf runs "$${GROWLM_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/growlm}"
