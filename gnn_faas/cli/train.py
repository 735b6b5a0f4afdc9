"""``gnn-faas train --dataset NAME --arch gcn|sage|gin|gat [...] --out DIR``.

Prepares the dataset into the store if missing, trains the reference PyG model
on CPU (full batch for small graphs, sampled mini-batches otherwise; see
:mod:`gnn_faas.functions.train` for the splits), writes the checkpoint
(``model.safetensors`` + ``config.json`` with the training figures in
``extra``) and prints a one-line JSON summary.
"""

from __future__ import annotations

import argparse

from gnn_faas.errors import InvalidRequest


def parse_fanouts(text: str | None) -> tuple[int, ...] | None:
    """``"10,5"`` -> ``(10, 5)``; ``None``/``""`` -> None."""
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise InvalidRequest(f"fanouts must be comma-separated integers, got {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a GNN on a dataset's vertex labels and write a checkpoint",
        description=__doc__.split("\n\n", 1)[1].replace("``", ""),
    )
    p.add_argument("--dataset", required=True, help="dataset / graph name (e.g. cora, bitcoin-otc)")
    p.add_argument("--arch", required=True, choices=("gcn", "sage", "gin", "gat"))
    p.add_argument("--layers", type=int, default=2, help="message-passing layers (default 2)")
    p.add_argument(
        "--hidden", type=int, default=16, help="hidden width (gat: per head) (default 16)"
    )
    p.add_argument("--epochs", type=int, default=200, help="training epochs (default 200)")
    p.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (default 0.01)")
    p.add_argument("--weight-decay", type=float, default=5e-4, help="default 5e-4")
    p.add_argument("--dropout", type=float, default=0.5, help="default 0.5")
    p.add_argument("--heads", type=int, default=1, help="gat attention heads (default 1)")
    p.add_argument("--aggr", default="mean", choices=("mean", "max"), help="sage aggregator")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and init (default 0)")
    p.add_argument(
        "--split",
        choices=("planetoid", "stratified"),
        default=None,
        help="planetoid (20/class, 500 val, 1000 test; default for cora) or "
        "stratified 60/20/20 with class weights (default otherwise)",
    )
    p.add_argument(
        "--fanouts",
        default=None,
        help="sampled mini-batch training with these fanouts, e.g. 10,5 "
        "(default: full batch up to 100k vertices, else 10 per hop)",
    )
    p.add_argument("--batch-size", type=int, default=512, help="mini-batch size (default 512)")
    p.add_argument(
        "--max-split-vertices",
        type=int,
        default=None,
        help="at most N vertices of each split part (train, val, test), a seeded sample: "
        "a quick model of a graph of millions of vertices (default: all)",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: half the CPUs, <= 4)"
    )
    p.add_argument("--store", default=None, help="store URI (default: file://./var/store)")
    p.add_argument(
        "--from",
        dest="from_dir",
        default=None,
        help="directory of the dataset's source files if it must be prepared",
    )
    p.add_argument(
        "--out", default=None, help="checkpoint directory (default var/models/DATASET-ARCH)"
    )
    p.set_defaults(handler=_train)


def _train(args: argparse.Namespace) -> int:
    from gnn_faas.functions.train import TrainOptions, summary_line, train

    if args.threads is not None and args.threads < 1:
        raise InvalidRequest("--threads must be >= 1")
    for name in ("layers", "hidden", "epochs", "heads", "batch_size", "max_split_vertices"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise InvalidRequest(f"--{name.replace('_', '-')} must be >= 1")
    opts = TrainOptions(
        dataset=args.dataset,
        arch=args.arch,
        layers=args.layers,
        hidden=args.hidden,
        epochs=args.epochs,
        lr=args.lr,
        weight_decay=args.weight_decay,
        dropout=args.dropout,
        heads=args.heads,
        aggr=args.aggr,
        seed=args.seed,
        store=args.store or "",
        out=args.out or "",
        from_dir=args.from_dir,
        split=args.split,
        fanouts=parse_fanouts(args.fanouts),
        batch_size=args.batch_size,
        max_split_vertices=args.max_split_vertices,
        threads=args.threads,
    )
    print(summary_line(train(opts)))
    return 0
