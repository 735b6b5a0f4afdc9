# Memory function image (gnn-faas-memory): numpy/scipy/flask/gunicorn and the storage clients,
# NO torch (docs/architecture.md, principle 1; the build fails if torch slipped in).
#
#   make images                  # builds it offline (base from debootstrap, see the Makefile)
#   DOCKER_BUILDKIT=1 docker build --network host -f gnn_faas/functions/memory.Dockerfile \
#       --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt -t gnn-faas-memory .
#   docker run --network host --read-only --tmpfs /tmp -e PORT=8080 \
#       -v /srv/store:/srv/store:ro gnn-faas-memory --store file:///srv/store --graph bitcoin-otc
#
# The build context is the repository root. BASE_IMAGE: any Debian-like image with python3 >= 3.11
# and its venv module (default: the debootstrap base `make images` imports; with a registry,
# python:3.11-slim). The dependencies are locks/memory.txt (`make lock`): every package pinned
# with its files' hashes, installed with --require-hashes --no-deps (no resolution at build
# time). pip (run from its wheel: no pip stays in the image) reaches the package index with the
# CA bundle given as the BuildKit secret `ca` (optional): the secret is mounted for one RUN and
# never lands in a layer.
#
# Contract (Knative, OpenFaaS, the docker platform): listens on $PORT (8080) at $HOST
# (0.0.0.0); readiness on /v2/health/ready and /_/health; runs as uid 10001; only /tmp is
# written (read-only root filesystem); GNN_FAAS_STORE_FILE names a file holding the store URI
# (OpenFaaS mounts Secrets as files), GNN_FAAS_CACHE_PRIOR and GNN_FAAS_CACHE_MAX_ROWS set the
# feature cache (the chart's OpenFaaS Functions cannot set a command); the container's memory limit (cgroup) sizes the feature
# cache unless --memory-mb is given; a worker killed (e.g. by the OOM killer) ends the container
# (GNN_FAAS_EXIT_ON_WORKER_DEATH), so the platform sees the kill. SIGTERM shuts down cleanly.
ARG BASE_IMAGE=gnn-faas-base:bookworm

# Build stage: the venv, trimmed; the image itself gets only the venv (one COPY).
FROM ${BASE_IMAGE} AS build

# botocore describes every AWS service (30 MB); the store needs S3 (and STS/SSO for credentials)
ARG BOTOCORE_SERVICES="s3 sts sso sso-oidc"

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONUNBUFFERED=1

# Dependencies first, in their own layer: a change to the code rebuilds only the last layers.
# The byte code of modules the function never imports goes (scripts/prune_bytecode.py); numpy's and scipy's own test suites go (a third of scipy, never imported), and so do C and
# Cython sources, headers and type stubs.
COPY locks/memory.txt /opt/gnn-faas/locks/
RUN --mount=type=secret,id=ca \
    set -e; if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip="python $(ls /usr/share/python-wheels/pip-*.whl /usr/local/lib/python3*/ensurepip/_bundled/pip-*.whl \
      /usr/lib/python3*/ensurepip/_bundled/pip-*.whl 2>/dev/null | head -n 1)/pip"; \
    python3 -m venv --without-pip /opt/venv; \
    $pip install -q --require-hashes --no-deps -r /opt/gnn-faas/locks/memory.txt; \
    rm -rf /root/.cache; \
    for d in /opt/venv/lib/python3*/site-packages/botocore/data/*/; do \
      case " ${BOTOCORE_SERVICES} " in *" $(basename "$d") "*) ;; *) rm -rf "$d" ;; esac; done; \
    find /opt/venv/lib/python3*/site-packages/numpy /opt/venv/lib/python3*/site-packages/scipy \
      -depth -type d -name tests -exec rm -rf {} +; \
    find /opt/venv/lib/python3*/site-packages \( -name '*.pyi' -o -name '*.pxd' -o -name '*.pyx' \
      -o -name '*.h' -o -name '*.c' -o -name '*.cpp' -o -name '*.f' -o -name '*.f90' \) -delete

