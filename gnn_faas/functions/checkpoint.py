"""Model checkpoints: ``model.safetensors`` (layer weights) + ``config.json``.

A checkpoint directory holds::

    config.json          ModelConfig (architecture, dimensions, graph, task, ...)
    model.safetensors    the weights, named as the state_dict of a PyG module
                         whose layers are ``self.convs = torch.nn.ModuleList([...])``

Weight names per layer ``i`` (0-based; ``c`` = PyG ``out_channels``, ``H`` = heads):

    gcn   convs.i.lin.weight [c, d_in]     convs.i.bias [c]
    sage  convs.i.lin_l.weight [c, d_in]   convs.i.lin_l.bias [c]   convs.i.lin_r.weight [c, d_in]
    gin   convs.i.nn.0.weight [hidden, d_in]  convs.i.nn.0.bias [hidden]
          convs.i.nn.2.weight [d_out, hidden] convs.i.nn.2.bias [d_out]  (convs.i.eps [1] optional)
    gat   convs.i.lin.weight [H*c, d_in]   convs.i.att_src [1, H, c]  convs.i.att_dst [1, H, c]
          convs.i.bias [H*c] (heads concatenated) or [c] (heads averaged)

Per-layer settings (``ModelConfig.layers``) give each layer its own ``c``,
``H``, concat and GIN MLP width; a layer built with ``bias=False`` has no bias
(sage: no ``lin_l.bias``), a SAGE layer with ``root_weight=False`` no ``lin_r``.

The memory side needs only the config: :func:`load_config` never imports
torch. Only :func:`save_checkpoint` and :func:`load_state` do, inside.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.functions.model_config import ModelConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def checkpoint_sha256(ckpt_dir: str | Path) -> str:
    """sha256 over the checkpoint's ``config.json`` and ``model.safetensors``."""
    h = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        path = Path(ckpt_dir) / name
        if not path.is_file():
            raise NotFound(f"checkpoint {ckpt_dir}: no {name}")
        h.update(name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def expected_shapes(config: ModelConfig) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """``(required name -> shape, optional names)`` of the weights of ``config``."""
    shapes: dict[str, tuple[int, ...]] = {}
    optional: set[str] = set()
    dims = config.layer_dims()
    settings = config.layer_settings()
    for i, (d_in, c) in enumerate(config.layer_channels()):
        p = f"convs.{i}."
        lc = settings[i]
        if config.arch == "gcn":
            shapes |= {p + "lin.weight": (c, d_in)}
            if lc.bias:
                shapes[p + "bias"] = (c,)
        elif config.arch == "sage":
            shapes[p + "lin_l.weight"] = (c, d_in)
            if lc.bias:
                shapes[p + "lin_l.bias"] = (c,)
            if lc.root_weight:
                shapes[p + "lin_r.weight"] = (c, d_in)
        elif config.arch == "gin":
            h, d_out = lc.mlp_hidden, dims[i][1]
            shapes |= {
                p + "nn.0.weight": (h, d_in),
                p + "nn.0.bias": (h,),
                p + "nn.2.weight": (d_out, h),
                p + "nn.2.bias": (d_out,),
            }
            shapes[p + "eps"] = (1,)
            optional.add(p + "eps")
        else:
            heads = lc.heads
            shapes |= {
                p + "lin.weight": (heads * c, d_in),
                p + "att_src": (1, heads, c),
                p + "att_dst": (1, heads, c),
            }
            if lc.bias:
                shapes[p + "bias"] = (heads * c,) if lc.concat else (c,)
    return shapes, optional


def check_shapes(config: ModelConfig, shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """Raise :class:`InvalidRequest` listing missing, unexpected or mis-shaped weights."""
    want, optional = expected_shapes(config)
    missing = sorted(set(want) - set(shapes) - optional)
    unexpected = sorted(set(shapes) - set(want))
    wrong = [
        f"{k}: {list(shapes[k])} (expected {list(v)})"
        for k, v in want.items()
        if k in shapes and tuple(shapes[k]) != tuple(v)
    ]
    problems = []
    if missing:
        problems.append(f"missing {missing}")
    if unexpected:
        problems.append(f"unexpected {unexpected}")
    if wrong:
        problems.append("wrong shapes " + "; ".join(wrong))
    if problems:
        desc = (
            f"{config.arch} in={config.in_dim} hidden={config.hidden_dim} "
            f"out={config.out_dim} layers={config.num_layers} heads={config.heads}"
            + ("" if config.layers is None else f" per-layer {_layers_text(config)}")
        )
        raise InvalidRequest(
            f"{where}: weights do not match the model ({desc}): " + ", ".join(problems)
        )


def _layers_text(config: ModelConfig) -> str:
    return ", ".join(
        f"{lc.channels}x{lc.heads}{'c' if lc.concat else ''}" for lc in config.layer_settings()
    )


def save_checkpoint(
    path: str | os.PathLike, config: ModelConfig, state_dict: dict[str, Any]
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` under ``path`` (created).

    ``state_dict`` values are torch tensors (or numpy arrays); names and shapes
    are checked against ``config`` first, so a bad checkpoint is never written.
    """
    import numpy as np
    import torch
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for k, v in state_dict.items():
        t = torch.from_numpy(np.asarray(v)) if not isinstance(v, torch.Tensor) else v
        tensors[k] = t.detach().to("cpu", torch.float32).contiguous()
    check_shapes(config, {k: tuple(t.shape) for k, t in tensors.items()}, "checkpoint")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    # Write to temporary names, then rename: a reader never sees half a checkpoint.
    tmp_w, tmp_c = out / (WEIGHTS_FILE + ".tmp"), out / (CONFIG_FILE + ".tmp")
    save_file(tensors, str(tmp_w), metadata={"format": "gnn-faas-model", "arch": config.arch})
    tmp_c.write_text(config.to_json() + "\n")
    # safetensors creates its file 0600: give the weights the config's (umask) mode, so a
    # function running as another user (a container's) can read the checkpoint
    shutil.copymode(tmp_c, tmp_w)
    os.replace(tmp_w, out / WEIGHTS_FILE)
    os.replace(tmp_c, out / CONFIG_FILE)
    return out


def load_config(path: str | os.PathLike) -> ModelConfig:
    """The ModelConfig of the checkpoint at ``path`` (no torch)."""
    f = Path(path) / CONFIG_FILE
    if not f.is_file():
        raise NotFound(f"no model checkpoint at {str(path)!r}: {CONFIG_FILE} is missing")
    try:
        text = f.read_text()
    except OSError as exc:
        raise NotFound(f"cannot read {f}: {exc}") from None
    try:
        return ModelConfig.from_json(text)
    except InvalidRequest as exc:
        raise InvalidRequest(f"{f}: {exc}") from None


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    """The weights (``dict[str, torch.Tensor]``) of the checkpoint at ``path``,
    checked against its config."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config = load_config(path)
    f = Path(path) / WEIGHTS_FILE
    if not f.is_file():
        raise NotFound(f"no model checkpoint at {str(path)!r}: {WEIGHTS_FILE} is missing")
    try:
        state = load_file(str(f))
    except (SafetensorError, OSError) as exc:
        raise InvalidRequest(f"{f} is not a readable safetensors file: {exc}") from None
    check_shapes(config, {k: tuple(v.shape) for k, v in state.items()}, str(f))
    return state
