"""HTTP clients of the memory and compute functions, and the HTTP transport.

:class:`MemoryClient` and :class:`ComputeClient` speak the functions' frame
protocol over a pool of persistent connections
(:mod:`gnn_faas.functions.keepalive_http`; :mod:`urllib3` for ``https``). A remote error
(``{"error": ...}`` with a status) is raised again here as the matching
:class:`~gnn_faas.errors.GnnFaasError` subclass (400 -> InvalidRequest,
413 -> PayloadTooLarge, 404 -> NotFound, 503 -> Unavailable, ...); a refused
or dropped connection or a timeout is :class:`~gnn_faas.errors.Unavailable`.
:class:`HttpTransport` implements :class:`gnn_faas.functions.executor.Transport`
over the two clients, so :func:`~gnn_faas.functions.executor.run_layers` drives
real function instances. Every call carries the current request's W3C
``traceparent`` (:func:`gnn_faas.request_id.outgoing_headers`). No torch here.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import requests
import urllib3

from gnn_faas import deadline, errors, graph_version, request_id
from gnn_faas.functions.keepalive_http import KeepAlivePool
from gnn_faas.functions.layer_plan import LayerStep
from gnn_faas.storage.computation_graph import Block, ComputationGraph, cg_from_tensors
from gnn_faas.wire import FRAME_MIME, JSON_MIME, decode_frame, encode_frame

_BY_STATUS: dict[int, type[errors.GnnFaasError]] = {
    400: errors.InvalidRequest,
    404: errors.NotFound,
    405: errors.InvalidRequest,
    413: errors.PayloadTooLarge,
    502: errors.StorageError,
    503: errors.Unavailable,
    504: errors.Unavailable,
}


def error_for_status(status: int, message: str) -> errors.GnnFaasError:
    """The exception a remote ``status`` maps to (500 and unknown: GnnFaasError)."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = errors.InvalidRequest if 400 <= status < 500 else errors.GnnFaasError
    return cls(message)


@dataclass(frozen=True)
class CallTiming:
    """Where one function call's time went (seconds): ``total`` from the
    request's encoding to the answer's decoding; ``serde`` the frames'
    (de)serialisation on both sides; ``work`` the function's handler less its
    (de)serialisation; ``transport`` the rest (HTTP, sockets, the server's
    dispatch to its handler)."""

    total: float
    serde: float
    work: float
    transport: float


def server_timing(header: str) -> dict[str, float]:
    """``{"app": ms, "serde": ms}`` from a ``Server-Timing`` header."""
    out: dict[str, float] = {}
    for part in header.split(","):
        name, _, rest = part.strip().partition(";dur=")
        try:
            out[name] = float(rest)
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class Reply:
    """A function's answer: status, headers (case-insensitive) and body."""

    status: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


@contextmanager
def call_deadline(seconds: float) -> Iterator[None]:
    """Within the block, every function call of this thread times out by
    ``seconds`` from now (each call's own timeout still applies when shorter);
    a call begun after the deadline is :class:`~gnn_faas.errors.Unavailable`.
    The request's deadline (:mod:`gnn_faas.deadline`) under another name."""
    with deadline.scope(seconds):
        yield


