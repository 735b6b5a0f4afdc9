"""The orchestrator's partitioned, pipelined execution equals the unpartitioned one.

Function pools are replaced by in-process ones whose "instances" answer with the
same numpy Aggregate and torch Update the real functions run, so the test is
about what the orchestrator does: cut each layer into partitions that fit a
memory budget, ship each with only the source rows it touches (its own rows
first), chain each partition's Update to its Aggregate, and reassemble rows in
order.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

from gnn_faas import errors
from gnn_faas.functions.aggregate import aggregate
from gnn_faas.functions.executor import LocalTransport, run_layers
from gnn_faas.functions.layer_plan import ModelPlan
from gnn_faas.scheduler.orchestrator import ClientCache, Orchestrator, compact_rows
from gnn_faas.storage.computation_graph import Block
from tests.functions.test_composition import (
    cora_fetcher,
    looped_cora_fetcher,
    make_model,
    pyg_full,
    self_loop_rows,
)


class InProcessMemory:
    """Aggregates like a memory function. From its second call on it waits (up to
    10 s) for the first Update to have started: it only has if Updates are chained
    to each partition's Aggregate rather than run after all of them."""

    def __init__(self, transport: LocalTransport, calls: list, first_post: threading.Event):
        self.t = transport
        self.calls = calls
        self.first_post = first_post
        self.waits: list[bool] = []

    def aggregate(self, op, block, src_ids, h=None, extras=None, **kw):
        if self.calls:
            self.waits.append(self.first_post.wait(timeout=10))
        self.calls.append(("aggregate", block.num_dst, block.num_src))
        x = self.t.features(src_ids) if h is None else h
        out = {"agg": aggregate(op, block, x, eps=kw["eps"], negative_slope=kw["negative_slope"],
                                **(extras or {}))}  # fmt: skip
        if kw["return_root"]:
            out["root"] = x[: block.num_dst]
        return out

    def features(self, ids):
        return self.t.features(ids)


class InProcessCompute:
    def __init__(self, model, calls: list, first_post: threading.Event):
        self.model = model
        self.calls = calls
        self.first_post = first_post

    def pre(self, layer, h):
        self.calls.append(("pre", layer, h.shape[0]))
        return self.model.pre(layer, h)

    def post(self, layer, agg, root=None):
        self.first_post.set()
        self.calls.append(("post", layer, agg.shape[0]))
        return self.model.post(layer, agg, root)

    def post_pre(self, layer, agg, root=None):
        self.calls.append(("post_pre", layer, agg.shape[0]))
        return self.model.pre(layer + 1, self.post(layer, agg, root))


class InProcessPool:
    """``submit(fn)`` runs ``fn(instance)`` on a thread, like a FunctionPool."""

    def __init__(self, name: str, workers: int = 3):
        self.instance = SimpleNamespace(id=name, url=f"inproc://{name}")
        self.executor = ThreadPoolExecutor(max_workers=workers)

    def submit(self, fn, inline: bool = False) -> Future:
        return self.executor.submit(fn, self.instance)


class InProcessClients(ClientCache):
    def __init__(self, memory, compute):
        super().__init__()
        self._m, self._c = memory, compute

    def memory(self, url):
        return self._m

    def compute(self, url):
        return self._c


def test_compact_rows_keeps_own_rows_first_and_only_used_sources():
    # 4 dst rows over 7 sources; rows 1..3 use sources {0, 5, 6, 2}
    indptr = np.array([0, 1, 3, 4, 6])
    indices = np.array([4, 5, 0, 6, 2, 5])
    block = Block(4, 7, indptr, indices)
    sub, sel = compact_rows(block, 1, 4)
    assert sel.tolist() == [1, 2, 3, 0, 5, 6]  # own rows, then the others sorted
    assert sub.num_dst == 3 and sub.num_src == 6
    # the same edges, in global (block-local) ids
    back = sel[sub.indices]
    assert back.tolist() == indices[1:6].tolist()
    assert np.diff(sub.indptr).tolist() == [2, 1, 2]


