"""``gnn-faas bench updates`` and ``bench update-faults``: their pieces and short runs.

The pieces are checked against plain definitions: the edge cycle's batches
and what the graph holds after them, freshness (the first answer on the acked
version or a later one) against a loop over answers, the PyG reference on the
targets' in-neighbourhood against PyG on the whole graph. The short runs
(slow: they start stacks) check behaviour, not speed: every answer equals
PyG, nothing failed, no batch was lost, no kill left a half batch visible.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gnn_faas.bench.update_figures import freshness, hop_edges, reference_scores, summarise
from gnn_faas.bench.update_graphs import new_edges
from gnn_faas.bench.update_writer import EdgeCycle, WriterProcess, batch_body
from gnn_faas.cli import main
from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.format import open_graph, write_graph


def test_the_edge_cycle_adds_removes_and_knows_what_is_present():
    edges = np.arange(14).reshape(7, 2)
    c = EdgeCycle(edges, batch=3, cycle="add-remove")
    assert c.per_pass == 3
    kinds = [c.get(k)[0] for k in range(7)]
    assert kinds == ["add_edges"] * 3 + ["remove_edges"] * 3 + ["add_edges"]
    assert np.array_equal(c.get(2)[1], edges[6:7]) and np.array_equal(c.get(4)[1], edges[3:6])
    # replaying the batches on a multiset gives what present() says
    held: list[tuple[int, int]] = []
    for k in range(10):
        assert sorted(map(tuple, c.present(k).tolist())) == sorted(held), k
        kind, e = c.get(k)
        for pair in map(tuple, e.tolist()):
            held.append(pair) if kind == "add_edges" else held.remove(pair)
    a = EdgeCycle(edges, batch=3, cycle="add")
    assert a.present(4).shape[0] == 7 + 3 and all(a.get(k)[0] == "add_edges" for k in range(9))
    with pytest.raises(InvalidRequest):
        EdgeCycle(edges[:0], batch=3)


def test_the_writer_process_posts_the_cycles_batches_in_order(tmp_path):
    """A writer in its own process (no interpreter shared with the load) posts
    the batches a cycle gives from ``first`` on, with the token, and returns an
    ack per batch with the version the server answered."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    got: list[tuple[str, str, bytes]] = []

    class Updates(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server hook
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append((self.path, self.headers["Authorization"], body))
            answer = json.dumps({"version": len(got)}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            """Quiet: no line per request on the test's stderr."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Updates)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cycle = EdgeCycle(np.arange(14).reshape(7, 2), batch=3, cycle="add-remove")
        cycle.save(str(tmp_path / "edges.npy"))
        writer = WriterProcess(cycle.file, cycle.batch, cycle.cycle)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        acks = writer.run(url, "g", "secret", until=time.monotonic() + 60, first=2,
                          max_edges=4, binary=False)  # fmt: skip
    finally:
        server.shutdown()
    assert [a.version for a in acks] == [1, 2] and all(a.status == 200 for a in acks)
    assert [(a.kind, a.edges) for a in acks] == [("add_edges", 1), ("remove_edges", 3)]
    assert all(a.sent <= a.acked <= time.monotonic() for a in acks)
    assert {p for p, _, _ in got} == {"/v2/graphs/g/updates"}
    assert {auth for _, auth, _ in got} == {"Bearer secret"}
    want = [json.loads(batch_body(*cycle.get(k), binary=False)[0]) for k in (2, 3)]
    assert [json.loads(b) for _, _, b in got] == want


def test_a_paced_stream_posts_its_rate_in_edges_short_batches_included(monkeypatch):
    """At ``rate`` edges/s a batch is due when the edges before it are: a pass's
    short last batch (1 edge of 7 in batches of 3) brings the next one forward,
    so the edges posted per second are ``rate``, not fewer (on a fake clock)."""
    import gnn_faas.bench.update_writer as uw

    class Clock:
        now = 100.0

        def monotonic(self):
            return self.now

        def sleep(self, s):
            self.now += s

    clock = Clock()
    monkeypatch.setattr(uw, "time", clock)
    sent: list[tuple[float, int]] = []

    posters: list = []

    class Poster:
        def __init__(self, url, timeout_s):
            self.url, self.open = url, True
            posters.append(self)

        def post(self, path, body, headers):
            n = json.loads(body)
            sent.append((clock.now, len(next(iter(n.values())))))
            return 200, {"version": len(sent)}

        def close(self):
            self.open = False

    monkeypatch.setattr(uw, "Poster", Poster)
    cycle = EdgeCycle(np.arange(14).reshape(7, 2), batch=3, cycle="add-remove")
    acks = uw.post_batches("http://x", "g", "t", cycle, until=1e9, rate=2.0, binary=False,
                           max_edges=14)  # fmt: skip
    assert [n for _, n in sent] == [3, 3, 1, 3, 3, 1]
    before = np.concatenate([[0], np.cumsum([n for _, n in sent])[:-1]])
    assert [t - 100.0 for t, _ in sent] == pytest.approx(before / 2.0)
    assert sum(a.edges for a in acks) == 14
    assert [(p.url, p.open) for p in posters] == [("http://x", False)]  # one connection, closed


def test_a_batch_body_is_oip_binary_or_json():
    e = np.array([[1, 2], [3, 4]])
    body, headers = batch_body("add_edges", e, binary=True)
    n = int(headers["Inference-Header-Content-Length"])
    head = json.loads(body[:n])
    assert head["inputs"][0]["shape"] == [2, 2] and head["inputs"][0]["datatype"] == "INT64"
    assert np.array_equal(np.frombuffer(body[n:], "<i8").reshape(2, 2), e)
    body, _ = batch_body("remove_edges", e, binary=False)
    assert json.loads(body) == {"remove_edges": [[1, 2], [3, 4]]}


def test_freshness_is_the_first_answer_on_the_version_or_later():
    rng = np.random.default_rng(0)
    acked = np.sort(rng.uniform(0, 10, 40))
    versions = np.arange(1, 41)
    ends = np.sort(rng.uniform(0, 12, 300))
    seen = np.minimum(40, np.floor(np.interp(ends - 0.3, acked, versions, left=0)).astype(int))
    shuffled = rng.permutation(ends.size)  # answers come in any order
    got = freshness(acked, versions, ends[shuffled], seen[shuffled])
    for i, (t, v) in enumerate(zip(acked, versions)):  # the definition, answer by answer
        later = [e for e, s in zip(ends, seen) if s >= v]
        want = max(0.0, min(later) - t) if later else np.nan
        assert (np.isnan(want) and np.isnan(got[i])) or got[i] == pytest.approx(want), i
    s = summarise(got)
    assert s["observed"] + s["unobserved"] == 40 and s["p99_s"] <= s["max_s"]


@pytest.mark.parametrize("arch", ["gcn", "gat"])
def test_the_reference_on_a_neighbourhood_equals_pyg_on_the_whole_graph(tmp_path, arch):
    torch = pytest.importorskip("torch")
    from gnn_faas.bench.update_checks import write_checkpoint
    from gnn_faas.functions.checkpoint import load_config, load_state
    from gnn_faas.functions.pyg_models import PygGNN

    rng = np.random.default_rng(1)
    n = 300
    src, dst = rng.integers(0, n, 1500), rng.integers(0, n, 1500)
    order = np.lexsort((src, dst))
    src, dst = src[order], dst[order]
    ptr = np.concatenate(([0], np.cumsum(np.bincount(dst, minlength=n))))
    x = rng.standard_normal((n, 8)).astype(np.float32)
    write_graph(f"file://{tmp_path}", "g", indptr=ptr, indices=src, features=x, symmetrized=False)
    ckpt = write_checkpoint(str(tmp_path / "m"), open_graph(f"file://{tmp_path}", "g"), arch, 0)
    targets = np.array([0, 5, 17, 299])
    keep = hop_edges(src, dst, targets, 2)
    assert keep.size < src.size and set(dst[keep]) >= set(targets)
    net = PygGNN(load_config(ckpt))
    net.load_state_dict({k: torch.as_tensor(v) for k, v in load_state(ckpt).items()})
    net.eval()
    with torch.no_grad():
        whole = net(torch.from_numpy(x), torch.from_numpy(np.stack([src, dst]))).numpy()
    got = reference_scores(ckpt, src, dst, x, targets)
    np.testing.assert_allclose(got, whole[targets], rtol=1e-5, atol=1e-6)


def test_new_edges_drop_repeats_and_what_the_base_holds(tmp_path):
    ptr = np.array([0, 1, 2, 2])  # edges 1->0, 2->1
    write_graph(f"file://{tmp_path}", "g", indptr=ptr, indices=np.array([1, 2]),
                features=np.zeros((3, 2), np.float32), symmetrized=False)  # fmt: skip
    g = open_graph(f"file://{tmp_path}", "g")
    stream = np.array([[0, 2], [1, 0], [0, 2], [2, 0], [2, 1]])
    assert new_edges(stream, g).tolist() == [[0, 2], [2, 0]]


@pytest.mark.slow
def test_a_short_update_benchmark_is_exact_and_loses_nothing(tmp_path, capsys):
    argv = ["bench", "updates", "--store", f"file://{tmp_path}", "--rps", "10",
            "--reader-rps", "5", "--duration", "8", "--rounds", "2", "--batch", "500", "--sample", "40",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["failed_requests"] == 0 and r["batches_failed"] == 0
    assert r["batches_acked"] > 0 and r["final_version"] == r["batches_acked"]
    assert r["max_abs_diff_pyg"] < 1e-5
    assert r["pyg"]["after_compaction"]["versions"] == [[r["final_version"] + 1]] * 2
    assert r["compaction"]["ok"] and r["compaction_peak_mib"] > 0
    assert r["infer_during_compaction"]["failed"] == 0
    assert r["freshness"][0]["observed"] > 0 and r["freshness"][1]["observed"] > 0
    for key in ("updates_per_s", "ack_p50_ms", "ack_p99_ms", "freshness_p99_s",
                "infer_p99_ms_with_updates", "infer_p99_ms_without_updates", "compaction_s",
                "store", "graph"):  # fmt: skip
        assert key in r, key
    committed = r["gateway_metrics"]
    assert (
        committed["gnn_faas_graph_update_batches_total{graph=bitcoin-otc-cut,outcome=committed}"]
        == r["batches_acked"]
    )  # noqa: E501


@pytest.mark.slow
def test_short_fault_runs_lose_nothing(tmp_path, capsys):
    argv = ["bench", "update-faults", "--store", f"file://{tmp_path}", "--writer-kills", "4",
            "--compaction-kills", "4", "--batches", "60", "--sample", "30", "--json"]  # fmt: skip
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["violations"] == [] and r["ok"]
    assert sum(r["writer"]["hits"].values()) == 4 and sum(r["compaction"]["hits"].values()) == 4
    assert r["compaction"]["verify_failures"] == 0 and r["served"]["wrong_answers"] == 0
    cw = r["concurrent_writers"]
    assert cw["none_lost"] and cw["final_version"] == 60 and cw["distinct_versions"]