class FunctionClient:
    """Shared plumbing: frames and JSON over persistent connections. The timing
    of the calling thread's last frame call is :meth:`last_timing`.

    Calls go through a pool of ``pool_size`` kept-alive connections to
    ``base_url`` (size it to the threads that call through it): for ``http://``
    the lean client of :mod:`gnn_faas.functions.keepalive_http` (its docstring
    has the figures), for ``https://`` :mod:`urllib3`; not :mod:`requests`,
    which costs about 0.7 ms more per call (per-call environment, proxy and
    netrc lookups, request preparation), and a lone request makes four calls. ``session``:
    send through this :class:`requests.Session` instead (custom adapters,
    auth, proxies; the tests mount in-process apps on one)."""

    role = "function"

    def __init__(
        self,
        base_url: str,
        session: requests.Session | None = None,
        timeout: float = 60.0,
        pool_size: int = 10,
    ):
        self.base_url = base_url.rstrip("/")
        self.session = session
        self.timeout = timeout
        self._pool: urllib3.connectionpool.HTTPConnectionPool | None = None
        self._lean: KeepAlivePool | None = None
        if session is None:
            url = urllib3.util.parse_url(self.base_url)
            self._prefix = url.path or ""
            if url.scheme == "http" and url.host:
                self._lean = KeepAlivePool(url.host, url.port or 80, maxsize=pool_size)
            else:
                self._pool = urllib3.connection_from_url(
                    self.base_url, maxsize=max(int(pool_size), 1), block=False
                )
        self._timing = threading.local()

    def last_timing(self) -> CallTiming | None:
        return getattr(self._timing, "last", None)

    def close(self) -> None:
        if self._lean is not None:
            self._lean.close()
        if self._pool is not None:
            self._pool.close()
        if self.session is not None:
            self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _unreachable(self, exc: BaseException) -> errors.Unavailable:
        return errors.Unavailable(
            f"{self.role} function at {self.base_url} unreachable ({type(exc).__name__})"
        )

    def _call_timeout(self) -> float:
        """This call's timeout: the client's, cut to what is left of the calling
        request's deadline (:func:`call_deadline`)."""
        left = deadline.remaining()
        if left is None:
            return self.timeout
        if left <= 0:
            raise errors.Unavailable(f"no time left for a call to the {self.role} function")
        return min(self.timeout, left)

    def _send(self, method: str, path: str, body: bytes | None, headers: dict) -> Reply:
        timeout = self._call_timeout()
        if self._lean is not None:
            try:
                r = self._lean.request(method, self._prefix + path, body, headers, timeout)
            except OSError as exc:  # refused, reset, timed out, or not HTTP we read
                raise self._unreachable(exc) from None
            return Reply(r.status, r.headers, r.data)
        if self._pool is None:
            assert self.session is not None
            try:
                r = self.session.request(
                    method, self.base_url + path, data=body, headers=headers, timeout=timeout
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                raise self._unreachable(exc) from None
            return Reply(r.status_code, r.headers, r.content)
        try:
            r = self._pool.urlopen(
                method,
                self._prefix + path,
                body=body,
                headers=headers,
                retries=False,
                redirect=False,
                timeout=urllib3.Timeout(connect=timeout, read=timeout),
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._unreachable(exc) from None
        return Reply(r.status, r.headers, r.data)

    def _request(
        self, method: str, path: str, body: bytes | None = None, headers: dict | None = None
    ) -> Reply:
        # the request id of the request served, as a child span (gnn_faas/request_id.py)
        out = {**(headers or {}), **request_id.outgoing_headers()}
        left = deadline.header_value()  # the callee's store reads stop at our deadline
        if left is not None:
            out[deadline.HEADER] = left
        version = graph_version.header_value()  # the callee answers on our graph version
        if version is not None:
            out[graph_version.HEADER] = version
        resp = self._send(method, path, body, out)
        if resp.status >= 400:
            try:
                message = resp.json()["error"]
            except (ValueError, KeyError, TypeError):
                message = resp.text[:200] or f"HTTP {resp.status}"
            failed = resp.headers.get(errors.FAILED_HEADER)
            if failed == "forward":
                raise errors.ForwardFailed(f"{self.role} function: {message}")
            if failed == "store":  # the store's fault: not this instance's, not the client's
                raise errors.StoreUnavailable(message)
            if failed == "corrupt":
                raise errors.CorruptBlob(message)
            raise error_for_status(resp.status, f"{self.role} function: {message}")
        return resp

    def post_encoded(self, path: str, body: bytes) -> Reply:
        """POST an encoded frame; the answer as it came (a frame, not decoded)."""
        resp = self._request("POST", path, body, {"Content-Type": FRAME_MIME})
        if resp.headers.get("Content-Type", "").split(";")[0] != FRAME_MIME:
            raise errors.GnnFaasError(f"{self.role} function answered without a frame")
        return resp

    def _frame(self, resp: Reply) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        if resp.headers.get("Content-Type", "").split(";")[0] != FRAME_MIME:
            raise errors.GnnFaasError(f"{self.role} function answered without a frame")
        return decode_frame(resp.content, max_bytes=len(resp.content))

    def post_frame(
        self, path: str, tensors: dict[str, np.ndarray], params: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        t0 = time.perf_counter()
        body = encode_frame(tensors, params)
        t1 = time.perf_counter()
        resp = self._request("POST", path, body, {"Content-Type": FRAME_MIME})
        t2 = time.perf_counter()
        out = self._frame(resp)
        t3 = time.perf_counter()
        server = server_timing(resp.headers.get("Server-Timing", ""))
        app, server_serde = server.get("app", 0.0) / 1e3, server.get("serde", 0.0) / 1e3
        # a call the function forwarded (``forward``: its duration seen by the
        # function; ``forward_app``/``forward_serde``: the next function's own
        # figures) is that call's timing, and not this one's work
        fwd = server.get("forward", 0.0) / 1e3
        self._timing.forwarded = None
        if "forward" in server:
            fwd_app = server.get("forward_app", 0.0) / 1e3
            fwd_serde = server.get("forward_serde", 0.0) / 1e3
            self._timing.forwarded = CallTiming(
                total=fwd,
                serde=fwd_serde,
                work=max(fwd_app - fwd_serde, 0.0),
                transport=max(fwd - fwd_app, 0.0),
            )
        self._timing.last = CallTiming(
            total=t3 - t0 - fwd,
            serde=(t1 - t0) + (t3 - t2) + server_serde,
            work=max(app - server_serde - fwd, 0.0),
            transport=max((t2 - t1) - app, 0.0),
        )
        return out

    def forwarded_timing(self) -> CallTiming | None:
        """The timing of the call the calling thread's last frame call forwarded."""
        return getattr(self._timing, "forwarded", None)

    def post_json(self, path: str, obj: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict]:
        body = json.dumps(obj, separators=(",", ":")).encode()
        return self._frame(self._request("POST", path, body, {"Content-Type": JSON_MIME}))

    def get_json(self, path: str) -> dict[str, Any]:
        return self._request("GET", path).json()

    def ready(self) -> bool:
        """``True`` when ``/v2/health/ready`` answers 200 (never raises)."""
        try:
            return self._request("GET", "/v2/health/ready").status == 200
        except errors.GnnFaasError:
            return False

    def stats(self) -> dict[str, Any]:
        return self.get_json("/v1/stats")


class MemoryClient(FunctionClient):
    role = "memory"

    def graph(
        self,
        targets: np.ndarray | list[int],
        hops: int,
        fanouts: list[int] | None = None,
        seed: int = 0,
        degrees: bool = True,
    ) -> ComputationGraph:
        """The ``hops``-layer computation graph of ``targets`` (global ids)."""
        t = np.asarray(targets, dtype=np.int64)
        params = {
            "hops": int(hops),
            "fanouts": None if fanouts is None else [int(f) for f in fanouts],
            "seed": int(seed),
            "degrees": bool(degrees),
        }
        tensors, _ = self.post_frame("/v1/graph", {"targets": t}, params)
        return cg_from_tensors(tensors)

    def aggregate(
        self,
        op: str,
        block: Block,
        src_ids: np.ndarray,
        h: np.ndarray | None = None,
        extras: dict[str, np.ndarray] | None = None,
        **options: Any,
    ) -> dict[str, np.ndarray]:
        """Aggregate ``block`` (local CSR) over the rows of ``src_ids`` (global):
        ``h`` when given, else the memory side's input rows. Returns ``{"agg"[,
        "root"]}`` or, with ``partial``, the partial state; ``options`` are
        :func:`aggregate_frame`'s (with ``forward``, :meth:`forwarded_timing`
        is the forwarded call's)."""
        tensors, params = aggregate_frame(op, block, src_ids, h, extras, **options)
        out, _ = self.post_frame("/v1/aggregate", tensors, params)
        return out

    def chain(
        self, layers: list[tuple[dict[str, np.ndarray], dict[str, Any]]], compute_url: str
    ) -> dict[str, np.ndarray]:
        """Every layer in one call (``layers``: each layer's :func:`aggregate_frame`
        with its ``forward``): the memory function forwards each aggregate to the
        compute function at ``compute_url`` and aggregates the next layer over
        its answer; the last Update's tensors (``{"h"}``)."""
        tensors = {f"{i}/{k}": v for i, (t, _) in enumerate(layers) for k, v in t.items()}
        chain = [{k: v for k, v in p.items() if k != "forward_url"} for _, p in layers]
        out, _ = self.post_frame(
            "/v1/aggregate", tensors, {"chain": chain, "forward_url": str(compute_url)}
        )
        return out

    def features(self, ids: np.ndarray | list[int]) -> np.ndarray:
        out, _ = self.post_frame("/v1/features", {"ids": np.asarray(ids, dtype=np.int64)})
        return out["x"]


class ComputeClient(FunctionClient):
    role = "compute"

    def model(self) -> dict[str, Any]:
        return self.get_json("/v1/model")

    def pre(self, layer: int, h: np.ndarray) -> dict[str, np.ndarray]:
        out, _ = self.post_frame(
            "/v1/update", {"h": np.asarray(h, np.float32)}, {"layer": int(layer), "stage": "pre"}
        )
        return out

    def post(self, layer: int, agg: np.ndarray, root: np.ndarray | None = None) -> np.ndarray:
        tensors = {"agg": np.asarray(agg, np.float32)}
        if root is not None:
            tensors["root"] = np.asarray(root, np.float32)
        out, _ = self.post_frame("/v1/update", tensors, {"layer": int(layer), "stage": "post"})
        return out["h"]

    def post_pre(
        self, layer: int, agg: np.ndarray, root: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """:meth:`post` of ``layer`` then :meth:`pre` of ``layer + 1``, one call."""
        tensors = {"agg": np.asarray(agg, np.float32)}
        if root is not None:
            tensors["root"] = np.asarray(root, np.float32)
        params = {"layer": int(layer), "stage": "post", "pre_next": True}
        out, _ = self.post_frame("/v1/update", tensors, params)
        return out

    def head(self, kind: str, **tensors: np.ndarray) -> np.ndarray:
        """``head("edge", h_u=..., h_v=...)`` -> scores; ``head("graph", h=...,
        segments=...)`` -> readout rows."""
        out, _ = self.post_frame("/v1/head", dict(tensors), {"kind": kind})
        return out["score" if kind == "edge" else "readout"]


def aggregate_frame(
    op: str,
    block: Block,
    src_ids: np.ndarray,
    h: np.ndarray | None = None,
    extras: dict[str, np.ndarray] | None = None,
    *,
    eps: float = 0.0,
    negative_slope: float = 0.2,
    dst_offset: int | None = None,
    return_root: bool = False,
    partial: bool = False,
    include_self: bool = True,
    forward: tuple[str, int] | None = None,
    forward_pre_next: bool = False,
    state_set: tuple[str, str] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The tensors and params of an aggregate call (:meth:`MemoryClient.aggregate`).

    ``forward=(url, layer)``: the memory function sends the aggregate straight to
    the compute function at ``url`` (Update of ``layer``, stage ``post``) and
    answers with its ``{"h"}`` (``forward_pre_next``: Update also runs layer
    ``layer + 1``'s pre, see :meth:`ComputeClient.post_pre`). ``state_set=(model,
    checkpoint)``: the embedding set whose stored states recompute the rows that
    ``extras``' ``state_*`` tensors name (SRPE, see
    ``gnn_faas/functions/memory_app.py``)."""
    tensors = {
        "indptr": np.asarray(block.indptr, dtype=np.int64),
        "indices": np.asarray(block.indices, dtype=np.int64),
        "src_ids": np.asarray(src_ids, dtype=np.int64),
    }
    if h is not None:
        tensors["h"] = np.asarray(h, dtype=np.float32)
    for k, v in (extras or {}).items():
        tensors[k] = np.asarray(v)
    params = {
        "op": op,
        "num_dst": int(block.num_dst),
        "dst_offset": int(getattr(block, "dst_offset", 0) if dst_offset is None else dst_offset),
        "eps": float(eps),
        "negative_slope": float(negative_slope),
        "return_root": bool(return_root),
        "partial": bool(partial),
        "include_self": bool(include_self),
    }
    if state_set is not None:
        params["state_model"], params["state_checkpoint"] = str(state_set[0]), str(state_set[1])
    if forward is not None:
        params["forward_url"], params["forward_layer"] = str(forward[0]), int(forward[1])
        params["forward_pre_next"] = bool(forward_pre_next)
    return tensors, params


def aggregate_step(
    memory: MemoryClient,
    step: LayerStep,
    block: Block,
    src_ids: np.ndarray,
    h: np.ndarray | None,
    extras: dict[str, np.ndarray],
    **kw: Any,
) -> dict[str, np.ndarray]:
    """``memory.aggregate`` with the layer step's operator and parameters
    (``kw``: e.g. ``forward``, ``forward_pre_next``)."""
    return memory.aggregate(
        step.op,
        block,
        src_ids,
        h,
        extras,
        eps=step.eps,
        negative_slope=step.negative_slope,
        return_root=step.return_root,
        **kw,
    )


class HttpTransport:
    """:class:`~gnn_faas.functions.executor.Transport` over a memory and a compute function."""

    def __init__(self, memory: MemoryClient, compute: ComputeClient):
        self.memory = memory
        self.compute = compute

    def aggregate(
        self,
        step: LayerStep,
        block: Block,
        h_src: np.ndarray | None,
        src_ids: np.ndarray,
        extras: dict[str, np.ndarray],
    ) -> dict[str, np.ndarray]:
        return aggregate_step(self.memory, step, block, src_ids, h_src, extras)

    def features(self, ids: np.ndarray) -> np.ndarray:
        return self.memory.features(ids)

    def pre(self, step: LayerStep, h: np.ndarray) -> dict[str, np.ndarray]:
        return self.compute.pre(step.layer, h)

    def post(self, step: LayerStep, agg: np.ndarray, root: np.ndarray | None) -> np.ndarray:
        return self.compute.post(step.layer, agg, root)