def test_compact_rows_on_random_blocks_and_ranges():
    """Own rows first, then every other source the rows read, once and sorted; the
    edges unchanged in block ids; the whole block of a fetch (every source
    read) is itself."""
    rng = np.random.default_rng(4)
    for _ in range(200):
        n_dst = int(rng.integers(1, 12))
        n_src = n_dst + int(rng.integers(0, 15))
        deg = rng.integers(0, 5, n_dst)
        indptr = np.concatenate(([0], np.cumsum(deg))).astype(np.int64)
        indices = rng.integers(0, n_src, int(indptr[-1])).astype(np.int64)
        block = Block(n_dst, n_src, indptr, indices)
        a = int(rng.integers(0, n_dst))
        b = int(rng.integers(a + 1, n_dst + 1))
        sub, sel = compact_rows(block, a, b)
        cols = indices[indptr[a] : indptr[b]]
        others = sorted(set(cols.tolist()) - set(range(a, b)))
        assert sel.tolist() == list(range(a, b)) + others
        assert sub.num_dst == b - a and sub.num_src == sel.size
        assert sel[sub.indices].tolist() == cols.tolist()
        assert sub.indptr.tolist() == (indptr[a : b + 1] - indptr[a]).tolist()
    whole = Block(2, 4, np.array([0, 2, 3]), np.array([3, 2, 0]))
    sub, sel = compact_rows(whole, 0, 2)
    assert sel.tolist() == [0, 1, 2, 3] and sub.indices.tolist() == [3, 2, 0]


@pytest.mark.parametrize("name", ["gcn", "sage-mean", "gat"])
def test_partitioned_pipelined_run_equals_run_layers(tmp_path, name):
    fetcher = cora_fetcher(tmp_path / "store")
    _, update = make_model(name, 2, fetcher, tmp_path)
    plan = ModelPlan.from_config(update.config)
    targets = np.random.default_rng(3).choice(2708, 40, replace=False)
    cg = fetcher.fetch(targets, 2, degrees=True)
    expected = run_layers(plan, cg, LocalTransport(fetcher, update))

    mem_calls, comp_calls, first_post = [], [], threading.Event()
    # one memory instance: partitions aggregate one after another
    memory_pool, compute_pool = InProcessPool("memory", workers=1), InProcessPool("compute")
    memory = InProcessMemory(LocalTransport(fetcher, update), mem_calls, first_post)
    clients = InProcessClients(memory, InProcessCompute(update, comp_calls, first_post))
    # a budget of ~64 KiB per partition: Cora's 1433-wide rows force many partitions
    orch = Orchestrator(plan, memory_pool, compute_pool, budget_bytes=64 * 1024, clients=clients)
    got, stats = orch.run(cg)

    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert stats.partitions[0] > 1  # layer 1 really was partitioned
    assert stats.aggregated_rows == cg.layer_sizes[1] + cg.layer_sizes[2]
    # every destination row aggregated and updated exactly once per layer
    posts = {
        layer: sum(n for kind, lyr, n in comp_calls if kind == "post" and lyr == layer)
        for layer in (1, 2)
    }
    assert posts == {1: cg.layer_sizes[1], 2: cg.layer_sizes[2]}
    # pipelining: partition 0's Update started while later partitions still waited
    # for their Aggregate (each later Aggregate found the first Update running)
    assert memory.waits and all(memory.waits)


@pytest.mark.parametrize("name", ["gcn", "sage-mean", "gin", "gat"])
def test_partitioned_run_on_a_graph_with_self_loops_equals_pyg(tmp_path, name):
    """Partitions cut rows and compact sources (compact_rows): a stored self
    loop becomes the row's own source, and GCN's degrees still exclude it."""
    fetcher = looped_cora_fetcher(cora_fetcher(tmp_path / "store"))
    model, update = make_model(name, 2, fetcher, tmp_path)
    plan = ModelPlan.from_config(update.config)
    targets = np.random.default_rng(3).choice(2708, 40, replace=False)
    cg = fetcher.fetch(targets, 2, degrees=True)
    assert self_loop_rows(cg).size > 0
    memory = InProcessMemory(LocalTransport(fetcher, update), [], threading.Event())
    memory.first_post.set()  # no waiting for a first Update: not a pipelining test
    clients = InProcessClients(memory, InProcessCompute(update, [], memory.first_post))
    orch = Orchestrator(
        plan, InProcessPool("memory"), InProcessPool("compute"), budget_bytes=64 * 1024,
        clients=clients,
    )  # fmt: skip
    got, stats = orch.run(cg)
    assert stats.partitions[0] > 1
    ref = pyg_full(model, fetcher)
    np.testing.assert_allclose(got[cg.target_index], ref[targets], rtol=1e-4, atol=1e-5)


