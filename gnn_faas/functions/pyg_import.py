"""Convert the state_dict of a PyG model into a gnn-faas checkpoint.

Expected module layout: the model keeps its message-passing layers, in order,
in ``self.convs = torch.nn.ModuleList([...])`` and has no other parameters::

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList([GCNConv(1433, 16), GCNConv(16, 7)])

        def forward(self, x, edge_index):
            for i, conv in enumerate(self.convs):
                x = conv(x, edge_index)
                if i < len(self.convs) - 1:
                    x = x.relu()  # (dropout while training)
            return x

with layers built as PyG's defaults (:mod:`gnn_faas.functions.model_config`):
``GCNConv(d_in, c)``, ``SAGEConv(d_in, c, aggr="mean"|"max")``,
``GINConv(Sequential(Linear(d_in, hidden), ReLU(), Linear(hidden, d_out)))``,
``GATConv(d_in, c, heads=H)`` (``concat=False`` for the last layer). The
weight names each layer must have are listed in
:mod:`gnn_faas.functions.checkpoint`. Files: ``safetensors.torch.save_file``
output, or ``torch.save(model.state_dict(), path)`` (read with
``weights_only=True``; no pickle of code is ever executed). A ``module.``
prefix (DataParallel) is stripped, and the ``lin_src``/``lin_dst`` names of
older PyG ``GATConv`` versions are mapped to ``lin``.

Dimensions the caller does not give are read from the weights' shapes; those
given must agree with them.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.functions.checkpoint import check_shapes, save_checkpoint
from gnn_faas.functions.model_config import ARCHS, ModelConfig

_CONV = re.compile(r"^convs\.(\d+)\.")
_FLAGS = {
    "in_dim": "--in-dim",
    "hidden_dim": "--hidden",
    "out_dim": "--out-dim",
    "num_layers": "--layers",
    "heads": "--heads",
    "eps": "--eps",
}


def read_state_dict(path: str | os.PathLike) -> dict[str, Any]:
    """Tensors of a safetensors file or a ``torch.save`` file (``weights_only``)."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_file():
        raise NotFound(f"state_dict file not found: {p}")
    with p.open("rb") as f:
        head = f.read(8)
    if head[:2] == b"PK" or head[:1] == b"\x80":  # torch.save zip or legacy pickle
        try:
            obj = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many types for unsafe or corrupt files
            raise InvalidRequest(
                f"{p}: not a weights-only torch state_dict ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''})"
            ) from None
    else:
        try:
            obj = load_file(str(p))
        except (SafetensorError, OSError) as exc:
            raise InvalidRequest(
                f"{p}: neither safetensors nor a torch.save file ({exc})"
            ) from None
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise InvalidRequest(f"{p}: expected a dict of tensors (a state_dict)")
    return dict(obj)


def normalise_names(state: dict[str, Any]) -> dict[str, Any]:
    """Strip ``module.``; map old GATConv ``lin_src``/``lin_dst`` to ``lin``."""
    import torch

    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    out = dict(state)
    for k in list(out):
        if k.endswith(".lin_src.weight"):
            base = k[: -len("lin_src.weight")]
            dst = out.pop(base + "lin_dst.weight", None)
            if dst is not None and not torch.equal(dst, out[k]):
                raise InvalidRequest(
                    f"{base}lin_src and lin_dst differ (a bipartite GATConv): not supported"
                )
            out[base + "lin.weight"] = out.pop(k)
    return out


