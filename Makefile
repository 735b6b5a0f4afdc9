# The whole set-up on a fresh machine is `make run` or `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STORE ?= file://$(CURDIR)/var/store

.PHONY: install lock test-deps registry-deps kube-tools run test test-fast lint format bench clean images engine-stop push chart-push gpu-wheels gpu-check docs docs-gen

install: $(VENV)/.installed

# Every install comes from the lock files under locks/ (`make lock` writes them from
# pyproject.toml; scripts/lock.py says how): each package pinned with its files' hashes,
# installed with --require-hashes --no-deps, so nothing is resolved and two installs are the
# same. torch first, alone, from the CPU wheel on disk (--no-index: the only candidate is that
# file, never a CUDA build); then the dev lock (torch's dependencies included); then gnn_faas
# itself, editable, built by the setuptools the dev lock pins. --clear: a venv holds exactly
# the lock, whatever an earlier install left.
TORCH_WHEELS ?= /opt/wheels
$(VENV)/.installed: pyproject.toml locks/dev.txt locks/torch-cpu.txt
	$(PYTHON) -m venv --clear $(VENV)
	$(BIN)/pip install -q --require-hashes --no-deps --no-index --find-links $(TORCH_WHEELS) -r locks/torch-cpu.txt
	$(BIN)/pip install -q --require-hashes --no-deps -r locks/dev.txt
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $@

# Rewrite locks/ from pyproject.toml with uv (the `lock` extra; needs the package index), then
# check them (tests/test_locks.py runs the same check offline). Commit the result.
UV ?= $(BIN)/uv
lock:
	@[ -x "$(UV)" ] || { rm -f $(VENV)/.installed; $(MAKE) install; }
	$(BIN)/python scripts/lock.py compile --uv $(UV) --torch-wheels $(TORCH_WHEELS)
	$(BIN)/python scripts/lock.py check

# Real servers for the storage tests: redis-server from Debian (moto's S3
# server comes with the pip extras above).
test-deps:
	@command -v redis-server >/dev/null || { \
	  (apt-get update -q && apt-get install -y -q redis-server) >/dev/null; }

# A real OCI registry for the push tests: Debian's docker-registry (the CNCF Distribution
# registry); tests/registry.py starts it on a free loopback port and stops it.
registry-deps:
	@command -v docker-registry >/dev/null || { \
	  (apt-get update -q && apt-get install -y -q docker-registry) >/dev/null; }

# Real helm, kubectl and kube-apiserver 1.20.2 for the chart and platform tests
# (../shared/tools/kube-apiserver.sh; the apiserver is built once, a few minutes,
# then cached under ~/.cache/gnn-faas-tools). The tests call the script too.
kube-tools: install
	PYTHON=$(BIN)/python bash ../shared/tools/kube-apiserver.sh tools >/dev/null
	PYTHON=$(BIN)/python bash ../shared/tools/kube-apiserver.sh build >/dev/null

run: install
	$(BIN)/gnn-faas demo --store $(STORE)

# The images are built first; the container tests (tests/test_images.py, the docker platform
# and gateway tests) start the engine themselves (tests/docker_engine.py, the same script) and
# stop it at the end. Where no engine can start at all they skip, saying why; a failed build
# fails them.
test: install test-deps registry-deps kube-tools
	$(MAKE) images || echo "make test: the images were not built; the container tests say why"
	$(BIN)/python -m pytest -q
	$(MAKE) docs

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check gnn_faas tests scripts/gen_docs.py
	$(BIN)/ruff format --check gnn_faas tests scripts/gen_docs.py

format: install
	$(BIN)/ruff format gnn_faas tests
	$(BIN)/ruff check --fix gnn_faas tests

# The generated docs pages (references from the code, tables from docs/results/*.json, the
# request-path picture): rerun after changing the config, a command, an endpoint, a chart value
# or a result; tests/test_docs.py fails while a page is stale.
docs-gen: install
	$(BIN)/python scripts/gen_docs.py

# The docs site (MkDocs, Material theme) into build/site; --strict: a broken link, a missing
# page or a stale generated page fails it.
docs: install
	$(BIN)/python scripts/gen_docs.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir build/site

bench: install
	$(BIN)/gnn-faas datasets prepare bitcoin-otc --store $(STORE)
	$(BIN)/gnn-faas bench fetch --store $(STORE) --graph bitcoin-otc --hops 2 --queries 200 --json