class RealMemoryFunction:
    """The memory function's own request path (frames in, frames out), in process."""

    def __init__(self, fn):
        from gnn_faas.functions.client import MemoryClient

        self.fn = fn
        self.client = MemoryClient("inproc://memory")

    def aggregate(self, op, block, src_ids, h=None, extras=None, **kw):
        from gnn_faas.wire import decode_frame

        captured = {}

        def post_frame(path, tensors, params):
            captured["tensors"] = tensors
            body = self.fn.aggregate_request(tensors, params)
            return decode_frame(body, max_bytes=len(body))

        self.client.post_frame = post_frame
        out = self.client.aggregate(op, block, src_ids, h, extras, **kw)
        self.last_tensors = captured["tensors"]
        return out

    def features(self, ids):
        from gnn_faas.wire import decode_frame

        body = self.fn.features_request({"ids": np.asarray(ids, np.int64)}, {})
        return decode_frame(body, max_bytes=len(body))[0]["x"]


@pytest.mark.parametrize("name", ["gcn", "gat"])
def test_new_vertices_and_srpe_through_the_orchestrator(tmp_path, name):
    """A new-vertex request's rows travel to the real memory function (new_x);
    precomputed serving reads the boundary's stored rows; both equal run_layers."""
    from gnn_faas.functions.checkpoint import checkpoint_sha256
    from gnn_faas.functions.memory_app import MemoryFunction, MemoryFunctionConfig
    from gnn_faas.functions.precompute import precompute
    from gnn_faas.storage.embeddings import EmbeddingStore
    from gnn_faas.storage.overlay import GraphOverlay
    from gnn_faas.storage.srpe_graph import build_srpe_graph
    from tests.storage.test_overlay import new_request

    fetcher = cora_fetcher(tmp_path / "store")
    _, update = make_model(name, 2, fetcher, tmp_path)
    plan = ModelPlan.from_config(update.config)
    N = fetcher.graph.num_nodes
    feats, edges = new_request(fetcher, n=3, seed=4)
    ov = GraphOverlay.build(N, feats, edges, symmetrize=True)
    fn = MemoryFunction(
        MemoryFunctionConfig(store=f"file://{tmp_path / 'store'}", graph="cora", memory_mb=512)
    )
    memory = RealMemoryFunction(fn)
    clients = InProcessClients(memory, InProcessCompute(update, [], threading.Event()))
    orch = Orchestrator(
        plan, InProcessPool("m", 1), InProcessPool("c"), budget_bytes=256 * 1024, clients=clients
    )
    targets = np.array([N, N + 2, 17])
    cg = fetcher.fetch(targets, 2, degrees=True, overlay=ov)
    expected = run_layers(plan, cg, LocalTransport(fetcher, update, overlay=ov))
    got, stats = orch.run(cg, overlay=ov)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert stats.device == "cpu"
    if name == "gcn":  # layer 1 aggregated on the memory side, new rows shipped along
        assert stats.partitions[0] > 1 and fn.counts["aggregate"] >= stats.partitions[0]

    precompute(fetcher.graph, tmp_path / "ckpt", "m")
    emb = EmbeddingStore.open(fetcher.graph, "m", checkpoint_sha256(tmp_path / "ckpt"))
    sg = build_srpe_graph(fetcher, targets, 2, 0.5, overlay=ov)
    expected = run_layers(plan, sg, LocalTransport(fetcher, update, overlay=ov), emb.rows)
    got, _ = orch.run(sg, overlay=ov, embeddings=emb.rows)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("forward", [False, True], ids=["apart", "forwarded"])
