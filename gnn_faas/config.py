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
    buffers: {num_buffers: 4}
    models:
      - name: bitcoin-otc
        graph: bitcoin-otc
        dataset: bitcoin-otc
        slo_s: 0.3
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gnn_faas.errors import InvalidRequest
from gnn_faas.paths import var_dir

MODES = ("graph_sharing", "no_sharing", "request_centric")


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    threads: int = 32
    request_timeout_s: float = 30.0
    max_body_bytes: int = 16 * 1024 * 1024
    # admission control (gateway/admission.py): shed when the predicted latency
    # exceeds admission_headroom * SLO; admission: false admits everything
    admission: bool = True
    admission_headroom: float = 0.7


@dataclass(frozen=True)
class PlatformConfig:
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


@dataclass(frozen=True)
class BufferSettings:
    """Graph-sharing buffers (λGrapher 3.2-3.3); see gateway/buffer_pool.py."""

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

    def for_slo(self, slo_s: float):
        """The gateway's :class:`BufferConfig` for a model with this SLO (τ is
        configured relative to the SLO, so one section serves every model)."""
        from gnn_faas.gateway.buffer_pool import BufferConfig

        return BufferConfig(
            num_buffers=self.num_buffers,
            slo_s=slo_s,
            gamma=self.gamma,
            delta=self.delta,
            tau_s=self.tau_fraction * slo_s,
            max_steps=self.max_steps,
            alpha=self.alpha,
            beta=self.beta,
            max_requests_per_buffer=self.max_requests_per_buffer,
            exec_estimate_s=self.exec_estimate_s,
            global_opt=self.global_opt,
        )


@dataclass(frozen=True)
class ModelServingConfig:
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
    max_targets: int = 1024
    mode: str = "graph_sharing"


@dataclass(frozen=True)
class ServingConfig:
    store: str = ""
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    platform: PlatformConfig = field(default_factory=PlatformConfig)
    buffers: BufferSettings = field(default_factory=BufferSettings)
    models: tuple[ModelServingConfig, ...] = (ModelServingConfig(),)

    def __post_init__(self):
        if not self.store:
            object.__setattr__(self, "store", f"file://{var_dir() / 'store'}")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise InvalidRequest(f"duplicate model names in config: {names}")
        for m in self.models:
            if m.mode not in MODES:
                raise InvalidRequest(f"model {m.name!r}: mode must be one of {MODES}")
            if m.slo_s <= 0:
                raise InvalidRequest(f"model {m.name!r}: slo_s must be positive")

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
    """The serving config from YAML ``path``, or the embedded default."""
    if path is None:
        return ServingConfig()
    p = Path(path)
    if not p.is_file():
        raise InvalidRequest(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise InvalidRequest(f"{p}: invalid YAML ({exc})") from None
    return from_dict(ServingConfig, data, str(p))
