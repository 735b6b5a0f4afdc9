"""The configuration of a served GNN model (``config.json`` of a checkpoint).

Memory functions read it to know which Aggregate each layer needs, so this
module must not import torch. The weights live beside it in
``model.safetensors`` (see :mod:`gnn_faas.functions.checkpoint`).

Every architecture has ``num_layers`` message-passing layers with a ReLU
between layers (none after the last) and follows PyG's defaults:

- ``gcn``: ``GCNConv`` with symmetric normalisation ``D^-1/2 (A + I) D^-1/2``;
- ``sage``: ``SAGEConv(aggr=aggr)`` with a root weight, no output normalisation;
- ``gin``: ``GINConv(MLP[Linear(d_in, hidden_dim), ReLU, Linear(hidden_dim, d_out)], eps)``;
- ``gat``: ``GATConv(heads=heads)``; hidden layers concatenate their heads,
  ``hidden_dim`` is the width of ONE head (PyG's ``out_channels``), so a hidden
  layer outputs ``heads * hidden_dim``; the last layer averages its heads.

Per-layer settings (``layers``, one :class:`LayerConfig` per layer) override
the uniform ones, for anything PyG lets each layer choose: the width
(``channels``, PyG's ``out_channels``), GAT ``heads`` and ``concat`` (the
common ``GATConv(in, h, heads=4)`` then ``GATConv(4h, out, heads=1)``), GAT
``negative_slope``, SAGE ``aggr`` and ``root_weight``, GIN ``eps`` and MLP
width, and ``bias``. A layer outputs ``heads * channels`` rows wide when it
concatenates its heads, else ``channels``; the last layer's output is ``out_dim``.

``task`` says what the output of the last layer is: ``"vertex"`` means class
scores (logits, ``out_dim == num_classes``); any other task (``"embedding"``,
``"edge"``, ``"graph"``) means embeddings of width ``out_dim`` that the
edge-level (``sigmoid(<h_u, h_v>)``) or graph-level (mean readout) heads use.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gnn_faas.choices import ARCHS
from gnn_faas.errors import InvalidRequest

SAGE_AGGRS = ("mean", "max")
TASKS = ("vertex", "embedding", "edge", "graph")
CONFIG_FORMAT = "gnn-faas-model"
CONFIG_VERSION = 1
# Per-architecture normalisation, written into config.json for readers of the file.
NORMALIZATION = {"gcn": "sym", "sage": "none", "gin": "none", "gat": "softmax"}


@dataclass(frozen=True)
class LayerConfig:
    """One layer's settings (PyG constructor arguments of its conv).

    ``channels``: PyG ``out_channels`` (gat: per head; gin: the MLP's output).
    ``heads``/``concat``/``negative_slope``: gat. ``aggr``/``root_weight``: sage.
    ``eps``/``mlp_hidden``: gin (``Linear(d_in, mlp_hidden), ReLU,
    Linear(mlp_hidden, channels)``). ``bias``: the conv's output bias (gcn,
    sage ``lin_l``, gat).
    """

    channels: int
    heads: int = 1
    concat: bool = False
    negative_slope: float = 0.2
    aggr: str = "mean"
    root_weight: bool = True
    eps: float = 0.0
    mlp_hidden: int = 0
    bias: bool = True

    @property
    def out_width(self) -> int:
        """Width of the layer's output rows."""
        return self.channels * self.heads if self.concat else self.channels

    @classmethod
    def from_dict(cls, d: Any, where: str) -> LayerConfig:
        if not isinstance(d, dict):
            raise InvalidRequest(f"model config: {where} must be an object")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise InvalidRequest(f"model config: {where}: unknown keys {unknown}")
        try:
            return cls(**d)
        except TypeError as exc:
            raise InvalidRequest(f"model config: {where}: {exc}") from None