@pytest.mark.parametrize("name", ["gcn", "sage-mean", "sage-max", "gin"])
def test_srpe_from_stored_states_through_the_orchestrator(tmp_path, name, forward):
    """Layer 1 of an SRPE graph built from stored states, cut into partitions
    that mix queries and recomputed candidates: the real memory function reads
    each recomputed candidate's state row once and adds the request's changed
    terms; the answers equal the in-process path's (run_layers with states),
    with Update called apart or through the memory function (forwarded)."""
    from gnn_faas.functions.checkpoint import checkpoint_sha256
    from gnn_faas.functions.memory_app import MemoryFunction, MemoryFunctionConfig
    from gnn_faas.functions.precompute import precompute
    from gnn_faas.storage.embeddings import EmbeddingStore, StaleEmbeddings
    from gnn_faas.storage.overlay import GraphOverlay
    from gnn_faas.storage.srpe_graph import build_srpe_graph
    from tests.functions.test_srpe_recompute import triangle_request

    fetcher = cora_fetcher(tmp_path / "store")
    _, update = make_model(name, 2, fetcher, tmp_path)
    plan = ModelPlan.from_config(update.config)
    N = fetcher.graph.num_nodes
    feats, edges, last = triangle_request(fetcher, seed=2)
    ov = GraphOverlay.build(N, feats, edges, symmetrize=True)
    sha = checkpoint_sha256(tmp_path / "ckpt")
    precompute(fetcher.graph, tmp_path / "ckpt", "m")
    emb = EmbeddingStore.open(fetcher.graph, "m", sha)
    # room for the test process's own memory: no request re-executed (it would read twice)
    fn = MemoryFunction(
        MemoryFunctionConfig(store=f"file://{tmp_path / 'store'}", graph="cora", memory_mb=16384)
    )
    compute = InProcessCompute(update, [], threading.Event())
    memory = RealMemoryFunction(fn)
    if forward:
        memory = ForwardingMemory(memory, {"inproc://c": compute})
    orch = Orchestrator(
        plan, InProcessPool("m", 1), InProcessPool("c"), budget_bytes=96 * 1024,
        clients=InProcessClients(memory, compute), forward=forward,
    )  # fmt: skip
    targets = np.array([N, last, N + 2, 17, 1200])
    tr = LocalTransport(fetcher, update, overlay=ov)
    for budget in (1.0, 0.3):
        sg = build_srpe_graph(fetcher, targets, 2, budget, overlay=ov, from_state=True)
        want = run_layers(plan, sg, tr, emb.rows, states=emb.state_rows)
        before = fn.stats()
        got, stats = orch.run(sg, overlay=ov, embeddings=emb.rows, state_set=("m", sha))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert stats.partitions[0] > 1  # queries and candidates cut into several calls
        # each recomputed candidate's state row read once, by the memory function
        after = fn.stats()
        assert after["reexecutions"] == before["reexecutions"]
        assert after["state_rows_read"] - before["state_rows_read"] == sg.recomputed.size > 0
        assert after["state_bytes_read"] > before["state_bytes_read"]
        if forward:  # every partition's Update went through the memory function
            assert len(memory.forwarded) == sum(stats.partitions)
            memory.forwarded.clear()
        if budget == 1.0 and name == "gcn":  # degrees the request changed were corrected
            assert (~sg.delta.added).any()
    with pytest.raises(errors.InvalidRequest, match="embedding set"):
        orch.run(sg, overlay=ov, embeddings=emb.rows)
    with pytest.raises(StaleEmbeddings):
        orch.run(sg, overlay=ov, embeddings=emb.rows, state_set=("m", "0" * 64))


class ForwardingMemory:
    """A memory function that, asked to, sends its aggregate to the compute
    function at the URL the orchestrator chose (``computes[url]``) and answers
    with Update's rows; ``fail`` names compute URLs it cannot reach."""

    def __init__(self, inner, computes: dict, fail: frozenset = frozenset()):
        self.inner, self.computes, self.fail = inner, computes, fail
        self.forwarded: list[str] = []

    def aggregate(
        self, op, block, src_ids, h=None, extras=None, forward=None, forward_pre_next=False, **kw
    ):
        out = self.inner.aggregate(op, block, src_ids, h, extras, **kw)
        if forward is None:
            return out
        url, layer = forward
        self.forwarded.append(url)
        if url in self.fail:
            raise errors.ForwardFailed(f"forwarding to {url} failed")
        compute = self.computes[url]
        if forward_pre_next:
            return compute.post_pre(layer, out["agg"], out.get("root"))
        return {"h": compute.post(layer, out["agg"], out.get("root"))}

    def chain(self, layers, compute_url):
        """Every layer in turn, as the memory function runs a chained call: each
        aggregate forwarded, the next layer over the rows Update answered."""
        out = None
        for tensors, params in layers:
            t = dict(tensors)
            block = Block(params["num_dst"], t["src_ids"].size, t.pop("indptr"), t.pop("indices"))
            src = t.pop("src_ids")
            out = self.aggregate(
                params["op"], block, src, None if out is None else out["h"], t,
                forward=(compute_url, params["forward_layer"]),
                forward_pre_next=params["forward_pre_next"], eps=params["eps"],
                negative_slope=params["negative_slope"], return_root=params["return_root"],
            )  # fmt: skip
        return out

    def forwarded_timing(self):
        return None

    def features(self, ids):
        return self.inner.features(ids)


