"""A tiny Flask app served by :func:`gnn_faas.functions.gunicorn_runner.serve` for the
front tests: ``python -m tests.functions.front_app THREADS MAX_CONNECTIONS TIMEOUT_S
MAX_BODY [WORKER_CLASS]``."""

from __future__ import annotations

import sys

INLINE_MAX = 4096  # the front's inline_max_bytes here


def factory():
    import json
    import threading

    import numpy as np
    from flask import Flask, has_request_context, jsonify, request

    from gnn_faas.http import body_route, frame_route, install, loop_route

    app = install(Flask("front-test"), max_content_length=int(sys.argv[4]))
    held, release = threading.Event(), threading.Event()

    def where(tensors: dict, params: dict) -> dict:
        """Which thread served the call: 1 for the event loop's (the main thread)."""
        main = threading.current_thread() is threading.main_thread()
        return {"main": np.array([int(main)], np.int64)}

    frame_route(app, "/where", where)

    def raw(params: dict, body: bytes, headers) -> tuple[bytes, dict]:
        """Who answered a body route: Flask (a request context) or the dispatcher."""
        out = {"flask": has_request_context(), "n": int(params["n"]), "bytes": len(body),
               "main": threading.current_thread() is threading.main_thread(),
               "type": headers.get("content-type")}  # fmt: skip
        return json.dumps(out).encode(), {"Content-Type": "application/json"}

    body_route(app, r"/raw/(?P<n>[0-9]+)", raw)

    @app.post("/raw/<int:n>")
    def raw_view(n: int):
        body, headers = raw({"n": n}, request.get_data(), {"content-type": request.content_type})
        return app.response_class(body, headers=headers)

    @app.get("/hold")
    def hold():  # a request that stays in the thread pool until /release
        held.set()
        return jsonify({"released": release.wait(60)})

    blocked, unblock, lock = [0], threading.Event(), threading.Lock()

    @app.get("/block")
    def block():  # holds a pool thread until /unblock (answered on the loop)
        with lock:
            blocked[0] += 1
        return jsonify({"unblocked": unblock.wait(60)})

    # answered on the event loop, never by a pool thread (so even when all are blocked)
    loop_route(app, "/v2/health/live", lambda: (200, {"live": True}))
    loop_route(app, "/blocked", lambda: (200, {"blocked": blocked[0]}))
    loop_route(app, "/unblock", lambda: (unblock.set(), (200, {"ok": True}))[1])

    @app.get("/held")
    def is_held():
        return jsonify({"held": held.is_set()})

    @app.get("/release")
    def release_():
        release.set()
        return jsonify({"ok": True})

    @app.post("/echo")
    def echo():
        body = request.get_data()
        return jsonify({"bytes": len(body), "head": body[:16].decode("latin-1")})

    @app.get("/v2/health/ready")
    @app.get("/ping")
    def ping():
        return jsonify({"ok": True})

    @app.get("/front")
    def front():
        from gnn_faas.functions.buffered_worker import front_stats

        return jsonify(front_stats())

    @app.get("/nan")
    def nan():
        return jsonify({"x": float("nan")})

    @app.get("/gc")
    def collector():
        import gc

        return jsonify({"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())})

    return app


def main() -> int:
    from gnn_faas.functions.buffered_worker import FrontSettings
    from gnn_faas.functions.gunicorn_runner import ServerConfig, serve

    threads, cap, timeout_s, max_body = sys.argv[1:5]
    worker = sys.argv[5] if len(sys.argv) > 5 else ServerConfig.worker_class
    front = FrontSettings(
        max_connections=int(cap),
        header_timeout_s=float(timeout_s),
        body_timeout_s=float(timeout_s),
        keepalive_s=float(timeout_s),
        max_body_bytes=int(max_body),
        sweep_s=0.1,
        inline_max_bytes=INLINE_MAX,
    )
    config = ServerConfig(role="front-test", threads=int(threads), front=front, worker_class=worker)
    return serve(factory, config)


if __name__ == "__main__":
    sys.exit(main())
