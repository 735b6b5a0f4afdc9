"""Versioned graphs on every backend (storage/versions.py, graph_state.py, delta.py).

Random batches (edges added and removed, vertices added and removed, rows
replaced) are committed one by one; after each, what a fetcher reads at the
new version (every vertex's in-list, degrees, feature rows) must equal an
independent reference: the same operations applied to a plain edge list and a
row table. Old states stay as they were (snapshot isolation); bad batches are
refused naming the row and change nothing; two writers lose no batch; a
segment written without its record is invisible.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.delta import Delta, UpdateBatch
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import open_graph, write_graph
from gnn_faas.storage.resident import open_structure
from gnn_faas.storage.versions import GraphVersions, latest

DIM = 3


class Reference:
    """The graph as a plain edge list and row table, changed op by op."""

    def __init__(self, src, dst, feats, symmetrized: bool):
        self.edges = list(zip(src.tolist(), dst.tolist()))
        self.rows = {i: feats[i].copy() for i in range(feats.shape[0])}
        self.n = feats.shape[0]
        self.removed: set[int] = set()
        self.sym = symmetrized

    def apply(self, b: UpdateBatch) -> None:
        k = b.new_features.shape[0]
        for i in range(k):
            self.rows[self.n + i] = b.new_features[i].copy()
        self.n += k
        for i, row in zip(b.feature_ids.tolist(), b.features):
            self.rows[i] = row.copy()
        gone = set()
        for u, v in b.remove_edges.tolist():
            gone.add((u, v))
            if self.sym:
                gone.add((v, u))
        self.edges = [e for e in self.edges if e not in gone]
        for u, v in b.add_edges.tolist():
            self.edges.append((u, v))
            if self.sym:
                self.edges.append((v, u))
        for x in b.remove_vertices.tolist():
            self.removed.add(x)
        self.edges = [
            e for e in self.edges if e[0] not in self.removed and e[1] not in self.removed
        ]

    def in_list(self, v: int) -> list[int]:
        return sorted(u for u, w in self.edges if w == v)


def random_batch(rng, ref: Reference, n_ops: int = 12) -> UpdateBatch:
    alive = [v for v in range(ref.n) if v not in ref.removed]
    k = int(rng.integers(0, 3))
    new = list(range(ref.n, ref.n + k))
    ends = alive + new
    add = rng.choice(ends, size=(int(rng.integers(0, n_ops)), 2)) if ends else np.zeros((0, 2))
    present = [e for e in ref.edges if e[0] in alive and e[1] in alive]
    take = rng.permutation(len(present))[: int(rng.integers(0, 4))]
    remove = np.array([present[i] for i in take], np.int64).reshape(-1, 2)
    if ref.sym and remove.size:  # one direction per undirected edge
        keep = remove[:, 0] <= remove[:, 1]
        remove = remove[keep]
    remove = np.unique(remove, axis=0) if remove.size else remove
    rows = rng.choice(alive, size=int(rng.integers(0, 3)), replace=False) if alive else []
    untouched = sorted(
        set(alive) - set(add.reshape(-1).tolist()) - set(remove.reshape(-1).tolist())
    )
    drop = rng.choice(untouched, size=min(len(untouched), int(rng.integers(0, 2))), replace=False)
    drop = np.setdiff1d(drop, rows)
    return UpdateBatch.from_arrays({
        "add_edges": np.asarray(add, np.int64).reshape(-1, 2),
        "remove_edges": remove,
        "new_features": rng.standard_normal((k, DIM)).astype(np.float32),
        "feature_ids": np.asarray(rows, np.int64),
        "features": rng.standard_normal((len(rows), DIM)).astype(np.float32),
        "remove_vertices": np.asarray(drop, np.int64),
        # an empty batch is refused: always change one row at least
    } if (k or len(add) or remove.size or len(rows) or len(drop)) else {
        "feature_ids": np.array([alive[0]]),
        "features": rng.standard_normal((1, DIM)).astype(np.float32),
    })  # fmt: skip


def make_graph(uri: str, symmetrized: bool, seed: int = 0, n: int = 40):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, 120)
    dst = rng.integers(0, n, 120)
    if symmetrized:
        src, dst = np.concatenate((src, dst)), np.concatenate((dst, src))
    order = np.lexsort((src, dst))
    src, dst = src[order], dst[order]
    indptr = np.concatenate(([0], np.cumsum(np.bincount(dst, minlength=n)))).astype(np.int64)
    feats = rng.standard_normal((n, DIM)).astype(np.float32)
    write_graph(uri, "g", indptr=indptr, indices=src, features=feats, symmetrized=symmetrized)
    return src, dst, feats


def versions_of(uri: str, freshness_s: float = 0.0) -> GraphVersions:
    backend = open_backend(uri)

    def open_base(prefix: str):
        graph = open_graph(backend, "g")
        structure = open_structure(graph, 1 << 30)
        fetcher = KHopFetcher(graph, structure=structure)
        return graph, fetcher.base_neighbours

    gv = GraphVersions(backend, "g", open_base, freshness_s=freshness_s)
    gv.fetcher = KHopFetcher(gv.state.graph)  # plain store reads beside the resident ones
    return gv


def check_equal(gv: GraphVersions, ref: Reference) -> None:
    state = gv.state
    fetcher = KHopFetcher(state.graph).at(state)
    alive = np.array([v for v in range(ref.n) if v not in ref.removed], np.int64)
    assert state.num_nodes == ref.n
    counts, nbrs = fetcher.neighbours(alive)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    for i, v in enumerate(alive.tolist()):
        assert sorted(nbrs[bounds[i] : bounds[i + 1]].tolist()) == ref.in_list(v), v
    assert np.array_equal(fetcher.in_degrees(alive), [len(ref.in_list(v)) for v in alive])
    loops = [sum(1 for u in ref.in_list(v) if u == v) for v in alive.tolist()]
    assert np.array_equal(fetcher.self_loops(alive), loops)
    rows = fetcher.read_features(alive)
    assert np.array_equal(rows, np.stack([ref.rows[v] for v in alive.tolist()]))
    assert state.num_edges == len(ref.edges)
    for v in ref.removed:
        with pytest.raises(NotFound, match="removed"):
            state.check_targets(np.array([v]))


@pytest.mark.parametrize("symmetrized", [False, True], ids=["directed", "symmetrised"])
def test_every_version_reads_as_the_reference(store_uri, symmetrized):
    src, dst, feats = make_graph(store_uri, symmetrized)
    ref = Reference(src, dst, feats, symmetrized)
    gv = versions_of(store_uri)
    rng = np.random.default_rng(1)
    states = []
    for step in range(8):
        batch = random_batch(rng, ref)
        rec, delta = gv.commit(batch)
        assert rec.version == step + 1 and isinstance(delta, Delta)
        ref.apply(batch)
        check_equal(gv, ref)
        states.append((gv.state, ref.n))
    # an old state is as it was: a request holding it is not disturbed
    first, n_first = states[0]
    assert first.num_nodes == n_first and first.version == 1
    # a fresh reader rebuilt from the store sees the same newest version
    again = versions_of(store_uri)
    assert again.state.version == 8
    check_equal(again, ref)


@pytest.mark.parametrize("symmetrized", [False, True], ids=["directed", "symmetrised"])
def test_both_levels_of_changed_lists_read_as_the_reference(tmp_path, monkeypatch, symmetrized):
    """With the recent level folding after a few entries, versions alternate
    between lists in both levels and freshly folded ones: each reads as the
    reference, and so does compaction's single view of them."""
    from gnn_faas.storage import graph_state
    from gnn_faas.storage.compaction import merged_csr

    monkeypatch.setattr(graph_state, "FOLD_MIN_ENTRIES", 100)
    monkeypatch.setattr(graph_state, "FOLD_SCALE", 1)
    uri = f"file://{tmp_path}"
    src, dst, feats = make_graph(uri, symmetrized)
    ref = Reference(src, dst, feats, symmetrized)
    gv = versions_of(uri)
    rng = np.random.default_rng(2)
    seen = {"both": 0, "folded": 0}
    for _ in range(30):
        batch = random_batch(rng, ref)
        before = gv.state.ch_ids.size
        gv.commit(batch)
        ref.apply(batch)
        check_equal(gv, ref)
        st = gv.state
        seen["both"] += bool(st.rc_ids.size and st.ch_ids.size)
        seen["folded"] += bool(st.rc_ids.size == 0 and st.ch_ids.size > before)
        ptr, idx = merged_csr(st, (st.graph.read_blob("indptr"), st.graph.read_blob("indices")))
        alive = [v for v in range(ref.n) if v not in ref.removed]
        assert [sorted(idx[ptr[v] : ptr[v + 1]].tolist()) for v in alive] == [
            ref.in_list(v) for v in alive
        ]
    assert seen["both"] >= 5 and seen["folded"] >= 2, seen