# gnn_faas itself: built by the setuptools of locks/build.txt (outside the venv, gone with
# this RUN), --no-build-isolation so no build requirement is resolved either.
COPY pyproject.toml README.md locks/build.txt scripts/prune_bytecode.py /opt/gnn-faas/
COPY gnn_faas /opt/gnn-faas/gnn_faas
RUN --mount=type=secret,id=ca \
    set -e; if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip="python $(ls /usr/share/python-wheels/pip-*.whl /usr/local/lib/python3*/ensurepip/_bundled/pip-*.whl \
      /usr/lib/python3*/ensurepip/_bundled/pip-*.whl 2>/dev/null | head -n 1)/pip"; \
    $pip install -q --require-hashes --no-deps --target /tmp/build -r /opt/gnn-faas/build.txt; \
    PYTHONPATH=/tmp/build $pip install -q --no-deps --no-build-isolation /opt/gnn-faas; \
    rm -rf /tmp/build /root/.cache; \
    python -c "import importlib.util as u; assert u.find_spec('torch') is None, 'torch in the memory image'"; \
    python -c "import importlib.util as u, sys; u.find_spec('boto3') is None and sys.exit(); import boto3; boto3.client('s3', region_name='us-east-1')"; \
    python -c "import gnn_faas.functions.memory_app"; \
    mods="gnn_faas.functions.memory_app gnn_faas.cli gnn_faas.cli.serve gnn_faas.functions.gunicorn_runner \
      gunicorn.app.base gunicorn.workers.gthread gnn_faas.storage.backends.file"; \
    for extra in boto3:gnn_faas.storage.backends.s3 redis:gnn_faas.storage.backends.redis; do \
      if python -c "import ${extra%%:*}" 2>/dev/null; then mods="$mods ${extra#*:} ${extra%%:*}"; fi; done; \
    case "$mods" in *boto3*) mods="$mods botocore.client botocore.session botocore.endpoint \
      botocore.auth botocore.signers botocore.httpsession botocore.retries.standard s3transfer";; esac; \
    python /opt/gnn-faas/prune_bytecode.py /opt/venv/lib/python3*/site-packages $mods; \
    rm -rf /opt/gnn-faas

FROM ${BASE_IMAGE}
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
RUN echo 'gnnfaas:x:10001:10001:gnn-faas:/tmp:/usr/sbin/nologin' >>/etc/passwd; \
    echo 'gnnfaas:x:10001:' >>/etc/group

USER 10001:10001
WORKDIR /tmp
ENV HOME=/tmp TMPDIR=/tmp XDG_CACHE_HOME=/tmp/.cache MPLCONFIGDIR=/tmp/matplotlib \
    PYTHONDONTWRITEBYTECODE=1 \
    GNN_FAAS_EXIT_ON_WORKER_DEATH=1 \
    HOST=0.0.0.0 PORT=8080 GNN_FAAS_STORE="" GNN_FAAS_GRAPH=""
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request as r; r.urlopen('http://127.0.0.1:%s/v2/health/ready' % os.environ.get('PORT', '8080'), timeout=2)"]
ENTRYPOINT ["/bin/sh", "-c", "if [ -n \"${GNN_FAAS_STORE_FILE}\" ]; then GNN_FAAS_STORE=$(cat \"$GNN_FAAS_STORE_FILE\") || exit 2; fi; exec gnn-faas serve memory --host \"${HOST}\" --port \"${PORT}\" ${GNN_FAAS_STORE:+--store \"$GNN_FAAS_STORE\"} ${GNN_FAAS_GRAPH:+--graph \"$GNN_FAAS_GRAPH\"} ${GNN_FAAS_CACHE_PRIOR:+--cache-prior \"$GNN_FAAS_CACHE_PRIOR\"} ${GNN_FAAS_CACHE_MAX_ROWS:+--cache-max-rows \"$GNN_FAAS_CACHE_MAX_ROWS\"} \"$@\"", "gnn-faas-memory"]
CMD []

# Labels last: their build arguments change every build and must not void the cache above.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG BASE_IMAGE
LABEL org.opencontainers.image.title="gnn-faas-memory" \
      org.opencontainers.image.description="gnn-faas memory function: on-demand CSR fetch, memory-aware feature cache, Aggregate (no torch)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="https://github.com/gnn-faas/gnn-faas" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
