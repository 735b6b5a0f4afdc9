"""What a lone request costs outside the gateway: client latency minus the gateway's own.

One stack (``gnn-faas up``, Bitcoin OTC, GCN) takes lone requests ``GAP``
seconds apart from two clients in turn: the benchmarks' open-loop sender
(:func:`gnn_faas.traces.open_loop.send_open_loop`, one connection per request)
and a blocking socket doing the same exchange. For each, prints the medians of
the client's latency, of the answer's ``latency_ms`` (the gateway's, from the
request's first byte to its answer) and of their difference: the connection,
the reply and the client's own cost.

    python scripts/client_gap.py --requests 60 --gap 0.3

Runs with the current venv's Python; the store is the default (``var/store``,
prepared on first use).
"""

from __future__ import annotations

import argparse
import json
import socket
import time

import numpy as np
from interleaved_lone_requests import config  # this directory (run as a script)

from gnn_faas.stack import Stack, prepared_model
from gnn_faas.traces.open_loop import parse_answer, send_open_loop

PATH = "/v2/models/bitcoin-otc/infer"


def socket_exchange(port: int, body: bytes) -> tuple[float, dict]:
    """One request on a new blocking connection: latency (s) and the answer's parameters."""
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(head.encode() + body)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    latency = time.perf_counter() - t0
    _, _, answer = parse_answer(b"".join(chunks))
    return latency, json.loads(answer)["parameters"]


def summary(client_s: list[float], gateway_ms: list[float]) -> dict:
    client = np.asarray(client_s) * 1e3
    gateway = np.asarray(gateway_ms)
    return {
        "client_p50_ms": float(np.median(client)),
        "gateway_p50_ms": float(np.median(gateway)),
        "gap_p50_ms": float(np.median(client - gateway)),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=60)
    p.add_argument("--gap", type=float, default=0.3, help="seconds between requests")
    args = p.parse_args()
    base, graph, ckpt = prepared_model(None, "bitcoin-otc", "gcn", 0.3)
    order = graph.read_blob("request_order")
    targets = [int(order[i % order.size]) for i in range(args.requests)]
    bodies = [
        json.dumps(
            {"inputs": [{"name": "targets", "shape": [1], "datatype": "INT64", "data": [t]}]}
        ).encode()
        for t in targets
    ]
    seen = {"open_loop": ([], []), "socket": ([], [])}
    with Stack(config(base.store, ckpt, {"platform": {"memory_function_mb": 256}})) as stack:
        send_open_loop(stack.url, PATH, np.arange(10) * 0.05, bodies[:10])  # warm up
        for body in bodies:
            sent = send_open_loop(stack.url, PATH, np.zeros(1), [body], keep_answers=True)
            seen["open_loop"][0].append(float(sent.latency[0]))
            seen["open_loop"][1].append(json.loads(sent.body[0])["parameters"]["latency_ms"])
            time.sleep(args.gap)
            latency, params = socket_exchange(stack.port, body)
            seen["socket"][0].append(latency)
            seen["socket"][1].append(params["latency_ms"])
            time.sleep(args.gap)
    print(json.dumps({k: summary(*v) for k, v in seen.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
