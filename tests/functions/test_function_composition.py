"""Memory function + compute function, composed over HTTP, equal PyG on Cora.

The two Flask apps are driven through the real clients (:class:`MemoryClient`,
:class:`ComputeClient`) and :class:`HttpTransport`; the clients' ``requests``
sessions are routed into the apps in-process by :class:`FlaskAdapter`, so every
call goes through frame encoding, HTTP routing, validation and decoding. The
computation graph itself comes from the memory function (``/v1/graph``). The
weights are moved with ``gnn-faas model import`` (helpers from
``test_composition``); the reference is the PyG model on the whole graph (full
neighbourhoods) or on the sampled computation graph.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import numpy as np
import pytest
import requests
import torch
from requests.structures import CaseInsensitiveDict
from safetensors.torch import save_file

from gnn_faas import errors
from gnn_faas.cli import main
from gnn_faas.functions.aggregate import combine_partials, slice_rows
from gnn_faas.functions.client import ComputeClient, HttpTransport, MemoryClient
from gnn_faas.functions.compute_app import create_compute_app
from gnn_faas.functions.executor import run_layers
from gnn_faas.functions.memory_app import MemoryFunctionConfig, create_memory_app
from gnn_faas.functions.update import UpdateModel
from tests.functions.test_composition import (
    ATOL,
    LOOPED,
    RTOL,
    cora_fetcher,
    looped_cora_fetcher,
    make_model,
    pyg_full,
    pyg_sampled,
    self_loop_rows,
)
from tests.functions.test_pyg_import import Net, _per_layer_models


class FlaskAdapter(requests.adapters.BaseAdapter):
    """A ``requests`` transport adapter that serves requests with a Flask app in-process."""

    def __init__(self, app):
        super().__init__()
        self.client = app.test_client()

    def send(self, request, **kwargs):
        parts = urlsplit(request.url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        r = self.client.open(
            path, method=request.method, data=request.body, headers=dict(request.headers)
        )
        resp = requests.Response()
        resp.status_code = r.status_code
        resp.reason = r.status
        resp.headers = CaseInsensitiveDict(r.headers)
        resp._content = r.get_data()
        resp.url = request.url
        resp.request = request
        return resp

    def close(self):
        pass


def session_for(app, base: str) -> requests.Session:
    s = requests.Session()
    s.mount(base, FlaskAdapter(app))
    return s


@pytest.fixture(scope="module")
def fetcher(tmp_path_factory):
    return cora_fetcher(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def memory(fetcher):
    store = fetcher.graph.backend.uri
    app = create_memory_app(MemoryFunctionConfig(store=store, graph="cora", memory_mb=2048))
    base = "http://memory.test"
    return MemoryClient(base, session=session_for(app, base))


def compute_client(ckpt) -> ComputeClient:
    app = create_compute_app(str(ckpt), device="cpu", threads=1)
    base = "http://compute.test"
    return ComputeClient(base, session=session_for(app, base))


@pytest.fixture(scope="module")
def targets() -> np.ndarray:
    t = np.random.default_rng(7).choice(2708, 30, replace=False)
    return np.concatenate((t, t[:2]))  # repeats come back in request order


ARCHS = ["gcn", "sage-mean", "sage-max", "gin", "gat"]


@pytest.mark.parametrize("name", ARCHS)
def test_full_neighbourhoods_equal_pyg(name, fetcher, memory, targets, tmp_path):
    model, update = make_model(name, 2, fetcher, tmp_path)
    transport = HttpTransport(memory, compute_client(tmp_path / "ckpt"))
    cg = memory.graph(targets, 2, degrees=True)
    out = run_layers(update.plan, cg, transport)
    ref = pyg_full(model, fetcher)
    np.testing.assert_allclose(out[cg.target_index], ref[targets], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ARCHS)
def test_sampled_neighbourhoods_equal_pyg(name, fetcher, memory, targets, tmp_path):
    model, update = make_model(name, 2, fetcher, tmp_path)
    transport = HttpTransport(memory, compute_client(tmp_path / "ckpt"))
    cg = memory.graph(targets, 2, fanouts=[5, 3], seed=11, degrees=True)
    assert cg.indices.size < fetcher.fetch(targets, 2).indices.size  # really sampled
    out = run_layers(update.plan, cg, transport)
    np.testing.assert_allclose(out, pyg_sampled(model, fetcher, cg), rtol=RTOL, atol=ATOL)


@pytest.fixture(scope="module")
def looped(fetcher):
    return looped_cora_fetcher(fetcher)


@pytest.fixture(scope="module")
def looped_memory(looped):
    store = looped.graph.backend.uri
    app = create_memory_app(MemoryFunctionConfig(store=store, graph=LOOPED, memory_mb=2048))
    base = "http://memory-loops.test"
    return MemoryClient(base, session=session_for(app, base))


@pytest.mark.parametrize("name", ARCHS)
def test_graph_with_self_loops_through_the_functions_equals_pyg(
    name, looped, looped_memory, targets, tmp_path
):
    """Cora with self loops, served by the memory and compute functions over
    HTTP: the degrees the memory function ships exclude the self loops."""
    model, update = make_model(name, 2, looped, tmp_path)
    transport = HttpTransport(looped_memory, compute_client(tmp_path / "ckpt"))
    cg = looped_memory.graph(targets, 2, degrees=True)
    assert self_loop_rows(cg).size > 0
    out = run_layers(update.plan, cg, transport)
    ref = pyg_full(model, looped)
    np.testing.assert_allclose(out[cg.target_index], ref[targets], rtol=RTOL, atol=ATOL)
    cg = looped_memory.graph(targets, 2, fanouts=[5, 3], seed=11, degrees=True)
    out = run_layers(update.plan, cg, transport)
    np.testing.assert_allclose(out, pyg_sampled(model, looped, cg), rtol=RTOL, atol=ATOL)


def test_partitioned_layer_through_the_memory_function(fetcher, memory, targets):
    """Rows split over 3 calls (dst_offset) and sources over 2 partial calls."""
    cg = memory.graph(targets, 2, degrees=True)
    b = cg.block(1)
    src = cg.nodes[: b.num_src]
    deg = {"deg_src": cg.in_degree[: b.num_src]}
    whole = memory.aggregate("gcn", b, src, extras=deg)["agg"]
    cuts = [0, b.num_dst // 3, 2 * b.num_dst // 3, b.num_dst]
    rows = [memory.aggregate("gcn", slice_rows(b, lo, hi), src, extras=deg)["agg"]
            for lo, hi in zip(cuts, cuts[1:])]  # fmt: skip
    np.testing.assert_allclose(np.concatenate(rows), whole, rtol=1e-6)
    odd = b.indices % 2 == 1
    parts = []
    for keep, self_term in ((odd, True), (~odd, False)):
        counts = np.bincount(np.repeat(np.arange(b.num_dst), np.diff(b.indptr))[keep],
                             minlength=b.num_dst)  # fmt: skip
        part = type(b)(b.num_dst, b.num_src, np.concatenate(([0], np.cumsum(counts))),
                       b.indices[keep])  # fmt: skip
        parts.append(memory.aggregate("gcn", part, src, extras=deg, partial=True,
                                      include_self=self_term))  # fmt: skip
    np.testing.assert_allclose(combine_partials("gcn", parts), whole, rtol=1e-5, atol=1e-6)


def test_remote_errors_come_back_as_the_matching_exceptions(memory, tmp_path):
    with pytest.raises(errors.InvalidRequest, match="memory function: .*999999"):
        memory.features([1, 999999])
    with pytest.raises(errors.InvalidRequest, match="hops"):
        memory.graph([1], 50)
    with pytest.raises(errors.NotFound):
        memory.get_json("/v1/nothing")
    assert memory.ready()
    assert memory.stats()["graph"] == "cora"
    dead = MemoryClient("http://127.0.0.1:9", timeout=2)  # nothing listens on port 9
    with pytest.raises(errors.Unavailable, match="unreachable"):
        dead.features([1])
    assert not dead.ready()


@pytest.mark.parametrize("name", ["gat-4-then-1", "gat-mixed", "sage-per-layer", "gin-per-layer"])
def test_per_layer_imported_models_through_the_functions_equal_pyg(
    name, fetcher, memory, targets, tmp_path, capsys
):
    """PyG models whose layers differ (GAT heads 4 then 1, concat, slopes; SAGE
    aggregators and root weights; GIN eps), imported by the CLI and served by
    the memory and compute functions over HTTP."""
    torch.manual_seed(5)
    convs, flags = _per_layer_models()[name]
    model = Net(convs).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "m.st"))
    arch = name.split("-")[0]
    argv = ["model", "import", "--pyg", str(tmp_path / "m.st"), "--arch", arch, *flags]
    assert main([*argv, "--out", str(tmp_path / "ckpt")]) == 0, capsys.readouterr().err
    compute = compute_client(tmp_path / "ckpt")
    plan = UpdateModel.load(tmp_path / "ckpt", device="cpu").plan
    cg = memory.graph(targets, len(convs), degrees=True)
    out = run_layers(plan, cg, HttpTransport(memory, compute))
    np.testing.assert_allclose(
        out[cg.target_index], pyg_full(model, fetcher)[targets], rtol=RTOL, atol=ATOL
    )
