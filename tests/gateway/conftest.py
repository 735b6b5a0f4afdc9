"""A real gateway in this process: DataPlane over the local platform (real
function processes), its app served on a free loopback port by werkzeug: as
production serves it (``url``: the Flask app behind the
:class:`~gnn_faas.http.FrameDispatcher`, which answers inference itself) and the
bare Flask app (``flask_url``), so tests can hold the two paths to one answer.

``live_gateway`` serves a GCN with task ``embedding`` (it answers vertex, edge
and graph requests) on Bitcoin OTC, and the reference: the same checkpoint run
by PyG on the whole graph. One per test session: the fuzz and client tests
share it, so its function instances start once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest


@dataclass
class LiveGateway:
    url: str
    flask_url: str
    app: object
    plane: object
    model: str
    reference: np.ndarray  # [num_nodes, out_dim] embeddings by PyG
    num_nodes: int


@pytest.fixture(scope="session")
def live_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    from werkzeug.serving import make_server

    from gnn_faas.config import ServingConfig, from_dict
    from gnn_faas.gateway.app import create_gateway_app
    from gnn_faas.gateway.data_plane import DataPlane
    from gnn_faas.http import wsgi_app
    from gnn_faas.storage.datasets import ensure_dataset
    from tests.pyg_reference import checkpoint_with_reference

    root = tmp_path_factory.mktemp("live-gateway")
    store = f"file://{root / 'store'}"
    graph = ensure_dataset(store, "bitcoin-otc")
    reference = checkpoint_with_reference(
        graph, root / "ckpt", seed=3, arch="gcn", hidden_dim=16, out_dim=8, num_layers=2,
        task="embedding",
    )  # fmt: skip
    config = from_dict(
        ServingConfig,
        {
            "store": store,
            "gateway": {"request_timeout_s": 60.0},
            "platform": {
                "memory_function_mb": 256,
                "compute_function_mb": 512,
                "max_memory_instances": 1,
                "max_compute_instances": 1,
            },
            "models": [
                {
                    "name": "emb",
                    "graph": "bitcoin-otc",
                    "dataset": "bitcoin-otc",
                    "checkpoint": str(root / "ckpt"),
                    "max_targets": 64,
                    "mode": "no_sharing",
                }
            ],
        },
    )
    plane = DataPlane(config)
    plane.start()
    try:
        deadline = time.monotonic() + 120
        while not plane.ready():
            if time.monotonic() > deadline:
                raise TimeoutError("function instances not ready in 120 s")
            time.sleep(0.2)
        app = create_gateway_app(plane)
        servers = [
            make_server("127.0.0.1", 0, wsgi_app(app), threaded=True),
            make_server("127.0.0.1", 0, app, threaded=True),
        ]
        threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
        for thread in threads:
            thread.start()
        try:
            yield LiveGateway(
                url=f"http://127.0.0.1:{servers[0].server_port}",
                flask_url=f"http://127.0.0.1:{servers[1].server_port}",
                app=app,
                plane=plane,
                model="emb",
                reference=reference,
                num_nodes=graph.num_nodes,
            )
        finally:
            for server, thread in zip(servers, threads):
                server.shutdown()
                thread.join(timeout=10)
    finally:
        plane.shutdown()
