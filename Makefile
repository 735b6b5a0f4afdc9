# The whole set-up on a fresh machine is `make run` or `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STORE ?= file://$(CURDIR)/var/store

.PHONY: install test-deps registry-deps kube-tools run test test-fast lint format bench clean images engine-stop push chart-push docs docs-gen

install: $(VENV)/.installed

# torch is installed first, pinned, so pip takes the CPU wheel from the local
# find-links instead of resolving a CUDA build from an index.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[all,test,docs]'
	touch $@

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
TORCH_WHEEL ?= $(firstword $(wildcard /opt/wheels/torch-2.13.0+cpu-cp311-*.whl))
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

# Stop the engine `make images` or the tests started under build/docker, if one still runs.
engine-stop:
	$(ENGINE) stop $(DOCKER_DIR)

clean: engine-stop
	rm -rf $(VENV) var build *.egg-info