def test_the_rows_version_is_the_newest_that_set_rows_or_added_vertices(tmp_path):
    """What memory functions must read (graph_version.rows): every version that
    added vertices or set rows; one that changed only edges leaves it alone, for
    the writer's state and for a reader that folds the log."""
    uri = f"file://{tmp_path}"
    make_graph(uri, symmetrized=True)
    gv = versions_of(uri)
    assert gv.state.rows_version == gv.state.base_version == 0
    edges_only = UpdateBatch.from_arrays({"add_edges": [[0, 1]]})
    row = {"feature_ids": [2], "features": np.ones((1, DIM), np.float32)}
    vertex = {"new_features": np.ones((1, DIM), np.float32), "add_edges": [[0, 40]]}
    want = []
    for arrays in ({"add_edges": [[0, 1]]}, row, {"remove_edges": [[0, 1]]}, vertex, {}):
        batch = UpdateBatch.from_arrays(arrays) if arrays else edges_only
        rec, delta = gv.commit(batch)
        sets = bool(arrays) and ("feature_ids" in arrays or "new_features" in arrays)
        assert delta.sets_rows == sets
        want.append(rec.version if sets else (want[-1] if want else 0))
        assert gv.state.rows_version == want[-1], (arrays, gv.state.figures())
    assert want == [0, 2, 2, 4, 4]
    assert versions_of(uri).state.rows_version == 4  # a reader's fold agrees


