# Memory function image: numpy/scipy/flask/gunicorn, NO torch (DESIGN principle 1).
#
#   docker build -f gnn_faas/functions/memory.Dockerfile -t gnn-faas-memory .
#   docker run -p 8080:8080 -e GNN_FAAS_STORE=s3://bucket/store -e GNN_FAAS_GRAPH=bitcoin-otc \
#       gnn-faas-memory [--memory-mb 512 --threads 4 ...]
#
# The build context is the repository root. Only the core dependencies are
# installed (`pip install .`), plus the storage clients named in EXTRAS; the
# build fails if torch slipped in. The container's memory limit (cgroup) sizes
# the feature cache unless --memory-mb is given. PORT (Knative sets it) picks
# the port; gunicorn's master is PID 1, so SIGTERM shuts down cleanly.
ARG BASE=python:3.11-slim
FROM ${BASE}

ARG EXTRAS=s3,redis
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/gnn-faas
COPY pyproject.toml README.md ./
COPY gnn_faas ./gnn_faas
RUN pip install ".[${EXTRAS}]" \
 && python -c "import importlib.util as u; assert u.find_spec('torch') is None, 'torch in the memory image'" \
 && python -c "import gnn_faas.functions.memory_app"

RUN useradd --system --uid 10001 gnnfaas
USER 10001
ENV PORT=8080 GNN_FAAS_STORE="" GNN_FAAS_GRAPH=bitcoin-otc
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s \
  CMD python -c "import os, urllib.request as r; r.urlopen(f'http://127.0.0.1:{os.environ[\"PORT\"]}/v2/health/ready', timeout=2)"
ENTRYPOINT ["/bin/sh", "-c", "exec gnn-faas serve memory --host 0.0.0.0 --port \"${PORT}\" --store \"${GNN_FAAS_STORE}\" --graph \"${GNN_FAAS_GRAPH}\" \"$@\"", "gnn-faas-memory"]
CMD []
