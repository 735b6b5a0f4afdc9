"""Decision-tree timeout configurator: numpy evaluation equals sklearn, JSON
round trip, hindsight labels, fitting, and the issue's test: every request
stays inside its SLO in a fake-clock replay of the real Twitter trace over
Bitcoin OTC's real request order."""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import pytest
from sklearn.tree import DecisionTreeRegressor

from gnn_faas.cli import main
from gnn_faas.clock import FakeClock
from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.gateway.buffer import FEATURES, PendingRequest
from gnn_faas.gateway.buffer_pool import BufferConfig, BufferPoolState, MultiBufferPool
from gnn_faas.gateway.timeout_configurator import (
    DecisionTreeTimeoutConfigurator,
    FixedTimeoutConfigurator,
    TimeoutParams,
    TreeArrays,
    load_configurator,
)
from gnn_faas.gateway.timeout_history import (
    TimeoutHistory,
    fit_timeout_tree,
    label_decision,
    replay_buffers,
    trace_request_stream,
)
from gnn_faas.storage.datasets import prepare_dataset
from gnn_faas.storage.format import open_graph
from gnn_faas.traces import twitter


@pytest.fixture(scope="module")
def bitcoin(tmp_path_factory):
    store = f"file://{tmp_path_factory.mktemp('store')}"
    prepare_dataset(store, "bitcoin-otc", feature_dim=4)
    return store, open_graph(store, "bitcoin-otc")


@pytest.fixture(scope="module")
def labelled(bitcoin):
    """States and hindsight labels from a replay of 10 s of the trace at 40 req/s."""
    _, graph = bitcoin
    arrivals = twitter.arrivals(40, 10, seed=1)
    sets = trace_request_stream(graph, arrivals, hops=2)
    res = replay_buffers(
        arrivals,
        sets,
        BufferConfig(),
        graph.num_nodes,
        FixedTimeoutConfigurator(0),
        label=True,
        follow="oracle",
    )
    return res.states, res.labels


def test_numpy_tree_equals_sklearn_and_survives_json(labelled):
    x, y = labelled
    assert x.shape[1] == len(FEATURES) and len(np.unique(y)) > 2
    model = DecisionTreeRegressor(max_depth=6, min_samples_leaf=5, random_state=0).fit(x, y)
    conf = DecisionTreeTimeoutConfigurator(TimeoutParams(), TreeArrays.from_sklearn(model))
    back = DecisionTreeTimeoutConfigurator.from_json(conf.to_json())
    # probe: the training states, jittered ones, and states sitting exactly on
    # every split threshold (where float32 rounding decides the branch)
    rng = np.random.default_rng(0)
    probes = [x, x * rng.uniform(0.9, 1.1, x.shape)]
    t = back.tree
    inner = np.flatnonzero(t.children_left != -1)
    on_split = np.repeat(x[:1], inner.size, axis=0)
    on_split[np.arange(inner.size), t.feature[inner]] = t.threshold[inner]
    probes += [on_split, np.nextafter(on_split, np.inf), np.nextafter(on_split, -np.inf)]
    z = np.concatenate(probes)
    expected = model.predict(z)
    np.testing.assert_array_equal(conf.tree.predict(z), expected)
    np.testing.assert_array_equal(back.tree.predict(z), expected)
    decisions = back.decide_many(z)
    np.testing.assert_array_equal(decisions, np.clip(np.floor(expected + 0.5), -1, 3))
    assert back.decide(z[0]) == decisions[0]
    # fit() is the same sklearn fit
    fitted = DecisionTreeTimeoutConfigurator.fit(x, y, max_depth=6, min_samples_leaf=5)
    np.testing.assert_array_equal(fitted.tree.predict(z), expected)
    assert fitted.meta["samples"] == x.shape[0]


def test_bundled_tree():
    conf = DecisionTreeTimeoutConfigurator.bundled("bitcoin-otc")
    assert conf.params == TimeoutParams()
    assert conf.tree.node_count > 1 and conf.tree.max_depth <= 8
    assert conf.meta["graph"] == "bitcoin-otc"
    assert all(r["slo_violations"] == 0 for r in conf.meta["replay"])
    rng = np.random.default_rng(0)
    states = np.column_stack(
        [
            rng.uniform(0, 1, 500),
            rng.uniform(0, 0.9, 500),
            rng.integers(1, 20, 500),
            rng.uniform(0, 100, 500),
            rng.integers(1, 6000, 500),
        ]
    )
    d = conf.decide_many(states)
    assert d.min() >= -1 and d.max() <= conf.params.max_steps
    assert len(np.unique(d)) > 1  # it does adapt to the state


