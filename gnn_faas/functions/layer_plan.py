"""How each layer of a model splits into compute and memory stages (no torch).

A layer is up to three stages: an optional ``pre`` (compute side, torch), an
``aggregate`` (memory side, :mod:`gnn_faas.functions.aggregate`) and a ``post``
(compute side). Per architecture (``W``, ``b``: the layer's weights):

- gcn, aggregate first: ``agg = gcn(h)``; post ``h' = agg W^T + b``.
- gcn, transform first: pre ``z = h W^T``; ``agg = gcn(z)``; post ``h' = agg + b``.
  GCN is linear, so both orders give the same result; they move different
  bytes. Aggregate-first sends ``n_src`` rows of width ``d_in`` to the memory
  side and ``n_dst`` of width ``d_in`` back; transform-first sends and returns
  width ``d_out``. Layer 1 always aggregates first: its input rows already live
  on the memory side, so nothing is sent. A later layer transforms first when
  ``d_out < d_in`` (fewer bytes both ways). ``LayerStep.transform_first``
  records the choice.
- sage: ``agg = mean|max(h)`` (per layer) over the in-neighbours and ``root`` =
  the destinations' own rows (``return_root``, unless ``root_weight=False``);
  post ``lin_l(agg) + lin_r(root)``.
- gin: ``agg = (1 + eps) h_i + sum_j h_j``; post ``MLP(agg)``.
- gat: pre ``x' = W h`` per head, ``alpha_src = <x', att_src>``, ``alpha_dst =
  <x', att_dst>``; ``agg`` = attention-weighted sum; post concat (``concat``)
  or mean of the heads, ``+ b``; heads, concat and ``negative_slope`` are per
  layer. Layer 1's pre needs the raw input rows on
  the compute side: the memory side reads them (``Transport.features``) and
  ships them, then receives ``x'`` and the attention terms back.

Every post applies ReLU unless the layer is the last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.model_config import ModelConfig

FLOAT_BYTES = 4  # float32 on the wire


@dataclass(frozen=True)
class LayerStep:
    """One layer's stages and what travels between them."""

    layer: int  # 1-based
    op: str  # aggregate op
    pre: bool  # compute-side stage before aggregate
    post: bool  # always True
    transform_first: bool  # gcn only: pre applies W, post only adds b
    return_root: bool  # sage: aggregate also returns the destinations' own rows
    needs_degrees: bool  # gcn: extras["deg_src"]
    needs_alpha: bool  # gat: extras["alpha_src"], extras["alpha_dst"]
    agg_dim: int  # width of rows shipped memory->compute after aggregate
    in_dim: int
    out_dim: int
    last: bool
    eps: float = 0.0
    negative_slope: float = 0.2
    heads: int = 1
    concat: bool = False  # gat: post concatenates the heads (else averages them)
    bias: bool = True  # post adds the layer's bias

    @property
    def src_dim(self) -> int:
        """Width of the source rows the aggregate reads (after ``pre``)."""
        return self.agg_dim if self.pre else self.in_dim

    def bytes_moved(self, n_src: int, n_dst: int) -> int:
        """Bytes between the memory and compute sides for this layer.

        compute->memory: the source rows when they are not the input features
        (layer > 1, or after ``pre``), plus gat's attention terms;
        memory->compute: the raw input rows of layer 1 when ``pre`` needs them,
        the aggregated rows and sage's root rows.
        """
        to_memory = to_compute = 0
        if self.pre and self.layer == 1:
            to_compute += n_src * self.in_dim  # input features for pre
        if self.pre or self.layer > 1:
            to_memory += n_src * self.src_dim
        if self.needs_alpha:
            to_memory += (n_src + n_dst) * self.heads
        to_compute += n_dst * self.agg_dim
        if self.return_root:
            to_compute += n_dst * self.in_dim
        return FLOAT_BYTES * (to_memory + to_compute)


@dataclass(frozen=True)
class ModelPlan:
    """The per-layer steps of a model."""

    config: ModelConfig
    steps: tuple[LayerStep, ...]

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> ModelPlan:
        steps = []
        chans = cfg.layer_channels()
        settings = cfg.layer_settings()
        for layer, (d_in, d_out) in enumerate(cfg.layer_dims(), start=1):
            last = layer == cfg.num_layers
            lc = settings[layer - 1]
            common = dict(
                layer=layer, post=True, in_dim=d_in, out_dim=d_out, last=last, bias=lc.bias
            )
            if cfg.arch == "gcn":
                # Layer 1's rows are on the memory side already: aggregate first.
                tf = layer > 1 and d_out < d_in
                step = LayerStep(
                    op="gcn",
                    pre=tf,
                    transform_first=tf,
                    return_root=False,
                    needs_degrees=True,
                    needs_alpha=False,
                    agg_dim=d_out if tf else d_in,
                    **common,
                )
            elif cfg.arch == "sage":
                step = LayerStep(
                    op=lc.aggr,
                    pre=False,
                    transform_first=False,
                    return_root=lc.root_weight,
                    needs_degrees=False,
                    needs_alpha=False,
                    agg_dim=d_in,
                    **common,
                )
            elif cfg.arch == "gin":
                step = LayerStep(
                    op="gin",
                    pre=False,
                    transform_first=False,
                    return_root=False,
                    needs_degrees=False,
                    needs_alpha=False,
                    agg_dim=d_in,
                    eps=float(lc.eps),
                    **common,
                )
            else:  # gat
                step = LayerStep(
                    op="gat",
                    pre=True,
                    transform_first=False,  # a gcn choice; gat's pre is not optional
                    return_root=False,
                    needs_degrees=False,
                    needs_alpha=True,
                    agg_dim=lc.heads * chans[layer - 1][1],
                    heads=lc.heads,
                    concat=lc.concat,
                    negative_slope=float(lc.negative_slope),
                    **common,
                )
            steps.append(step)
        return cls(config=cfg, steps=tuple(steps))

    def step(self, layer: int) -> LayerStep:
        if not 1 <= layer <= len(self.steps):
            raise InvalidRequest(f"layer must be in 1..{len(self.steps)}, got {layer}")
        return self.steps[layer - 1]

    def bytes_moved(self, layer_sizes: Sequence[int]) -> int:
        """Bytes over the wire between memory and compute functions for one
        computation graph with ``layer_sizes`` ``(n_0, ..., n_L)`` (float32
        rows; the final output to the gateway not included)."""
        if len(layer_sizes) != len(self.steps) + 1:
            raise InvalidRequest(
                f"layer_sizes needs {len(self.steps) + 1} entries, got {len(layer_sizes)}"
            )
        return sum(
            s.bytes_moved(int(layer_sizes[s.layer - 1]), int(layer_sizes[s.layer]))
            for s in self.steps
        )
