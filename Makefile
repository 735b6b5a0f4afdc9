# The whole set-up on a fresh machine is `make run` or `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STORE ?= file://$(CURDIR)/var/store

.PHONY: install test-deps kube-tools run test test-fast lint format bench clean

install: $(VENV)/.installed

# torch is installed first, pinned, so pip takes the CPU wheel from the local
# find-links instead of resolving a CUDA build from an index.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[all,test]'
	touch $@

# Real servers for the storage tests: redis-server from Debian (moto's S3
# server comes with the pip extras above).
test-deps:
	@command -v redis-server >/dev/null || { \
	  (apt-get update -q && apt-get install -y -q redis-server) >/dev/null; }

# Real helm, kubectl and kube-apiserver 1.20.2 for the chart and platform tests
# (../shared/tools/kube-apiserver.sh; the apiserver is built once, a few minutes,
# then cached under ~/.cache/gnn-faas-tools). The tests call the script too.
kube-tools: install
	PYTHON=$(BIN)/python bash ../shared/tools/kube-apiserver.sh tools >/dev/null
	PYTHON=$(BIN)/python bash ../shared/tools/kube-apiserver.sh build >/dev/null

run: install
	$(BIN)/gnn-faas demo --store $(STORE)

test: install test-deps kube-tools
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check gnn_faas tests
	$(BIN)/ruff format --check gnn_faas tests

format: install
	$(BIN)/ruff format gnn_faas tests
	$(BIN)/ruff check --fix gnn_faas tests

bench: install
	$(BIN)/gnn-faas datasets prepare bitcoin-otc --store $(STORE)
	$(BIN)/gnn-faas bench fetch --store $(STORE) --graph bitcoin-otc --hops 2 --queries 200 --json

clean:
	rm -rf $(VENV) var build *.egg-info