def test_bad_batches_name_the_row_and_change_nothing(tmp_path):
    uri = f"file://{tmp_path}"
    src, dst, _ = make_graph(uri, symmetrized=False)
    present = set(zip(src.tolist(), dst.tolist()))
    absent = next([u, v] for u in range(6, 40) for v in range(6, 40) if (u, v) not in present)
    gv = versions_of(uri)
    gv.commit(UpdateBatch.from_arrays({"remove_vertices": np.array([5])}))
    before = latest(open_backend(uri), "g").version
    z = np.zeros((1, DIM), np.float32)
    cases = {
        "add_edges row 1: unknown vertex id 999": {"add_edges": [[0, 1], [999, 2]]},
        "add_edges row 0: vertex 5 was removed": {"add_edges": [[5, 1]]},
        "new_features row 0: 2 values": {"new_features": np.zeros((1, 2), np.float32)},
        "features row 0: not a finite number": {"feature_ids": [1], "features": z + np.nan},
        "new_ids row 1: duplicate id 40": {
            "new_features": np.zeros((2, DIM), np.float32),
            "new_ids": [40, 40],
        },  # fmt: skip
        "new_ids row 0: vertex 3 already exists": {"new_features": z, "new_ids": [3]},
        "remove_edges row 0: no edge": {"remove_edges": [absent]},
        "remove_edges row 1: no edge": {"remove_edges": [[int(src[0]), int(dst[0])], absent]},
        "is removed by this batch": {"add_edges": [[1, 2]], "remove_vertices": [2]},
    }
    for message, arrays in cases.items():
        with pytest.raises(InvalidRequest, match=message.split(":")[0]) as err:
            gv.commit(UpdateBatch.from_arrays(arrays))
        assert message.split(": ", 1)[-1].split()[0] in str(err.value), (message, err.value)
    assert latest(open_backend(uri), "g").version == before  # nothing applied


