"""``gnn-faas up``, ``invoke`` and ``status``.

``gnn-faas up [--config FILE] [--port P] [--platform local|docker]`` prepares what the config names (the
graph from the dataset registry when the store lacks it; a checkpoint trained
on the graph's vertex task when none exists), then serves the gateway under
gunicorn: one worker process with threads and background timers; the worker
builds the data plane, which starts function instances on the platform, and
stops them when it exits.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8080"  # gnn_faas.client.DEFAULT_URL (not imported: light parser)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="serve the gateway and its functions (embedded default)")
    p.add_argument("--config", default=None, help="YAML serving config (default: embedded)")
    p.add_argument("--host", default=None, help="gateway address (default: config, 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="gateway port (default: config, 8080)")
    p.add_argument(
        "--platform",
        default=None,
        help="where function instances run: local (processes, the default) or docker "
        "(containers of the images `make images` builds); overrides the config's platform.kind",
    )
    p.add_argument("--log-level", default="info")
    p.set_defaults(handler=_up)

    i = sub.add_parser(
        "invoke",
        help="send one inference request to a running gateway",
        description="Send one request of a kind (--targets, --pairs or --vertices) and print "
        "the answer as JSON. A 503 (overload) exits 3, saying to retry; other errors exit 2.",
    )
    i.add_argument("model", help="model name (see GET /v2/models)")
    kind = i.add_mutually_exclusive_group(required=True)
    kind.add_argument("--targets", type=int, nargs="+", help="vertex ids (a vertex request)")
    kind.add_argument(
        "--pairs", type=int, nargs="+", metavar="U V", help="vertex pairs u1 v1 u2 v2 ... (edge)"
    )
    kind.add_argument("--vertices", type=int, nargs="+", help="vertex ids (a graph-level request)")
    i.add_argument("--graph-ids", type=int, nargs="+", help="per --vertices id, its graph 0..g-1")
    i.add_argument(
        "--new-features",
        metavar="NPY",
        help="new vertices' features, a float [n, d] .npy file (ids from the stored count up)",
    )
    i.add_argument(
        "--new-edges", type=int, nargs="+", metavar="U V", help="new edges u1 v1 u2 v2 ..."
    )
    i.add_argument("--outputs", nargs="+", help="output names to answer (default: all)")
    i.add_argument("--binary", action="store_true", help="binary tensor data both ways")
    i.add_argument("--url", default=DEFAULT_URL)
    i.add_argument("--timeout", type=float, default=30.0)
    i.set_defaults(handler=_invoke)

    s = sub.add_parser("status", help="instances, queues, buffers and caches of a gateway")
    s.add_argument("--url", default=DEFAULT_URL)
    s.add_argument("--json", action="store_true", help="print the raw JSON")
    s.set_defaults(handler=_status)


def check_platform(config) -> None:
    """An unknown platform kind is a clear error before anything starts."""
    from gnn_faas.errors import InvalidRequest
    from gnn_faas.scheduler.platform import PLATFORMS

    if config.platform.kind not in PLATFORMS:
        raise InvalidRequest(
            f"unknown platform {config.platform.kind!r}; choose one of {sorted(PLATFORMS)}"
        )


def _up(args: argparse.Namespace) -> int:
    import dataclasses

    from gnn_faas.config import load_config
    from gnn_faas.functions.buffered_worker import FrontSettings
    from gnn_faas.functions.gunicorn_runner import ServerConfig, serve
    from gnn_faas.logs import configure_logging
    from gnn_faas.stack import prepare

    configure_logging(args.log_level)
    if args.port is not None and not 0 <= args.port <= 65535:
        from gnn_faas.errors import InvalidRequest

        raise InvalidRequest(f"--port: {args.port} is not allowed; allowed: integer in [0, 65535]")
    config = load_config(args.config)
    if args.config:  # error hints name the command with this config (storage/embeddings.py)
        import os

        os.environ["GNN_FAAS_CONFIG"] = str(Path(args.config).resolve())
    gw = config.gateway
    if args.host or args.port is not None:
        gw = dataclasses.replace(
            gw, host=args.host or gw.host, port=gw.port if args.port is None else args.port
        )
        config = dataclasses.replace(config, gateway=gw)
    if args.platform is not None:
        config = dataclasses.replace(
            config, platform=dataclasses.replace(config.platform, kind=args.platform)
        )
    check_platform(config)
    if config.platform.kind == "docker":
        from gnn_faas.scheduler.platform.docker import check_mounts, preflight

        preflight(config.platform.docker)  # engine and images: one clear error now
    prepare(config, log=logging.getLogger("gnn_faas.up").info)
    if config.platform.kind == "docker":
        check_mounts(config)  # what the containers mount is readable by their user
    from gnn_faas.gateway.data_plane import load_structures

    # every graph verified before anything is served: a corrupt store is one line, exit 2
    structures = load_structures(config)
    holder: dict = {}

    def factory():
        from gnn_faas.gateway.app import create_gateway_app
        from gnn_faas.gateway.data_plane import DataPlane

        configure_logging(args.log_level)
        # resident structures come from the master (forked, not read again)
        # commits run in a child process: a batch's work stays off the serving
        # process's interpreter lock (gateway/graph_writer.py)
        plane = DataPlane(config, structures=structures, writer_process=True)
        holder["plane"] = plane
        plane.start()
        return create_gateway_app(plane)

    def worker_exit(server, worker):
        plane = holder.get("plane")
        if plane is not None:
            plane.shutdown()

    server = ServerConfig(
        role="gateway",
        host=gw.host,
        port=gw.port,
        workers=1,
        threads=gw.threads,
        timeout=max(30, int(gw.request_timeout_s) * 2),
        graceful_timeout=15,
        keepalive=max(1, round(gw.keepalive_s)),
        # the stamp of a request's first byte starts its latency (gateway/accept_clock.py)
        worker_class="gnn_faas.gateway.accept_clock.AcceptStampWorker"
        if gw.front == "buffered"
        else "gthread",
        front=FrontSettings(
            max_connections=gw.max_connections,
            header_timeout_s=gw.header_timeout_s,
            body_timeout_s=gw.body_timeout_s,
            keepalive_s=gw.keepalive_s,
            max_body_bytes=config.limits.max_body_bytes,
            trim_after_bytes=1 << 20,
        ),
        extra={"worker_exit": worker_exit},
    )
    return serve(factory, server)


def _invoke(args: argparse.Namespace) -> int:
    import sys

    import numpy as np

    from gnn_faas import client
    from gnn_faas.errors import InvalidRequest, Unavailable

    if args.pairs is not None and len(args.pairs) % 2:
        raise InvalidRequest("--pairs: give an even number of ids (u1 v1 u2 v2 ...)")
    if args.new_edges is not None and len(args.new_edges) % 2:
        raise InvalidRequest("--new-edges: give an even number of ids (u1 v1 u2 v2 ...)")
    if args.graph_ids is not None and args.vertices is None:
        raise InvalidRequest("--graph-ids needs --vertices")
    if args.targets is not None:
        body = client.vertex_request(args.targets)
    elif args.pairs is not None:
        body = client.edge_request(args.pairs)
    else:
        body = client.graph_request(args.vertices, args.graph_ids)
    if args.new_features is not None or args.new_edges is not None:
        if args.new_features is None:
            raise InvalidRequest("--new-edges needs --new-features")
        try:
            feats = np.load(args.new_features, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InvalidRequest(f"--new-features {args.new_features}: {exc}") from None
        body = client.with_new_vertices(body, feats, args.new_edges or [])
    with client.GatewayClient(args.url, timeout_s=args.timeout) as gateway:
        try:
            result = gateway.infer(args.model, body, outputs=args.outputs, binary=args.binary)
        except Unavailable as exc:
            print(
                f"gnn-faas invoke: unavailable, retry in {exc.retry_after_s:g} s: {exc}",
                file=sys.stderr,
            )
            return 3
    answer = {
        "model_name": result.model,
        "id": result.id,
        "outputs": {name: arr.tolist() for name, arr in result.outputs.items()},
        "parameters": result.parameters,
    }
    print(json.dumps(answer))
    return 0


def _print_functions(rows: list[dict]) -> None:
    """Per function: replicas as the platform reports them, in-flight calls, queue."""
    if not rows:
        return
    print(
        f"  {'function':<28} {'desired':>7} {'actual':>6} {'ready':>5} "
        f"{'in-flight':>9} {'queue':>5}  revision"
    )

    def n(v):
        return "-" if v is None else str(v)

    for r in rows:
        print(
            f"  {r['function']:<28} {n(r.get('desired')):>7} {n(r.get('actual')):>6} "
            f"{n(r.get('ready')):>5} {n(r.get('in_flight')):>9} {n(r.get('queue_length')):>5}  "
            f"{r.get('revision') or '-'}"
        )
        if r.get("error"):
            print(f"    platform error: {r['error']}")


def _status(args: argparse.Namespace) -> int:
    from gnn_faas.client import GatewayClient

    with GatewayClient(args.url, timeout_s=10) as gateway:
        st = gateway.status()
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(f"ready: {st['ready']}  uptime: {st['uptime_s']:.0f} s")
    print("instances:")
    for inst in st["instances"]:
        print(
            f"  {inst['id']:<28} {inst['state']:<8} {inst['url']:<24} "
            f"{inst['spec']['memory_mb']:>6} MiB  cold start {inst.get('cold_start_s') or 0:.2f} s"
        )
    for m in st["models"]:
        print(f"model {m['model']} ({m['mode']}): {m['totals']}")
        for key in ("memory_pool", "compute_pool"):
            pool = m[key]
            states = ", ".join(f"{i['instance']} {i['state']}" for i in pool["instances"])
            print(f"  {pool['name']}: [{states}] queues {pool['queues']} pending {pool['pending']}")
        _print_functions(m.get("functions") or [])
        bs = m.get("buffer_stats") or {}
        if bs:
            print(
                f"  buffers: {len(m['buffers'])} open, {bs.get('closed_buffers', 0)} closed, "
                f"mean sharing degree {bs.get('mean_sharing_degree', 0):.3f}"
            )
        for c in m.get("caches", []):
            if "note" in c:
                print(f"  caches: {c['note']}")
                continue
            if "error" in c:
                print(f"  cache of {c['instance']}: unavailable ({c['error']})")
                continue
            print(
                f"  cache of {c['instance']}: hit rate {c.get('hit_rate', 0):.3f}, "
                f"{c.get('rows', 0)} rows / capacity {c.get('capacity_rows', 0)}, "
                f"{c.get('evictions', 0)} evictions"
            )
    tot = st["metering"]["total"]
    print(
        f"metering: {tot['allocated_gb_s']:.2f} GB-s allocated, {tot['busy_gb_s']:.3f} busy, "
        f"{tot['vcpu_s']:.1f} vCPU-s, {tot['cold_starts']} cold starts"
    )
    return 0
