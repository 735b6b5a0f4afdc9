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

with layers of the supported convs, each with its own settings (stored as
``ModelConfig.layers`` when they differ, :mod:`gnn_faas.functions.model_config`):
``GCNConv(d_in, c, bias)``, ``SAGEConv(d_in, c, aggr="mean"|"max",
root_weight, bias)``, ``GINConv(Sequential(Linear(d_in, h), ReLU(), Linear(h,
c)), eps)``, ``GATConv(d_in, c, heads=H, concat, negative_slope, bias)`` (e.g.
``heads=4`` then ``heads=1``). Settings that the weights reveal are read from
them; :data:`UNSUPPORTED` names the ones refused. The weight names each layer
must have are listed in :mod:`gnn_faas.functions.checkpoint`. Files: ``safetensors.torch.save_file``
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
from gnn_faas.functions.model_config import ARCHS, LayerConfig, ModelConfig

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


# Weights that mean a PyG setting gnn-faas does not serve, per arch: the
# message names the setting instead of listing unexpected tensor names.
UNSUPPORTED = {
    "gcn": {"lin.bias": "GCNConv with a bias inside lin (not PyG's GCNConv)"},
    "sage": {
        "lin.weight": "SAGEConv(project=True)",
        "lin_r.bias": "SAGEConv with a bias on lin_r (not PyG's SAGEConv)",
    },
    "gin": {"lin.weight": "GINEConv(edge_dim=...) (only GINConv is supported)"},
    "gat": {
        "lin_edge.weight": "GATConv(edge_dim=...)",
        "att_edge": "GATConv(edge_dim=...)",
        "res.weight": "GATConv(residual=True)",
        "att": "GATv2Conv (only GATConv is supported)",
        "lin_l.weight": "GATv2Conv (only GATConv is supported)",
        "lin.bias": "GATConv with a bias inside lin (not PyG's GATConv)",
    },
}
# the weight every layer of an arch has
_MAIN = {"gcn": "lin.weight", "sage": "lin_l.weight", "gin": "nn.0.weight", "gat": "att_src"}
_GIN_MLP = re.compile(r"^nn\.(\d+)\.")
PER_LAYER = ("heads", "eps", "aggr", "concat", "negative_slope")


def _per_layer(value: Any, n: int, flag: str) -> list[Any] | None:
    """A per-layer setting given as one value (every layer) or one per layer."""
    if value is None:
        return None
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(values) == 1:
        values = values * n
    if len(values) != n:
        raise InvalidRequest(f"{flag} needs 1 or {n} values (one per layer), got {len(values)}")
    return values


def _check_supported(state: dict[str, Any], arch: str, layers: list[int]) -> None:
    for i in layers:
        p = f"convs.{i}."
        names = {k[len(p) :] for k in state if k.startswith(p)}
        looks_like = _MAIN[arch] in names  # else: the wrong --arch, said below
        for name, setting in UNSUPPORTED[arch].items():
            if name in names and (looks_like or "only" in setting):
                raise InvalidRequest(
                    f"convs.{i}: {setting} is not supported (weight {p}{name}); supported: "
                    "GCNConv, SAGEConv(aggr='mean'|'max'), GINConv(Sequential(Linear, ReLU, "
                    "Linear)), GATConv(heads, concat, negative_slope) with or without bias"
                )
        if arch == "gin":
            extra = sorted({m.group(1) for n in names if (m := _GIN_MLP.match(n))} - {"0", "2"})
            if extra:
                raise InvalidRequest(
                    f"convs.{i}: GINConv(nn=...) must be Sequential(Linear, ReLU, Linear); "
                    f"found modules nn.{', nn.'.join(extra)} (e.g. BatchNorm) - not supported"
                )