def test_new_vertices_take_the_next_ids_and_edges_may_name_them(tmp_path):
    uri = f"file://{tmp_path}"
    make_graph(uri, symmetrized=False)
    gv = versions_of(uri)
    rows = np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM)
    batch = UpdateBatch.from_arrays(
        {"new_features": rows, "new_ids": [41, 40], "add_edges": [[41, 40], [0, 41]]}
    )
    gv.commit(batch)
    f = KHopFetcher(gv.state.graph).at(gv.state)
    assert np.array_equal(f.read_features(np.array([40, 41])), rows[[1, 0]])
    c, nb = f.neighbours(np.array([40, 41]))
    assert c.tolist() == [1, 1] and nb.tolist() == [41, 0]


def test_two_writers_lose_no_batch(store_uri):
    make_graph(store_uri, symmetrized=False)
    writers = [versions_of(store_uri), versions_of(store_uri)]  # two processes' views
    per = 15
    errors: list = []

    def write(w: int) -> None:
        try:
            for i in range(per):
                row = np.full((1, DIM), w * 100 + i, np.float32)
                writers[w].commit(UpdateBatch.from_arrays({"new_features": row}))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    final = versions_of(store_uri).state
    assert final.version == 2 * per and final.num_nodes == 40 + 2 * per
    rows = KHopFetcher(final.graph).at(final).read_features(np.arange(40, 40 + 2 * per))
    assert sorted(rows[:, 0].tolist()) == sorted(w * 100 + i for w in range(2) for i in range(per))


def test_a_writer_behind_another_takes_a_batch_naming_what_the_other_added(tmp_path):
    uri = f"file://{tmp_path}"
    make_graph(uri, symmetrized=False)
    first, behind = versions_of(uri), versions_of(uri, freshness_s=3600.0)
    first.commit(UpdateBatch.from_arrays({"new_features": np.ones((1, DIM), np.float32)}))
    assert behind.state.num_nodes == 40  # it has not looked since
    rec, _ = behind.commit(UpdateBatch.from_arrays({"add_edges": [[40, 1]]}))
    assert rec.version == 2 and behind.state.num_nodes == 41
    c, nb = behind.fetcher.at(behind.state).neighbours(np.array([1]))
    assert 40 in nb.tolist()
    with pytest.raises(InvalidRequest, match="add_edges row 0: unknown vertex id 41"):
        behind.commit(UpdateBatch.from_arrays({"add_edges": [[41, 1]]}))  # bad on the newest
    assert latest(open_backend(uri), "g").version == 2


def test_a_segment_without_its_record_is_invisible(tmp_path):
    uri = f"file://{tmp_path}"
    make_graph(uri, symmetrized=False)
    gv = versions_of(uri)
    backend = open_backend(uri)
    # a writer killed after its segment and before its record
    orphan = UpdateBatch.from_arrays({"add_edges": [[1, 2]]})
    delta = gv.state.prepare(orphan)
    backend.pipe_file("g/log/000000000001-orphan.seg", delta.encode())
    assert versions_of(uri).state.version == 0
    rec, _ = gv.commit(UpdateBatch.from_arrays({"add_edges": [[3, 4]]}))
    fresh = versions_of(uri).state
    assert rec.version == fresh.version == 1
    f = KHopFetcher(fresh.graph).at(fresh)
    c, nb = f.neighbours(np.array([2, 4]))
    assert 3 in nb[c[0] :].tolist() and 1 not in nb[: c[0]].tolist()[-1:]


