"""The gateway's writer process (gateway/graph_writer.py): batches committed in a
child, adopted by the serving process's state.

After every batch the serving side's state (built only from the answers'
deltas) must equal the reference graph and a fresh reader of the store; a bad
batch is the same 400 naming its row, nothing committed; another writer's
versions between two of the child's are read from the store; a child that died
is started again, and a batch it held in flight is a 503 that leaves the store
all or nothing.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest, NotFound, Unavailable
from gnn_faas.gateway import graph_writer
from gnn_faas.gateway.graph_writer import WriterProcess
from gnn_faas.storage.delta import UpdateBatch
from tests.storage.test_versions import (
    Reference,
    check_equal,
    make_graph,
    random_batch,
    versions_of,
)


@pytest.fixture
def graph(tmp_path):
    uri = f"file://{tmp_path / 'store'}"
    src, dst, feats = make_graph(uri, symmetrized=True, seed=21)
    writer = WriterProcess(uri, ["g"], 1 << 30)
    writer.start()
    try:
        yield uri, Reference(src, dst, feats, True), writer
    finally:
        writer.close()


def test_batches_committed_in_the_child_are_adopted_exactly(graph):
    uri, ref, writer = graph
    serving = versions_of(uri, freshness_s=60.0)  # learns versions only from the answers
    rng = np.random.default_rng(22)
    for step in range(8):
        batch = random_batch(rng, ref)
        rec, delta = writer.commit("g", batch)
        ref.apply(batch)
        assert rec.version == step + 1
        assert serving.adopt(rec, delta).version == rec.version
        check_equal(serving, ref)  # built from the deltas alone
    check_equal(versions_of(uri), ref)  # the store holds the same
    assert writer.started == 1


def test_offered_versions_are_taken_at_the_next_check_in_one_merge(graph):
    uri, ref, writer = graph
    serving, other = versions_of(uri, freshness_s=60.0), versions_of(uri)
    rng = np.random.default_rng(26)
    for who in ("child", "child", "child", "other", "child", "child"):
        batch = random_batch(rng, ref)
        if who == "child":
            serving.offer(*writer.commit("g", batch))
        else:
            other.commit(batch)
        ref.apply(batch)
    assert serving.state.version == 0  # offered, not taken until the check
    merges = []
    apply_all = type(serving.state).apply_all
    type(serving.state).apply_all = lambda st, items: (
        merges.append(len(items)) or apply_all(st, items)
    )
    try:
        assert serving.poll().version == 6  # the offered run, then the store past the gap
    finally:
        type(serving.state).apply_all = apply_all
    assert merges[0] == 3  # versions 1-3 from the answers, in one merge
    check_equal(serving, ref)


def test_a_bad_batch_is_the_same_error_and_commits_nothing(graph):
    uri, ref, writer = graph
    bad = UpdateBatch.from_arrays({"add_edges": [[1, 2], [3, 10**6]]})
    with pytest.raises(InvalidRequest, match="add_edges row 1: unknown vertex id"):
        writer.commit("g", bad)
    with pytest.raises(NotFound, match="not writable"):
        writer.commit("other", UpdateBatch.from_arrays({"add_edges": [[1, 2]]}))
    check_equal(versions_of(uri), ref)  # version 0, as written
    batch = random_batch(np.random.default_rng(23), ref)
    rec, _ = writer.commit("g", batch)  # the child goes on
    assert rec.version == 1


def test_versions_another_writer_made_between_are_read_from_the_store(graph):
    uri, ref, writer = graph
    serving, other = versions_of(uri, freshness_s=60.0), versions_of(uri)
    rng = np.random.default_rng(24)
    for who in ("child", "other", "other", "child", "child", "other", "child"):
        batch = random_batch(rng, ref)
        if who == "child":  # its first try loses the race when the other wrote last
            rec, delta = writer.commit("g", batch)
            serving.adopt(rec, delta)
        else:
            other.commit(batch)
        ref.apply(batch)
    assert serving.state.version == 7
    check_equal(serving, ref)


def test_a_dead_child_is_started_again_and_a_batch_in_flight_is_all_or_nothing(graph, monkeypatch):
    uri, ref, writer = graph
    rng = np.random.default_rng(25)
    batch = random_batch(rng, ref)
    writer.commit("g", batch)
    ref.apply(batch)
    os.kill(writer.pid(), signal.SIGKILL)  # between batches: the next one starts another
    deadline = time.monotonic() + 60
    while writer.alive() and time.monotonic() < deadline:  # the kill takes a moment
        time.sleep(0.01)
    batch = random_batch(rng, ref)
    rec, _ = writer.commit("g", batch)
    ref.apply(batch)
    assert rec.version == 2 and writer.started == 2
    sent = graph_writer.write_frame

    def send_then_die(fd, tensors, params):  # the child dies with the batch in hand
        sent(fd, tensors, params)
        if "graph" in params:
            os.kill(writer.pid(), signal.SIGKILL)

    monkeypatch.setattr(graph_writer, "write_frame", send_then_die)
    batch = random_batch(rng, ref)
    with pytest.raises(Unavailable, match="may or may not have been committed"):
        writer.commit("g", batch)
    monkeypatch.setattr(graph_writer, "write_frame", sent)
    fresh = versions_of(uri)
    if fresh.state.version == 3:  # it got in before the kill: whole
        ref.apply(batch)
    else:
        assert fresh.state.version == 2  # or not at all
    check_equal(fresh, ref)
    batch = random_batch(rng, ref)
    rec, _ = writer.commit("g", batch)  # a third child takes the next batch
    ref.apply(batch)
    assert writer.started == 3
    check_equal(versions_of(uri), ref)


def test_a_store_the_child_cannot_open_is_said_on_the_first_batch(tmp_path):
    writer = WriterProcess(f"file://{tmp_path / 'empty'}", ["g"], 1 << 20)
    try:
        with pytest.raises(NotFound):
            writer.commit("g", UpdateBatch.from_arrays({"add_edges": [[1, 2]]}))
    finally:
        writer.close()
