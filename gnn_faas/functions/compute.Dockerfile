# Compute function image (gnn-faas-compute): torch and the Update stages of the layers.
#
#   make images                  # builds it offline (CPU torch from the wheel on disk)
#   make images TORCH_VARIANT=cuda   # torch from PyPI: its default Linux build brings CUDA
#   docker run --network host --read-only --tmpfs /tmp -e PORT=8080 \
#       -v $PWD/var/models/bitcoin-otc:/model:ro gnn-faas-compute --model /model
#
# The build context is the repository root. BASE_IMAGE as in memory.Dockerfile. torch:
# - WHEELS names an image whose root holds torch-*.whl (`make images` imports the CPU wheel
#   from /opt/wheels into gnn-faas-wheels); that wheel is bind-mounted for one RUN, so it never
#   lands in a layer, and installed from locks/torch-cpu.txt (--no-index --require-hashes: that
#   file and its hash, nothing else). With no wheel there, pip installs torch of the locked
#   version from TORCH_INDEX: PyTorch's CPU index by default, https://pypi.org/simple for a
#   CUDA build (the wheels bring the CUDA runtime; the host gives the driver through the NVIDIA
#   container toolkit); that torch and its CUDA wheels are resolved there, not hash-locked.
# - Every other dependency (torch's own included) comes from locks/compute.txt with
#   --require-hashes --no-deps: no resolution at build time.
# - The function uses CUDA when torch sees a device (--device overrides), else the CPU with
#   GNN_FAAS_THREADS threads (default: the CPUs the container may use / workers).
# pip reaches the index with the CA bundle given as the BuildKit secret `ca` (optional; never
# in a layer). The image also runs the chart's prepare Job (`gnn-faas datasets prepare`, `gnn-faas
# train` with PyG, `gnn-faas model push`) and pulls its checkpoint from the store at start
# (`serve compute --store URI --model-name NAME`; in the entrypoint: GNN_FAAS_MODEL_NAME with
# GNN_FAAS_STORE, or GNN_FAAS_STORE_FILE naming a file that holds the store URI): the lock
# brings PyG and the store clients (extras compute, train, s3, redis).
# Contract as memory.Dockerfile: $PORT, /v2/health/ready and /_/health, uid 10001,
# read-only root filesystem with /tmp writable.
ARG BASE_IMAGE=gnn-faas-base:bookworm
ARG WHEELS=gnn-faas-base:bookworm
FROM ${WHEELS} AS wheels
FROM ${BASE_IMAGE}

# botocore describes every AWS service (30 MB); the store needs S3 (and STS/SSO for credentials)
ARG BOTOCORE_SERVICES="s3 sts sso sso-oidc"
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONUNBUFFERED=1

# torch first, on its own (the largest layer, the one that changes least), then the other
# dependencies (--no-deps: torch is never resolved again).
COPY locks/torch-cpu.txt /opt/gnn-faas/locks/
RUN --mount=type=bind,from=wheels,target=/wheels --mount=type=secret,id=ca \
    set -e; if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip="python $(ls /usr/share/python-wheels/pip-*.whl /usr/local/lib/python3*/ensurepip/_bundled/pip-*.whl \
      /usr/lib/python3*/ensurepip/_bundled/pip-*.whl 2>/dev/null | head -n 1)/pip"; \
    python3 -m venv --without-pip /opt/venv; \
    if ls /wheels/torch-*.whl >/dev/null 2>&1; then \
      $pip install -q --require-hashes --no-deps --no-index --find-links /wheels \
        -r /opt/gnn-faas/locks/torch-cpu.txt; \
    else version=$(sed -n 's/^torch==\([^+ ]*\).*/\1/p' /opt/gnn-faas/locks/torch-cpu.txt); \
      $pip install -q --index-url "${TORCH_INDEX}" "torch==${version}"; fi; \
    rm -rf /root/.cache