def infer_config(state: dict[str, Any], arch: str, **given: Any) -> ModelConfig:
    """A ModelConfig for ``state``: dimensions from the weights unless ``given``
    (``in_dim``, ``hidden_dim``, ``out_dim``, ``num_layers``, ``heads``, ``eps``,
    and the descriptive fields ``aggr``, ``graph``, ``task``, ``num_classes``,
    ``fanouts``). Raises :class:`InvalidRequest` when they contradict."""
    import torch

    if arch not in ARCHS:
        raise InvalidRequest(f"arch must be one of {ARCHS}, got {arch!r}")
    layers = sorted({int(m.group(1)) for k in state if (m := _CONV.match(k))})
    stray = sorted(k for k in state if not _CONV.match(k))
    if stray:
        raise InvalidRequest(
            f"weights outside the convs ModuleList are not supported: {stray[:5]} "
            "(expected names like convs.0.lin.weight)"
        )
    if not layers or layers != list(range(len(layers))):
        raise InvalidRequest(f"expected layers convs.0 .. convs.L-1, found {layers}")

    def shape(name: str) -> tuple[int, ...]:
        if name not in state:
            raise InvalidRequest(f"{arch} weights need {name!r}; found {sorted(state)[:8]} ...")
        return tuple(state[name].shape)

    last = layers[-1]
    inferred: dict[str, Any] = {"num_layers": len(layers)}
    if arch == "gcn":
        inferred |= {
            "in_dim": shape("convs.0.lin.weight")[1],
            "hidden_dim": shape("convs.0.lin.weight")[0],
            "out_dim": shape(f"convs.{last}.lin.weight")[0],
        }
    elif arch == "sage":
        inferred |= {
            "in_dim": shape("convs.0.lin_l.weight")[1],
            "hidden_dim": shape("convs.0.lin_l.weight")[0],
            "out_dim": shape(f"convs.{last}.lin_l.weight")[0],
        }
    elif arch == "gin":
        inferred |= {
            "in_dim": shape("convs.0.nn.0.weight")[1],
            "hidden_dim": shape("convs.0.nn.0.weight")[0],
            "out_dim": shape(f"convs.{last}.nn.2.weight")[0],
        }
        eps = {float(state[k].reshape(-1)[0]) for k in state if k.endswith(".eps")}
        if len(eps) > 1:
            raise InvalidRequest(f"GIN layers have different eps {sorted(eps)}: not supported")
        if eps:
            inferred["eps"] = eps.pop()
    else:
        att = shape("convs.0.att_src")
        if len(att) != 3:
            raise InvalidRequest(f"convs.0.att_src must be [1, heads, C], got {list(att)}")
        inferred |= {
            "in_dim": shape("convs.0.lin.weight")[1],
            "heads": att[1],
            "hidden_dim": att[2],
            "out_dim": shape(f"convs.{last}.att_src")[-1],
        }
    for k, v in inferred.items():
        g = given.get(k)
        if g is None:
            continue
        if k == "hidden_dim" and len(layers) == 1:
            continue  # a one-layer model has no hidden width to check
        if (float(g) if k == "eps" else int(g)) != v:
            raise InvalidRequest(f"{_FLAGS[k]} {g} does not match the weights ({v})")
    if len(layers) == 1:
        inferred["hidden_dim"] = given.get("hidden_dim") or inferred["hidden_dim"]
    fields = {k: v for k, v in given.items() if v is not None}
    for k in ("in_dim", "hidden_dim", "out_dim", "num_layers", "heads", "eps"):
        fields.pop(k, None)
    if fields.get("task", "vertex") == "vertex" and not fields.get("num_classes"):
        fields["num_classes"] = inferred["out_dim"]
    config = ModelConfig(arch=arch, **inferred, **fields)
    bad = [k for k, v in state.items() if not torch.is_floating_point(v)]
    if bad:
        raise InvalidRequest(f"weights must be floating point: {bad[:5]}")
    check_shapes(config, {k: tuple(v.shape) for k, v in state.items()}, "import")
    return config


def import_pyg(
    src: str | os.PathLike, out: str | os.PathLike, arch: str, **given: Any
) -> ModelConfig:
    """Read the PyG state_dict file ``src`` and write a checkpoint to ``out``."""
    state = normalise_names(read_state_dict(src))
    config = infer_config(state, arch, **given)
    # The GIN eps buffer is carried by the config; keep the file to the layer weights.
    weights = {k: v for k, v in state.items() if not k.endswith(".eps")}
    extra = dict(config.extra)
    extra.setdefault("imported_from", str(Path(src).name))
    config = ModelConfig(**{**asdict(config), "extra": extra})
    save_checkpoint(out, config, weights)
    return config
