"""The gateway's graph endpoints: updates while serving, a graph's state, compaction.

``POST /v2/graphs/{graph}/updates`` (gateway/graph_updates.py) commits a batch
as the next version (storage/versions.py), in the gateway's writer process when
it has one (gateway/graph_writer.py), and answers it once it is durable. Every
gateway's requests run on it within ``graphs.freshness_s``, this one's too: it
takes the version from the writer's answer at its next check, without a store
read, a stream's versions in one merge. With ``freshness_s: 0`` this gateway's
next request runs on it (read-your-writes). ``GET /v2/graphs/{graph}`` says the
version, counts, the log's size and the last compaction. When a graph's log passes
``graphs.compact_share`` of its base, one compaction runs in the background
(storage/compaction.py); serving goes on meanwhile, and the new base is
picked up like any new version.
"""

from __future__ import annotations

import logging
import threading
import time

from prometheus_client import Counter, Gauge

from gnn_faas.config import ServingConfig
from gnn_faas.errors import NotFound
from gnn_faas.gateway.graph_updates import check_token, parse_update
from gnn_faas.gateway.graph_writer import WriterProcess
from gnn_faas.gateway.inference_request import RawInferRequest
from gnn_faas.gateway.metrics import GatewayMetrics
from gnn_faas.storage.compaction import compact
from gnn_faas.storage.versions import GraphVersions

log = logging.getLogger("gnn_faas.gateway")


class GraphUpdates:
    """Updates, state and compaction of the graphs a gateway serves."""

    def __init__(
        self,
        serving: ServingConfig,
        graphs: dict[str, GraphVersions],
        metrics: GatewayMetrics,
        writer_process: bool = False,
    ):
        self.serving = serving
        self.graphs = graphs
        self.config = serving.graphs
        # commits in a child process (gateway/graph_writer.py), for the graphs that
        # take writes; else in this one
        writable = [g for g in graphs if self.config.token_of(g) is not None]
        self.writer = (
            WriterProcess(serving.store, writable, int(serving.gateway.structure_budget_mb * 2**20))
            if writer_process and writable
            else None
        )
        r = metrics.registry
        self.batches = Counter(
            "gnn_faas_graph_update_batches", "Update batches, by outcome", ["graph", "outcome"],
            registry=r,
        )  # fmt: skip
        self.changes = Counter(
            "gnn_faas_graph_update_changes", "Changes committed (edges, vertices, rows)",
            ["graph", "kind"], registry=r,
        )  # fmt: skip
        self.compactions = Counter(
            "gnn_faas_graph_compactions", "Compactions run by this gateway", ["graph", "outcome"],
            registry=r,
        )  # fmt: skip
        version = Gauge(
            "gnn_faas_graph_version", "Newest graph version known", ["graph"], registry=r
        )
        for name, gv in graphs.items():
            version.labels(name).set_function(lambda gv=gv: gv.state.version)
        self._compacting: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def versions(self, graph: str) -> GraphVersions:
        try:
            return self.graphs[graph]
        except KeyError:
            raise NotFound(
                f"unknown graph {graph!r}; served: {', '.join(sorted(self.graphs))}"
            ) from None

    def update(self, graph: str, body: bytes | RawInferRequest, authorization: str | None) -> dict:
        """Check the token, parse and commit one batch: what the answer says."""
        gv = self.versions(graph)
        check_token(self.config.token_of(graph), authorization, graph)
        t0 = time.perf_counter()
        try:
            batch = parse_update(body, self.serving.limits, self.config.max_batch_ops)
            if self.writer is not None:
                rec, delta = self.writer.commit(graph, batch)
                if gv.freshness_s <= 0:  # read-your-writes: this gateway's next request
                    gv.adopt(rec, delta)
                else:  # with the next check, merged with the versions offered meanwhile
                    gv.offer(rec, delta)
            else:
                rec, delta = gv.commit(batch)
        except Exception:
            self.batches.labels(graph, "refused").inc()
            raise
        self.batches.labels(graph, "committed").inc()
        summary = delta.summary()
        for kind, n in summary.items():
            self.changes.labels(graph, kind).inc(n)
        self.maybe_compact(graph)
        return {
            "graph": graph,
            "version": rec.version,
            "num_nodes": rec.num_nodes,
            "num_edges": rec.num_edges,
            "applied": summary,
            "new_ids": delta.new_ids.tolist(),
            "commit_ms": (time.perf_counter() - t0) * 1e3,
        }

    def info(self, graph: str) -> dict:
        """``GET /v2/graphs/{graph}``: version, counts, log size, last compaction."""
        gv = self.versions(graph)
        state = gv.current()  # what a request would run on now (freshness_s 0: checked)
        rec = gv.record
        base = sum(i.nbytes for i in state.graph.manifest.blobs.values())
        return {
            "graph": graph,
            "version": state.version,
            "base": state.graph.prefix,
            "base_version": state.base_version,
            "num_nodes": state.num_nodes,
            "num_edges": state.num_edges,
            "removed_vertices": int(state.features.removed.size),
            "delta": {
                "segments": rec.num_segments,
                "bytes": rec.delta_bytes,
                "share_of_base": rec.delta_bytes / max(1, base),
            },
            "last_compaction": rec.last_compaction,
            "compacting": graph in self._compacting,
            "freshness_s": gv.freshness_s,
            "writable": self.config.token_of(graph) is not None,
        }

    def list(self) -> list[dict]:
        return [self.info(g) for g in sorted(self.graphs)]

    # -- compaction ----------------------------------------------------------------
    def maybe_compact(self, graph: str) -> bool:
        """Start a background compaction when the log passed its share of the base."""
        share = self.config.compact_share
        if share <= 0:
            return False
        info = self.info(graph)
        if info["delta"]["share_of_base"] < share:
            return False
        return self.compact_in_background(graph)

    def compact_in_background(self, graph: str) -> bool:
        with self._lock:
            if graph in self._compacting:
                return False
            gv = self.versions(graph)
            thread = threading.Thread(
                target=self._compact, args=(graph, gv), daemon=True, name=f"compact-{graph}"
            )
            self._compacting[graph] = thread
        thread.start()
        return True

    def _compact(self, graph: str, gv: GraphVersions) -> None:
        try:
            out = compact(gv.backend, graph, grace_s=self.config.compaction_grace_s)
            gv.refresh()
            self.compactions.labels(graph, "done").inc()
            log.info("graph %s compacted: %s", graph, out)
        except Exception as exc:  # noqa: BLE001 - the log keeps serving; the next batch retries
            self.compactions.labels(graph, "failed").inc()
            log.warning("compacting graph %s failed: %s", graph, exc)
        finally:
            with self._lock:
                self._compacting.pop(graph, None)

    def start(self) -> None:
        """Start the writer process (it opens the writable graphs meanwhile)."""
        if self.writer is not None:
            self.writer.start()

    def shutdown(self) -> None:
        for thread in list(self._compacting.values()):
            thread.join(timeout=60)
        if self.writer is not None:
            self.writer.close()
