"""What ``gnn-faas status`` and ``/metrics`` show of one served model."""

from __future__ import annotations

from typing import Any


def model_status(rt: Any) -> dict:
    """A :class:`~gnn_faas.gateway.data_plane.ModelRuntime`'s status: totals,
    admission, buffers (and the work-conserving gate), pools, caches, functions."""
    buffers = rt.buffers
    return {
        "model": rt.name,
        "graph": rt.model.graph,
        "mode": rt.model.mode,
        "ready": rt.ready(),
        "totals": dict(rt.totals),
        "admission": rt.admission.as_dict(),
        "buffers": buffers.snapshot() if buffers is not None else [],
        "buffer_stats": buffers.stats if buffers is not None else {},
        "memory_pool": {**rt.memory_pool.snapshot(), "stats": rt.memory_pool.stats},
        "compute_pool": {**rt.compute_pool.snapshot(), "stats": rt.compute_pool.stats},
        "gateway_fetch": rt.fetcher.stats.as_dict(),
        **srpe_status(rt),
        "caches": cache_stats(rt),
        "functions": function_rows(rt),
    }


def srpe_status(rt: Any) -> dict:
    """Precomputed serving's settings (``recompute_from`` and, where the stored
    states could not be used, why) and the gateway's reads of the boundary's
    stored embeddings; nothing for exact serving."""
    emb = getattr(rt, "embeddings", None)
    if emb is None:
        return {}
    return {"srpe": {**rt.srpe_parameters(), "embeddings_read": emb.reader.stats.as_dict()}}


def function_rows(rt: Any) -> list[dict]:
    """Per function: desired, actual and ready replicas and the ready revision
    (as the platform reports them), calls in flight and queue length (the
    gateway's pool: busy instances, items queued on instances or pending)."""
    rows = []
    for pool in (rt.memory_pool, rt.compute_pool):
        snap = pool.snapshot()
        try:
            row = dict(rt.platform.replicas(pool.name))
        except Exception as exc:  # a platform API down must not break status
            row = {"function": pool.name, "error": str(exc)}
        row["in_flight"] = sum(1 for i in snap["instances"] if i["state"] == "busy")
        row["queue_length"] = sum(snap["queues"].values()) + snap["pending"]
        rows.append(row)
    return rows


REPLICA_CACHE_NOTE = (
    "per-replica cache figures are on each memory replica's /metrics "
    "(gnn_faas_cache_hit_ratio; the chart's functionsPodMonitor scrapes them)"
)


def cache_stats(rt: Any) -> list[dict]:
    """Each warm memory instance's own figures (cache hit rate, bytes read).

    Where the platform's instances are slots behind one URL (Knative,
    OpenFaaS), a call would reach a replica its router picks, not the one
    asked about, and count against that replica's concurrency like real work:
    status then points at the replicas' own metrics instead."""
    if not getattr(rt.platform, "addresses_instances", True):
        return [{"note": REPLICA_CACHE_NOTE}]
    out = []
    for inst in rt.memory_pool.instances():
        try:
            st = rt.orchestrator.clients.memory(inst.url).stats()
        except Exception as exc:  # an instance going away must not break status
            out.append({"instance": inst.id, "error": str(exc)})
            continue
        states = {k: v for k, v in st.items() if k.startswith("state_")}  # SRPE's stored states
        out.append(
            {
                "instance": inst.id,
                **st.get("cache", {}),
                "bytes_read": st.get("bytes_read"),
                **states,
            }
        )
    return out