# Container images, built offline: a Debian bookworm base made by debootstrap and imported
# (scripts/base-image.sh; BASE_IMAGE=python:3.11-slim where a registry is reachable), the CPU
# torch wheel from /opt/wheels as an image for the compute build to mount, then the three
# images with BuildKit (`--network host`; pip gets the host's CA bundle as a build secret).
# Builds into the engine DOCKER_HOST names when one answers; otherwise starts its own dockerd
# under build/docker (scripts/docker-engine.sh) and stops it when done.
DOCKER_DIR := build/docker
ENGINE := scripts/docker-engine.sh
BASE_IMAGE ?= gnn-faas-base:bookworm
# Images are tagged with the chart's appVersion (what the chart's image references name) and
# `latest` (what the docker platform runs by default).
APP_VERSION := $(shell sed -n 's/^appVersion: *"*\([^"]*\)"*/\1/p' charts/Chart.yaml)
IMAGE_TAG ?= $(APP_VERSION)
TORCH_VARIANT ?= cpu
# the CPU wheel locks/torch-cpu.txt pins (its hash is checked in the build)
TORCH_VERSION := $(shell sed -n 's/^torch==\([^ ]*\).*/\1/p' locks/torch-cpu.txt)
TORCH_WHEEL ?= $(firstword $(wildcard $(TORCH_WHEELS)/torch-$(TORCH_VERSION)-cp311-*.whl))
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
IMAGES := memory:gnn_faas/functions/memory.Dockerfile compute:gnn_faas/functions/compute.Dockerfile gateway:gnn_faas/gateway/Dockerfile

