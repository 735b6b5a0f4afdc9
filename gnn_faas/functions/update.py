"""Update: the compute-side half of every GNN layer (torch), plus output heads.

:class:`UpdateModel` holds only layer weights (no graph) and applies the
``pre`` and ``post`` stages of :mod:`gnn_faas.functions.layer_plan` with numpy
in and out, so the transports that carry its tensors stay torch-free:

- gcn: pre ``z = h W^T`` (transform-first layers only); post ``agg W^T + b``
  (aggregate-first) or ``agg + b`` (transform-first);
- sage: post ``W_l agg + b_l + W_r root``;
- gin: post ``MLP(agg) = W_2 ReLU(W_1 agg + b_1) + b_2``;
- gat: pre ``x' = W h`` as ``[n, H, C]``, ``alpha_src = (x' * att_src).sum(-1)``,
  ``alpha_dst = (x' * att_dst).sum(-1)``; post concat heads (``concat``) or
  their mean, ``+ b`` (heads and concat per layer);

then ReLU unless the layer is the last. Heads: ``edge_scores`` =
``sigmoid(<h_u, h_v>)`` (edge-level requests), ``graph_readout`` = mean pool per
segment (graph-level requests). Everything runs under ``torch.inference_mode``
on CUDA when present, else CPU.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.checkpoint import check_shapes, load_config, load_state
from gnn_faas.functions.device import select_device
from gnn_faas.functions.layer_plan import LayerStep, ModelPlan
from gnn_faas.functions.model_config import ModelConfig


class TransferStats:
    """Host<->device traffic of the Update stages: each input batch is moved to
    the device once, each answer back once (on the CPU the "moves" are the
    same calls, counted the same way)."""

    def __init__(self) -> None:
        self.to_device = 0
        self.from_device = 0
        self.bytes_to_device = 0
        self.bytes_from_device = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def _rows(a: np.ndarray, name: str, width: int | None = None, ndim: int = 2) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise InvalidRequest(f"{name} must be a numpy array")
    if not np.issubdtype(a.dtype, np.floating):
        raise InvalidRequest(f"{name} must be floating point (float32), got {a.dtype}")
    if a.ndim != ndim or (width is not None and a.shape[-1] != width):
        raise InvalidRequest(f"{name} has shape {a.shape}, expected {ndim}-D with width {width}")
    return a


class UpdateModel:
    """The layer weights of one model and its Update stages."""

    def __init__(self, config: ModelConfig, state: dict[str, torch.Tensor], device: str = "cpu"):
        check_shapes(config, {k: tuple(v.shape) for k, v in state.items()}, "UpdateModel")
        self.config = config
        self.plan = ModelPlan.from_config(config)
        self.device = torch.device(device)
        # weights resident on the device for the instance's lifetime
        self.w = {
            k: v.detach().to(self.device, torch.float32).contiguous() for k, v in state.items()
        }
        self.transfers = TransferStats()

    @classmethod
    def load(cls, ckpt_dir: str | os.PathLike, device: str | None = None) -> UpdateModel:
        """Load a checkpoint directory onto ``device`` (``auto``/``None``: CUDA if
        visible, else CPU; see :mod:`gnn_faas.functions.device`)."""
        return cls(load_config(ckpt_dir), load_state(ckpt_dir), select_device(device))

    # -- helpers ---------------------------------------------------------------
    def _step(self, layer: int) -> LayerStep:
        return self.plan.step(layer)

    def _param(self, layer: int, name: str) -> torch.Tensor:
        return self.w[f"convs.{layer - 1}.{name}"]

    def _bias(self, out: torch.Tensor, layer: int, name: str) -> torch.Tensor:
        """``out + b``, or ``out`` for a layer built with ``bias=False``."""
        return out + self._param(layer, name) if self._step(layer).bias else out

    def _t(self, a: np.ndarray) -> torch.Tensor:
        """One host->device move of a batch (a read-only frame view is copied
        once on the host first: torch wants writable memory)."""
        a = np.ascontiguousarray(a, dtype=np.float32)
        if not a.flags.writeable:
            a = a.copy()
        t = torch.from_numpy(a)
        self.transfers.to_device += 1
        self.transfers.bytes_to_device += a.nbytes
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def _np(self, t: torch.Tensor) -> np.ndarray:
        """One device->host move of an answer."""
        out = t.to("cpu", torch.float32).numpy()
        self.transfers.from_device += 1
        self.transfers.bytes_from_device += out.nbytes
        return out

    # -- stages ----------------------------------------------------------------
    def pre(self, layer: int, h: np.ndarray) -> dict[str, np.ndarray]:
        """Compute-side stage before aggregate: ``{"h": ...}`` (gat adds
        ``"alpha_src"``, ``"alpha_dst"`` ``[n, heads]`` over all given rows)."""
        step = self._step(layer)
        if not step.pre:
            raise InvalidRequest(f"layer {layer} of this {self.config.arch} model has no pre stage")
        _rows(h, "h", step.in_dim)
        with torch.inference_mode():
            x = self._t(h)
            z = x @ self._param(layer, "lin.weight").T
            if step.op == "gcn":
                return {"h": self._np(z)}
            heads = step.heads
            z = z.view(-1, heads, step.agg_dim // heads)
            a_src = (z * self._param(layer, "att_src")).sum(-1)
            a_dst = (z * self._param(layer, "att_dst")).sum(-1)
            return {"h": self._np(z), "alpha_src": self._np(a_src), "alpha_dst": self._np(a_dst)}

    def post(self, layer: int, agg: np.ndarray, root: np.ndarray | None = None) -> np.ndarray:
        """Compute-side stage after aggregate: the layer's output rows
        ``[num_dst, out_dim]`` (ReLU applied unless last)."""
        step = self._step(layer)
        if step.op == "gat":
            _rows(agg, "agg", step.agg_dim // step.heads, ndim=3)
            if agg.shape[1] != step.heads:
                raise InvalidRequest(f"agg must have {step.heads} heads, got {agg.shape[1]}")
        else:
            _rows(agg, "agg", step.agg_dim)
        with torch.inference_mode():
            a = self._t(agg)
            if step.op == "gcn":
                out = a if step.transform_first else a @ self._param(layer, "lin.weight").T
                out = self._bias(out, layer, "bias")
            elif step.op in ("mean", "max"):  # sage
                out = self._bias(a @ self._param(layer, "lin_l.weight").T, layer, "lin_l.bias")
                if step.return_root:
                    if root is None:
                        raise InvalidRequest(f"layer {layer} (sage) needs the root rows")
                    _rows(root, "root", step.in_dim)
                    if root.shape[0] != agg.shape[0]:
                        raise InvalidRequest("root and agg must have the same number of rows")
                    out = out + self._t(root) @ self._param(layer, "lin_r.weight").T
            elif step.op == "gin":
                hid = torch.relu(
                    a @ self._param(layer, "nn.0.weight").T + self._param(layer, "nn.0.bias")
                )
                out = hid @ self._param(layer, "nn.2.weight").T + self._param(layer, "nn.2.bias")
            else:  # gat
                out = a.reshape(a.shape[0], -1) if step.concat else a.mean(dim=1)
                out = self._bias(out, layer, "bias")
            if not step.last:
                out = torch.relu(out)
            return self._np(out)

    # -- heads -------------------------------------------------------------------
    def edge_scores(self, h_u: np.ndarray, h_v: np.ndarray) -> np.ndarray:
        """Edge-level head: ``sigmoid(<h_u, h_v>)`` per row pair -> ``[n]``."""
        _rows(h_u, "h_u")
        _rows(h_v, "h_v")
        if h_u.shape != h_v.shape:
            raise InvalidRequest(f"h_u {h_u.shape} and h_v {h_v.shape} must have the same shape")
        with torch.inference_mode():
            return self._np(torch.sigmoid((self._t(h_u) * self._t(h_v)).sum(-1)))

    def graph_readout(self, h: np.ndarray, segments: np.ndarray) -> np.ndarray:
        """Graph-level head: mean of the rows of each segment id ->
        ``[num_graphs, d]`` with ``num_graphs = segments.max() + 1`` (an empty
        segment gives zeros)."""
        _rows(h, "h")
        seg = np.asarray(segments)
        if seg.ndim != 1 or seg.shape[0] != h.shape[0]:
            raise InvalidRequest(f"segments must be 1-D with {h.shape[0]} entries")
        if seg.size and (not np.issubdtype(seg.dtype, np.integer) or seg.min() < 0):
            raise InvalidRequest("segments must be non-negative integers")
        num_graphs = int(seg.max()) + 1 if seg.size else 0
        with torch.inference_mode():
            idx = torch.from_numpy(seg.astype(np.int64)).to(self.device)
            x = self._t(h)
            total = torch.zeros(num_graphs, h.shape[1], device=self.device).index_add_(0, idx, x)
            count = torch.bincount(idx, minlength=num_graphs).clamp(min=1).unsqueeze(1)
            return self._np(total / count)