def test_load_configurator(tmp_path, caplog):
    bundled = load_configurator(None, graph="bitcoin-otc", config=BufferConfig())
    assert isinstance(bundled, DecisionTreeTimeoutConfigurator)
    assert not caplog.records  # the bundled tree matches the default config
    assert isinstance(load_configurator(None, graph="cora"), FixedTimeoutConfigurator)
    path = tmp_path / "t.json"
    bundled.save(path)
    with caplog.at_level("WARNING"):
        again = load_configurator(path, config=BufferConfig(beta=2.0))
    assert again.tree.node_count == bundled.tree.node_count
    assert "fitted with" in caplog.text
    with pytest.raises(NotFound):
        load_configurator(tmp_path / "missing.json", graph="bitcoin-otc")


def _serve_trace(tree, config, graph, arrivals, sets):
    """Run the real MultiBufferPool on a fake clock over an arrival stream;
    returns completion times (close + exec estimate) and the closed buffers."""
    clock = FakeClock(0.0)
    closed = []
    pool = MultiBufferPool(config, graph.num_nodes, clock, tree, closed.append)

    def run_until(t):
        while (e := pool.next_event_time()) <= t and e < math.inf:
            clock.set(e)
            pool.tick()

    for i, (a, u) in enumerate(zip(arrivals, sets, strict=True)):
        run_until(a)
        pool.submit(str(i), u, payload=i)
    run_until(math.inf)
    completion = np.full(arrivals.size, np.nan)
    for cb in closed:
        completion[[r.payload for r in cb.requests]] = cb.closed_at + config.exec_estimate_s
    return completion, closed


@pytest.mark.parametrize(
    ("rps", "exec_estimate_s", "delta"),
    [(40, 0.05, 0.5), (80, 0.05, 0.5), (40, 0.2, 0.8)],
)
def test_timeout_configurator_keeps_every_request_inside_its_slo(
    bitcoin, rps, exec_estimate_s, delta
):
    _, graph = bitcoin
    tree = DecisionTreeTimeoutConfigurator.bundled("bitcoin-otc")
    params = TimeoutParams(**{**tree.params.__dict__, "delta": delta})
    config = BufferConfig.from_params(params, slo_s=0.3, exec_estimate_s=exec_estimate_s)
    arrivals = twitter.arrivals(rps, 15, seed=7)
    sets = trace_request_stream(graph, arrivals, hops=2, offset=3000)
    completion, closed = _serve_trace(tree, config, graph, arrivals, sets)
    assert not np.isnan(completion).any()  # every request was served
    assert np.all(completion <= arrivals + config.slo_s + 1e-9)
    waits = [cb.closed_at - cb.opened_at for cb in closed]
    assert max(waits) <= config.tmax + 1e-9
    reasons = {cb.reason for cb in closed}
    if exec_estimate_s + config.tmax > config.slo_s:
        assert "deadline" in reasons  # the SLO budget, not Tmax, had to bind
    # the tree does batch: more than one request per buffer on average
    assert arrivals.size / len(closed) > 1.5


def test_hindsight_label_waits_for_overlapping_arrivals():
    # T0 = 60 ms, τ = 30 ms; sparse arrivals on purpose: no fast path
    cfg = BufferConfig(gamma=0.2, fast_path_arrivals=0.0)
    u = np.arange(100)
    sets = [u, u, u]
    policy = FixedTimeoutConfigurator(0)

    def pool_at_first_decision(arrivals):
        pool = BufferPoolState(cfg, 200)
        pool.submit(PendingRequest("0", u, 0.0, 0.3, 0), 0.0)
        return pool, pool.slots[0], cfg.tau

    # two identical requests will arrive at 40 and 50 ms: wait for them
    arrivals = np.array([0.0, 0.04, 0.05])
    pool, b, now = pool_at_first_decision(arrivals)
    best, gains = label_decision(pool, b, now, arrivals, sets, 1, policy)
    assert best >= 0 and gains[best + 1] == gains.max()
    assert gains[best + 1] > gains[0] + 0.5  # sharing 2/3 beats closing alone
    # nothing else arrives in time: closing now beats waiting until T0
    late = np.array([0.0, 5.0, 5.0])
    pool, b, now = pool_at_first_decision(late)
    best, gains = label_decision(pool, b, now, late, sets, 1, policy)
    assert best == -1 and np.all(np.diff(gains) < 0)
    # labelling leaves the pool untouched (it works on forks)
    assert pool.slots[0].num_requests == 1 and pool.slots[0].decisions == []