def test_compaction_writes_the_same_graph_and_keeps_serving(store_uri):
    from gnn_faas.storage.compaction import compact

    src, dst, feats = make_graph(store_uri, symmetrized=True, seed=3)
    ref = Reference(src, dst, feats, True)
    gv = versions_of(store_uri)
    rng = np.random.default_rng(4)
    for _ in range(5):
        batch = random_batch(rng, ref)
        gv.commit(batch)
        ref.apply(batch)
    held = gv.state  # a request running on version 5 during the compaction
    backend = open_backend(store_uri)
    clock = [1000.0]
    out = compact(backend, "g", grace_s=60.0, now=lambda: clock[0])
    assert out["compacted"] and out["folded_version"] == 5 and out["version"] == 6
    fresh = versions_of(store_uri)
    assert fresh.state.version == 6 and fresh.state.base_version == 5
    assert not fresh.state.has_changes  # everything is in the new base now
    check_equal(fresh, ref)
    # the held state still reads (its blobs are not deleted before the grace period)
    f = KHopFetcher(held.graph).at(held)
    alive = np.array([v for v in range(ref.n) if v not in ref.removed])
    assert np.array_equal(f.read_features(alive), np.stack([ref.rows[v] for v in alive]))
    # commits go on after it, and a second compaction collects the first's garbage
    batch = random_batch(rng, ref)
    fresh.commit(batch)
    ref.apply(batch)
    clock[0] += 120.0
    out2 = compact(backend, "g", grace_s=60.0, now=lambda: clock[0])
    assert out2["deleted"] > 0 and out2["folded_version"] == 7
    check_equal(versions_of(store_uri), ref)
    assert open_graph(backend, "g").prefix == "g/base-000000000007"


def test_a_reader_sees_a_commit_within_freshness_s(tmp_path, monkeypatch):
    """The freshness rule: a reader checks the store when its last check is older
    than freshness_s (on every call with 0), so a commit acknowledged at t is
    seen by every call after t + freshness_s. Time is the test's own clock."""
    import gnn_faas.storage.versions as versions_mod

    uri = f"file://{tmp_path}"
    make_graph(uri, symmetrized=False)
    now = [1000.0]
    monkeypatch.setattr(versions_mod.time, "monotonic", lambda: now[0])
    writer = versions_of(uri)
    lazy = versions_of(uri, freshness_s=5.0)  # no refresher thread: current() alone
    eager = versions_of(uri, freshness_s=0.0)
    assert lazy.current().version == eager.current().version == 0
    writer.commit(UpdateBatch.from_arrays({"add_edges": [[1, 2]]}))  # acknowledged at t=1000
    assert eager.current().version == 1  # freshness 0: read-your-writes for any reader
    now[0] += 4.9
    assert lazy.current().version == 0  # within freshness_s: may still be the old one
    now[0] += 0.2
    assert lazy.current().version == 1  # after t + freshness_s: seen


def test_a_store_that_does_not_answer_the_version_check_fails_no_request(tmp_path, monkeypatch):
    """During an outage a request runs on the newest version known: the check is
    the store's problem, not the request's (nothing can commit to a store that is down)."""
    import gnn_faas.storage.versions as versions_mod
    from gnn_faas.errors import StoreUnavailable

    uri = f"file://{tmp_path}"
    make_graph(uri, symmetrized=False)
    gv = versions_of(uri, freshness_s=0.0)
    gv.commit(UpdateBatch.from_arrays({"add_edges": [[1, 2]]}))

    def down(*a, **k):
        raise StoreUnavailable("graph store is unavailable")

    monkeypatch.setattr(versions_mod, "read_version", down)
    monkeypatch.setattr(versions_mod, "latest_version", down)
    assert gv.current().version == 1
