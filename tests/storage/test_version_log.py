"""A long log (storage/versions.py, graph_state.py): records stay bounded, folding many
deltas at once equals applying them one by one.

``GraphState.apply_all`` merges the changed lists once for any number of
deltas (catching up, compaction); it must give exactly the state
``apply`` gives one delta at a time, also when a later delta removes what an
earlier one added and a still later one adds it again. A record lists at most
``SEGMENTS_PER_RECORD`` segments and points to the record holding the older
ones: every reader (a fresh one, one catching up, compaction, a memory
function's rows) still finds the whole log, and records written before the
chain (every segment listed) still read.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from gnn_faas.storage import versions as versions_mod
from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.compaction import compact
from gnn_faas.storage.delta import UpdateBatch
from gnn_faas.storage.format import VERSION_HINT, VERSIONS_DIR, version_key
from gnn_faas.storage.versions import HINT_EVERY, latest, segments_after
from tests.storage.test_versions import (
    DIM,
    Reference,
    check_equal,
    make_graph,
    random_batch,
    versions_of,
)


def same_state(a, b) -> None:
    assert a.version == b.version and a.num_edges == b.num_edges and a.num_nodes == b.num_nodes
    for name in ("ch_ids", "ch_ptr", "ch_idx"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    fa, fb = a.features, b.features
    for name in ("feat_ids", "feat_rows", "new_labels", "removed"):
        assert np.array_equal(getattr(fa, name), getattr(fb, name)), name
    assert a.segments == b.segments and a.delta_bytes == b.delta_bytes


@pytest.mark.parametrize("symmetrized", [False, True], ids=["directed", "symmetrised"])
def test_folding_many_deltas_equals_applying_them_one_by_one(tmp_path, symmetrized):
    uri = f"file://{tmp_path}"
    src, dst, feats = make_graph(uri, symmetrized, seed=7)
    ref = Reference(src, dst, feats, symmetrized)
    gv = versions_of(uri)
    start = gv.state
    rng = np.random.default_rng(8)
    items = []
    churn = None  # an edge removed, added again, removed, added again
    for step in range(15):
        if step % 3 == 2:
            if churn is None or set(churn) & ref.removed:
                alive = [e for e in ref.edges if not set(e) & ref.removed and e[0] != e[1]]
                churn = alive[0]
            present = churn in ref.edges
            e = np.array([churn if not symmetrized else sorted(churn)], np.int64)
            batch = UpdateBatch.from_arrays({"remove_edges" if present else "add_edges": e})
        else:
            batch = random_batch(rng, ref)
        rec, delta = gv.commit(batch)
        ref.apply(batch)
        items.append((delta, rec.version, rec.segments[-1][1], rec.segments[-1][2]))
    one_by_one = start
    for item in items:
        one_by_one = one_by_one.apply(*item)
    same_state(start.apply_all(items), one_by_one)
    same_state(one_by_one, gv.state)
    check_equal(gv, ref)


def test_records_stay_bounded_and_every_reader_finds_the_whole_log(store_uri, monkeypatch):
    monkeypatch.setattr(versions_mod, "SEGMENTS_PER_RECORD", 3)
    src, dst, feats = make_graph(store_uri, symmetrized=False, seed=9)
    ref = Reference(src, dst, feats, False)
    gv = versions_of(store_uri)
    behind = versions_of(store_uri)  # a reader that catches up over several records
    backend = open_backend(store_uri)
    rng = np.random.default_rng(10)
    for _ in range(10):
        batch = random_batch(rng, ref)
        gv.commit(batch)
        ref.apply(batch)
    head = latest(backend, "g")
    assert head.version == 10 and len(head.segments) <= 3 and head.num_segments == 10
    assert head.segments_from > 0  # it points back
    listed = segments_after(backend, head, 0)
    assert [s[0] for s in listed] == list(range(1, 11))
    assert head.delta_bytes == sum(s[2] for s in listed)
    for v in range(1, 11):  # no record lists more than the limit plus the one it adds
        rec = versions_mod.record(backend, "g", v)
        assert len(rec.segments) <= 4
    behind.refresh()
    check_equal(behind, ref)
    check_equal(versions_of(store_uri), ref)  # a fresh reader walks back to the base
    out = compact(backend, "g", grace_s=60.0)
    assert out["compacted"] and out["segments_folded"] == 10
    for _ in range(5):  # the log grows again on the new base
        batch = random_batch(rng, ref)
        gv.commit(batch)
        ref.apply(batch)
    head = latest(backend, "g")
    assert head.base_version == 10 and head.num_segments == 5
    assert [s[0] for s in segments_after(backend, head, 0)] == list(range(12, 17))
    check_equal(versions_of(store_uri), ref)


def test_a_record_listing_every_segment_still_reads(tmp_path):
    uri = f"file://{tmp_path}"
    src, dst, feats = make_graph(uri, symmetrized=False, seed=11)
    ref = Reference(src, dst, feats, False)
    gv = versions_of(uri)
    rng = np.random.default_rng(12)
    for _ in range(4):
        batch = random_batch(rng, ref)
        gv.commit(batch)
        ref.apply(batch)
    # rewrite the records as the format before the chain wrote them
    root = tmp_path / "g" / "versions"
    for v in range(1, 5):
        path = root / f"{v:012d}.json"
        doc = json.loads(path.read_text())
        all_segments = [list(s) for s in segments_after(open_backend(uri), gv.record, 0)][:v]
        doc["segments"] = all_segments
        for key in ("segments_from", "log_bytes", "log_segments"):
            doc.pop(key)
        path.write_text(json.dumps(doc))
    old = versions_mod.record(open_backend(uri), "g", 4)
    assert old.segments_from == 0 and old.num_segments == 4
    check_equal(versions_of(uri), ref)
    gv2 = versions_of(uri)
    rows = rng.standard_normal((1, DIM)).astype(np.float32)
    batch = UpdateBatch.from_arrays({"new_features": rows})
    rec, _ = gv2.commit(batch)  # continues an old record
    ref.apply(batch)
    assert rec.version == 5 and rec.num_segments == 5
    assert version_key("g", 5).endswith("000000000005.json")
    check_equal(versions_of(uri), ref)


def test_a_poll_reads_one_record_while_nothing_is_new_and_finds_what_came(tmp_path):
    uri = f"file://{tmp_path}"
    src, dst, feats = make_graph(uri, symmetrized=False, seed=13)
    ref = Reference(src, dst, feats, False)
    writer, reader = versions_of(uri), versions_of(uri, freshness_s=1.0)
    reads: list[str] = []
    inner = reader.backend.cat_file

    def counted(path, *a, **kw):
        reads.append(path)
        return inner(path, *a, **kw)

    reader.backend.cat_file = counted
    reader.poll()  # the first poll is a full refresh (hint, then probes)
    reads.clear()
    reader.poll()
    assert reads == ["g/versions/000000000001.json"]  # nothing new: one read
    rng = np.random.default_rng(14)
    for _ in range(3):
        batch = random_batch(rng, ref)
        writer.commit(batch)
        ref.apply(batch)
    assert reader.poll().version == 3
    check_equal(reader, ref)


def test_the_hint_moves_every_few_versions_and_readers_search_past_it(tmp_path, monkeypatch):
    uri = f"file://{tmp_path}"
    src, dst, feats = make_graph(uri, symmetrized=False, seed=15)
    ref = Reference(src, dst, feats, False)
    writer = versions_of(uri)
    backend = open_backend(uri)
    hint = f"g/{VERSIONS_DIR}/{VERSION_HINT}"
    rng = np.random.default_rng(16)

    def commit(n: int) -> None:
        for _ in range(n):
            batch = random_batch(rng, ref)
            writer.commit(batch)
            ref.apply(batch)

    commit(HINT_EVERY + 1)  # the hint moved at version 1 and at HINT_EVERY
    assert backend.cat_file(hint).decode() == str(HINT_EVERY)
    monkeypatch.setattr(versions_mod, "HINT_EVERY", 10**6)  # from here on it stays behind
    commit(40)
    newest = HINT_EVERY + 41
    reads: list[str] = []
    inner = backend.cat_file

    def counted(path, *a, **kw):
        reads.append(path)
        return inner(path, *a, **kw)

    backend.cat_file = counted
    assert latest(backend, "g").version == newest  # 41 versions past the hint
    # hint, its record, then 2 log2(41) probes at most (one by one would be 42)
    assert len(reads) <= 2 + 2 * math.ceil(math.log2(41)), reads
    reads.clear()
    assert latest(backend, "g", known=newest - 1).version == newest  # from what it knows
    assert len(reads) <= 5, reads
    reads.clear()
    assert latest(backend, "g", known=newest).version == newest
    assert reads == [hint, version_key("g", newest), version_key("g", newest + 1)]
    check_equal(versions_of(uri), ref)  # a fresh reader finds the newest version
