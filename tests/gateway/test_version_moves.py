"""A buffer that closes across graph versions runs on the newest of them.

An in-process data plane (real function processes, graph sharing) is handed a
closed buffer by hand: one request parsed on version 1, one on version 2 (which
changed rows and edges those requests read). The older request is moved onto
version 2 (its k-hop fetched again there), so both run in one execution; both
answers name version 2 and equal PyG on the graph at version 2. A request whose
target the newest version removed is not moved: it answers on its own version.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future

import numpy as np
import pytest

from gnn_faas.gateway.execution import InferenceJob
from gnn_faas.storage.fetcher import FetchStats
from gnn_faas.traces.replay import vertex_request
from tests.gateway.test_snapshot_isolation import current_graph, start_plane
from tests.pyg_reference import pyg_outputs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    dp, graph, ckpt = start_plane(tmp_path_factory.mktemp("moves"), "graph_sharing", seed=5)
    yield dp, graph, ckpt
    dp.shutdown()


def job(rt, targets, state) -> InferenceJob:
    req, overlay = rt._parse(vertex_request(targets), state)
    cg = rt._graph_of(rt.fetcher_at(state), req.targets, overlay, FetchStats())
    return InferenceJob(req, cg, Future(), time.perf_counter(), overlay, state=state)


def run_buffer(rt, jobs) -> list[tuple[np.ndarray, int, str]]:
    """The jobs as one closed buffer: (scores, version, execution) per job."""
    rt.executions.run_merged(jobs, {"buffer_id": "b", "buffer_requests": len(jobs)})
    out = []
    for j in jobs:
        outputs, info = j.future.result(timeout=60)
        out.append((np.asarray(dict(outputs)["scores"]), info["graph_version"], info["execution"]))
    return out


def moves(dp) -> float:
    return dp.metrics.registry.get_sample_value("gnn_faas_version_moves_total", {"model": "m"}) or 0


def pyg_at(state, graph, ckpt, targets) -> np.ndarray:
    src, dst, x = current_graph(state, graph)
    return pyg_outputs(ckpt, src, dst, x)[targets]


def test_a_buffer_across_versions_runs_once_on_the_newest(plane):
    dp, graph, ckpt = plane
    rt = dp.models["m"]
    order = [int(t) for t in graph.read_blob("request_order")]
    old_targets, new_targets = order[:3], order[3:6]
    v1 = rt.versions.current()
    old_job = job(rt, old_targets, v1)
    # version 2 changes rows the old request reads and adds an edge into its target
    reads = np.unique(old_job.cg.nodes)
    rows = [[4.0] * graph.manifest.feature_dim] * 2
    batch = {"set_features": {"ids": reads[:2].tolist(), "features": rows},
             "add_edges": [[order[-1], old_targets[0]]]}  # fmt: skip
    dp.updates.update("bitcoin-otc", json.dumps(batch).encode(), "Bearer t")
    v2 = rt.versions.current()
    assert v2.version == v1.version + 1
    before = moves(dp)
    (got_old, ver_old, ex_old), (got_new, ver_new, ex_new) = run_buffer(
        rt, [old_job, job(rt, new_targets, v2)]
    )
    assert ver_old == ver_new == v2.version and ex_old == ex_new  # one execution, on v2
    assert moves(dp) == before + 1
    np.testing.assert_allclose(got_old, pyg_at(v2, graph, ckpt, old_targets), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_new, pyg_at(v2, graph, ckpt, new_targets), rtol=1e-4, atol=1e-5)
    # the move mattered: on version 1 the old request's answer differs
    assert not np.allclose(pyg_at(v1, graph, ckpt, old_targets), got_old, atol=1e-4)


def test_a_request_whose_target_the_newest_version_removed_keeps_its_own(plane):
    dp, graph, ckpt = plane
    rt = dp.models["m"]
    order = [int(t) for t in graph.read_blob("request_order")]
    kept_targets, other = order[6:8], order[8:10]
    v1 = rt.versions.current()
    kept = job(rt, kept_targets, v1)
    dp.updates.update(
        "bitcoin-otc", json.dumps({"remove_vertices": [kept_targets[1]]}).encode(), "Bearer t"
    )
    v2 = rt.versions.current()
    before = moves(dp)
    (got_kept, ver_kept, ex_kept), (got_other, ver_other, ex_other) = run_buffer(
        rt, [kept, job(rt, other, v2)]
    )
    assert (ver_kept, ver_other) == (v1.version, v2.version) and ex_kept != ex_other
    assert moves(dp) == before
    np.testing.assert_allclose(
        got_kept, pyg_at(v1, graph, ckpt, kept_targets), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(got_other, pyg_at(v2, graph, ckpt, other), rtol=1e-4, atol=1e-5)
