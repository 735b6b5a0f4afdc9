# Compute function image: torch + the layer weights' Update stages.
#
#   docker build -f gnn_faas/functions/compute.Dockerfile -t gnn-faas-compute .
#   docker run -p 8080:8080 -v $PWD/var/models/bitcoin-otc:/model gnn-faas-compute [--threads 2]
#
# The build context is the repository root. By default the CPU torch wheel is
# installed from PyTorch's CPU index (no CUDA libraries: a much smaller image).
# For GPUs pick a CUDA wheel index (the wheels bring the CUDA runtime; the host
# provides the driver through the NVIDIA container toolkit), optionally on a
# CUDA base image that has Python >= 3.10 and pip (--build-arg BASE=...):
#
#   docker build -f gnn_faas/functions/compute.Dockerfile \
#       --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124 -t gnn-faas-compute:cuda .
#
# The function uses CUDA when torch sees a device, else the CPU with
# GNN_FAAS_THREADS (default: cores / workers) threads per worker, set after the
# fork. MODEL_DIR is the checkpoint (config.json + model.safetensors).
ARG BASE=python:3.11-slim
FROM ${BASE}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, from the chosen index, so `.[compute]` finds it satisfied and
# never resolves a different (CUDA) build from PyPI
RUN pip install --index-url "${TORCH_INDEX}" "torch${TORCH_VERSION:+==${TORCH_VERSION}}"

WORKDIR /opt/gnn-faas
COPY pyproject.toml README.md ./
COPY gnn_faas ./gnn_faas
RUN pip install ".[compute]" \
 && python -c "import gnn_faas.functions.compute_app, torch; print('torch', torch.__version__)"

RUN useradd --system --uid 10001 gnnfaas
USER 10001
ENV PORT=8080 MODEL_DIR=/model
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=2s --start-period=10s \
  CMD python -c "import os, urllib.request as r; r.urlopen(f'http://127.0.0.1:{os.environ[\"PORT\"]}/v2/health/ready', timeout=2)"
ENTRYPOINT ["/bin/sh", "-c", "exec gnn-faas serve compute --host 0.0.0.0 --port \"${PORT}\" --model \"${MODEL_DIR}\" \"$@\"", "gnn-faas-compute"]
CMD []