def test_fit_timeout_tree_on_a_short_trace(bitcoin):
    _, graph = bitcoin
    streams = []
    for k, rps in enumerate((30, 60)):
        a = twitter.arrivals(rps, 5, seed=k)
        streams.append((a, trace_request_stream(graph, a, hops=2, offset=k * 500)))
    tree, report = fit_timeout_tree(
        streams, BufferConfig(), graph.num_nodes, rounds=2, meta={"graph": "bitcoin-otc"}
    )
    assert [r["follow"] for r in report["rounds"]] == ["oracle", "policy"]
    assert report["rounds"][1]["samples"] > report["rounds"][0]["samples"]
    for fitted, base in zip(report["fitted"], report["baseline_fixed_t0"], strict=True):
        assert fitted["slo_violations"] == 0
        # waiting longer than T0 where it pays shares more than the fixed T0
        assert fitted["mean_sharing_degree"] > base["mean_sharing_degree"]
    again = DecisionTreeTimeoutConfigurator.from_json(tree.to_json())
    assert again.meta["graph"] == "bitcoin-otc" and again.tree.node_count == report["tree"]["nodes"]


def test_cli_fit_and_evaluate(bitcoin, tmp_path, capsys):
    store, _ = bitcoin
    out = tmp_path / "tree.json"
    common = ["--store", store, "--graph", "bitcoin-otc", "--rps", "30", "--duration", "4"]
    assert main(["timeouts", "fit", *common, "--rounds", "1", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["out"] == str(out) and report["fitted"][0]["slo_violations"] == 0
    tree = DecisionTreeTimeoutConfigurator.load(out)
    assert tree.meta["rps"] == [30.0]
    assert main(["timeouts", "evaluate", *common, "--tree", str(out)]) == 0
    figures = json.loads(capsys.readouterr().out)["replay"][0]
    assert figures["slo_violations"] == 0 and figures["requests"] == report["fitted"][0]["requests"]
    assert main(["timeouts", "evaluate", *common[:2], "--graph", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_history_ring_buffer():
    h = TimeoutHistory(capacity=4)
    for i in range(6):
        h.record(buffer_id=i // 2, time=float(i), state=np.full(5, i), decision=i % 3 - 1)
    assert len(h) == 4
    a = h.arrays()
    assert a["time"].tolist() == [2.0, 3.0, 4.0, 5.0]
    assert a["buffer_id"].tolist() == [1, 1, 2, 2]
    h.complete(1, 0.5)
    assert a["outcome"].tolist()[:2] != [0.5, 0.5]  # arrays() is a copy
    out = h.arrays()["outcome"]
    assert out[:2].tolist() == [0.5, 0.5] and np.isnan(out[2:]).all()
    h.complete(0, 1.0)  # its records were overwritten: nothing to fill
    assert h.decision_histogram() == {"-1": 1, "0": 1, "1": 2}

    shared = TimeoutHistory(capacity=1000)

    def writer(k):
        for i in range(300):
            shared.record(k * 1000 + i, float(i), np.zeros(5), 0)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(shared) == 1000 and len(set(shared.arrays()["buffer_id"].tolist())) == 1000


def test_bad_tree_files(tmp_path):
    with pytest.raises(InvalidRequest, match="not JSON"):
        DecisionTreeTimeoutConfigurator.from_json("{")
    with pytest.raises(InvalidRequest, match="not a gnn-faas-timeout-tree"):
        DecisionTreeTimeoutConfigurator.from_json('{"format": "pickle"}')
    good = json.loads(DecisionTreeTimeoutConfigurator.bundled().to_json())
    cyclic = json.loads(json.dumps(good))
    cyclic["tree"]["children_left"][0] = 0  # a node that is its own child
    with pytest.raises(InvalidRequest, match="inconsistent"):
        DecisionTreeTimeoutConfigurator.from_json(json.dumps(cyclic))
    short = json.loads(json.dumps(good))
    short["tree"]["value"] = short["tree"]["value"][:-1]
    with pytest.raises(InvalidRequest, match="equal length"):
        DecisionTreeTimeoutConfigurator.from_json(json.dumps(short))
    bad_params = json.loads(json.dumps(good))
    bad_params["params"]["gamma"] = 2.0
    with pytest.raises(InvalidRequest, match="bad params"):
        DecisionTreeTimeoutConfigurator.from_json(json.dumps(bad_params))
    with pytest.raises(NotFound):
        DecisionTreeTimeoutConfigurator.load(tmp_path / "missing.json")


def test_scalar_decide_equals_vectorised(labelled):
    """``decide`` walks the tree with Python scalars; ``decide_many`` in numpy."""
    x, y = labelled
    conf = DecisionTreeTimeoutConfigurator.fit(x, y, max_depth=6, min_samples_leaf=5)
    rng = np.random.default_rng(1)
    z = np.concatenate([x, x * rng.uniform(0.8, 1.2, x.shape)])
    many = conf.decide_many(z)
    assert [conf.decide(s) for s in z] == many.tolist()
    np.testing.assert_array_equal([conf.tree.predict_one(s) for s in z], conf.tree.predict(z))