COPY locks/compute.txt /opt/gnn-faas/locks/
RUN --mount=type=secret,id=ca \
    set -e; if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip="python $(ls /usr/share/python-wheels/pip-*.whl /usr/local/lib/python3*/ensurepip/_bundled/pip-*.whl \
      /usr/lib/python3*/ensurepip/_bundled/pip-*.whl 2>/dev/null | head -n 1)/pip"; \
    $pip install -q --require-hashes --no-deps -r /opt/gnn-faas/locks/compute.txt; \
    rm -rf /root/.cache; \
    for d in /opt/venv/lib/python3*/site-packages/botocore/data/*/; do \
      case " ${BOTOCORE_SERVICES} " in *" $(basename "$d") "*) ;; *) rm -rf "$d" ;; esac; done; \
    find /opt/venv/lib/python3*/site-packages/numpy /opt/venv/lib/python3*/site-packages/scipy \
      -depth -type d -name tests -exec rm -rf {} +; \
    find /opt/venv/lib/python3*/site-packages \( -name '*.pyi' -o -name '*.pxd' -o -name '*.pyx' \
      -o -name '*.h' -o -name '*.c' -o -name '*.cpp' -o -name '*.f' -o -name '*.f90' \) -delete

# gnn_faas itself, built as in memory.Dockerfile (locks/build.txt, --no-build-isolation)
COPY pyproject.toml README.md locks/build.txt /opt/gnn-faas/
COPY gnn_faas /opt/gnn-faas/gnn_faas
RUN --mount=type=secret,id=ca \
    set -e; if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip="python $(ls /usr/share/python-wheels/pip-*.whl /usr/local/lib/python3*/ensurepip/_bundled/pip-*.whl \
      /usr/lib/python3*/ensurepip/_bundled/pip-*.whl 2>/dev/null | head -n 1)/pip"; \
    $pip install -q --require-hashes --no-deps --target /tmp/build -r /opt/gnn-faas/build.txt; \
    PYTHONPATH=/tmp/build $pip install -q --no-deps --no-build-isolation /opt/gnn-faas; \
    rm -rf /tmp/build /root/.cache /opt/gnn-faas; \
    python -c "import torch, gnn_faas.functions.compute_app; print('torch', torch.__version__)"; \
    python -c "import torch_geometric, boto3, redis, gnn_faas.functions.pyg_models, gnn_faas.functions.checkpoint_store"; \
    echo 'gnnfaas:x:10001:10001:gnn-faas:/tmp:/usr/sbin/nologin' >>/etc/passwd; \
    echo 'gnnfaas:x:10001:' >>/etc/group

USER 10001:10001
WORKDIR /tmp
ENV HOME=/tmp TMPDIR=/tmp XDG_CACHE_HOME=/tmp/.cache MPLCONFIGDIR=/tmp/matplotlib \
    TORCH_HOME=/tmp/.cache/torch TORCHINDUCTOR_CACHE_DIR=/tmp/.cache/inductor \
    PYTHONDONTWRITEBYTECODE=1 \
    GNN_FAAS_EXIT_ON_WORKER_DEATH=1 \
    HOST=0.0.0.0 PORT=8080 MODEL_DIR="" GNN_FAAS_MODEL_NAME="" GNN_FAAS_STORE="" GNN_FAAS_STORE_FILE=""
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request as r; r.urlopen('http://127.0.0.1:%s/v2/health/ready' % os.environ.get('PORT', '8080'), timeout=2)"]
ENTRYPOINT ["/bin/sh", "-c", "if [ -n \"${GNN_FAAS_STORE_FILE}\" ]; then GNN_FAAS_STORE=$(cat \"$GNN_FAAS_STORE_FILE\") || exit 2; fi; exec gnn-faas serve compute --host \"${HOST}\" --port \"${PORT}\" ${MODEL_DIR:+--model \"$MODEL_DIR\"} ${GNN_FAAS_MODEL_NAME:+--store \"$GNN_FAAS_STORE\" --model-name \"$GNN_FAAS_MODEL_NAME\"} \"$@\"", "gnn-faas-compute"]
CMD []

# Labels last: their build arguments change every build and must not void the cache above.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG BASE_IMAGE
LABEL org.opencontainers.image.title="gnn-faas-compute" \
      org.opencontainers.image.description="gnn-faas compute function: Update stages of GNN layers on torch (CPU or CUDA)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="https://github.com/gnn-faas/gnn-faas" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
