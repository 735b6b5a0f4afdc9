"""A memory function forwarding its aggregate to a compute function (``/v1/aggregate``
with ``forward_url``): the compute function is served over real HTTP (werkzeug, in a
thread), the memory function in process through the real client."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from werkzeug.serving import make_server

from gnn_faas import errors
from gnn_faas.functions.client import ComputeClient
from gnn_faas.functions.compute_app import create_compute_app
from gnn_faas.functions.layer_plan import ModelPlan
from tests.functions.test_composition import make_model
from tests.functions.test_function_composition import fetcher, memory  # noqa: F401 - fixtures


@pytest.fixture
def served_compute(fetcher, tmp_path):  # noqa: F811 - the fixture imported above
    """``(base URL, ComputeClient, plan)`` of a real HTTP compute function (sage:
    its Update takes root rows too)."""
    _, update = make_model("sage-mean", 2, fetcher, tmp_path)
    app = create_compute_app(str(tmp_path / "ckpt"), device="cpu", threads=1)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}"
    client = ComputeClient(base)
    try:
        yield base, client, ModelPlan.from_config(update.config)
    finally:
        client.close()
        server.shutdown()
        thread.join(timeout=10)


def test_forwarded_aggregate_equals_aggregate_then_update(memory, served_compute):  # noqa: F811
    base, compute, plan = served_compute
    cg = memory.graph([3, 17, 99], 2, degrees=True)
    block, step = cg.block(1), plan.steps[0]
    src = cg.nodes[: block.num_src]
    apart = memory.aggregate(step.op, block, src, return_root=step.return_root)
    assert "root" in apart  # sage: the root rows must travel to Update too
    expected = compute.post(step.layer, apart["agg"], apart["root"])
    got = memory.aggregate(
        step.op, block, src, return_root=step.return_root, forward=(base, step.layer)
    )
    assert set(got) == {"h"}
    np.testing.assert_allclose(got["h"], expected, rtol=1e-6)
    # the forwarded call's figures come back apart from the memory function's own
    fwd, own = memory.forwarded_timing(), memory.last_timing()
    assert fwd is not None and fwd.total > 0 and fwd.work > 0
    assert own.total > 0 and own.work >= 0
    assert compute.stats()["requests_by_stage"]["post"] == 2


def test_forwarding_errors(memory, served_compute):  # noqa: F811
    base, _, plan = served_compute
    cg = memory.graph([3], 2, degrees=True)
    block, step = cg.block(1), plan.steps[0]
    src = cg.nodes[: block.num_src]
    kw = dict(return_root=True)
    # nothing listens there: a 502 that names the compute side, not the memory function
    with pytest.raises(errors.ForwardFailed, match="forwarding to the compute function"):
        memory.aggregate(step.op, block, src, forward=("http://127.0.0.1:9", 1), **kw)
    with pytest.raises(errors.InvalidRequest, match="forward_url must be an http"):
        memory.aggregate(step.op, block, src, forward=("file:///etc/passwd", 1), **kw)
    with pytest.raises(errors.InvalidRequest, match="forward_layer"):
        memory.aggregate(step.op, block, src, forward=(base, -1), **kw)
    with pytest.raises(errors.InvalidRequest, match="partial aggregate"):
        memory.aggregate(step.op, block, src, forward=(base, 1), partial=True)
    # the compute function's own 4xx keeps its status (layer 7 does not exist)
    with pytest.raises(errors.InvalidRequest, match="memory function: compute function"):
        memory.aggregate(step.op, block, src, forward=(base, 7), **kw)
    assert memory.ready()  # the memory function serves on


def test_a_function_behind_a_path_prefix(fetcher, tmp_path):  # noqa: F811
    """A platform URL may carry a path (OpenFaaS: ``/function/NAME``): the
    client's connection pool keeps it in front of every call."""
    from werkzeug.exceptions import NotFound
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    make_model("gcn", 2, fetcher, tmp_path)
    app = create_compute_app(str(tmp_path / "ckpt"), device="cpu", threads=1)
    routed = DispatcherMiddleware(NotFound(), {"/function/compute": app})
    server = make_server("127.0.0.1", 0, routed, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with ComputeClient(f"http://127.0.0.1:{server.server_port}/function/compute/") as c:
            assert c.ready() and c.model()["config"]["arch"] == "gcn"
        with ComputeClient(f"http://127.0.0.1:{server.server_port}") as c:
            assert not c.ready()  # the same server without the prefix: nothing there
    finally:
        server.shutdown()
        thread.join(timeout=10)


def test_a_chained_call_runs_every_layer_through_the_compute_function(
    fetcher,  # noqa: F811
    memory,  # noqa: F811
    served_compute,
    tmp_path,
):
    """The whole model in one memory call (every layer one part): the memory
    function forwards each layer's aggregate and aggregates the next over the
    rows Update answered; the answer equals the layers run apart."""
    from gnn_faas.functions.executor import LocalTransport, run_layers
    from gnn_faas.scheduler.orchestrator import Orchestrator

    base, compute, plan = served_compute
    (tmp_path / "again").mkdir()  # the same seeded model as the served one, in process
    _, update = make_model("sage-mean", 2, fetcher, tmp_path / "again")
    cg = memory.graph([3, 17, 99], 2, degrees=True)
    expected = run_layers(plan, cg, LocalTransport(fetcher, update))
    layers = Orchestrator(plan, None, None, budget_bytes=1 << 30, forward=True)._chain_layers(
        cg, None
    )
    assert layers is not None and len(layers) == 2
    before = compute.stats()["requests_by_stage"]["post"]
    got = memory.chain(layers, base)
    np.testing.assert_allclose(got["h"], expected, rtol=1e-5, atol=1e-6)
    assert compute.stats()["requests_by_stage"]["post"] == before + 2  # one Update per layer
    fwd = memory.forwarded_timing()
    assert fwd is not None and fwd.total > 0  # both forwards' figures, summed
    # a layer's rows come from the Update before it, never from the caller
    (t0, p0), (t1, p1) = layers
    with pytest.raises(errors.InvalidRequest, match="from the Update before"):
        memory.chain([(t0, p0), ({**t1, "h": np.zeros((t1["src_ids"].size, 16), np.float32)}, p1)],
                     base)  # fmt: skip
    with pytest.raises(errors.InvalidRequest, match="unexpected tensor"):
        memory.post_frame(
            "/v1/aggregate", {"7/indptr": t0["indptr"]}, {"chain": [p0], "forward_url": base}
        )
