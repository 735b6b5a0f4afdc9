"""``gnn-faas model import|show|push|pull``: checkpoints from PyG state_dicts,
and checkpoints kept in the graph store (``push --store URI DIR...``, ``pull
--store URI --name NAME --out DIR``; see functions/checkpoint_store.py).

``gnn-faas model import --pyg STATE_DICT --arch gcn|sage|gin|gat [--in-dim
--hidden --out-dim --layers --heads --aggr --eps --concat --negative-slope ...]
--out DIR`` converts the state_dict of a PyG model into the checkpoint format
(``model.safetensors`` + ``config.json``). The model must keep its layers in
order in ``self.convs = torch.nn.ModuleList([...])``, apply ReLU between them
and have no other parameters, so the names look like ``convs.0.lin.weight``.

Supported convs and the settings each layer may choose on its own:

  GCNConv(in, out, bias=True|False)
  SAGEConv(in, out, aggr='mean'|'max', root_weight=True|False, bias=True|False)
  GINConv(Sequential(Linear(in, h), ReLU(), Linear(h, out)), eps=..., train_eps=...)
  GATConv(in, out, heads=H, concat=True|False, negative_slope=..., bias=True|False)

Widths, GAT heads (e.g. heads=4 then heads=1), GAT concat, GIN eps and MLP
width, bias and root_weight are read from the weights; what the weights do not
show is given per layer as one value or a comma list: --aggr mean,max,
--negative-slope 0.2, --concat for a last GAT layer without bias. Assumed as
PyG's defaults (not visible in weights): GCNConv(improved=False,
add_self_loops=True, normalize=True), SAGEConv(normalize=False),
GATConv(add_self_loops=True). Not supported, with an error naming the
setting: SAGEConv(project=True), GATConv(edge_dim=..., residual=True),
GATv2Conv, GINEConv, a GIN MLP other than Linear-ReLU-Linear.

The file is ``safetensors.torch.save_file(model.state_dict(), PATH)`` or
``torch.save(model.state_dict(), PATH)`` (read with ``weights_only=True``).
Dimensions not given are read from the weights; given ones must agree.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="import or show model checkpoints")
    cmds = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    imp = cmds.add_parser(
        "import",
        help="convert a PyG state_dict into a checkpoint",
        description=__doc__.split("\n\n", 1)[1].replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    imp.add_argument(
        "--pyg",
        required=True,
        metavar="STATE_DICT",
        help="safetensors or torch.save file of the model's state_dict",
    )
    imp.add_argument("--arch", required=True, choices=("gcn", "sage", "gin", "gat"))
    imp.add_argument("--in-dim", type=int, default=None)
    imp.add_argument("--hidden", type=int, default=None, help="hidden width (gat: per head)")
    imp.add_argument("--out-dim", type=int, default=None)
    imp.add_argument("--layers", type=int, default=None)
    imp.add_argument(
        "--heads", default=None, help="gat heads, one or per layer (e.g. 4,1; from weights)"
    )
    imp.add_argument(
        "--aggr", default=None, help="sage aggregator mean|max, one or per layer (default mean)"
    )
    imp.add_argument(
        "--eps", default=None, help="gin eps, one or per layer (default: from weights, else 0)"
    )
    imp.add_argument(
        "--concat",
        default=None,
        help="gat concat true|false, one or per layer (default: from weights; "
        "hidden layers concatenate, the last averages)",
    )
    imp.add_argument(
        "--negative-slope", default=None, help="gat LeakyReLU slope, one or per layer (0.2)"
    )
    imp.add_argument("--graph", default="", help="the store graph the model serves")
    imp.add_argument(
        "--task",
        default="vertex",
        choices=("vertex", "embedding", "edge", "graph"),
        help="vertex: outputs are class scores; otherwise embeddings",
    )
    imp.add_argument("--num-classes", type=int, default=0)
    imp.add_argument("--fanouts", default=None, help="default serving fanouts, e.g. 10,5")
    imp.add_argument("--out", required=True, help="checkpoint directory to write")
    imp.set_defaults(handler=_import)
    show = cmds.add_parser("show", help="print a checkpoint's config.json")
    show.add_argument("path", metavar="DIR")
    show.set_defaults(handler=_show)
    push = cmds.add_parser("push", help="copy checkpoints into the store (_models/NAME/)")
    push.add_argument("--store", required=True, help="store URI")
    push.add_argument("paths", nargs="+", metavar="DIR", help="checkpoint directories")
    push.add_argument("--name", default=None, help="model name (default: the directory's name)")
    push.set_defaults(handler=_push)
    pull = cmds.add_parser("pull", help="copy a checkpoint from the store into a directory")
    pull.add_argument("--store", required=True, help="store URI")
    pull.add_argument("--name", required=True, help="model name")
    pull.add_argument("--out", required=True, help="directory to write")
    pull.set_defaults(handler=_pull)


def _import(args: argparse.Namespace) -> int:
    from gnn_faas.cli.train import parse_fanouts
    from gnn_faas.functions.pyg_import import import_pyg

    config = import_pyg(
        args.pyg,
        args.out,
        args.arch,
        in_dim=args.in_dim,
        hidden_dim=args.hidden,
        out_dim=args.out_dim,
        num_layers=args.layers,
        heads=_list(args.heads, int, "--heads"),
        eps=_list(args.eps, float, "--eps"),
        aggr=_list(args.aggr, _aggr, "--aggr"),
        concat=_list(args.concat, str, "--concat"),
        negative_slope=_list(args.negative_slope, float, "--negative-slope"),
        graph=args.graph,
        task=args.task,
        num_classes=args.num_classes or None,
        fanouts=parse_fanouts(args.fanouts),
    )
    dims = "x".join(str(d) for d in [config.in_dim] + [o for _, o in config.layer_dims()])
    heads = ""
    if config.arch == "gat":
        heads = ", heads " + ",".join(str(lc.heads) for lc in config.layer_settings())
    print(f"imported {config.arch} ({dims}, {config.num_layers} layers{heads}) -> {args.out}")
    return 0


def _aggr(text: str) -> str:
    from gnn_faas.functions.model_config import SAGE_AGGRS

    if text not in SAGE_AGGRS:
        raise ValueError(f"must be one of {SAGE_AGGRS}")
    return text


def _list(text: str | None, conv, flag: str) -> list | None:
    """``"4,1"`` -> ``[4, 1]`` (one value or one per layer)."""
    from gnn_faas.errors import InvalidRequest

    if text is None:
        return None
    try:
        return [conv(x.strip()) for x in str(text).split(",")]
    except ValueError as exc:
        raise InvalidRequest(f"{flag} {text!r}: {exc}") from None


def _show(args: argparse.Namespace) -> int:
    from gnn_faas.functions.checkpoint import load_config

    print(load_config(args.path).to_json())
    return 0


def _push(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gnn_faas.errors import InvalidRequest
    from gnn_faas.functions.checkpoint_store import push_checkpoint

    if args.name and len(args.paths) > 1:
        raise InvalidRequest("--name needs exactly one checkpoint directory")
    for path in args.paths:
        name = args.name or Path(path).resolve().name
        n = push_checkpoint(args.store, path, name)
        print(f"pushed {path} as model {name!r} ({n} bytes) to {args.store}")
    return 0


def _pull(args: argparse.Namespace) -> int:
    from gnn_faas.functions.checkpoint_store import pull_checkpoint

    out = pull_checkpoint(args.store, args.name, args.out)
    print(f"pulled model {args.name!r} into {out}")
    return 0
