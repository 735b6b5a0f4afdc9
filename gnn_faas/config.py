"""Serving configuration: frozen dataclasses loaded from YAML.

With no file, :func:`load_config` returns the embedded default: the local
platform, a file store under ``./var/store``, the bundled Bitcoin OTC graph and
a GCN trained on its vertex task, served as model ``bitcoin-otc`` with an SLO
of 0.3 s (λGrapher's). Unknown keys are errors, so a typo never silently falls
back to a default.

Example::

    store: file:///srv/gnn-faas/store
    gateway: {port: 8080}
    platform: {keep_alive_s: 600, memory_function_mb: 512}
    # functions as containers instead (make images):
    # platform: {kind: docker, docker: {memory_image: gnn-faas-memory:latest}}
    buffers: {num_buffers: 4}
    limits: {max_body_bytes: 16777216, max_json_depth: 16}
    models:
      - name: bitcoin-otc
        graph: bitcoin-otc
        dataset: bitcoin-otc
        slo_s: 0.3
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gnn_faas.choices import (
    CACHE_PRIORS,
    DEVICES,
    EMBEDDINGS,
    MODES,
    OBJECTIVES,
    RECOMPUTE_FROM,
    RECOMPUTE_POLICIES,
)
from gnn_faas.config_schema import validate
from gnn_faas.errors import InvalidRequest
from gnn_faas.paths import default_store, var_dir


@dataclass(frozen=True)
class GatewayConfig:
    """The gateway's HTTP server, the ``gateway:`` section.

    - ``host`` / ``port``: where it listens (``gnn-faas up --host/--port`` override them).
    - ``threads``: HTTP threads of its one worker process.
    - ``request_timeout_s``: seconds a request may take before it is answered 503.
    - ``admission_headroom``: the share of the SLO a request's predicted latency may use
      before admission control sheds it (503 with ``Retry-After``).
    """

    host: str = "127.0.0.1"
    port: int = 8080
    threads: int = 32
    request_timeout_s: float = 30.0
    # admission control (gateway/admission.py): shed when the predicted latency
    # exceeds admission_headroom * SLO; admission: false admits everything
    admission: bool = True
    admission_headroom: float = 0.65
    # the HTTP front (functions/buffered_worker.py): requests are read whole on an
    # event loop before a thread takes them; "gthread" is stock gunicorn (a baseline)
    front: str = "buffered"
    max_connections: int = 2048  # open connections; one more is answered 503 at once
    header_timeout_s: float = 10.0  # first byte -> end of the header block
    body_timeout_s: float = 30.0  # end of the header block -> end of the body
    keepalive_s: float = 30.0  # an idle kept-alive connection is closed after this
    # memory functions send their aggregate straight to the compute instance the
    # gateway chose (one gateway call per partition and layer, not two; an
    # execution whose every layer is one part runs all its layers in one call),
    # where the platform addresses instances (local, docker; docs/architecture.md, section 2)
    forward_update: bool = True
    # the graph structure every request's k-hop step reads (indptr, indices,
    # degrees) is held in the gateway's memory when it fits this budget, else
    # read through a chunk cache of this size (storage/resident.py)
    structure_budget_mb: float = 512.0


@dataclass(frozen=True)
class LimitsConfig:
    """Bounds on one inference request, checked before any work starts.

    Every check costs time and memory in proportion to the request's own size
    (bytes, number of values), never to the values it holds: vertex ids are
    checked against the graph's ``num_nodes``, graph ids against the number of
    vertices in the same request, element counts (the product of a declared
    shape) against the per-model ``max_targets`` before ``data`` is read.

    - ``max_body_bytes``: the whole HTTP body, JSON and binary tensor data (413);
    - ``max_json_depth``: nesting of JSON arrays and objects (a rank-2 ``data``
      inside the request is depth 5);
    - ``max_inputs`` / ``max_outputs``: entries of ``inputs`` / ``outputs``;
    - ``max_rank``: entries of a ``shape``;
    - ``max_id_chars``: length of the request ``id`` and of every name;
    - ``max_parameters``: entries of a ``parameters`` object;
    - ``max_values``: elements of a tensor of values (not ids), e.g. FP32 features.

    YAML: a ``limits:`` section, e.g. ``limits: {max_body_bytes: 1048576}``.
    """

    max_body_bytes: int = 16 * 1024 * 1024
    max_json_depth: int = 16
    max_inputs: int = 8
    max_outputs: int = 8
    max_rank: int = 4
    max_id_chars: int = 256
    max_parameters: int = 32
    max_values: int = 1 << 20

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidRequest(f"limits.{f.name} must be a positive integer, got {v!r}")


@dataclass(frozen=True)
class KnativeSettings:
    """Where the knative backend finds the chart's Knative Services.

    - ``namespace``: the namespace of the chart's functions (the release's).
    """

    namespace: str = "default"
    # label selector of this release's functions (the chart sets app.kubernetes.io/instance)
    selector: str = ""
    # kubeconfig file; None: in-cluster config, else ~/.kube/config
    kubeconfig: str | None = None
    # seconds between reads of the API (Services, PodAutoscalers, pods)
    refresh_s: float = 1.0
    # seconds a new dispatch slot waits for Knative to add a ready replica
    start_timeout_s: float = 60.0


@dataclass(frozen=True)
class OpenFaaSSettings:
    """How the openfaas backend reaches the OpenFaaS gateway.

    - ``url``: the OpenFaaS gateway's URL.
    - ``namespace``: the function namespace (``null``: OpenFaaS's default).
    - ``selector``: label selector of this release's functions.
    - ``user_env`` / ``password_env``: environment variables holding the basic-auth
      user and password.
    - ``credentials_secret``: else ``NAMESPACE/NAME`` of OpenFaaS's basic-auth Secret,
      read through the Kubernetes API (``null``: the variables only).
    - ``user_key`` / ``password_key``: the keys of user and password in that Secret.
    - ``refresh_s``: seconds between reads of the functions' replicas.
    - ``start_timeout_s``: seconds a new dispatch slot waits for a ready replica.
    """

    url: str = "http://gateway.openfaas:8080"
    namespace: str | None = None
    selector: str = ""
    # basic auth read from these environment variables, else from the Kubernetes Secret
    # credentials_secret ("NAMESPACE/NAME", keys user_key and password_key): OpenFaaS keeps it
    # in its own namespace, which a Pod cannot mount (the chart grants `get` on it alone)
    user_env: str = "OPENFAAS_USER"
    password_env: str = "OPENFAAS_PASSWORD"
    credentials_secret: str | None = None
    user_key: str = "basic-auth-user"
    password_key: str = "basic-auth-password"
    # kubeconfig for reading that Secret; None: in-cluster config, else ~/.kube/config
    kubeconfig: str | None = None
    # scale through /system/scale-function with FaaS-GNN's launch rule (else OpenFaaS does)
    gateway_scaling: bool = False
    # calls one replica serves at once
    concurrency: int = 1
    refresh_s: float = 1.0
    start_timeout_s: float = 60.0


@dataclass(frozen=True)
class DockerSettings:
    """The ``docker`` platform (scheduler/platform/docker.py): function instances
    as containers of the images ``make images`` builds.

    - ``host``: the engine (``null``: ``$DOCKER_HOST``, else the default socket).
    - ``memory_image`` / ``compute_image``: the images of the memory and compute functions.
    - ``start_timeout_s``: seconds a container may take to answer its ready probe.
    - ``stop_grace_s``: seconds between SIGTERM and SIGKILL when an instance stops.
    - ``memory_aware_cache``: ``false`` tells memory functions the machine's memory
      instead of their container's limit (the cache then grows past it: a baseline).
    - ``tmpfs_mb``: size of each container's ``/tmp`` (its only writable path).
    """

    host: str | None = None
    memory_image: str = "gnn-faas-memory:latest"
    compute_image: str = "gnn-faas-compute:latest"
    start_timeout_s: float = 60.0
    stop_grace_s: float = 5.0
    memory_aware_cache: bool = True
    tmpfs_mb: int = 64

    def platform_kwargs(self) -> dict[str, Any]:
        return {
            "docker_host": self.host,
            "images": {"memory": self.memory_image, "compute": self.compute_image},
            "start_timeout_s": self.start_timeout_s,
            "stop_grace_s": self.stop_grace_s,
            "memory_aware_cache": self.memory_aware_cache,
            "tmpfs_mb": self.tmpfs_mb,
        }


@dataclass(frozen=True)
class PlatformConfig:
    """Where function instances run and how big they are, the ``platform:`` section.

    - ``kind``: ``local`` (processes, the default), ``docker``, ``knative`` or ``openfaas``.
    - ``keep_alive_s``: seconds an idle instance lives before it stops (scale to zero).
    - ``memory_function_mb`` / ``compute_function_mb``: memory of one memory / compute
      function instance (MiB), what it is billed and sized on.
    - ``memory_vcpus`` / ``compute_vcpus``: vCPUs of one instance.
    - ``max_memory_instances`` / ``max_compute_instances``: the most instances of each
      model's memory / compute function.
    """

    kind: str = "local"
    keep_alive_s: float = 600.0
    memory_function_mb: int = 512
    compute_function_mb: int = 1024
    memory_vcpus: float = 1.0
    compute_vcpus: float = 1.0
    max_memory_instances: int = 4
    max_compute_instances: int = 4
    # instances started before traffic (provisioned concurrency / Knative minScale)
    min_instances: int = 1
    # memory function instance memory budget for one partition (λGrapher Alg. 2)
    runtime_mb: int = 96
    docker: DockerSettings = field(default_factory=DockerSettings)
    knative: KnativeSettings = field(default_factory=KnativeSettings)
    openfaas: OpenFaaSSettings = field(default_factory=OpenFaaSSettings)

    def backend_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the ``kind`` backend's constructor from this section."""
        if self.kind == "docker":
            return self.docker.platform_kwargs()
        if self.kind in ("knative", "openfaas"):
            return {"settings": getattr(self, self.kind)}
        return {}


@dataclass(frozen=True)
class BufferSettings:
    """Graph-sharing buffers (λGrapher 3.2-3.3), the ``buffers:`` section; a model's
    :class:`~gnn_faas.gateway.buffer_pool.BufferConfig` is
    ``BufferConfig.from_settings(settings, slo_s)``.

    - ``num_buffers``: buffers open at once per model.
    - ``gamma``: a buffer's first timeout, T0 = gamma x SLO.
    - ``delta``: the longest a buffer waits from its first request, Tmax = delta x SLO.
    - ``tau_fraction``: the decision interval, tau = tau_fraction x SLO.
    - ``max_steps``: the longest extension one decision may make, in steps of tau.
    - ``alpha`` / ``beta``: weights of sharing degree and of wait in a closed buffer's
      gain (alpha x S - beta x D), what the timeout tree is fitted to.
    - ``max_requests_per_buffer``: a buffer closes when it holds this many requests.
    - ``exec_estimate_s``: seconds a closed buffer needs to execute; a buffer closes in
      time for each of its requests to meet the SLO.
    - ``global_opt``: move requests between open buffers when that raises sharing.
    - ``latency_slack``: ``balanced``: mean latency within (1 + slack) x no sharing's.
    """

    num_buffers: int = 4
    gamma: float = 0.1
    delta: float = 0.5
    tau_fraction: float = 0.1
    max_steps: int = 3
    alpha: float = 1.0
    beta: float = 0.5
    max_requests_per_buffer: int = 64
    exec_estimate_s: float = 0.05
    global_opt: bool = True
    tree: str | None = None  # fitted decision tree JSON; None: the one shipped for the graph
    # when a buffer may hold requests (gateway/work_conserving.py): cost | balanced | latency
    objective: str = "balanced"
    latency_slack: float = 0.1


@dataclass(frozen=True)
class ModelBufferSettings:
    """A model's own buffer objective (None: the ``buffers`` section's).

    - ``objective``: ``cost``, ``balanced`` or ``latency`` for this model (``null``: the
      ``buffers`` section's).
    - ``latency_slack``: this model's slack (``null``: the ``buffers`` section's).
    """

    objective: str | None = None
    latency_slack: float | None = None


@dataclass(frozen=True)
class ModelServingConfig:
    """One served model, an entry of ``models:``.

    - ``name``: the model's name in the API (``/v2/models/NAME``).
    - ``graph``: the graph in the store it serves.
    - ``arch`` / ``layers`` / ``hidden`` / ``epochs``: the model trained on first start
      when there is no checkpoint (``gcn``, ``sage``, ``gin``, ``gat``).
    - ``slo_s``: the latency objective in seconds (buffers, admission, SLO counts).
    - ``fanouts``: per hop, in-neighbours sampled per vertex (-1: all; ``null``: all
      at every hop).
    - ``mode``: ``graph_sharing``, ``no_sharing`` (buffers, each request aggregated
      alone) or ``request_centric`` (no buffers, no cache: the AWSGNN baseline).
    - ``recompute_budget``: ``precomputed``: the share of candidate vertices recomputed.
    - ``recompute_policy``: which candidates: ``query_edge_ratio``, ``random`` or
      ``importance``.
    - ``max_new_edges``: the most edges a new-vertex request may add.
    - ``compute_function_mb`` / ``memory_vcpus`` / ``compute_vcpus``: this model's sizes
      where they differ from ``platform.*`` (``null``: the platform's).
    """

    name: str = "bitcoin-otc"
    graph: str = "bitcoin-otc"
    dataset: str | None = "bitcoin-otc"  # prepared into the store when the graph is missing
    checkpoint: str | None = None  # None: var/models/NAME, trained on first start
    arch: str = "gcn"
    layers: int = 2
    hidden: int = 64
    epochs: int = 100
    slo_s: float = 0.3
    fanouts: tuple[int, ...] | None = None
    max_targets: int = 1024  # most vertex ids one request may name (see LimitsConfig)
    mode: str = "graph_sharing"
    # OMEGA's SRPE: "precomputed" reads the stored p^(l) of the queries' neighbours
    # (gnn-faas precompute) and recomputes the recompute_budget share of them
    embeddings: str = "exact"
    recompute_budget: float = 0.05
    recompute_policy: str = "query_edge_ratio"
    # a recomputed candidate's layer 1: from its stored aggregate state and the
    # request's changed terms where the model and the stored set allow it, else
    # (or with "neighbourhood") from its whole in-neighbourhood's input rows
    recompute_from: str = "state"
    # new-vertex requests (gateway/new_vertices.py): most vertices / edges a request adds
    max_new_vertices: int = 256
    max_new_edges: int = 65536
    # memory functions' feature-cache prior: degree, or Quiver's FAP (gnn-faas datasets metrics)
    cache_prior: str = "degree"
    # compute functions' Update device: auto (CUDA when visible), cpu, cuda
    device: str = "auto"
    # this model's function sizes where they differ from platform.* (the chart's `sizing`):
    # the memory budget of its partitions follows its own memory function
    memory_function_mb: int | None = None
    compute_function_mb: int | None = None
    memory_vcpus: float | None = None
    compute_vcpus: float | None = None
    # buffers: {objective: cost | balanced | latency, latency_slack: 0.1}
    buffers: ModelBufferSettings = field(default_factory=ModelBufferSettings)


@dataclass(frozen=True)
class GraphToken:
    """A write token for one graph (``${VAR}`` read from the environment).

    - ``graph``: the graph it lets a client update.
    - ``token``: the bearer token (``${VAR}``: from the environment, e.g. a Secret).
    """

    graph: str = ""
    token: str = ""


@dataclass(frozen=True)
class GraphsConfig:
    """Graphs that change while they are served (storage/versions.py).

    - ``freshness_s``: an update acknowledged at ``t`` is seen by every request arriving
      after ``t + freshness_s``, on the acknowledging gateway too; 0: every request checks
      the store for a newer version, and the acknowledging gateway's next request sees it.
    - ``write_token``: bearer token of ``POST /v2/graphs/{g}/updates`` for every graph
      (``${VAR}``: from the environment); none and no ``tokens``: updates are refused.
    - ``tokens``: per-graph write tokens (``[{graph, token}]``), checked before ``write_token``.
    - ``compact_share``: compact a graph when its log's bytes pass this share of its
      base's (0: never automatically).
    - ``compaction_grace_s``: what a compaction supersedes is deleted only after this
      long (keep it above ``gateway.request_timeout_s``).
    - ``max_batch_ops``: the most changes (edges, vertices, rows) one batch may hold.
    """

    freshness_s: float = 1.0
    write_token: str | None = None
    tokens: tuple[GraphToken, ...] = ()
    compact_share: float = 0.25
    compaction_grace_s: float = 120.0
    max_batch_ops: int = 1_000_000

    def token_of(self, graph: str) -> str | None:
        """The token that lets a client update ``graph`` (``None``: updates refused)."""
        for t in self.tokens:
            if t.graph == graph:
                return _secret(t.token)
        return _secret(self.write_token)


def _secret(value: str | None) -> str | None:
    """A token with ``${VAR}`` read from the environment; ``None`` when empty or
    when a variable is unset (never the literal ``${VAR}``: anyone could send it)."""
    if not value:
        return None
    out = os.path.expandvars(value)
    if not out or "$" in out:
        return None
    return out


@dataclass(frozen=True)
class ServingConfig:
    """The whole serving config (the YAML file ``gnn-faas up --config`` reads).

    - ``store``: the graph store's URI: ``file:///path``, ``s3://bucket/prefix`` or
      ``redis://host:6379/0``; ``${VAR}`` is read from the environment (empty:
      ``file://./var/store``).
    """

    store: str = ""
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    platform: PlatformConfig = field(default_factory=PlatformConfig)
    buffers: BufferSettings = field(default_factory=BufferSettings)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    graphs: GraphsConfig = field(default_factory=GraphsConfig)
    models: tuple[ModelServingConfig, ...] = (ModelServingConfig(),)

    def __post_init__(self):
        # ${VAR} in the store URI comes from the environment (the chart's Redis URL is a Secret)
        object.__setattr__(self, "store", os.path.expandvars(self.store))
        if not self.store:
            object.__setattr__(self, "store", default_store())
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise InvalidRequest(f"duplicate model names in config: {names}")
        for m in self.models:
            if m.mode not in MODES:
                raise InvalidRequest(f"model {m.name!r}: mode must be one of {MODES}")
            if m.slo_s <= 0:
                raise InvalidRequest(f"model {m.name!r}: slo_s must be positive")
            for key, allowed in (
                ("embeddings", EMBEDDINGS),
                ("recompute_policy", RECOMPUTE_POLICIES),
                ("recompute_from", RECOMPUTE_FROM),
                ("cache_prior", CACHE_PRIORS),
                ("device", DEVICES),
            ):
                if getattr(m, key) not in allowed:
                    raise InvalidRequest(f"model {m.name!r}: {key} must be one of {allowed}")
            if not 0.0 <= m.recompute_budget <= 1.0:
                raise InvalidRequest(f"model {m.name!r}: recompute_budget must lie in [0, 1]")
            if m.max_new_vertices < 0 or m.max_new_edges < 0:
                raise InvalidRequest(f"model {m.name!r}: max_new_vertices/edges must be >= 0")
            if isinstance(m.max_targets, bool) or m.max_targets < 1:
                raise InvalidRequest(f"model {m.name!r}: max_targets must be a positive integer")
            objective = m.buffers.objective or self.buffers.objective
            if objective not in OBJECTIVES:
                raise InvalidRequest(
                    f"model {m.name!r}: buffers.objective must be one of {OBJECTIVES}"
                )
            slack = m.buffers.latency_slack
            if slack is not None and not slack >= 0:
                raise InvalidRequest(f"model {m.name!r}: buffers.latency_slack must be >= 0")

    def model(self, name: str) -> ModelServingConfig:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    def checkpoint_dir(self, m: ModelServingConfig) -> Path:
        return Path(m.checkpoint) if m.checkpoint else var_dir() / "models" / m.name


def from_dict(cls: type, data: Any, where: str = "config") -> Any:
    """Build dataclass ``cls`` from plain data, checking keys and nested types."""
    if not dataclasses.is_dataclass(cls):
        return data
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise InvalidRequest(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InvalidRequest(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _convert(hints[name], value, f"{where}.{name}")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise InvalidRequest(f"{where}: {exc}") from None


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        return _convert(non_none[0], value, where)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise InvalidRequest(f"{where}: expected a list")
        item = args[0] if args else Any
        return tuple(_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool) and not isinstance(value, tp):
        raise InvalidRequest(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def load_config(path: str | Path | None = None) -> ServingConfig:
    """The serving config from YAML ``path``, or the embedded default. The
    document is checked against :data:`gnn_faas.config_schema.SCHEMA` first:
    every violation, one line each, in one :class:`InvalidRequest`."""
    if path is None:
        return ServingConfig()
    p = Path(path)
    if not p.is_file():
        raise InvalidRequest(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise InvalidRequest(f"{p}: invalid YAML ({exc})") from None
    validate(data, str(p))
    return from_dict(ServingConfig, data, str(p))