@pytest.mark.parametrize("name", ["gcn", "sage-mean", "gat"])
def test_forwarded_run_equals_run_layers(tmp_path, name):
    """Memory functions forwarding their aggregate to the compute instance the
    orchestrator chose: the same rows as Aggregate and Update called apart,
    partitioned (sage's root rows travel along), one forwarded call per part."""
    fetcher = cora_fetcher(tmp_path / "store")
    _, update = make_model(name, 2, fetcher, tmp_path)
    plan = ModelPlan.from_config(update.config)
    cg = fetcher.fetch(np.random.default_rng(3).choice(2708, 40, replace=False), 2, degrees=True)
    expected = run_layers(plan, cg, LocalTransport(fetcher, update))
    first_post = threading.Event()
    first_post.set()
    compute = InProcessCompute(update, [], first_post)
    inner = InProcessMemory(LocalTransport(fetcher, update), [], first_post)
    memory = ForwardingMemory(inner, {"inproc://compute": compute})
    orch = Orchestrator(
        plan, InProcessPool("memory"), InProcessPool("compute"), budget_bytes=64 * 1024,
        clients=InProcessClients(memory, compute), forward=True,
    )  # fmt: skip
    got, stats = orch.run(cg)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert stats.partitions[0] > 1
    assert len(memory.forwarded) == sum(stats.partitions)  # Update only through the memory side
    assert [c for c in compute.calls if c[0] == "post"] and stats.bytes_to_compute > 0
    # a layer 2 with a pre stage (gcn transforming first, gat) has it run by
    # layer 1's Update calls, per partition, never as a call of its own
    kinds = {(kind, layer) for kind, layer, _ in compute.calls}
    assert ("pre", 2) not in kinds
    assert (("post_pre", 1) in kinds) == plan.steps[1].pre


def test_forwarding_failures_drop_the_instance_at_fault(tmp_path):
    """A compute instance the memory function cannot reach is dropped and the
    call retried on another compute instance, the memory instance kept; a
    memory instance that fails is dropped by the memory pool, the compute kept."""
    from gnn_faas.clock import FakeClock
    from gnn_faas.scheduler.function_pool import FunctionPool

    fetcher = cora_fetcher(tmp_path / "store")
    _, update = make_model("gcn", 2, fetcher, tmp_path)
    plan = ModelPlan.from_config(update.config)
    cg = fetcher.fetch(np.array([3, 17]), 2, degrees=True)
    expected = run_layers(plan, cg, LocalTransport(fetcher, update))
    first_post = threading.Event()
    first_post.set()
    compute = InProcessCompute(update, [], first_post)
    inner = InProcessMemory(LocalTransport(fetcher, update), [], first_post)
    urls = {f"http://compute-{i}": compute for i in (1, 2, 3)}
    memory = ForwardingMemory(inner, urls, fail=frozenset({"http://compute-1"}))

    def launcher(kind):
        ids = itertools.count(1)
        return lambda: SimpleNamespace(id=(i := next(ids)), url=f"http://{kind}-{i}")

    dropped: list[str] = []
    mem_pool = FunctionPool("m", launcher("memory"), FakeClock(), 2, on_failed=dropped.append)
    comp_pool = FunctionPool("c", launcher("compute"), FakeClock(), 2, on_failed=dropped.append)
    orch = Orchestrator(
        plan, mem_pool, comp_pool, budget_bytes=1 << 30,
        clients=InProcessClients(memory, compute), forward=True,
    )  # fmt: skip
    try:
        got, _ = orch.run(cg)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        assert [i.url for i in dropped] == ["http://compute-1"]
        assert mem_pool.stats["instance_failures"] == 0 and comp_pool.stats["retries"] == 1

        class DeadMemory(ForwardingMemory):
            def aggregate(self, *a, **kw):
                raise errors.Unavailable("memory function unreachable")

        orch.clients = InProcessClients(DeadMemory(inner, urls), compute)
        with pytest.raises(errors.Unavailable, match="failed on 3 instance"):
            orch.run(cg)
        assert all(i.url.startswith("http://memory-") for i in dropped[1:]) and len(dropped) == 4
        assert comp_pool.stats["instance_failures"] == 1  # only compute-1, from before
    finally:
        mem_pool.close()
        comp_pool.close()
