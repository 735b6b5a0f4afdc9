"""``gnn-faas serve memory|compute``: one function instance (Flask under gunicorn).

This is what the local platform starts as a process and what the container
images run::

    gnn-faas serve memory --store URI --graph NAME [--port P --host H --memory-mb M
                          --workers 1 --threads 4 --predictor FILE]
    gnn-faas serve compute --model DIR [--port P --host H --threads N --workers 1]
                           [--store URI --model-name NAME]

With ``--store`` and ``--model-name`` the compute function first pulls the
checkpoint ``_models/NAME/`` from the store into ``--model`` (a writable
directory): how a function started in a cluster gets its model without an init
container (Knative gates those behind a feature flag).

``--port 0`` (the default) takes a free port. Once the sockets are bound the
instance prints one line, ``gnn-faas memory function listening on
http://HOST:PORT (pid N)``; ``/v2/health/ready`` answers 200 when the worker
has opened the graph (memory) or loaded the weights (compute). SIGTERM shuts
down cleanly (exit 0). The master process imports neither torch nor the app:
each worker builds its app after the fork (memory: no torch anywhere).

``--threads`` is, for the memory function, the HTTP threads per worker
(gthread); for the compute function, torch's intra-op threads per worker
(``GNN_FAAS_THREADS``; default: cores / workers), set after the fork, with
``--http-threads`` HTTP threads.
"""

from __future__ import annotations

import argparse
import os


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run one memory or compute function instance")
    roles = p.add_subparsers(dest="role", metavar="ROLE", required=True)

    m = roles.add_parser("memory", help="memory function: graph fetch, feature cache, Aggregate")
    m.add_argument("--store", required=True, help="graph store URI (file://, s3://, redis://)")
    m.add_argument("--graph", required=True, help="graph name in the store")
    _common(m, threads_help="HTTP threads per worker (default: 4)", threads_default=4)
    m.add_argument(
        "--memory-mb",
        type=float,
        default=None,
        help="instance memory limit in MiB (default: cgroup limit, else physical memory)",
    )
    m.add_argument("--predictor", default=None, help="peak predictor JSON (default: bundled)")
    m.add_argument(
        "--decay-every", type=int, default=None, help="halve access counts every N requests (128)"
    )
    m.add_argument(
        "--degree-weight", type=float, default=None, help="weight of the degree prior (0.5)"
    )
    m.add_argument(
        "--cache-max-rows", type=int, default=None, help="hard cap on cached rows (default: none)"
    )
    m.add_argument(
        "--cache-prior",
        choices=("degree", "fap"),
        default="degree",
        help="feature cache prior: out-degree, or Quiver's FAP blob (top-k kept, cache warmed)",
    )
    m.set_defaults(handler=_serve_memory)

    c = roles.add_parser("compute", help="compute function: Update layers of one model")
    c.add_argument("--model", required=True, help="checkpoint directory (config.json + weights)")
    c.add_argument(
        "--store",
        default=None,
        help="pull the checkpoint from this store first (with --model-name)",
    )
    c.add_argument(
        "--model-name", default=None, help="model name in the store (_models/NAME/, with --store)"
    )
    _common(
        c,
        threads_help="torch threads per worker (default: $GNN_FAAS_THREADS or cores / workers)",
        threads_default=None,
    )
    c.add_argument("--http-threads", type=int, default=4, help="HTTP threads per worker")
    c.add_argument(
        "--device",
        default="auto",
        help="auto (CUDA when visible, else CPU; default), cpu, cuda or cuda:N",
    )
    c.set_defaults(handler=_serve_compute)


def _common(p: argparse.ArgumentParser, threads_help: str, threads_default: int | None) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to bind (default: 0, a free one)")
    p.add_argument("--workers", type=int, default=1, help="gunicorn worker processes")
    p.add_argument("--threads", type=int, default=threads_default, help=threads_help)
    p.add_argument("--timeout", type=int, default=120, help="worker timeout in seconds")


def _check(args: argparse.Namespace) -> None:
    from gnn_faas.errors import InvalidRequest

    if args.workers < 1:
        raise InvalidRequest("--workers must be >= 1")
    if args.threads is not None and args.threads < 1:
        raise InvalidRequest("--threads must be >= 1")
    if not 0 <= args.port <= 65535:
        raise InvalidRequest("--port must be in 0..65535")


def _serve_memory(args: argparse.Namespace) -> int:
    from gnn_faas.functions.gunicorn_runner import ServerConfig, serve

    _check(args)
    store, graph = args.store, args.graph
    opts = dict(
        memory_mb=args.memory_mb,
        predictor=args.predictor,
        cache_max_rows=args.cache_max_rows,
        cache_prior=args.cache_prior,
        workers=args.workers,
    )
    if args.decay_every is not None:
        opts["decay_every"] = args.decay_every
    if args.degree_weight is not None:
        opts["degree_weight"] = args.degree_weight

    def factory():  # runs in the worker, after the fork
        from gnn_faas.functions.memory_app import MemoryFunctionConfig, create_memory_app
        from gnn_faas.functions.memory_limit import rss_bytes

        # the master lives in the same container: its memory is off the budget
        reserve_mb = rss_bytes(os.getppid()) / 2**20 / args.workers
        cfg = MemoryFunctionConfig(store=store, graph=graph, reserve_mb=reserve_mb, **opts)
        return create_memory_app(cfg)

    config = ServerConfig(
        role="memory",
        host=args.host,
        port=args.port,
        workers=args.workers,
        threads=args.threads,
        timeout=args.timeout,
    )
    return serve(factory, config)


def _serve_compute(args: argparse.Namespace) -> int:
    from gnn_faas.functions.checkpoint import load_config
    from gnn_faas.functions.gunicorn_runner import ServerConfig, serve

    _check(args)
    import importlib.util

    from gnn_faas.errors import InvalidRequest, MissingExtra
    from gnn_faas.functions.device import parse_device

    if importlib.util.find_spec("torch") is None:  # the worker would die on import
        raise MissingExtra("the compute function", "compute", "torch")
    if (args.store is None) != (args.model_name is None):
        raise InvalidRequest("--store and --model-name go together (pull the checkpoint first)")
    if args.store is not None:
        from gnn_faas.functions.checkpoint_store import pull_checkpoint

        pull_checkpoint(args.store, args.model_name, args.model)
    load_config(args.model)  # fail fast with one line (no torch: config only)
    args.device = parse_device(args.device)  # spelling only: CUDA is asked in the worker
    model_dir, device, workers = args.model, args.device, args.workers
    threads = args.threads

    def post_fork(server, worker) -> None:
        # per worker, after the fork: the master never touched torch or CUDA
        from gnn_faas.functions.compute_app import default_threads

        n = threads or default_threads(workers)
        os.environ["GNN_FAAS_THREADS"] = str(n)
        os.environ["OMP_NUM_THREADS"] = str(n)
        # calls run on the event loop's thread or a pool thread, and OpenMP keeps a
        # team per calling thread: spinning teams burnt ~10x a small Update's CPU
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    def factory():
        from gnn_faas.functions.compute_app import create_compute_app, default_threads

        return create_compute_app(model_dir, device=device, threads=default_threads(workers))

    config = ServerConfig(
        role="compute",
        host=args.host,
        port=args.port,
        workers=args.workers,
        threads=args.http_threads,
        timeout=args.timeout,
    )
    return serve(factory, config, post_fork=post_fork)