images:
	@set -euo pipefail; \
	own=0; $(ENGINE) running $(DOCKER_DIR) || own=1; \
	host=$$($(ENGINE) start $(DOCKER_DIR)); export DOCKER_HOST=$$host; \
	if [ $$own = 1 ] && $(ENGINE) running $(DOCKER_DIR); then \
	  trap '$(ENGINE) stop $(DOCKER_DIR)' EXIT; else own=0; fi; \
	docker=$$($(ENGINE) docker); export DOCKER_BUILDKIT=1; t0=$$(date +%s); \
	if [ "$(BASE_IMAGE)" = gnn-faas-base:bookworm ]; then \
	  DOCKER=$$docker scripts/base-image.sh $(BASE_IMAGE); fi; \
	wheels=$(BASE_IMAGE); torch=(); \
	if [ "$(TORCH_VARIANT)" = cuda ]; then torch=(--build-arg TORCH_INDEX=https://pypi.org/simple); \
	elif [ -n "$(TORCH_WHEEL)" ]; then \
	  wheels=gnn-faas-wheels:$$(basename "$(TORCH_WHEEL)" .whl | tr '+' '-' | cut -c1-120); \
	  $$docker image inspect $$wheels >/dev/null 2>&1 || \
	    tar -C $$(dirname "$(TORCH_WHEEL)") -cf - $$(basename "$(TORCH_WHEEL)") | \
	      $$docker import - $$wheels >/dev/null; fi; \
	secret=(); [ -r "$(CA_BUNDLE)" ] && secret=(--secret id=ca,src=$(CA_BUNDLE)); \
	labels=(--build-arg VERSION=$$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml) \
	  --build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
	  --build-arg CREATED=$$(date -u +%Y-%m-%dT%H:%M:%SZ)); \
	for spec in $(IMAGES); do name=$${spec%%:*}; file=$${spec#*:}; \
	  echo "make images: gnn-faas-$$name:$(IMAGE_TAG) ($$file)"; \
	  $$docker build --progress plain --network host --build-arg BASE_IMAGE=$(BASE_IMAGE) \
	    --build-arg WHEELS=$$wheels "$${torch[@]}" "$${secret[@]}" "$${labels[@]}" \
	    -f $$file -t gnn-faas-$$name:$(IMAGE_TAG) -t gnn-faas-$$name:latest . \
	    >$(DOCKER_DIR)/build-$$name.log 2>&1 || \
	    { tail -n 40 $(DOCKER_DIR)/build-$$name.log; exit 1; }; done; \
	$$docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' 'gnn-faas-*'; \
	echo "make images: $$(( $$(date +%s) - t0 )) s"

# `make push REGISTRY=host:port[/path]`: tag the three images (built by `make images`) as
# REGISTRY/gnn-faas-KIND:IMAGE_TAG and push them; build/pushed-images.txt records each pushed
# reference with its digest (REGISTRY/gnn-faas-KIND:TAG@sha256:...), one a line. Same engine
# rule as `make images`. A loopback registry (127.0.0.0/8, localhost) is plain HTTP, as Docker
# allows by default.
push:
	@set -euo pipefail; test -n "$(REGISTRY)" || { echo "make push: set REGISTRY=host:port[/path]" >&2; exit 2; }; \
	own=0; $(ENGINE) running $(DOCKER_DIR) || own=1; \
	host=$$($(ENGINE) start $(DOCKER_DIR)); export DOCKER_HOST=$$host; \
	if [ $$own = 1 ] && $(ENGINE) running $(DOCKER_DIR); then \
	  trap '$(ENGINE) stop $(DOCKER_DIR)' EXIT; else own=0; fi; \
	docker=$$($(ENGINE) docker); mkdir -p build; : >build/pushed-images.txt; \
	for spec in $(IMAGES); do name=gnn-faas-$${spec%%:*}; \
	  ref=$(patsubst %/,%,$(REGISTRY))/$$name:$(IMAGE_TAG); \
	  $$docker image inspect $$name:$(IMAGE_TAG) >/dev/null 2>&1 || \
	    { echo "make push: no image $$name:$(IMAGE_TAG); run make images first" >&2; exit 1; }; \
	  $$docker tag $$name:$(IMAGE_TAG) $$ref; \
	  $$docker push $$ref >build/push-$$name.log 2>&1 || { tail -n 20 build/push-$$name.log >&2; exit 1; }; \
	  digest=$$(sed -n 's/.*digest: \(sha256:[0-9a-f]*\).*/\1/p' build/push-$$name.log | tail -n 1); \
	  test -n "$$digest" || { echo "make push: no digest for $$ref" >&2; exit 1; }; \
	  echo "$$ref@$$digest" | tee -a build/pushed-images.txt; done

# `make chart-push REGISTRY=host:port[/path]`: `helm package` the chart into build/chart and
# `helm push` it to oci://REGISTRY/charts (install it with
# `helm install NAME oci://REGISTRY/charts/gnn-faas --version VERSION`). helm comes from
# ../shared/tools/kube-apiserver.sh; a loopback registry is reached over plain HTTP.
HELM ?= $(shell PYTHON=$(BIN)/python bash ../shared/tools/kube-apiserver.sh tools 2>/dev/null)/helm
chart-push:
	@set -euo pipefail; test -n "$(REGISTRY)" || { echo "make chart-push: set REGISTRY=host:port[/path]" >&2; exit 2; }; \
	plain=(); case "$(REGISTRY)" in 127.*|localhost*|\[::1\]*) plain=(--plain-http);; esac; \
	mkdir -p build/chart; rm -f build/chart/*.tgz; \
	$(HELM) package charts -d build/chart >/dev/null; pkg=$$(ls build/chart/*.tgz); \
	$(HELM) push $$pkg oci://$(patsubst %/,%,$(REGISTRY))/charts "$${plain[@]}" 2>&1 | tee build/chart/push.log; \
	grep -q '^Digest: sha256:' build/chart/push.log

# The GPU check (docs/gpu-check.md). `make gpu-wheels` downloads here, by locks/gpu.txt (hashes
# checked), the wheels for Python 3.12 of the core dependencies a lent GPU machine lacks (it has
# CUDA torch, PyG, numpy and scipy, and no package index) into build/gpu-wheels, the folder to
# carry there; scripts/gpu-check.sh installs from it with --no-index what is missing.
GPU_WHEELS := build/gpu-wheels
GPU_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
  manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64
gpu-wheels:
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(PYTHON) -m pip download -q --no-deps --require-hashes --only-binary=:all: \
	  --python-version 3.12 --implementation cp $(addprefix --platform ,$(GPU_PLATFORMS)) \
	  -d $(GPU_WHEELS) -r locks/gpu.txt
	@echo "make gpu-wheels: $$(ls $(GPU_WHEELS) | wc -l) wheels, $$(du -sh $(GPU_WHEELS) | cut -f1) in $(GPU_WHEELS)"

gpu-check:
	scripts/gpu-check.sh

# Stop the engine `make images` or the tests started under build/docker, if one still runs.
engine-stop:
	$(ENGINE) stop $(DOCKER_DIR)

clean: engine-stop
	rm -rf $(VENV) var build *.egg-info
