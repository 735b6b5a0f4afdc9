"""Run one benchmark against the file store, S3 (moto) and Redis, in one go.

Starts its own S3 server (``scripts/moto_ranged_server.py``) and ``redis-server``
on free loopback ports, prepares the graph into each store, then runs
``gnn-faas bench KIND ARGS --store URI`` for each store in turn (and, with
``--rtt-ms``, once more per remote store with that round-trip time added), and
writes each run's JSON under ``--out``:

    python scripts/bench_stores.py --out var/bench-stores e2e -- \\
        --rps 1,10,40,100 --duration 20 --modes gnn_faas,no_sharing,request_centric
    python scripts/bench_stores.py --out var/bench-stores --rtt-ms 20 --stores s3 e2e -- \\
        --rps 1,10 --duration 20 --modes gnn_faas

The figures in docs/architecture.md, section 6, come from these commands.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise SystemExit(f"{what} did not start on port {port}")


@contextlib.contextmanager
def servers(workdir: Path):
    """``{"s3": (uri, env), "redis": (uri, env)}`` of freshly started servers."""
    procs = []
    try:
        s3_port, redis_port = free_port(), free_port()
        log = open(workdir / "servers.log", "wb")  # noqa: SIM115 - closed below
        procs.append(subprocess.Popen(
            [sys.executable, str(REPO / "scripts" / "moto_ranged_server.py"), "-H", "127.0.0.1",
             "-p", str(s3_port)], stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
        redis = shutil.which("redis-server")
        if redis is None:
            raise SystemExit("redis-server is not installed (make test-deps installs it)")
        procs.append(subprocess.Popen(
            [redis, "--port", str(redis_port), "--save", "", "--appendonly", "no",
             "--bind", "127.0.0.1"], stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
        wait_port(s3_port, "moto")
        wait_port(redis_port, "redis-server")
        env = {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}",
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(workdir / "aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(workdir / "aws-credentials"),
        }
        import boto3

        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            boto3.client("s3").create_bucket(Bucket="gnn-faas-bench")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        yield {
            "s3": ("s3://gnn-faas-bench/store", env),
            "redis": (f"redis://127.0.0.1:{redis_port}/0", {}),
        }
    finally:
        for p in procs:
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)


def run(argv: list[str], env: dict, out: Path) -> None:
    cmd = [sys.executable, "-m", "gnn_faas", *argv, "--json"]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.monotonic()
    done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"failed: {' '.join(argv)}")
    doc = json.loads(done.stdout)
    doc["command"] = "gnn-faas " + " ".join(argv)
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    out.write_text(json.dumps(doc, indent=1, sort_keys=True))
    print(f"  -> {out} ({doc['wall_s']} s)", file=sys.stderr, flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for the JSON results")
    p.add_argument("--stores", default="file,s3,redis", help="which stores (comma-separated)")
    p.add_argument("--rtt-ms", type=float, default=0.0, help="also run the remote stores with this")
    p.add_argument("--graph", default="bitcoin-otc")
    p.add_argument("kind", help="the benchmark: e2e, overload, fetch, outage")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: the benchmark's options")
    args = p.parse_args()
    extra = [a for a in args.bench_args if a != "--"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    with tempfile.TemporaryDirectory(prefix="gnn-faas-bench-stores-") as tmp:
        work = Path(tmp)
        with servers(work) as remote:
            uris = {"file": (f"file://{work / 'file-store'}", {}), **remote}
            for name in stores:
                uri, env = uris[name]
                prep = ["datasets", "prepare", args.graph, "--store", uri]
                subprocess.run([sys.executable, "-m", "gnn_faas", *prep], env={**os.environ, **env},
                               check=True, capture_output=True)  # fmt: skip
                graph_arg = [] if args.kind == "outage" or "--graph" in extra else []
                base = ["bench", args.kind, *graph_arg, "--store", uri, *extra]
                run(base, env, out / f"{args.kind}-{name}.json")
                if args.rtt_ms and name != "file":
                    rtt = [*base, "--store-rtt-ms", str(args.rtt_ms)]
                    run(rtt, env, out / f"{args.kind}-{name}-rtt{args.rtt_ms:g}ms.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