@dataclass(frozen=True)
class ModelConfig:
    """Architecture, dimensions and provenance of a model (no weights)."""

    arch: str  # "gcn" | "sage" | "gin" | "gat"
    in_dim: int
    hidden_dim: int
    out_dim: int
    num_layers: int
    aggr: str = "mean"  # sage: "mean" | "max"
    heads: int = 1  # gat
    eps: float = 0.0  # gin
    graph: str = ""  # the graph it serves (store name)
    task: str = "vertex"  # what out_dim means: "vertex" class scores; embeddings otherwise
    num_classes: int = 0
    fanouts: tuple[int, ...] | None = None  # default sampling for serving (None = full)
    # per-layer settings overriding the uniform ones above (None: uniform)
    layers: tuple[LayerConfig, ...] | None = None
    # training figures (accuracy, epochs, ...); not hashed, so configs and plans
    # can key caches
    extra: dict = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.fanouts is not None and not isinstance(self.fanouts, tuple):
            object.__setattr__(self, "fanouts", tuple(self.fanouts))
        if self.layers is not None:
            if not isinstance(self.layers, (list, tuple)):
                raise InvalidRequest("model config: layers must be a list of objects")
            layers = tuple(
                x if isinstance(x, LayerConfig) else LayerConfig.from_dict(x, f"layers[{i}]")
                for i, x in enumerate(self.layers)
            )
            object.__setattr__(self, "layers", layers)
        self.validate()

    # -- validation ----------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`InvalidRequest` naming the first bad field."""
        if self.arch not in ARCHS:
            raise InvalidRequest(f"model config: arch must be one of {ARCHS}, got {self.arch!r}")
        for name in ("in_dim", "hidden_dim", "out_dim", "num_layers", "heads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidRequest(f"model config: {name} must be a positive integer, got {v!r}")
        if self.arch == "sage" and self.aggr not in SAGE_AGGRS:
            raise InvalidRequest(
                f"model config: sage aggr must be one of {SAGE_AGGRS}, got {self.aggr!r}"
            )
        if self.arch != "gat" and self.heads != 1:
            raise InvalidRequest(f"model config: heads applies to gat only (got {self.heads})")
        if not isinstance(self.eps, (int, float)) or not math.isfinite(self.eps):
            raise InvalidRequest(f"model config: eps must be a finite number, got {self.eps!r}")
        if self.task not in TASKS:
            raise InvalidRequest(f"model config: task must be one of {TASKS}, got {self.task!r}")
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int):
            raise InvalidRequest("model config: num_classes must be an integer")
        if self.num_classes < 0:
            raise InvalidRequest("model config: num_classes must be >= 0")
        if self.task == "vertex" and self.num_classes and self.num_classes != self.out_dim:
            raise InvalidRequest(
                f"model config: a vertex-task model outputs class scores, so out_dim "
                f"({self.out_dim}) must equal num_classes ({self.num_classes})"
            )
        if self.fanouts is not None:
            if len(self.fanouts) != self.num_layers:
                raise InvalidRequest(
                    f"model config: need one fanout per layer ({self.num_layers}), "
                    f"got {list(self.fanouts)}"
                )
            if any(isinstance(f, bool) or not isinstance(f, int) for f in self.fanouts):
                raise InvalidRequest("model config: fanouts must be integers (-1 = all)")
        if not isinstance(self.graph, str):
            raise InvalidRequest("model config: graph must be a string")
        if not isinstance(self.extra, dict):
            raise InvalidRequest("model config: extra must be a JSON object")
        if self.layers is not None:
            self._validate_layers()

    def _validate_layers(self) -> None:
        if len(self.layers) != self.num_layers:
            raise InvalidRequest(
                f"model config: layers has {len(self.layers)} entries for {self.num_layers} layers"
            )
        for i, lc in enumerate(self.layers):
            where = f"model config: layers[{i}]"
            for name in ("channels", "heads"):
                v = getattr(lc, name)
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise InvalidRequest(f"{where}.{name} must be a positive integer, got {v!r}")
            for name in ("concat", "root_weight", "bias"):
                if not isinstance(getattr(lc, name), bool):
                    raise InvalidRequest(f"{where}.{name} must be true or false")
            for name in ("eps", "negative_slope"):
                v = getattr(lc, name)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise InvalidRequest(f"{where}.{name} must be a finite number, got {v!r}")
            if self.arch != "gat" and (lc.heads != 1 or lc.concat):
                raise InvalidRequest(f"{where}: heads and concat apply to gat only")
            if self.arch == "sage" and lc.aggr not in SAGE_AGGRS:
                raise InvalidRequest(f"{where}.aggr must be one of {SAGE_AGGRS}, got {lc.aggr!r}")
            if self.arch == "gin" and (
                isinstance(lc.mlp_hidden, bool)
                or not isinstance(lc.mlp_hidden, int)
                or lc.mlp_hidden < 1
            ):
                raise InvalidRequest(f"{where}.mlp_hidden must be a positive integer for gin")
        if self.layers[-1].out_width != self.out_dim:
            raise InvalidRequest(
                f"model config: the last layer outputs {self.layers[-1].out_width} columns but "
                f"out_dim is {self.out_dim}"
            )

    # -- per-layer settings ------------------------------------------------------
    def layer_settings(self) -> tuple[LayerConfig, ...]:
        """Every layer's settings: ``layers`` when given, else the uniform
        fields (hidden layers ``hidden_dim`` wide, the last ``out_dim``; gat
        hidden layers concatenate their heads, the last averages them)."""
        if self.layers is not None:
            return self.layers
        out = []
        for layer in range(1, self.num_layers + 1):
            last = layer == self.num_layers
            out.append(
                LayerConfig(
                    channels=self.out_dim if last else self.hidden_dim,
                    heads=self.heads if self.arch == "gat" else 1,
                    concat=self.arch == "gat" and not last,
                    aggr=self.aggr,
                    eps=float(self.eps),
                    mlp_hidden=self.hidden_dim if self.arch == "gin" else 0,
                )
            )
        return tuple(out)

    # -- shapes ----------------------------------------------------------------
    def layer_channels(self) -> list[tuple[int, int]]:
        """``(d_in, channels)`` per layer: the PyG ``(in_channels, out_channels)``.

        Equals :meth:`layer_dims` except for GAT, whose ``out_channels`` is per head.
        """
        chans = []
        d_in = self.in_dim
        for lc in self.layer_settings():
            chans.append((d_in, lc.channels))
            d_in = lc.out_width
        return chans

    def layer_dims(self) -> list[tuple[int, int]]:
        """``(d_in, d_out)`` per layer: the widths of the rows each layer maps."""
        return [
            (d_in, lc.out_width)
            for (d_in, _), lc in zip(self.layer_channels(), self.layer_settings())
        ]

    # -- JSON ------------------------------------------------------------------
    def to_json(self) -> str:
        d = asdict(self)
        d["fanouts"] = None if self.fanouts is None else list(self.fanouts)
        if self.layers is None:
            del d["layers"]  # uniform models keep the file as before
        d["format"] = CONFIG_FORMAT
        d["version"] = CONFIG_VERSION
        d["normalization"] = NORMALIZATION[self.arch]
        return json.dumps(d, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> ModelConfig:
        """Parse and validate; :class:`InvalidRequest` with a clear message if bad."""
        try:
            d = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidRequest(f"model config is not valid JSON: {exc}") from None
        if not isinstance(d, dict):
            raise InvalidRequest("model config must be a JSON object")
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        d = dict(d)
        fmt = d.pop("format", CONFIG_FORMAT)
        if fmt != CONFIG_FORMAT:
            raise InvalidRequest(f"not a gnn-faas model config (format {fmt!r})")
        version = d.pop("version", CONFIG_VERSION)
        if version != CONFIG_VERSION:
            raise InvalidRequest(f"unsupported model config version {version!r}")
        d.pop("normalization", None)  # derived from arch
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise InvalidRequest(f"model config: unknown keys {unknown}")
        required = ("arch", "in_dim", "hidden_dim", "out_dim", "num_layers")
        missing = [k for k in required if k not in d]
        if missing:
            raise InvalidRequest(f"model config: missing keys {missing}")
        if d.get("fanouts") is not None:
            if not isinstance(d["fanouts"], list):
                raise InvalidRequest("model config: fanouts must be a list or null")
            d["fanouts"] = tuple(d["fanouts"])
        if isinstance(d.get("eps"), int) and not isinstance(d.get("eps"), bool):
            d["eps"] = float(d["eps"])
        return cls(**d)