def infer_config(state: dict[str, Any], arch: str, **given: Any) -> ModelConfig:
    """A ModelConfig for ``state``: dimensions and per-layer settings from the
    weights unless ``given`` (``in_dim``, ``hidden_dim``, ``out_dim``,
    ``num_layers``, ``heads``, ``eps``, ``concat``, ``negative_slope``, ``aggr``
    (the last five one value or one per layer), and the descriptive fields
    ``graph``, ``task``, ``num_classes``, ``fanouts``). Raises
    :class:`InvalidRequest` when they contradict or the weights mean a setting
    that is not supported.

    Read from the weights per layer: widths, GAT heads, GAT concat (the bias
    is ``[H*c]`` when concatenated, ``[c]`` when averaged; without a bias, the
    next layer's input width decides), GIN eps and MLP width, whether a bias
    (and SAGE's ``lin_r``) exists. Not in the weights, so given or PyG's
    default: SAGE ``aggr`` (mean), GAT ``negative_slope`` (0.2), the last GAT
    layer's concat when it has no bias (False).
    """
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
    _check_supported(state, arch, layers)
    n = len(layers)
    if given.get("num_layers") is not None and int(given["num_layers"]) != n:
        raise InvalidRequest(f"--layers {given['num_layers']} does not match the weights ({n})")

    per = {k: _per_layer(given.get(k), n, "--" + k.replace("_", "-")) for k in PER_LAYER}
    read = [_layer_from_weights(state, arch, i, layers, per) for i in layers]
    specs = [spec for spec, _ in read]
    in_dim = read[0][1]
    first = specs[0]
    inferred = {
        "num_layers": n,
        "in_dim": in_dim,
        "hidden_dim": first.mlp_hidden if arch == "gin" else first.channels,
        "out_dim": specs[-1].out_width,
    }
    for k in ("in_dim", "hidden_dim", "out_dim"):
        g = given.get(k)
        if g is None or (k == "hidden_dim" and n == 1 and arch != "gin"):
            continue  # a one-layer model has no hidden width to check
        if int(g) != inferred[k]:
            raise InvalidRequest(f"{_FLAGS[k]} {g} does not match the weights ({inferred[k]})")
    if n == 1 and arch != "gin":
        inferred["hidden_dim"] = given.get("hidden_dim") or inferred["hidden_dim"]
    fields = {k: v for k, v in given.items() if v is not None}
    for k in ("in_dim", "hidden_dim", "out_dim", "num_layers", *PER_LAYER):
        fields.pop(k, None)
    if fields.get("task", "vertex") == "vertex" and not fields.get("num_classes"):
        fields["num_classes"] = inferred["out_dim"]
    uniform = ModelConfig(
        arch=arch,
        **inferred,
        heads=first.heads,
        eps=first.eps,
        aggr=first.aggr,
        **fields,
    )
    # uniform models keep their config as before; others list every layer
    config = uniform
    if uniform.layer_settings() != tuple(specs):
        config = ModelConfig(**{**asdict(uniform), "layers": tuple(specs)})
    bad = [k for k, v in state.items() if not torch.is_floating_point(v)]
    if bad:
        raise InvalidRequest(f"weights must be floating point: {bad[:5]}")
    check_shapes(config, {k: tuple(v.shape) for k, v in state.items()}, "import")
    return config


def _layer_from_weights(
    state: dict[str, Any], arch: str, i: int, layers: list[int], per: dict[str, list | None]
) -> tuple[LayerConfig, int]:
    """``(settings, input width)`` of layer ``i`` read from its weights (``per``:
    the per-layer values given, checked against them)."""

    def shape(name: str) -> tuple[int, ...]:
        if name not in state:
            raise InvalidRequest(f"{arch} weights need {name!r}; found {sorted(state)[:8]} ...")
        return tuple(state[name].shape)

    p = f"convs.{i}."
    last = i == len(layers) - 1
    kw: dict[str, Any] = {}
    if arch == "gcn":
        c, d_in = shape(p + "lin.weight")
        kw["bias"] = p + "bias" in state
    elif arch == "sage":
        c, d_in = shape(p + "lin_l.weight")
        kw |= {
            "bias": p + "lin_l.bias" in state,
            "root_weight": p + "lin_r.weight" in state,
            "aggr": per["aggr"][i] if per["aggr"] else "mean",
        }
    elif arch == "gin":
        h, d_in = shape(p + "nn.0.weight")
        c = shape(p + "nn.2.weight")[0]
        eps = float(state[p + "eps"].reshape(-1)[0]) if p + "eps" in state else None
        want = per["eps"][i] if per["eps"] else None
        if eps is not None and want is not None and float(want) != eps:
            raise InvalidRequest(f"--eps {float(want)} does not match the weights ({eps:g})")
        kw |= {"mlp_hidden": h, "eps": eps if eps is not None else float(want or 0.0)}
    else:
        att = shape(p + "att_src")
        if len(att) != 3:
            raise InvalidRequest(f"{p}att_src must be [1, heads, C], got {list(att)}")
        heads, c = att[1], att[2]
        d_in = shape(p + "lin.weight")[1]
        if per["heads"] and int(per["heads"][i]) != heads:
            shown = ",".join(str(int(state[f"convs.{j}.att_src"].shape[1])) for j in layers)
            raise InvalidRequest(
                f"--heads {','.join(map(str, per['heads']))} does not match the weights ({shown})"
            )
        concat = _gat_concat(state, i, last, heads, c, per["concat"])
        kw |= {
            "heads": heads,
            "concat": concat,
            "bias": p + "bias" in state,
            "negative_slope": float(per["negative_slope"][i]) if per["negative_slope"] else 0.2,
        }
    return LayerConfig(channels=c, **kw), d_in


def _gat_concat(
    state: dict[str, Any], i: int, last: bool, heads: int, c: int, given: list | None
) -> bool:
    """Whether GAT layer ``i`` concatenates its heads: from its bias' width,
    else from the next layer's input width, else given, else PyG's usual
    (hidden layers concatenate, the last averages). With one head both are
    the same function; the usual choice is kept."""
    want = None if given is None else _bool(given[i])
    bias = state.get(f"convs.{i}.bias")
    found = None
    if heads > 1:
        if bias is not None and bias.shape[0] in (heads * c, c):
            found = bias.shape[0] == heads * c
        elif (w := state.get(f"convs.{i + 1}.lin.weight")) is not None and w.shape[1] in (
            heads * c,
            c,
        ):
            found = w.shape[1] == heads * c
    if found is not None and want is not None and found != want:
        raise InvalidRequest(
            f"--concat {str(want).lower()} for layer {i} does not match the weights "
            f"(concat={str(found).lower()})"
        )
    for v in (found, want):
        if v is not None:
            return v
    return not last


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InvalidRequest(f"--concat takes true or false per layer, got {v!r}")


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
